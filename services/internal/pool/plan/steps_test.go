// SPDX-License-Identifier: Apache-2.0

package plan

import (
	"fmt"
	"strings"
	"testing"
	"time"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dkc-dev/dkc/api/v1alpha1"
)

// The tables of Decide's pool steps, one each: what a step makes of its own inputs, whatever the nodes
// behind them. TestPoolRules has the rows for the steps together.

// counts parses selected/updated/ready/inProgress/failed/held, TestPoolRules' format.
func counts(t *testing.T, s string) v1alpha1.NodeCounts {
	t.Helper()
	var c v1alpha1.NodeCounts
	if _, err := fmt.Sscanf(s, "%d/%d/%d/%d/%d/%d", &c.Selected, &c.Updated, &c.Ready, &c.InProgress, &c.Failed,
		&c.Held); err != nil {
		t.Fatalf("counts %q: %v", s, err)
	}
	return c
}

func countsString(c v1alpha1.NodeCounts) string {
	return fmt.Sprintf("%d/%d/%d/%d/%d/%d", c.Selected, c.Updated, c.Ready, c.InProgress, c.Failed, c.Held)
}

func verdict(name string, s State, ready bool) Verdict {
	return Verdict{Name: name, State: s, Ready: ready}
}

func TestCount(t *testing.T) {
	manyHeld := make([]Verdict, v1alpha1.MaxHeldNodesListed+1)
	for i := range manyHeld {
		manyHeld[i] = Verdict{Name: fmt.Sprintf("n%03d", i), State: Held, Reason: ReasonNoSidecar, Ready: true}
	}
	for _, tc := range []struct {
		name     string
		verdicts []Verdict
		counts   string // selected/updated/ready/inProgress/failed/held
		pending  string // names, comma-separated
		// unavailable and notAssigned are the tally's.
		unavailable, notAssigned int
		held                     int // len(heldNodes)
	}{
		{name: "no node", counts: "0/0/0/0/0/0"},
		{name: "updated counts as ready only when Ready; one not Ready takes a slot",
			verdicts: []Verdict{verdict("a", Updated, true), verdict("b", Updated, false)},
			counts:   "2/2/1/0/0/0", unavailable: 1},
		{name: "pending: only the Ready ones may be assigned, in the verdicts' order",
			verdicts: []Verdict{verdict("b", Pending, true), verdict("a", Pending, false), verdict("c", Pending, true)},
			counts:   "3/0/0/0/0/0", pending: "b,c", unavailable: 1, notAssigned: 3},
		{name: "in progress takes a slot, Ready or not",
			verdicts: []Verdict{verdict("a", InProgress, true), verdict("b", InProgress, false)},
			counts:   "2/0/0/2/0/0", unavailable: 2},
		{name: "failed and Ready takes no slot",
			verdicts: []Verdict{verdict("a", Failed, true)}, counts: "1/0/0/0/1/0"},
		{name: "held: listed; a changing one takes a slot",
			verdicts: []Verdict{verdict("a", Held, true), {Name: "b", State: Held, Ready: true, Changing: true}},
			counts:   "2/0/0/0/0/2", unavailable: 1, held: 2},
		{name: "held nodes listed up to the bound, all counted", verdicts: manyHeld,
			counts: fmt.Sprintf("%d/0/0/0/0/%d", len(manyHeld), len(manyHeld)), held: v1alpha1.MaxHeldNodesListed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := count(tc.verdicts)
			if s := countsString(got.nodes); s != tc.counts {
				t.Errorf("counts %s, want %s", s, tc.counts)
			}
			if s := strings.Join(got.pending, ","); s != tc.pending {
				t.Errorf("pending %q, want %q", s, tc.pending)
			}
			if got.unavailable != tc.unavailable {
				t.Errorf("unavailable %d, want %d", got.unavailable, tc.unavailable)
			}
			if got.notAssigned() != tc.notAssigned {
				t.Errorf("not assigned %d, want %d", got.notAssigned(), tc.notAssigned)
			}
			if len(got.held) != tc.held {
				t.Errorf("%d heldNodes, want %d", len(got.held), tc.held)
			}
		})
	}
}

