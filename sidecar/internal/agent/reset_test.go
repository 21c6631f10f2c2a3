// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/dkc-dev/dkc/internal/nodeconfig"
	"github.com/dkc-dev/dkc/internal/poll"
	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
	"github.com/dkc-dev/dkc/sidecar/internal/probe"
)

// static is a config the kubelet refuses on a cpu_manager_state written under the local config's policy
// (none): cpuManagerPolicy none → static.
const static = cfgHeader + "cpuManagerPolicy: static\nreservedSystemCPUs: \"0\"\n"

const (
	cpuState = "/var/lib/kubelet/cpu_manager_state"
	memState = "/var/lib/kubelet/memory_manager_state"
)

// applyDrained is apply with the service's drained.
func (n *node) applyDrained(a *dkcv1.Assignment, drained bool) {
	n.t.Helper()
	defer n.drive()()
	n.agent.Apply(context.Background(), Desired{Assignment: a, Drained: drained})
}

// checkCalls compares the fake's stops, removals and restarts with want; "restart A" stands for the
// checkpoint file of uid u, resourceVersion A, "restart local" for the local config.
func (n *node) checkCalls(want ...string) {
	n.t.Helper()
	var exp []string
	for _, w := range want {
		if rv, ok := strings.CutPrefix(w, "restart "); ok {
			file := n.local
			if rv != "local" {
				file = filepath.Join(n.dir, "checkpoints/u", rv, "kubelet")
			}
			w = "restart " + file
		}
		exp = append(exp, w)
	}
	if got := n.kubelet.callLog(); !slices.Equal(got, exp) {
		n.t.Errorf("calls:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(exp, "\n  "))
	}
}

// TestChangeNeedingADrainWaitsForIt: a change the kubelet would refuse on its CPU manager's state is not
// restarted into while the node is not drained for it: the kubelet keeps its config, the status says what
// to do, and the config is not blamed or retried. The service's word that the node is drained for that
// assignment makes the sidecar stop the kubelet, remove the state file and start it with the config; the
// word withdrawn afterwards (the node uncordoned) changes nothing.
func TestChangeNeedingADrainWaitsForIt(t *testing.T) {
	n := newNode(t)
	n.kubelet.cpuState = "none"
	n.agent.cfg.NodeName = "node-1"
	n.applyDrained(assignment("u", "1", static), false)
	n.expect("1", "local", "local", string(nodeconfig.DrainRequiredError), 0)
	n.checkCalls()
	_, detail := n.agent.Status()
	for _, want := range []string{"cpu_manager_state (cpuManagerPolicy: none → static)", cpuState,
		"kubectl dkc assign node-1 --configmap kube-system/c --key kubelet --drain", "spec.disruption.drain: Allowed"} {
		if !strings.Contains(detail, want) {
			t.Errorf("detail %q does not say %q", detail, want)
		}
	}
	if f := n.agent.state.failure(n.mustAssigned()); f != "" {
		t.Errorf("the config was marked failed for a missing drain: %s", f)
	}
	if n.agent.phase != PhaseWaitingForDrain || n.agent.retry {
		t.Errorf("phase %s, retry %v; want %s, no retry at the ticks", n.agent.phase, n.agent.retry, PhaseWaitingForDrain)
	}
	if f, _ := n.kubelet.env.Get(); f == n.agent.store.ConfigFile(n.mustAssigned().ConfigMap) {
		t.Errorf("env file names the config that waits for a drain: a kubelet restarting by itself would refuse it")
	}
	n.reconcile() // what a tick would do, were one scheduled: still nothing
	n.expect("1", "local", "local", string(nodeconfig.DrainRequiredError), 0)

	n.applyDrained(assignment("u", "1", static), true)
	n.expect("1", "1", "local", "", 1)
	n.checkCalls("stop", "remove "+cpuState, "restart 1")
	if n.agent.state.s.Reset != nil {
		t.Errorf("reset still recorded after the config ran healthy: %+v", n.agent.state.s.Reset)
	}

	n.applyDrained(assignment("u", "1", static), false) // uncordoned
	n.expect("1", "1", "local", "", 1)
	n.checkCalls("stop", "remove "+cpuState, "restart 1")
}

// TestDrainedThroughTheStream: the drained of the service's messages reaches the agent with the
// assignment it came with, through Run.
func TestDrainedThroughTheStream(t *testing.T) {
	n := newNode(t)
	n.kubelet.cpuState = "none"
	defer n.drive()()
	updates := make(chan *dkcv1.WatchConfigResponse)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = n.agent.Run(ctx, updates); close(done) }()
	defer func() { cancel(); <-done }()
	wait := func(what string, ok func(*dkcv1.NodeConfigStatus) bool) {
		t.Helper()
		poll.UntilNil(t, what, func() error {
			if st := n.reporter.lastStatus(); !ok(st) {
				return fmt.Errorf("last status %v", st)
			}
			return nil
		})
	}
	a := assignment("u", "1", static)
	updates <- &dkcv1.WatchConfigResponse{Assignment: a}
	wait("the drain error", func(st *dkcv1.NodeConfigStatus) bool {
		return st.GetError() == string(nodeconfig.DrainRequiredError)
	})
	updates <- &dkcv1.WatchConfigResponse{Assignment: a, Drained: true}
	wait("config 1 active", func(st *dkcv1.NodeConfigStatus) bool {
		return rv(st.GetActive()) == "1" && st.GetError() == ""
	})
	updates <- &dkcv1.WatchConfigResponse{Assignment: a}
	updates <- &dkcv1.WatchConfigResponse{Assignment: a} // taken once the one before is done
	n.checkCalls("stop", "remove "+cpuState, "restart 1")
}

