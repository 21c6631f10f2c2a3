// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dkc-dev/dkc/internal/configcheck"
	"github.com/dkc-dev/dkc/internal/nodeconfig"
	"github.com/dkc-dev/dkc/sidecar/internal/probe"
)

// TestRollbackRules is docs/design.md's "The rollback rules" table, row by row: from a saved state
// (what is assigned, what is last-known-good, which of them failed to run before) and the events of one
// reconcile (each config's check, each restart's outcome), the steps the agent takes, the phase it ends in
// and the node's config error.
//
// State: "A" is assigned, "L" last-known-good ("A=L": the assigned config is last-known-good); "A!" / "L!":
// that config failed to run before. Events: "<slot>:<result>" with slot A, L or local; check results ok,
// load, validate, internal, unsupported (default ok); run outcomes healthy, fault, unverifiable, noanswer,
// transient, stopped, needsdrain, cannotreset (default healthy). Steps: "check X", "run X", "mark X failed".
func TestRollbackRules(t *testing.T) {
	for _, tc := range []struct {
		name   string
		state  string
		events string
		steps  string
		phase  Phase
		status nodeconfig.StatusError
		retry  bool
	}{
		// Nothing assigned.
		{"local runs", "", "", "check local, run local", PhaseLocal, "", false},
		{"local does not check: kubelet left alone", "", "check local:validate", "check local", PhaseHeld, nodeconfig.InternalError, false},
		{"local runs unhealthy: nothing to roll back to", "", "run local:fault", "check local, run local", PhaseFailed, nodeconfig.HealthError, false},

		// A new assignment.
		{"assigned runs: trial", "A L", "", "check A, run A", PhaseTrial, "", false},
		{"assigned is last-known-good", "A=L", "", "check A, run A", PhaseGood, "", false},
		{"assigned does not load: last-known-good", "A L", "check A:load", "check A, check L, run L", PhaseRolledBack, nodeconfig.LoadError, false},
		{"assigned does not validate: last-known-good", "A L", "check A:validate", "check A, check L, run L", PhaseRolledBack, nodeconfig.ValidateError, false},
		{"assigned not checked (helper failed): last-known-good, retried", "A L", "check A:internal", "check A, check L, run L", PhaseRolledBack, nodeconfig.InternalError, true},
		{"assigned is last-known-good, its check failed (helper): the same config as the fallback", "A=L", "check A:internal",
			"check A, check L, run L", PhaseGood, nodeconfig.InternalError, true},
		{"assigned does not validate, no last-known-good: local", "A", "check A:validate", "check A, check local, run local", PhaseLocalFallback, nodeconfig.ValidateError, false},

		// Restart outcomes.
		{"assigned runs unhealthy: marked failed, rolled back", "A L", "run A:fault",
			"check A, run A, mark A failed, check L, run L", PhaseRolledBack, nodeconfig.HealthError, false},
		{"assigned is last-known-good and runs unhealthy: local, not the same config again", "A=L", "run A:fault",
			"check A, run A, mark A failed, check local, run local", PhaseLocalFallback, nodeconfig.HealthError, false},
		{"assigned and last-known-good run unhealthy: local", "A L", "run A:fault run L:fault",
			"check A, run A, mark A failed, check L, run L, mark L failed, check local, run local", PhaseLocalFallback, nodeconfig.HealthError, false},
		{"all three run unhealthy: stop restarting", "A L", "run A:fault run L:fault run local:fault",
			"check A, run A, mark A failed, check L, run L, mark L failed, check local, run local", PhaseFailed, nodeconfig.HealthError, false},
		{"service manager failed: not blamed, retried", "A L", "run A:transient", "check A, run A", PhaseRetrying, nodeconfig.RestartError, true},
		{"configz refused with local's auth: not blamed, retried", "A L", "run A:unverifiable", "check A, run A", PhaseRetrying, nodeconfig.VerifyError, true},
		{"configz unanswered: not blamed, retried", "A L", "run A:noanswer", "check A, run A", PhaseRetrying, nodeconfig.VerifyTimeoutError, true},
		{"stopped during the health wait: nothing decided", "A L", "run A:stopped", "check A, run A", "", "", false},
		{"stopped while rolling back: the assigned error stays", "A L", "run A:fault run L:stopped",
			"check A, run A, mark A failed, check L, run L", "", nodeconfig.HealthError, false},
		{"needs a drain: kubelet left alone, not blamed, waits for the service", "A L", "run A:needsdrain", "check A, run A",
			PhaseWaitingForDrain, nodeconfig.DrainRequiredError, false},
		{"rolling back needs a drain: waits, the assigned config's failure is the status", "A L",
			"run A:fault run L:needsdrain",
			"check A, run A, mark A failed, check L, run L", PhaseWaitingForDrain, nodeconfig.HealthError, false},
		{"assigned does not validate, local needs a drain: waits, the validation error is the status", "A",
			"check A:validate run local:needsdrain",
			"check A, check local, run local", PhaseWaitingForDrain, nodeconfig.ValidateError, false},
		{"no reset possible here: marked failed, rolled back", "A L", "run A:cannotreset",
			"check A, run A, mark A failed, check L, run L", PhaseRolledBack, nodeconfig.HealthError, false},
		{"no reset possible for local either: kubelet left alone", "A", "run A:cannotreset run local:cannotreset",
			"check A, run A, mark A failed, check local, run local", PhaseHeld, nodeconfig.HealthError, false},
		{"nothing assigned, no reset possible for local: kubelet left alone", "", "run local:cannotreset",
			"check local, run local", PhaseHeld, nodeconfig.InternalError, false},

		// Saved failures.
		{"assigned failed before: not tried again", "A! L", "", "check L, run L", PhaseRolledBack, nodeconfig.HealthError, false},
		{"both failed before: local", "A! L!", "", "check local, run local", PhaseLocalFallback, nodeconfig.HealthError, false},
		{"last-known-good does not check: local", "A! L", "check L:validate", "check L, check local, run local", PhaseLocalFallback, nodeconfig.HealthError, false},

		// The local config as the last resort.
		{"no code for this kubelet: left alone, says so", "A L", "check A:unsupported check L:unsupported check local:unsupported",
			"check A, check L, check local", PhaseHeld, nodeconfig.UnsupportedKubeletError, false},
		{"local does not check: the assigned error stays", "A", "check A:validate check local:validate", "check A, check local", PhaseHeld, nodeconfig.ValidateError, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, events := parseRule(t, tc.state, tc.events)
			var steps []string
			var d decision
			for i := 0; ; i++ {
				if i > 20 {
					t.Fatalf("no end after steps %v", steps)
				}
				d = r.next()
				if d.action == actDone {
					break
				}
				name := map[slot]string{slotAssigned: "A", slotLastKnownGood: "L", slotLocal: "local"}[d.slot]
				switch d.action {
				case actCheck:
					steps = append(steps, "check "+name)
					err := events.check[d.slot]
					r.checked[d.slot] = &err
				case actRun:
					steps = append(steps, "run "+name)
					o := events.run[d.slot]
					r.ran[d.slot] = &o
				case actMarkFailed:
					steps = append(steps, "mark "+name+" failed")
					r.markFailed(d.slot, d.detail)
				}
			}
			if got := strings.Join(steps, ", "); got != tc.steps {
				t.Errorf("steps: %s\nwant:  %s", got, tc.steps)
			}
			if d.phase != tc.phase || d.status != tc.status || d.retry != tc.retry {
				t.Errorf("ended in phase %q, status %q, retry %v; want %q, %q, %v", d.phase, d.status, d.retry, tc.phase, tc.status, tc.retry)
			}
			if d.status != "" && d.detail == "" {
				t.Errorf("status %q without a detail", d.status)
			}
		})
	}
}