func TestHalt(t *testing.T) {
	failure := func(name string, retry int64) v1alpha1.FailedNode {
		return v1alpha1.FailedNode{Name: name, Revision: "r2", Reason: v1alpha1.FailureRolledBack, Retry: retry}
	}
	for _, tc := range []struct {
		name    string
		failed  []v1alpha1.FailedNode
		pool    []func(*v1alpha1.KubeletConfigPool)
		counted string // names, comma-separated
		halted  bool
		summary string
	}{
		{name: "no failure", summary: "0 failures count against maxFailures 1"},
		{name: "one failure, maxFailures 1 by default: halted", failed: []v1alpha1.FailedNode{failure("a", 0)},
			counted: "a", halted: true, summary: "1 failure counts against maxFailures 1"},
		{name: "a failure before the current spec.retry does not count", failed: []v1alpha1.FailedNode{failure("a", 0)},
			pool: mods(retry(1)), summary: "0 failures count against maxFailures 1"},
		{name: "only the current retry's failures count",
			failed: []v1alpha1.FailedNode{failure("a", 0), failure("b", 1), failure("c", 1)},
			pool:   mods(retry(1), maxFailures(3)), counted: "b,c", summary: "2 failures count against maxFailures 3"},
		{name: "reaching maxFailures halts",
			failed: []v1alpha1.FailedNode{failure("a", 0), failure("b", 0), failure("c", 0)},
			pool:   mods(maxFailures(3)), counted: "a,b,c", halted: true, summary: "3 failures count against maxFailures 3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := halt(tc.failed, &pool(tc.pool...).Spec)
			var names []string
			for _, f := range b.counted {
				names = append(names, f.Name)
			}
			if got := strings.Join(names, ","); got != tc.counted {
				t.Errorf("counted %q, want %q", got, tc.counted)
			}
			if b.halted != tc.halted {
				t.Errorf("halted %v, want %v", b.halted, tc.halted)
			}
			if b.summary() != tc.summary {
				t.Errorf("summary %q, want %q", b.summary(), tc.summary)
			}
		})
	}
}

func TestBatchCompletion(t *testing.T) {
	at := func(ago time.Duration) *metav1.Time { return &metav1.Time{Time: t0.Add(-ago)} }
	for _, tc := range []struct {
		name                string
		counts              string
		assigned, completed *metav1.Time
		want                *metav1.Time
	}{
		{name: "never assigned: no batch", counts: "1/0/0/0/0/0"},
		{name: "a batch in progress: not complete", counts: "2/0/0/1/0/0", assigned: at(time.Minute)},
		{name: "nothing in progress after the last assignment: complete now", counts: "2/1/1/0/0/0",
			assigned: at(time.Minute), want: at(0)},
		{name: "completed before the last assignment: complete again now", counts: "2/1/1/0/0/0",
			assigned: at(time.Minute), completed: at(time.Hour), want: at(0)},
		{name: "already seen complete: the time stays", counts: "2/1/1/0/0/0",
			assigned: at(time.Hour), completed: at(time.Minute), want: at(time.Minute)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := v1alpha1.KubeletConfigPoolStatus{Nodes: counts(t, tc.counts), LastAssignmentTime: tc.assigned,
				BatchCompletionTime: tc.completed}
			got := batchCompletion(st, t0)
			if (got == nil) != (tc.want == nil) || got != nil && !got.Equal(tc.want) {
				t.Errorf("batch completion %v, want %v", got, tc.want)
			}
		})
	}
}