// TestStateResets: what is removed before a restart, table-driven from a node running its local config
// (cpuManagerPolicy none, its cpu_manager_state written under it) through the assignments given, each with
// the service's drained.
func TestStateResets(t *testing.T) {
	type step struct {
		a       *dkcv1.Assignment
		drained bool
	}
	for _, tc := range []struct {
		name  string
		setup func(n *node)
		steps []step
		// status after the last step: assigned, active, error
		assigned, active string
		err              nodeconfig.StatusError
		calls            []string
		// check, if set, checks more of the node after the last step.
		check func(t *testing.T, n *node)
	}{
		{name: "drained with nothing to reset: a plain restart",
			steps:    []step{{assignment("u", "1", cfgHeader+"eventRecordQPS: 7\n"), true}},
			assigned: "1", active: "1", calls: []string{"restart 1"}},
		{name: "a drain is for its assignment only",
			steps: []step{{assignment("u", "1", cfgHeader+"eventRecordQPS: 7\n"), true},
				{assignment("u", "2", static), false}},
			assigned: "2", active: "1", err: nodeconfig.DrainRequiredError, calls: []string{"restart 1"}},
		{name: "fallback after a reset removes the same file again",
			steps:    []step{{assignment("u", "1", static+"maxPods: 13\n"), true}},
			assigned: "1", active: "local", err: nodeconfig.HealthError,
			calls: []string{"stop", "remove " + cpuState, "restart 1", "stop", "remove " + cpuState, "restart local"}},
		{name: "running config unknown and drained: every state file",
			setup: func(n *node) { n.kubelet.configzErr = probe.ErrRefused },
			steps: []step{{assignment("u", "1", static), true}},
			// /configz stays refused after the restart: what runs is not proven.
			assigned: "1", active: "local", err: nodeconfig.VerifyError,
			calls: []string{"stop", "remove " + cpuState + " " + memState, "restart 1"}},
		{name: "running config unknown and not drained: restarted as before then refused and rolled back",
			setup: func(n *node) { n.kubelet.configzErr = probe.ErrRefused },
			steps: []step{{assignment("u", "1", static), false}},
			// The kubelet refuses cpu_manager_state and exits; local runs again on it (unproven: /configz
			// stays refused).
			assigned: "1", active: "local", err: nodeconfig.VerifyError, calls: []string{"restart 1", "restart local"}},
		// A service manager that cannot stop the kubelet (--restart-mode=signal) cannot make the change,
		// drained or not: a final refusal, never a drain asked for nothing or a retry at every tick.
		{name: "signal restart mode not drained: refused and rolled back with no drain asked",
			setup:    func(n *node) { n.agent.svc = plainService{n.kubelet} },
			steps:    []step{{assignment("u", "1", static), false}},
			assigned: "1", active: "local", err: nodeconfig.HealthError, check: checkCannotReset},
		{name: "signal restart mode drained: refused and rolled back and not retried",
			setup:    func(n *node) { n.agent.svc = plainService{n.kubelet} },
			steps:    []step{{assignment("u", "1", static), true}},
			assigned: "1", active: "local", err: nodeconfig.HealthError, check: checkCannotReset},
		{name: "signal restart mode with nothing to reset: a plain restart",
			setup:    func(n *node) { n.agent.svc = plainService{n.kubelet} },
			steps:    []step{{assignment("u", "1", cfgHeader+"eventRecordQPS: 7\n"), false}},
			assigned: "1", active: "1", calls: []string{"restart 1"}},
		{name: "the kubelet's --root-dir",
			setup:    func(n *node) { n.agent.cfg.KubeletFlags = []string{"--root-dir", "/srv/kubelet/"} },
			steps:    []step{{assignment("u", "1", static), true}},
			assigned: "1", active: "1", calls: []string{"stop", "remove /srv/kubelet/cpu_manager_state", "restart 1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNode(t)
			n.kubelet.cpuState = "none"
			if tc.setup != nil {
				tc.setup(n)
			}
			for _, s := range tc.steps {
				n.applyDrained(s.a, s.drained)
			}
			st := n.reporter.lastStatus()
			if rv(st.GetAssigned()) != tc.assigned || rv(st.GetActive()) != tc.active || st.GetError() != string(tc.err) {
				t.Errorf("status assigned=%s active=%s error=%q; want %s %s %q", rv(st.GetAssigned()),
					rv(st.GetActive()), st.GetError(), tc.assigned, tc.active, tc.err)
			}
			n.checkCalls(tc.calls...)
			if tc.check != nil {
				tc.check(t, n)
			}
		})
	}
}