type ruleEvents struct {
	check [numSlots]error
	run   [numSlots]ranResult
}

func parseRule(t *testing.T, state, events string) (*round, ruleEvents) {
	t.Helper()
	src := func(name string) *corev1.NodeConfigSource {
		return &corev1.NodeConfigSource{ConfigMap: &corev1.ConfigMapNodeConfigSource{Namespace: "ns", Name: name, UID: types.UID("u-" + name),
			ResourceVersion: "1", KubeletConfigKey: "kubelet"}}
	}
	r := &round{}
	for _, f := range strings.Fields(state) {
		switch f {
		case "A", "A!":
			r.assigned = src("a")
		case "L", "L!":
			r.lkg = src("l")
		case "A=L":
			r.assigned, r.lkg = src("a"), src("a")
		default:
			t.Fatalf("state %q", f)
		}
		switch f {
		case "A!":
			r.failed[slotAssigned] = "kubelet not healthy before"
		case "L!":
			r.failed[slotLastKnownGood] = "kubelet not healthy before"
		}
	}
	var e ruleEvents
	for s := range e.run {
		e.run[s] = ranResult{outcome: OutcomeHealthy}
	}
	slots := map[string]slot{"A": slotAssigned, "L": slotLastKnownGood, "local": slotLocal}
	// Events come as "check X:result" or "run X:outcome" pairs of fields.
	fields := strings.Fields(events)
	for i := 0; i+1 < len(fields); i += 2 {
		name, result, ok := strings.Cut(fields[i+1], ":")
		s, known := slots[name]
		if !ok || !known {
			t.Fatalf("event %q %q", fields[i], fields[i+1])
		}
		switch fields[i] {
		case "check":
			e.check[s] = map[string]error{
				"ok":          nil,
				"load":        fmt.Errorf("%w: no such file", configcheck.ErrLoad),
				"validate":    fmt.Errorf("%w: maxPods: must be positive", configcheck.ErrValidate),
				"internal":    fmt.Errorf("run helper: exit status 2"),
				"unsupported": fmt.Errorf("%w: kubelet v1.20.0", configcheck.ErrUnsupportedKubelet),
			}[result]
		case "run":
			e.run[s] = map[string]ranResult{
				"healthy":      {outcome: OutcomeHealthy},
				"fault":        {outcome: OutcomeConfigFault, err: fmt.Errorf("not healthy after 1m")},
				"unverifiable": {outcome: OutcomeUnverifiable, err: fmt.Errorf("%w: 401", probe.ErrRefused)},
				"noanswer":     {outcome: OutcomeUnverifiable, err: fmt.Errorf("%w: timeout", probe.ErrNoAnswer)},
				"transient":    {outcome: OutcomeTransient, err: fmt.Errorf("restart kubelet: job failed")},
				"stopped":      {outcome: OutcomeStopped, err: fmt.Errorf("context canceled")},
				"needsdrain":   {outcome: OutcomeNeedsDrain, err: fmt.Errorf("node not drained: cpu_manager_state")},
				"cannotreset":  {outcome: OutcomeCannotReset, err: fmt.Errorf("kubelet state cannot be reset: cpu_manager_state")},
			}[result]
			if e.run[s].outcome == 0 {
				t.Fatalf("outcome %q", result)
			}
		default:
			t.Fatalf("event %q", fields[i])
		}
	}
	return r, e
}