func TestGates(t *testing.T) {
	invalid := &Invalid{Reason: v1alpha1.ReasonValidationFailed, Message: "cgroupDriver: unknown"}
	pausing := pauseBetweenBatches(5 * time.Minute)
	for _, tc := range []struct {
		name    string
		pool    []func(*v1alpha1.KubeletConfigPool)
		target  *Target // default r2
		invalid *Invalid
		halted  bool
		counts  string // selected/updated/ready/inProgress/failed/held
		pending []string
		// unavailable and maxUnavailable are the slots: maxUnavailable less unavailable are free.
		unavailable, maxUnavailable int
		// batchDone is how long ago the last batch completed (0: never).
		batchDone time.Duration
		// podWaits are the nodes in progress that wait for their pods.
		podWaits []string
		// restarting are the nodes in progress; budgets, when set, the PodDisruptionBudgets.
		restarting []string
		budgets    *budgetsOf

		updating string // status/reason
		message  string // a substring
		assign   string // names, comma-separated
		wait     time.Duration
	}{
		{name: "an invalid config stops everything, a halt included", invalid: invalid, halted: true,
			counts: "1/0/0/0/0/0", pending: []string{"a"}, maxUnavailable: 1,
			updating: "False/ConfigInvalid", message: "the config cannot be rolled out: cgroupDriver"},
		{name: "no revision yet", target: &Target{}, counts: "1/0/0/0/0/0", pending: []string{"a"}, maxUnavailable: 1,
			updating: "False/ConfigInvalid", message: "no revision to roll out yet"},
		{name: "halted, even paused", pool: mods(paused), halted: true, counts: "2/0/0/0/1/0", pending: []string{"b"},
			maxUnavailable: 1, updating: "False/Halted", message: "the pool is halted: 0 of 2 nodes updated"},
		{name: "paused", pool: mods(paused), counts: "1/0/0/0/0/0", pending: []string{"a"}, maxUnavailable: 1,
			updating: "False/Paused", message: "spec.paused"},
		{name: "every node updated: complete", counts: "2/2/2/0/0/0", maxUnavailable: 1,
			updating: "False/RolloutComplete", message: "2 of 2 nodes updated, 0 in progress"},
		{name: "the others failed or held: nothing to assign", counts: "3/1/1/0/1/1", maxUnavailable: 1,
			updating: "False/NothingToAssign", message: "the others are failed (1), held (1) or drifted (0)"},
		{name: "every node assigned, some in progress: rolling out", counts: "2/1/1/1/0/0", unavailable: 1,
			maxUnavailable: 1, updating: "True/RollingOut"},
		{name: "a pause between batches waits for the running batch", pool: mods(pausing), counts: "3/0/0/1/0/0",
			pending: []string{"b", "c"}, unavailable: 1, maxUnavailable: 2,
			updating: "True/RollingOut", message: "the next batch starts when none is"},
		{name: "a pause between batches: 3 minutes left", pool: mods(pausing), counts: "3/1/1/0/0/0",
			pending: []string{"b", "c"}, maxUnavailable: 2, batchDone: 2 * time.Minute,
			updating: "True/WaitingBetweenBatches", message: "starts at 2026-11-26T12:03:00Z", wait: 3 * time.Minute},
		{name: "a pause between batches over: the next batch", pool: mods(pausing), counts: "3/1/1/0/0/0",
			pending: []string{"b", "c"}, maxUnavailable: 2, batchDone: 5 * time.Minute,
			updating: "True/RollingOut", assign: "b,c"},
		{name: "outside the windows: nothing new until the next opens", pool: mods(windowAt("14:00", time.Hour, "")),
			counts: "2/0/0/0/0/0", pending: []string{"a", "b"}, maxUnavailable: 1,
			updating: "True/WaitingForMaintenanceWindow", message: "until the next opens at 2026-11-26T14:00:00Z",
			wait: 2 * time.Hour},
		{name: "outside the windows, a node in progress: it goes on, nothing new", pool: mods(windowAt("14:00", time.Hour, "")),
			counts: "2/0/0/1/0/0", pending: []string{"b"}, unavailable: 1, maxUnavailable: 2,
			updating: "True/WaitingForMaintenanceWindow", message: "0 of 2 nodes updated, 1 in progress", wait: 2 * time.Hour},
		{name: "inside a window: assigned", pool: mods(windowAt("11:30", time.Hour, "")), counts: "2/0/0/0/0/0",
			pending: []string{"a", "b"}, maxUnavailable: 1, updating: "True/RollingOut", assign: "a"},
		{name: "a window in its time zone: 13:00 in Berlin is 12:00 UTC", pool: mods(windowAt("13:00", time.Minute, "Europe/Berlin")),
			counts: "1/0/0/0/0/0", pending: []string{"a"}, maxUnavailable: 1, updating: "True/RollingOut", assign: "a"},
		{name: "outside the windows, nothing left to assign: complete", pool: mods(windowAt("14:00", time.Hour, "")),
			counts: "2/2/2/0/0/0", maxUnavailable: 1, updating: "False/RolloutComplete"},
		{name: "an unknown time zone stops assignments", pool: mods(windowAt("11:30", time.Hour, "Mars/Olympus_Mons")),
			counts: "1/0/0/0/0/0", pending: []string{"a"}, maxUnavailable: 1, updating: "False/InvalidMaintenanceWindow",
			message: `spec.maintenanceWindows[0]: timeZone "Mars/Olympus_Mons"`},
		{name: "no free slot, a node in progress: rolling out", counts: "3/0/0/1/0/0", pending: []string{"b", "c"},
			unavailable: 1, maxUnavailable: 1, updating: "True/RollingOut"},
		{name: "no free slot, a node waits for its pods: waiting for pods", counts: "3/0/0/1/0/0",
			pending: []string{"b", "c"}, unavailable: 1, maxUnavailable: 1, podWaits: []string{"node a: default/web-1"},
			updating: "True/WaitingForPods", message: "not Ready again: node a: default/web-1"},
		{name: "every node assigned, the last waits for its pods", counts: "2/1/1/1/0/0", unavailable: 1,
			maxUnavailable: 1, podWaits: []string{"node b: default/web-2"}, updating: "True/WaitingForPods",
			message: "node b: default/web-2"},
		{name: "a pause between batches waits for the pods of the running batch", pool: mods(pausing),
			counts: "3/0/0/1/0/0", pending: []string{"b", "c"}, unavailable: 1, maxUnavailable: 2,
			podWaits: []string{"node a: default/web-1"}, updating: "True/WaitingForPods",
			message: "the next batch starts when none is; pods that ran"},
		{name: "no free slot, nothing in progress: waiting for available nodes", counts: "3/1/0/0/0/0",
			pending: []string{"b", "c"}, unavailable: 1, maxUnavailable: 1,
			updating: "True/WaitingForAvailableNodes", message: "1 selected nodes are not Ready (maxUnavailable 1)"},
		{name: "no Ready pending node: waiting for available nodes", counts: "2/0/0/0/0/0", unavailable: 2,
			maxUnavailable: 3, updating: "True/WaitingForAvailableNodes"},
		{name: "free slots: the first pending nodes fill them", counts: "4/0/0/0/0/0",
			pending: []string{"a", "b", "c", "d"}, unavailable: 1, maxUnavailable: 3,
			updating: "True/RollingOut", message: "assigning 2: a, b", assign: "a,b"},
		{name: "more slots than pending nodes: all of them", counts: "2/0/0/0/0/0", pending: []string{"a", "b"},
			maxUnavailable: 5, updating: "True/RollingOut", assign: "a,b"},
		{name: "budgets that allow the restarts: the first pending nodes", counts: "3/0/0/0/0/0",
			pending: []string{"a", "b", "c"}, maxUnavailable: 2,
			budgets: &budgetsOf{allowed: map[string]int{"default/web": 2}, takes: map[string]map[string]int{
				"a": {"default/web": 1}, "b": {"default/web": 1}}},
			updating: "True/RollingOut", message: "assigning 2: a, b", assign: "a,b"},
		{name: "a budget's room is shared by the batch: the second node waits, the next without pods goes",
			counts: "3/0/0/0/0/0", pending: []string{"a", "b", "c"}, maxUnavailable: 2,
			budgets: &budgetsOf{allowed: map[string]int{"default/web": 1}, takes: map[string]map[string]int{
				"a": {"default/web": 1}, "b": {"default/web": 1}}},
			updating: "True/RollingOut", assign: "a,c", wait: 5 * time.Second,
			message: "held back by PodDisruptionBudgets: node b: PodDisruptionBudget default/web allows 0 more not Ready, its restart takes 1"},
		{name: "a node in progress holds its Ready pods' budget", counts: "3/0/0/1/0/0",
			pending: []string{"b", "c"}, restarting: []string{"a"}, unavailable: 1, maxUnavailable: 2,
			budgets: &budgetsOf{allowed: map[string]int{"default/web": 1}, takes: map[string]map[string]int{
				"a": {"default/web": 1}, "b": {"default/web": 1}, "c": {"default/web": 1, "default/db": 1}}},
			updating: "True/WaitingForDisruptionBudget", wait: 5 * time.Second,
			message: "without taking a PodDisruptionBudget below what it allows: node b: PodDisruptionBudget default/web allows 0"},
		{name: "a node whose restart takes more than its budget allows waits, naming each budget",
			counts: "1/0/0/0/0/0", pending: []string{"a"}, maxUnavailable: 1,
			budgets: &budgetsOf{allowed: map[string]int{"default/web": 1}, most: map[string]int{"default/web": 3},
				takes: map[string]map[string]int{"a": {"default/web": 2, "default/db": 1}}},
			updating: "True/WaitingForDisruptionBudget", wait: 5 * time.Second,
			message: "node a: PodDisruptionBudget default/db allows 0 more not Ready, its restart takes 1, default/web allows 1 more not Ready, its restart takes 2"},
		{name: "a node with more of a budget's pods than it ever allows goes with the budget whole; nodes without them beside it",
			counts: "3/0/0/0/0/0", pending: []string{"a", "b", "c"}, maxUnavailable: 3,
			budgets: &budgetsOf{allowed: map[string]int{"kube-system/dkc-server": 1}, takes: map[string]map[string]int{
				"a": {"kube-system/dkc-server": 2}}},
			updating: "True/RollingOut", assign: "a,b,c",
			message: "node a restarts alone among the pods of PodDisruptionBudget kube-system/dkc-server (2 of its pods, it allows 1)"},
		{name: "such a node waits while another restarting takes from its budget", counts: "3/0/0/1/0/0",
			pending: []string{"b", "c"}, restarting: []string{"a"}, unavailable: 1, maxUnavailable: 3,
			budgets: &budgetsOf{allowed: map[string]int{"kube-system/dkc-server": 1}, takes: map[string]map[string]int{
				"a": {"kube-system/dkc-server": 1}, "b": {"kube-system/dkc-server": 2}}},
			updating: "True/RollingOut", assign: "c", wait: 5 * time.Second,
			message: "node b: PodDisruptionBudget kube-system/dkc-server allows 0 more not Ready, its restart takes 2, more than it ever allows (1): it restarts alone once"},
		{name: "such a node goes beside a node that takes from no budget of its", counts: "3/0/0/1/0/0",
			pending: []string{"b", "c"}, restarting: []string{"a"}, unavailable: 1, maxUnavailable: 3,
			budgets: &budgetsOf{allowed: map[string]int{"kube-system/dkc-server": 1, "default/web": 1},
				takes: map[string]map[string]int{"a": {"default/web": 1}, "b": {"kube-system/dkc-server": 2},
					"c": {"kube-system/dkc-server": 1}}},
			updating: "True/RollingOut", assign: "b", wait: 5 * time.Second,
			message: "node b restarts alone among the pods of PodDisruptionBudget kube-system/dkc-server (2 of its pods, it allows 1)"},
		{name: "such a node waits while a pod of its budget is not Ready", counts: "1/0/0/0/0/0",
			pending: []string{"a"}, maxUnavailable: 1,
			budgets: &budgetsOf{allowed: map[string]int{"default/web": 0}, most: map[string]int{"default/web": 1},
				takes: map[string]map[string]int{"a": {"default/web": 2}}},
			updating: "True/WaitingForDisruptionBudget", wait: 5 * time.Second, message: "it restarts alone once"},
		{name: "a budget that allows nothing holds a node for good (maxUnavailable 0)", counts: "1/0/0/0/0/0",
			pending: []string{"a"}, maxUnavailable: 1,
			budgets: &budgetsOf{allowed: map[string]int{"default/web": 0}, takes: map[string]map[string]int{
				"a": {"default/web": 1}}},
			updating: "True/WaitingForDisruptionBudget", wait: 5 * time.Second,
			message: "node a: PodDisruptionBudget default/web allows 0 more not Ready, its restart takes 1"},
		{name: "held by a budget while a node waits for its pods: waiting for pods", counts: "2/0/0/1/0/0",
			pending: []string{"b"}, restarting: []string{"a"}, unavailable: 1, maxUnavailable: 2,
			podWaits: []string{"node a: default/web-1"},
			budgets: &budgetsOf{allowed: map[string]int{"default/web": 0}, takes: map[string]map[string]int{
				"b": {"default/web": 1}}},
			updating: "True/WaitingForPods",
			message:  "not Ready again: node a: default/web-1; held back by PodDisruptionBudgets: node b: PodDisruptionBudget default/web allows 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			target := r2
			if tc.target != nil {
				target = *tc.target
			}
			in := Input{Pool: pool(tc.pool...), Target: target, Invalid: tc.invalid, Now: t0}
			if tc.budgets != nil {
				in.Budgets = tc.budgets
			}
			tl := tally{nodes: counts(t, tc.counts), pending: tc.pending, unavailable: tc.unavailable,
				restarting: tc.restarting}
			var batchDone *metav1.Time
			if tc.batchDone > 0 {
				batchDone = &metav1.Time{Time: t0.Add(-tc.batchDone)}
			}
			g := gates(in, tl, tc.halted, batchDone, tc.maxUnavailable, maintenance(in.Pool, t0), tc.podWaits)
			if got := string(g.status) + "/" + g.reason; got != tc.updating {
				t.Errorf("Updating %s (%s), want %s", got, g.message, tc.updating)
			}
			if !strings.Contains(g.message, tc.message) {
				t.Errorf("message %q, want one with %q", g.message, tc.message)
			}
			if got := strings.Join(g.assign, ","); got != tc.assign {
				t.Errorf("assign %q, want %q", got, tc.assign)
			}
			if g.wait != tc.wait {
				t.Errorf("wait %v, want %v", g.wait, tc.wait)
			}
		})
	}
}