// checkCannotReset: the assigned config is marked failed with a detail that names the file, what invalidates
// it and the restart mode that can make the change; the node runs its local config, nothing retried.
func checkCannotReset(t *testing.T, n *node) {
	t.Helper()
	f := n.agent.state.failure(n.mustAssigned())
	for _, want := range []string{cpuState, "cpuManagerPolicy: none → static", "--restart-mode=systemd"} {
		if !strings.Contains(f, want) {
			t.Errorf("failure %q does not say %q", f, want)
		}
	}
	if _, detail := n.agent.Status(); !strings.Contains(detail, "--restart-mode=systemd") {
		t.Errorf("detail %q does not name --restart-mode=systemd", detail)
	}
	if n.agent.phase != PhaseLocalFallback || n.agent.retry {
		t.Errorf("phase %s, retry %v; want %s, no retry", n.agent.phase, n.agent.retry, PhaseLocalFallback)
	}
}

// plainService is a ServiceManager that restarts the kubelet and nothing more (systemd.Signal).
type plainService struct{ ServiceManager }

// TestOnlyTheDrainAllowsAReset: the service's word that the node is drained for its assignment, now, is
// what allows removing the kubelet's state — never a reset recorded earlier under a drain that may be over
// (the node uncordoned, its pods back). Each row starts from a node running its local config (cpuManagerPolicy
// none, its cpu_manager_state written under it) and applies the steps in order; a step may first change the
// node (before) or restart the sidecar (restart: its first round comes before the service says anything).
func TestOnlyTheDrainAllowsAReset(t *testing.T) {
	static1 := assignment("u", "1", static)
	type step struct {
		before  func(n *node)
		restart bool
		a       *dkcv1.Assignment
		drained bool
	}
	for _, tc := range []struct {
		name  string
		steps []step
		// after the last step: the status error, the phase, the stops, removals and restarts
		err   nodeconfig.StatusError
		phase Phase
		calls []string
	}{
		{name: "a removal failed then the drain withdrawn: nothing removed and a drain asked again",
			steps: []step{{before: func(n *node) { n.kubelet.failRemove = 1 }, a: static1, drained: true},
				{a: static1, drained: false}},
			err: nodeconfig.DrainRequiredError, phase: PhaseWaitingForDrain,
			calls: []string{"stop", "remove " + cpuState, "restart local"}},
		{name: "a removal failed then a sidecar restart: waits for the drain then removes",
			steps: []step{{before: func(n *node) { n.kubelet.failRemove = 1 }, a: static1, drained: true},
				{restart: true}, {a: static1, drained: true}},
			phase: PhaseTrial,
			calls: []string{"stop", "remove " + cpuState, "restart local", "stop", "remove " + cpuState, "restart 1"}},
		{name: "a reset recorded: adds nothing until drained and then its files go too",
			steps: []step{{a: static1, drained: false},
				{before: func(n *node) { n.recordReset("memory_manager_state") }, a: static1, drained: false},
				{before: func(n *node) { n.checkCalls() }, a: static1, drained: true}},
			phase: PhaseTrial, calls: []string{"stop", "remove " + cpuState + " " + memState, "restart 1"}},
		{name: "the assigned config failed after its reset and the node was uncordoned: the fallback removes nothing",
			steps: []step{{a: static1, drained: true},
				{before: func(n *node) {
					// What a trial that found the kubelet failing would leave, with the reset still recorded.
					n.recordReset("cpu_manager_state")
					n.agent.state.markFailed(n.mustAssigned(), "kubelet not healthy with config: healthz: refused")
					if err := n.agent.state.save(); err != nil {
						n.t.Fatal(err)
					}
				}, restart: true}},
			// The failure is what the status says, not the drain its fallback waits for.
			err: nodeconfig.HealthError, phase: PhaseWaitingForDrain,
			calls: []string{"stop", "remove " + cpuState, "restart 1"}},
		{name: "the assigned config failed after its reset and the node is drained again: the fallback removes the files",
			steps: []step{{a: static1, drained: true},
				{before: func(n *node) {
					n.recordReset("memory_manager_state")
					n.agent.state.markFailed(n.mustAssigned(), "kubelet not healthy with config: healthz: refused")
					if err := n.agent.state.save(); err != nil {
						n.t.Fatal(err)
					}
				}, restart: true},
				{a: static1, drained: true}},
			err: nodeconfig.HealthError, phase: PhaseLocalFallback,
			calls: []string{"stop", "remove " + cpuState, "restart 1",
				"stop", "remove " + cpuState + " " + memState, "restart local"}},
		{name: "running config unknown with a reset recorded and not drained: restarted as always and nothing removed",
			steps: []step{{a: static1, drained: false},
				{before: func(n *node) {
					n.recordReset("cpu_manager_state")
					n.kubelet.mu.Lock()
					n.kubelet.configzErr = probe.ErrRefused
					n.kubelet.mu.Unlock()
				}, a: static1, drained: false}},
			// The kubelet refuses its state and exits; the local config runs again, unproven (/configz
			// stays refused).
			err: nodeconfig.VerifyError, phase: PhaseRetrying, calls: []string{"restart 1", "restart local"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNode(t)
			n.kubelet.cpuState = "none"
			for _, s := range tc.steps {
				if s.before != nil {
					s.before(n)
				}
				if s.restart {
					n.start()
				}
				if s.a != nil {
					n.applyDrained(s.a, s.drained)
				}
			}
			if st, detail := n.agent.Status(); st.GetError() != string(tc.err) || n.agent.phase != tc.phase {
				t.Errorf("error %q, phase %s; want %q, %s (%s)", st.GetError(), n.agent.phase, tc.err, tc.phase, detail)
			}
			n.checkCalls(tc.calls...)
		})
	}
}