// TestStatusErrorPrecedence: the service's sync error wins (the original's error override), then a
// checkpoint that could not be written here, then what the assigned config came to.
func TestStatusErrorPrecedence(t *testing.T) {
	for _, tc := range []struct {
		sync, localSync, config nodeconfig.StatusError
		want                    nodeconfig.StatusError
		wantDetail              string
	}{
		{"", "", "", "", "config detail"},
		{"", "", nodeconfig.HealthError, nodeconfig.HealthError, "config detail"},
		{"", nodeconfig.SyncInternalError, nodeconfig.HealthError, nodeconfig.SyncInternalError, "local detail"},
		{nodeconfig.DownloadError, nodeconfig.SyncInternalError, nodeconfig.HealthError, nodeconfig.DownloadError, "local detail"},
		{nodeconfig.DownloadError, "", nodeconfig.HealthError, nodeconfig.DownloadError, "config detail"},
	} {
		got, detail := statusError(tc.sync, tc.localSync, "local detail", tc.config, "config detail")
		if got != tc.want || detail != tc.wantDetail {
			t.Errorf("statusError(%q, %q, %q) = %q, %q; want %q, %q", tc.sync, tc.localSync, tc.config, got, detail, tc.want, tc.wantDetail)
		}
	}
}

// TestTrialRules: when the assigned config becomes last-known-good (docs/design.md, "The rollback rules",
// the Trial row).
func TestTrialRules(t *testing.T) {
	src := func(name string) *corev1.NodeConfigSource {
		return &corev1.NodeConfigSource{ConfigMap: &corev1.ConfigMapNodeConfigSource{Namespace: "ns", Name: name, UID: types.UID("u-" + name),
			ResourceVersion: "1", KubeletConfigKey: "kubelet"}}
	}
	a, l := src("a"), src("l")
	for _, tc := range []struct {
		name  string
		trial trial
		want  bool
	}{
		{"ran the trial duration", trial{assigned: a, lkg: l, active: a, activeKnown: true, recorded: true, elapsed: 10 * time.Minute}, true},
		{"not yet", trial{assigned: a, lkg: l, active: a, activeKnown: true, recorded: true, elapsed: 10*time.Minute - 1}, false},
		{"already last-known-good", trial{assigned: a, lkg: a, active: a, activeKnown: true, recorded: true, elapsed: time.Hour}, false},
		{"runs something else (rolled back)", trial{assigned: a, lkg: l, active: l, activeKnown: true, recorded: true, elapsed: time.Hour}, false},
		{"not proven by this process", trial{assigned: a, lkg: l, active: a, recorded: true, elapsed: time.Hour}, false},
		{"no trial recorded", trial{assigned: a, lkg: l, active: a, activeKnown: true}, false},
		{"nothing assigned", trial{lkg: l, activeKnown: true, recorded: true, elapsed: time.Hour}, false},
	} {
		if got := trialOver(tc.trial, 10*time.Minute); got != tc.want {
			t.Errorf("%s: trialOver = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestNeedsDrainKeepsWhatRuns: a round that waits for a drain (or cannot reset the kubelet's state) left the
// kubelet alone, so what it runs stays proven — unless the round restarted it into a config before, which
// then failed. The detail says why the assigned config was given up, then what its fallback stands on.
func TestNeedsDrainKeepsWhatRuns(t *testing.T) {
	for _, tc := range []struct {
		state, events string
		activeUnknown bool
		detail        string
	}{
		{"A L", "run A:needsdrain", false, "node not drained: cpu_manager_state"},
		{"A L", "run A:fault run L:needsdrain", true, "kubelet not healthy with config: not healthy after 1m; " +
			"the fallback to the last-known-good config: node not drained: cpu_manager_state"},
		{"A", "check A:validate run local:needsdrain", false, "maxPods: must be positive; " +
			"the fallback to the local config: node not drained: cpu_manager_state"},
		{"A", "run A:fault run local:cannotreset", true, "kubelet not healthy with config: not healthy after 1m; " +
			"the fallback to the local config: kubelet state cannot be reset: cpu_manager_state"},
		{"", "run local:cannotreset", false, "local config: kubelet state cannot be reset: cpu_manager_state"},
	} {
		r, events := parseRule(t, tc.state, tc.events)
		var d decision
		for i := 0; i < 20; i++ {
			if d = r.next(); d.action == actDone {
				break
			}
			switch d.action {
			case actCheck:
				err := events.check[d.slot]
				r.checked[d.slot] = &err
			case actRun:
				o := events.run[d.slot]
				r.ran[d.slot] = &o
			case actMarkFailed:
				r.markFailed(d.slot, d.detail)
			}
		}
		if d.action != actDone || d.activeUnknown != tc.activeUnknown {
			t.Errorf("%s: %s, activeUnknown %v; want done, %v", tc.events, d.action, d.activeUnknown, tc.activeUnknown)
		}
		if !strings.HasSuffix(d.detail, tc.detail) {
			t.Errorf("%s: detail %q, want it to end %q", tc.events, d.detail, tc.detail)
		}
	}
}