func TestConditions(t *testing.T) {
	failure := func(name string) v1alpha1.FailedNode {
		return v1alpha1.FailedNode{Name: name, Revision: "r2", Reason: v1alpha1.FailureRolledBack, Error: "health"}
	}
	for _, tc := range []struct {
		name     string
		pool     []func(*v1alpha1.KubeletConfigPool)
		target   *Target // default r2
		invalid  *Invalid
		counts   string                // selected/updated/ready/inProgress/failed/held
		failed   []v1alpha1.FailedNode // and counted against the pool's maxFailures (halt)
		gone     []string
		overlaps []string
		conds    map[string]string // status/reason
		message  map[string]string // substrings
	}{
		{name: "a pool rolling out as expected", counts: "2/1/1/1/0/0",
			conds: map[string]string{"Paused": "False/NotPaused", "ConfigInvalid": "False/ConfigValid",
				"Halted": "False/WithinFailureBudget", "Degraded": "False/AsExpected", "Updated": "False/NodesNotUpdated"},
			message: map[string]string{"Halted": "0 failures count against maxFailures 1",
				"Updated": "1 of 2 nodes updated, 1 in progress"}},
		{name: "paused", pool: mods(paused), counts: "1/0/0/0/0/0",
			conds: map[string]string{"Paused": "True/PausedBySpec"}},
		{name: "invalid config: its reason and message",
			invalid: &Invalid{Reason: v1alpha1.ReasonConfigMapNotFound, Message: "configmap kube-system/blue-config not found"},
			counts:  "1/0/0/0/0/0", conds: map[string]string{"ConfigInvalid": "True/ConfigMapNotFound"},
			message: map[string]string{"ConfigInvalid": "blue-config not found"}},
		{name: "halted: the failures that count, a gone node marked so", counts: "1/0/0/0/1/0",
			failed: []v1alpha1.FailedNode{failure("a"), failure("x")}, gone: []string{"x"},
			conds: map[string]string{"Halted": "True/FailureBudgetExhausted", "Degraded": "True/NodesFailed"},
			message: map[string]string{
				"Halted":   "node a: RolledBack: health; node x (node gone): RolledBack: health; nothing more is assigned",
				"Degraded": "failed revision r2: node a"}},
		{name: "failures and overlaps: Degraded for the failures, naming both", pool: mods(maxFailures(2)),
			counts: "2/0/0/0/1/1",
			failed: []v1alpha1.FailedNode{failure("a")}, overlaps: []string{"node b is selected by pools blue, green"},
			conds:   map[string]string{"Halted": "False/WithinFailureBudget", "Degraded": "True/NodesFailed"},
			message: map[string]string{"Degraded": "node a: RolledBack: health; nodes selected by more than one pool"}},
		{name: "overlaps only", counts: "2/0/0/0/0/1", overlaps: []string{"node b is selected by pools blue, green"},
			conds:   map[string]string{"Degraded": "True/SelectorOverlap"},
			message: map[string]string{"Degraded": "which none of them touches: node b"}},
		{name: "no node selected", counts: "0/0/0/0/0/0", conds: map[string]string{"Updated": "False/NoNodesSelected"}},
		{name: "every node updated", counts: "2/2/1/0/0/0", conds: map[string]string{"Updated": "True/AllNodesUpdated"},
			message: map[string]string{"Updated": "all 2 selected nodes run revision r2"}},
		{name: "no revision: never updated", target: &Target{}, counts: "2/2/2/0/0/0",
			conds: map[string]string{"Updated": "False/NodesNotUpdated"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			target := r2
			if tc.target != nil {
				target = *tc.target
			}
			in := Input{Pool: pool(tc.pool...), Target: target, Invalid: tc.invalid, Now: t0}
			st := v1alpha1.KubeletConfigPoolStatus{Nodes: counts(t, tc.counts), FailedNodes: tc.failed}
			j := judged{gone: map[string]bool{}, overlaps: tc.overlaps}
			for _, g := range tc.gone {
				j.gone[g] = true
			}
			conditions(&st, in, halt(tc.failed, &in.Pool.Spec), j)
			if len(st.Conditions) != 5 {
				t.Errorf("%d conditions, want 5 (all but Updating)", len(st.Conditions))
			}
			for typ, want := range tc.conds {
				c := meta.FindStatusCondition(st.Conditions, typ)
				if c == nil {
					t.Errorf("condition %s missing", typ)
					continue
				}
				if got := string(c.Status) + "/" + c.Reason; got != want {
					t.Errorf("condition %s = %s (%s), want %s", typ, got, c.Message, want)
				}
			}
			for typ, want := range tc.message {
				if c := meta.FindStatusCondition(st.Conditions, typ); c == nil || !strings.Contains(c.Message, want) {
					t.Errorf("condition %s message %+v, want one with %q", typ, c, want)
				}
			}
		})
	}
}