// recordReset records, as a sidecar about to remove them would, files for the node's assignment.
func (n *node) recordReset(files ...string) {
	n.t.Helper()
	if err := n.agent.state.recordReset(n.mustAssigned(), files); err != nil {
		n.t.Fatal(err)
	}
}

// TestFailedResetStartsTheKubeletAgain: a reset is stop, remove, write the env file, start. A failure after
// the stop and before the start — or the sidecar told to stop there — never leaves the kubelet stopped: it is
// started again on the config it ran (the env file unchanged), the failure retried at the next tick. Each row
// starts from a node running its local config, drained for an assignment whose change needs
// cpu_manager_state removed.
func TestFailedResetStartsTheKubeletAgain(t *testing.T) {
	for _, tc := range []struct {
		name string
		// setup breaks the node; cancel stops the sidecar (the Apply's context).
		setup func(n *node, cancel func())
		calls []string
		// env is the config the env file names afterwards ("1" or "local"; "": not checked).
		env string
		err nodeconfig.StatusError
	}{
		{name: "the removal fails",
			setup: func(n *node, _ func()) { n.kubelet.failRemove = 1 },
			calls: []string{"stop", "remove " + cpuState, "restart local"}, env: "local", err: nodeconfig.RestartError},
		{name: "the stop fails",
			setup: func(n *node, _ func()) { n.kubelet.failStop = 1 },
			calls: []string{"stop", "restart local"}, env: "local", err: nodeconfig.RestartError},
		{name: "the env file cannot be written after the removal",
			setup: func(n *node, _ func()) {
				n.kubelet.afterRemove = func() {
					// A directory where the env file was: the write's rename fails, reading it too (the fake
					// kubelet then starts its local config, as the drop-in would without the variable).
					path := n.kubelet.env.Path
					if err := os.Remove(path); err != nil {
						n.t.Error(err)
					}
					if err := os.Mkdir(path, 0o755); err != nil {
						n.t.Error(err)
					}
				}
			},
			calls: []string{"stop", "remove " + cpuState, "restart local"}, err: nodeconfig.RestartError},
		{name: "the sidecar stops while the removal fails",
			setup: func(n *node, cancel func()) { n.kubelet.failRemove, n.kubelet.afterRemove = 1, cancel },
			calls: []string{"stop", "remove " + cpuState, "restart local"}, env: "local"},
		{name: "the sidecar stops once the files are removed: started with the config",
			setup: func(n *node, cancel func()) { n.kubelet.afterRemove = cancel },
			calls: []string{"stop", "remove " + cpuState, "restart 1"}, env: "1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNode(t)
			n.kubelet.cpuState = "none"
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			tc.setup(n, cancel)
			stop := n.drive()
			n.agent.Apply(ctx, Desired{Assignment: assignment("u", "1", static), Drained: true})
			stop()
			n.checkCalls(tc.calls...)
			if pid, _ := n.kubelet.MainPID(context.Background()); pid == 0 {
				t.Error("the kubelet was left stopped")
			}
			if tc.env != "" {
				want := n.local
				if tc.env != "local" {
					want = n.agent.store.ConfigFile(n.mustAssigned().ConfigMap)
				}
				if got, err := n.kubelet.env.Get(); got != want {
					t.Errorf("env file names %q (%v), want %q", got, err, want)
				}
			}
			if st, detail := n.agent.Status(); st.GetError() != string(tc.err) {
				t.Errorf("error %q (%s), want %q", st.GetError(), detail, tc.err)
			}
			if tc.err == nodeconfig.RestartError && !n.agent.retry {
				t.Error("no retry at the next tick")
			}
		})
	}
}

// TestFailedResetRetried: the tick after a failed removal makes the reset again, the node still drained.
func TestFailedResetRetried(t *testing.T) {
	n := newNode(t)
	n.kubelet.cpuState = "none"
	n.kubelet.failRemove = 1
	n.applyDrained(assignment("u", "1", static), true)
	n.expect("1", "local", "local", string(nodeconfig.RestartError), 1)
	if r := n.agent.state.s.Reset; r == nil || !slices.Equal(r.Files, []string{"cpu_manager_state"}) {
		t.Fatalf("reset recorded %+v, want cpu_manager_state", r)
	}
	n.reconcile()
	n.expect("1", "1", "local", "", 2)
	n.checkCalls("stop", "remove "+cpuState, "restart local", "stop", "remove "+cpuState, "restart 1")
	if f := n.agent.state.failure(n.mustAssigned()); f != "" {
		t.Errorf("the config was marked failed: %s", f)
	}
}

// TestResetRecord: a reset is recorded durably with the files of an earlier one for the same assignment,
// and a new assignment forgets it (its drain is its own). The record alone allows no reset.
func TestResetRecord(t *testing.T) {
	n := newNode(t)
	a := n.agent
	src := func(rv string) *corev1.NodeConfigSource {
		return &corev1.NodeConfigSource{ConfigMap: &corev1.ConfigMapNodeConfigSource{Namespace: "kube-system", Name: "c",
			UID: "u", ResourceVersion: rv, KubeletConfigKey: "kubelet"}}
	}
	if err := a.state.recordReset(src("1"), []string{"memory_manager_state"}); err != nil {
		t.Fatal(err)
	}
	if err := a.state.recordReset(src("1"), []string{"cpu_manager_state"}); err != nil {
		t.Fatal(err)
	}
	disk := &stateFile{path: a.state.path}
	if err := disk.load(); err != nil || disk.s.Reset == nil ||
		!slices.Equal(disk.s.Reset.Files, []string{"memory_manager_state", "cpu_manager_state"}) ||
		!nodeconfig.SameSource(disk.s.Reset.Source, src("1")) {
		t.Fatalf("recorded %+v (%v)", disk.s.Reset, err)
	}
	for _, tc := range []struct {
		name    string
		src     *corev1.NodeConfigSource
		drained bool
		may     bool
		remove  string
	}{
		{"recorded assignment, not drained", src("1"), false, false, "[cpu_manager_state]"},
		{"recorded assignment, drained", src("1"), true, true, "[cpu_manager_state memory_manager_state]"},
		{"another assignment, drained", src("2"), true, true, "[cpu_manager_state]"},
		{"another assignment, not drained", src("2"), false, false, "[cpu_manager_state]"},
	} {
		a.drained = drainMark{src: tc.src, on: tc.drained}
		ds := a.drainState(tc.src)
		if ds.mayReset() != tc.may || fmt.Sprint(ds.toRemove([]string{"cpu_manager_state"})) != tc.remove {
			t.Errorf("%s: mayReset %v, toRemove %v; want %v, %s", tc.name, ds.mayReset(),
				ds.toRemove([]string{"cpu_manager_state"}), tc.may, tc.remove)
		}
	}
	if err := a.state.clearAssigned(src("2"), nil); err != nil {
		t.Fatal(err)
	}
	disk = &stateFile{path: a.state.path}
	if err := disk.load(); err != nil || disk.s.Reset != nil {
		t.Errorf("a new assignment kept the reset record %+v (%v)", disk.s.Reset, err)
	}
}