// TestMaintenanceWindowStatus: status.maintenanceWindow says where the pool stands with its windows, and
// the decision is made again when a window opens or closes, so that the status stays true.
func TestMaintenanceWindowStatus(t *testing.T) {
	tm := func(s string) *metav1.Time {
		v, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return &metav1.Time{Time: v}
	}
	for _, tc := range []struct {
		name    string
		pool    *v1alpha1.KubeletConfigPool
		want    *v1alpha1.MaintenanceWindowStatus
		requeue time.Duration
	}{
		{name: "no windows: no status", pool: pool()},
		{name: "closed: when the next opens", pool: pool(windowAt("14:00", time.Hour, "")),
			want: &v1alpha1.MaintenanceWindowStatus{NextOpenTime: tm("2026-11-26T14:00:00Z")}, requeue: 2 * time.Hour},
		{name: "open: when it closes and the next opens", pool: pool(windowAt("11:30", time.Hour, "")),
			want: &v1alpha1.MaintenanceWindowStatus{Open: true, CloseTime: tm("2026-11-26T12:30:00Z"),
				NextOpenTime: tm("2026-11-27T11:30:00Z")}, requeue: 30 * time.Minute},
		{name: "open for good: nothing to wait for", pool: pool(windowAt("00:00", 24*time.Hour, "")),
			want: &v1alpha1.MaintenanceWindowStatus{Open: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Every node updated: nothing else (a node's timeout, a batch's pause) asks to decide again.
			p := Decide(Input{Pool: tc.pool, Target: r2, Nodes: []Node{updated("a")}, Now: t0})
			if !apiequality.Semantic.DeepEqual(p.Status.MaintenanceWindow, tc.want) {
				t.Errorf("status.maintenanceWindow %+v, want %+v", p.Status.MaintenanceWindow, tc.want)
			}
			if p.RequeueAfter != tc.requeue {
				t.Errorf("requeue after %v, want %v", p.RequeueAfter, tc.requeue)
			}
		})
	}
}

// budgetsOf are PodDisruptionBudgets given as tables: what each allows, what each node's restart takes.
type budgetsOf struct {
	allowed map[string]int
	most    map[string]int // default: allowed
	takes   map[string]map[string]int
}

func (b *budgetsOf) Allowed(budget string) int { return b.allowed[budget] }
func (b *budgetsOf) Most(budget string) int {
	if m, ok := b.most[budget]; ok {
		return m
	}
	return b.allowed[budget]
}
func (b *budgetsOf) Takes(node string) map[string]int { return b.takes[node] }