func TestRootDir(t *testing.T) {
	for _, tc := range []struct {
		flags []string
		want  string
	}{
		{nil, "/var/lib/kubelet"},
		{[]string{"--root-dir=/srv/k"}, "/srv/k"},
		{[]string{"--root_dir", "/srv/k", "--v=2"}, "/srv/k"},
		{[]string{"--root-dir=/a", "--root-dir=/b"}, "/b"},
		{[]string{"--", "--root-dir=/a"}, "/var/lib/kubelet"},
		{[]string{"--root-dir"}, "/var/lib/kubelet"},
	} {
		if got := rootDir(tc.flags); got != tc.want {
			t.Errorf("rootDir(%q) = %s, want %s", tc.flags, got, tc.want)
		}
	}
}

func TestStatePaths(t *testing.T) {
	got, err := statePaths("/var/lib/kubelet/", []string{"cpu_manager_state", "memory_manager_state"})
	if err != nil || !slices.Equal(got, []string{cpuState, memState}) {
		t.Errorf("statePaths = %v, %v", got, err)
	}
	for _, bad := range []struct {
		root  string
		files []string
	}{
		{"var/lib/kubelet", []string{"cpu_manager_state"}},
		{"/var/lib/kubelet", []string{"pki/kubelet.key"}},
		{"/var/lib/kubelet", []string{"../cpu_manager_state"}},
		{"/var/lib/kubelet", []string{"kubeconfig"}},
	} {
		if got, err := statePaths(bad.root, bad.files); err == nil {
			t.Errorf("statePaths(%s, %v) = %v, want refused", bad.root, bad.files, got)
		}
	}
}
