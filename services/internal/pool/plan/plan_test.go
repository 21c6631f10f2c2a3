// SPDX-License-Identifier: Apache-2.0

package plan

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
	_ "time/tzdata" // the zones as dkc-server ships them, not the host's zoneinfo
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/dkc-dev/dkc/api/v1alpha1"
	"github.com/dkc-dev/dkc/internal/nodeconfig"
)

var t0 = time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)

// The pool "blue" rolls out revision r2; its nodes ran r1 before.
var (
	r2 = Target{Revision: "r2", Source: corev1.ConfigMapNodeConfigSource{Namespace: "kube-system", Name: "blue-r2", KubeletConfigKey: "kubelet"}}
	r3 = Target{Revision: "r3", Source: corev1.ConfigMapNodeConfigSource{Namespace: "kube-system", Name: "blue-r3", KubeletConfigKey: "kubelet"}}
	on = resolved(r2.Source)
	r1 = resolved(corev1.ConfigMapNodeConfigSource{Namespace: "kube-system", Name: "blue-r1", KubeletConfigKey: "kubelet"})
	r0 = resolved(corev1.ConfigMapNodeConfigSource{Namespace: "kube-system", Name: "blue-r0", KubeletConfigKey: "kubelet"})
)

// resolved is a source as a node's status shows it: with UID and ResourceVersion.
func resolved(s corev1.ConfigMapNodeConfigSource) *corev1.NodeConfigSource {
	s.UID, s.ResourceVersion = types.UID("uid-"+s.Name), "7"
	return &corev1.NodeConfigSource{ConfigMap: &s}
}

func status(assigned, active, lkg *corev1.NodeConfigSource, err nodeconfig.StatusError) corev1.NodeConfigStatus {
	return corev1.NodeConfigStatus{Assigned: assigned, Active: active, LastKnownGood: lkg, Error: string(err)}
}

// waiting is a Ready node on r1, not assigned r2.
func waiting(name string) Node {
	return Node{Name: name, Ready: true, Status: status(r1, r1, r1, "")}
}

// assigned is a Ready node the pool assigned r2 a minute ago, whose status is st.
func assigned(name string, st corev1.NodeConfigStatus) Node {
	return Node{Name: name, Assigned: true, AssignedAt: t0.Add(-time.Minute), Ready: true, Status: st}
}

// onR1 is a Ready node the pool assigned r1 (before r2) a minute ago, coming from r0, whose status is st.
func onR1(name string, st corev1.NodeConfigStatus) Node {
	return Node{Name: name, Revision: "r1", Source: *r1.ConfigMap, AssignedAt: t0.Add(-time.Minute), Ready: true, Status: st}
}

func updated(name string) Node    { return assigned(name, status(on, on, on, "")) }
func inTrial(name string) Node    { return assigned(name, status(on, on, r1, "")) }
func rolledBack(name string) Node { return assigned(name, status(on, r1, r1, nodeconfig.HealthError)) }

func notReady(n Node) Node                { n.Ready = false; return n }
func since(d time.Duration, n Node) Node  { n.AssignedAt = t0.Add(-d); return n }
func others(n Node, pools ...string) Node { n.OtherPools = pools; return n }
func byHand(n Node) Node                  { n.HandAssigned = true; return n }
func unknownTime(n Node) Node             { n.AssignedAt = time.Time{}; return n }
func noStatus(n Node) Node                { n.NoStatus, n.Status = true, corev1.NodeConfigStatus{}; return n }

// windows is a node the sidecar DaemonSet does not run on.
func windows(n Node) Node { n.NoSidecar = "kubernetes.io/os is windows"; return n }

// pool is "blue" at generation 3, rolling out r2 (after r1), with the schema's defaults; mods change it.
func pool(mods ...func(*v1alpha1.KubeletConfigPool)) *v1alpha1.KubeletConfigPool {
	p := &v1alpha1.KubeletConfigPool{
		ObjectMeta: metav1.ObjectMeta{Name: "blue", Generation: 3},
		Spec: v1alpha1.KubeletConfigPoolSpec{
			ConfigMap: v1alpha1.ConfigMapReference{Namespace: "kube-system", Name: "blue-config", KubeletConfigKey: "kubelet"},
		},
		Status: v1alpha1.KubeletConfigPoolStatus{CurrentRevision: "r2", PreviousRevision: "r1"},
	}
	for _, m := range mods {
		m(p)
	}
	return p
}

func maxUnavailable(v intstr.IntOrString) func(*v1alpha1.KubeletConfigPool) {
	return func(p *v1alpha1.KubeletConfigPool) { p.Spec.MaxUnavailable = &v }
}

func maxFailures(n int32) func(*v1alpha1.KubeletConfigPool) {
	return func(p *v1alpha1.KubeletConfigPool) { p.Spec.MaxFailures = &n }
}

func paused(p *v1alpha1.KubeletConfigPool) { p.Spec.Paused = true }

func retry(n int64) func(*v1alpha1.KubeletConfigPool) {
	return func(p *v1alpha1.KubeletConfigPool) { p.Spec.Retry = n }
}

// windowAt gives the pool one maintenance window a day, opening at start (UTC) for d.
func windowAt(start string, d time.Duration, tz string) func(*v1alpha1.KubeletConfigPool) {
	return func(p *v1alpha1.KubeletConfigPool) {
		p.Spec.MaintenanceWindows = append(p.Spec.MaintenanceWindows,
			v1alpha1.MaintenanceWindow{Start: start, Duration: metav1.Duration{Duration: d}, TimeZone: tz})
	}
}

func pauseBetweenBatches(d time.Duration) func(*v1alpha1.KubeletConfigPool) {
	return func(p *v1alpha1.KubeletConfigPool) { p.Spec.PauseBetweenBatches = &metav1.Duration{Duration: d} }
}

// batch says when the pool last assigned nodes and, if not zero, when it saw that batch complete.
func batch(assignedAgo, completedAgo time.Duration) func(*v1alpha1.KubeletConfigPool) {
	return func(p *v1alpha1.KubeletConfigPool) {
		p.Status.LastAssignmentTime = &metav1.Time{Time: t0.Add(-assignedAgo)}
		if completedAgo != 0 {
			p.Status.BatchCompletionTime = &metav1.Time{Time: t0.Add(-completedAgo)}
		}
	}
}

// drifted is n with its ConfigDrift condition True for two hours: dkc's drop-in removed.
func drifted(n Node) Node {
	n.Drift, n.DriftCause, n.DriftSince = "WiringRemoved: drop-in gone", nodeconfig.DriftWiringRemoved, t0.Add(-2*time.Hour)
	return n
}

// flagDrift is n with its ConfigDrift condition True: a kubelet flag overrides a field.
func flagDrift(n Node) Node {
	n.Drift, n.DriftCause, n.DriftSince = "FlagOverride: --max-pods sets maxPods", nodeconfig.DriftFlagOverride,
		t0.Add(-2*time.Hour)
	return n
}

// repairAsked has the pool have asked ago for a repair of n's drift, as it stands, with sub-second
// precision as the controller stamps it.
func repairAsked(ago time.Duration, n Node) Node {
	n.Repair = &nodeconfig.DriftRepair{Cause: n.DriftCause, RequestTime: t0.Add(-ago).Add(123 * time.Millisecond),
		DriftSince: n.DriftSince}
	return n
}

// driftAgain has n's drift turn True again ago (found again after a repair): a second-truncated time, as
// a condition's lastTransitionTime is.
func driftAgain(ago time.Duration, n Node) Node {
	n.DriftSince = t0.Add(-ago).Truncate(time.Second)
	return n
}

// driftBecomes has n's standing drift change its cause without turning False (its lastTransitionTime
// stays).
func driftBecomes(cause string, n Node) Node {
	n.DriftCause, n.Drift = cause, cause+": changed"
	return n
}

// restore sets spec.drift.policy Restore.
func restore(p *v1alpha1.KubeletConfigPool) {
	p.Spec.Drift = &v1alpha1.Drift{Policy: v1alpha1.DriftRestore}
}

// failedBefore records a failure of node for revision under spec.retry r.
func failedBefore(node, revision string, r int64) func(*v1alpha1.KubeletConfigPool) {
	return func(p *v1alpha1.KubeletConfigPool) {
		p.Status.FailedNodes = append(p.Status.FailedNodes, v1alpha1.FailedNode{
			Name: node, Revision: revision, Reason: v1alpha1.FailureRolledBack, Error: string(nodeconfig.HealthError),
			Retry: r, Time: metav1.Time{Time: t0.Add(-time.Hour)},
		})
	}
}

// TestNodeRules is the node table of docs/design.md's "KubeletConfigPool", row for row: one node of the
// pool, and the state and reason the planner gives it.
func TestNodeRules(t *testing.T) {
	for _, tc := range []struct {
		name            string
		node            Node
		pool            []func(*v1alpha1.KubeletConfigPool)
		state           State
		reason          string
		wantUnavailable bool
		// leaderFor is how long the current leader has led (0: unknown).
		leaderFor time.Duration
	}{
		{name: "not assigned the revision: pending", node: waiting("n1"), state: Pending, reason: ReasonNotAssigned},
		{name: "not assigned and not Ready: pending, unavailable", node: notReady(waiting("n1")), state: Pending, reason: ReasonNotAssigned, wantUnavailable: true},
		{name: "assigned, status not caught up: in progress", node: assigned("n1", status(r1, r1, r1, "")), state: InProgress, reason: ReasonNotActive, wantUnavailable: true},
		{name: "assigned, status shows it assigned, not active: in progress", node: assigned("n1", status(on, r1, r1, "")), state: InProgress, reason: ReasonNotActive, wantUnavailable: true},
		{name: "runs it, Node not Ready: in progress", node: notReady(inTrial("n1")), state: InProgress, reason: ReasonNotReady, wantUnavailable: true},
		{name: "runs it, Ready, in its trial: in progress", node: inTrial("n1"), state: InProgress, reason: ReasonInTrial, wantUnavailable: true},
		{name: "runs it as last-known-good: updated", node: updated("n1"), state: Updated, reason: ReasonProven},
		{name: "updated, Node not Ready since: updated, unavailable", node: notReady(updated("n1")), state: Updated, reason: ReasonProven, wantUnavailable: true},
		{name: "updated, its kubelet runs something else since: drifted", node: drifted(updated("n1")), state: Drifted, reason: ReasonDrifted},
		{name: "in its trial, drift reported: still in progress", node: drifted(inTrial("n1")), state: InProgress, reason: ReasonInTrial, wantUnavailable: true},
		{name: "drifted, Restore, not asked yet: drifted, a repair candidate", node: drifted(updated("n1")), pool: mods(restore),
			state: Drifted, reason: ReasonDrifted},
		{name: "drifted, Restore, repair asked a minute ago: in progress", node: repairAsked(time.Minute, drifted(updated("n1"))),
			pool: mods(restore), state: InProgress, reason: ReasonRepairingDrift, wantUnavailable: true},
		{name: "drifted, Restore, found again after the repair: drifted", node: driftAgain(time.Second,
			repairAsked(time.Minute, drifted(updated("n1")))), pool: mods(restore), state: Drifted, reason: ReasonDrifted},
		{name: "drifted, Restore, repair asked nodeTimeout ago: drifted", node: repairAsked(31*time.Minute, drifted(updated("n1"))),
			pool: mods(restore), state: Drifted, reason: ReasonDrifted},
		{name: "drifted, Restore, found again within the second of the request: drifted", node: driftAgain(time.Minute,
			repairAsked(time.Minute, drifted(updated("n1")))), pool: mods(restore), state: Drifted, reason: ReasonDrifted},
		{name: "drifted, Restore, a request dated an hour ahead (forged): a repair candidate", node: repairAsked(-time.Hour,
			drifted(updated("n1"))), pool: mods(restore), state: Drifted, reason: ReasonDrifted},
		{name: "drifted, Restore, the drift became another repairable cause: drifted, a candidate again", node: driftBecomes(
			nodeconfig.DriftWiringReplaced, repairAsked(time.Minute, drifted(updated("n1")))), pool: mods(restore),
			state: Drifted, reason: ReasonDrifted},
		{name: "drifted, Report, repair asked a minute ago (policy changed since): drifted", node: repairAsked(time.Minute,
			drifted(updated("n1"))), state: Drifted, reason: ReasonDrifted},
		{name: "rolled back, Ready again on last-known-good: failed", node: rolledBack("n1"), state: Failed, reason: v1alpha1.FailureRolledBack},
		{name: "rolled back to the local config: failed", node: assigned("n1", status(on, nil, nil, nodeconfig.HealthError)), state: Failed, reason: v1alpha1.FailureRolledBack},
		{name: "does not load: failed", node: assigned("n1", status(on, r1, r1, nodeconfig.LoadError)), state: Failed, reason: v1alpha1.FailureConfigRefused},
		{name: "does not validate: failed", node: assigned("n1", status(on, r1, r1, nodeconfig.ValidateError)), state: Failed, reason: v1alpha1.FailureConfigRefused},
		{name: "kubelet too old or new for dkc: failed", node: assigned("n1", status(on, r1, r1, nodeconfig.UnsupportedKubeletError)), state: Failed, reason: v1alpha1.FailureConfigRefused},
		{name: "an error dkc does not know: failed", node: assigned("n1", status(on, r1, r1, "failed to frobnicate")), state: Failed, reason: v1alpha1.FailureConfigRefused},
		{name: "restart failed, will retry: in progress", node: assigned("n1", status(on, r1, r1, nodeconfig.RestartError)), state: InProgress, reason: ReasonRetrying, wantUnavailable: true},
		{name: "configz unanswered, will retry: in progress", node: assigned("n1", status(on, r1, r1, nodeconfig.VerifyTimeoutError)), state: InProgress, reason: ReasonRetrying, wantUnavailable: true},
		{name: "download failed, will retry: in progress", node: assigned("n1", status(on, r1, r1, nodeconfig.DownloadError)), state: InProgress, reason: ReasonRetrying, wantUnavailable: true},
		{name: "an error about the previous assignment: not judged", node: assigned("n1", status(r1, r1, r1, nodeconfig.ValidateError)), state: InProgress, reason: ReasonNotActive, wantUnavailable: true},
		{name: "a retried error once it is last-known-good: updated", node: assigned("n1", status(on, on, on, nodeconfig.InternalError)), state: Updated, reason: ReasonProven},
		{name: "in progress for nodeTimeout: failed", node: since(30*time.Minute, inTrial("n1")), state: Failed, reason: v1alpha1.FailureTimeout},
		{name: "in progress just under nodeTimeout: in progress", node: since(30*time.Minute-time.Second, inTrial("n1")), state: InProgress, reason: ReasonInTrial, wantUnavailable: true},
		{name: "assignment time unknown: never timed out", node: unknownTime(assigned("n1", status(r1, r1, r1, ""))), state: InProgress, reason: ReasonNotActive, wantUnavailable: true},
		{name: "failure recorded, node recovered and looks updated: still failed", node: updated("n1"),
			pool: mods(failedBefore("n1", "r2", 0)), state: Failed, reason: v1alpha1.FailureRolledBack},
		{name: "failure recorded for an earlier revision: judged afresh", node: updated("n1"),
			pool: mods(failedBefore("n1", "r1", 0)), state: Updated, reason: ReasonProven},
		{name: "failure recorded, then assigned by hand: still failed", node: byHand(rolledBack("n1")),
			pool: mods(failedBefore("n1", "r2", 0)), state: Failed, reason: v1alpha1.FailureRolledBack},
		{name: "assigned the previous revision by the pool, restarting: in progress", node: onR1("n1", status(r1, r0, r0, "")),
			state: InProgress, reason: ReasonPreviousRevision, wantUnavailable: true},
		{name: "assigned the previous revision, restart failed, will retry: in progress", node: onR1("n1", status(r1, r0, r0, nodeconfig.RestartError)),
			state: InProgress, reason: ReasonPreviousRevision, wantUnavailable: true},
		{name: "assigned the previous revision, in its trial: in progress", node: onR1("n1", status(r1, r1, r0, "")),
			state: InProgress, reason: ReasonPreviousRevision, wantUnavailable: true},
		{name: "assigned the previous revision, runs it, not Ready: in progress", node: notReady(onR1("n1", status(r1, r1, r0, ""))),
			state: InProgress, reason: ReasonPreviousRevision, wantUnavailable: true},
		{name: "assigned the previous revision, proven: pending", node: onR1("n1", status(r1, r1, r1, "")),
			state: Pending, reason: ReasonNotAssigned},
		{name: "assigned the previous revision, refused it: pending", node: onR1("n1", status(r1, r0, r0, nodeconfig.HealthError)),
			state: Pending, reason: ReasonNotAssigned},
		{name: "assigned the previous revision, in progress for nodeTimeout: failed", node: since(30*time.Minute, onR1("n1", status(r1, r1, r0, ""))),
			state: Failed, reason: v1alpha1.FailureTimeout},
		{name: "another pool selects it too: held", node: others(waiting("n1"), "green"), state: Held, reason: ReasonSelectedByOtherPools},
		{name: "another pool selects it, even on the revision, in its trial: held, unavailable", node: others(inTrial("n1"), "green"),
			state: Held, reason: ReasonSelectedByOtherPools, wantUnavailable: true},
		{name: "another pool selects it, settled: held", node: others(updated("n1"), "green"), state: Held, reason: ReasonSelectedByOtherPools},
		{name: "source set by hand after the pool's assignment: held", node: byHand(waiting("n1")), state: Held, reason: ReasonHandAssigned},
		{name: "set by hand, restarting onto it: held, unavailable", node: byHand(Node{Name: "n1", Ready: true, Status: status(on, r1, r1, "")}),
			state: Held, reason: ReasonHandAssigned, wantUnavailable: true},
		{name: "set by hand, restart failed, will retry: held, unavailable", node: byHand(Node{Name: "n1", Ready: true, Status: status(on, r1, r1, nodeconfig.RestartError)}),
			state: Held, reason: ReasonHandAssigned, wantUnavailable: true},
		{name: "set by hand, refused it: held", node: byHand(Node{Name: "n1", Ready: true, Status: status(on, r1, r1, nodeconfig.ValidateError)}),
			state: Held, reason: ReasonHandAssigned},
		{name: "no sidecar runs on it: held", node: windows(waiting("n1")), state: Held, reason: ReasonNoSidecar},
		{name: "no sidecar, not Ready: held, unavailable", node: notReady(windows(waiting("n1"))), state: Held, reason: ReasonNoSidecar, wantUnavailable: true},
		{name: "no sidecar, assigned before, never applied it: held, not timed out", node: since(time.Hour, windows(assigned("n1", status(r1, r1, r1, "")))),
			state: Held, reason: ReasonNoSidecar},
		{name: "no sidecar any more, proved the revision before: updated", node: windows(updated("n1")), state: Updated, reason: ReasonProven},
		{name: "sidecar never reported, not assigned: held", node: noStatus(waiting("n1")), state: Held, reason: ReasonNotReported},
		{name: "status lost, assigned long ago: in progress, not timed out", node: since(2*time.Hour, noStatus(updated("n1"))),
			state: InProgress, reason: ReasonNotReported, wantUnavailable: true},
		{name: "status lost, assigned the previous revision long ago: in progress, not timed out", node: since(2*time.Hour, noStatus(onR1("n1", status(r1, r0, r0, "")))),
			state: InProgress, reason: ReasonPreviousRevision, wantUnavailable: true},
		{name: "assigned before a leaderless hour, leader for 10m: in progress", node: since(2*time.Hour, inTrial("n1")), leaderFor: 10 * time.Minute,
			state: InProgress, reason: ReasonInTrial, wantUnavailable: true},
		{name: "assigned before a leaderless hour, leader for nodeTimeout: failed", node: since(2*time.Hour, assigned("n1", status(r1, r1, r1, ""))), leaderFor: 30 * time.Minute,
			state: Failed, reason: v1alpha1.FailureTimeout},
		{name: "assigned 29m into the term, in progress for nodeTimeout: failed", node: since(30*time.Minute, inTrial("n1")), leaderFor: time.Hour,
			state: Failed, reason: v1alpha1.FailureTimeout},
		{name: "previous revision before a leaderless hour, leader for 10m: in progress", node: since(2*time.Hour, onR1("n1", status(r1, r0, r0, ""))),
			leaderFor: 10 * time.Minute, state: InProgress, reason: ReasonPreviousRevision, wantUnavailable: true},
		{name: "must be drained, the pool may not drain: failed", node: assigned("n1", status(on, nil, nil, nodeconfig.DrainRequiredError)),
			state: Failed, reason: v1alpha1.FailureDrainRequired},
		{name: "must be drained, the pool drains it: in progress", node: assigned("n1", status(on, nil, nil, nodeconfig.DrainRequiredError)),
			pool: mods(mayDrain), state: InProgress, reason: ReasonDraining, wantUnavailable: true},
		{name: "must be drained, the drain failed: failed", node: drainFailed(assigned("n1", status(on, nil, nil, nodeconfig.DrainRequiredError))),
			pool: mods(mayDrain), state: Failed, reason: v1alpha1.FailureDrainFailed},
		{name: "draining for nodeTimeout: failed", node: since(30*time.Minute, assigned("n1", status(on, nil, nil, nodeconfig.DrainRequiredError))),
			pool: mods(mayDrain), state: Failed, reason: v1alpha1.FailureTimeout},
		{name: "proven, a pod not Ready again for a minute: in progress", node: notReadyFor(time.Minute, updated("n1")),
			state: InProgress, reason: ReasonPodsNotReady, wantUnavailable: true},
		{name: "proven, a pod not Ready for podReadinessTimeout: failed", node: notReadyFor(5*time.Minute, updated("n1")),
			state: Failed, reason: v1alpha1.FailurePodsNotReady},
		{name: "a pod not Ready for podReadinessTimeout, a leader for a minute: in progress", node: notReadyFor(time.Hour, updated("n1")),
			leaderFor: time.Minute, state: InProgress, reason: ReasonPodsNotReady, wantUnavailable: true},
		{name: "proven, a pod not Ready for a longer podReadinessTimeout: in progress", node: notReadyFor(5*time.Minute, updated("n1")),
			pool: mods(podReadinessTimeout(10 * time.Minute)), state: InProgress, reason: ReasonPodsNotReady, wantUnavailable: true},
		{name: "gate off (podReadinessTimeout 0s), a pod not Ready: updated", node: notReadyFor(time.Hour, updated("n1")),
			pool: mods(podReadinessTimeout(0)), state: Updated, reason: ReasonProven},
		{name: "gate off, a pod the kubelet failed: updated", node: podFailed(updated("n1")),
			pool: mods(podReadinessTimeout(0)), state: Updated, reason: ReasonProven},
		{name: "waiting for pods for nodeTimeout: failed", node: since(30*time.Minute, notReadyFor(time.Minute, updated("n1"))),
			state: Failed, reason: v1alpha1.FailureTimeout},
		{name: "in its trial, a pod not Ready: in its trial", node: notReadyFor(time.Minute, inTrial("n1")),
			state: InProgress, reason: ReasonInTrial, wantUnavailable: true},
		{name: "a pod the kubelet failed: failed", node: podFailed(updated("n1")), state: Failed, reason: v1alpha1.FailurePodsFailed},
		{name: "a pod the kubelet failed while the node restarts: failed", node: podFailed(inTrial("n1")),
			state: Failed, reason: v1alpha1.FailurePodsFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := Input{Pool: pool(tc.pool...), Target: r2, Nodes: []Node{tc.node}, Now: t0}
			if tc.leaderFor > 0 {
				in.TermStart = t0.Add(-tc.leaderFor)
			}
			p := Decide(in)
			if len(p.Nodes) != 1 {
				t.Fatalf("%d verdicts, want 1", len(p.Nodes))
			}
			v := p.Nodes[0]
			if v.State != tc.state || v.Reason != tc.reason {
				t.Errorf("verdict %s/%s (%s), want %s/%s", v.State, v.Reason, v.Detail, tc.state, tc.reason)
			}
			if v.Unavailable() != tc.wantUnavailable {
				t.Errorf("unavailable = %v, want %v", v.Unavailable(), tc.wantUnavailable)
			}
			failed := slices.ContainsFunc(p.Status.FailedNodes, func(f v1alpha1.FailedNode) bool { return f.Name == "n1" })
			if failed != (tc.state == Failed) {
				t.Errorf("in status.failedNodes: %v, want %v", failed, tc.state == Failed)
			}
		})
	}
}

func mods(m ...func(*v1alpha1.KubeletConfigPool)) []func(*v1alpha1.KubeletConfigPool) { return m }

// TestDrainRequiredSaysWhatStandsInTheWay: a node that must be drained first, in a pool that may not drain,
// fails with what its sidecar said stands in the way (the pods new eviction thresholds would evict), and
// the Degraded condition says it.
func TestDrainRequiredSaysWhatStandsInTheWay(t *testing.T) {
	n := assigned("n1", status(on, nil, nil, nodeconfig.DrainRequiredError))
	n.Detail = "using current (local): node not drained: the kubelet, restarted with configmap kube-system/c, " +
		"would evict or reject pods at once: n1: web/hungry would be evicted (memory.available; it uses 100Mi)"
	p := Decide(Input{Pool: pool(), Target: r2, Nodes: []Node{n}, Now: t0})
	if len(p.Status.FailedNodes) != 1 {
		t.Fatalf("failed nodes %+v, want n1", p.Status.FailedNodes)
	}
	f := p.Status.FailedNodes[0]
	want := string(nodeconfig.DrainRequiredError) + " (spec.disruption.drain is Never): " + n.Detail
	if f.Reason != v1alpha1.FailureDrainRequired || f.Error != want {
		t.Errorf("failure %s: %q, want %s: %q", f.Reason, f.Error, v1alpha1.FailureDrainRequired, want)
	}
	if c := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionDegraded); c == nil ||
		!strings.Contains(c.Message, "web/hungry would be evicted") {
		t.Errorf("Degraded %+v does not name the pod", c)
	}
}

func mayDrain(p *v1alpha1.KubeletConfigPool) {
	p.Spec.Disruption = &v1alpha1.Disruption{Drain: v1alpha1.DrainAllowed}
}

// notReadyFor has a pod of n lose its readiness d ago.
func notReadyFor(d time.Duration, n Node) Node {
	n.Pods = append(n.Pods, Pod{Name: "default/web-1", NotReadySince: t0.Add(-d)})
	return n
}

func podFailed(n Node) Node {
	n.Pods = append(n.Pods, Pod{Name: "default/web-2", Failed: "OutOfpods: Node didn't have enough resource: pods"})
	return n
}

func podReadinessTimeout(d time.Duration) func(*v1alpha1.KubeletConfigPool) {
	return func(p *v1alpha1.KubeletConfigPool) {
		p.Spec.Disruption = &v1alpha1.Disruption{PodReadinessTimeout: &metav1.Duration{Duration: d}}
	}
}

func drainFailed(n Node) Node {
	n.DrainFailed = "drain of node n1 not done within drainTimeout 10m0s: global timeout reached: 10m0s"
	return n
}

// names returns nodes called prefix00, prefix01, ... made by mk.
func names(n int, mk func(string) Node) []Node {
	var out []Node
	for i := range n {
		out = append(out, mk(fmt.Sprintf("n%02d", i)))
	}
	return out
}

// TestPoolRules is the pool table of docs/design.md's "KubeletConfigPool", row for row: what the pool
// assigns, its counts (selected/updated/ready/inProgress/failed/held) and conditions.
func TestPoolRules(t *testing.T) {
	invalid := &Invalid{Reason: v1alpha1.ReasonValidationFailed, Message: "failed to validate config: cgroupDriver: unknown"}
	for _, tc := range []struct {
		name    string
		pool    []func(*v1alpha1.KubeletConfigPool)
		target  *Target // default r2
		invalid *Invalid
		preview *Preview
		nodes   []Node
		assign  string // names, comma-separated
		repair  string // names, comma-separated
		counts  string // selected/updated/ready/inProgress/failed/held
		conds   map[string]string
		message map[string]string // substrings of condition messages
		requeue time.Duration
		// leaderFor is how long the current leader has led (0: unknown).
		leaderFor time.Duration
		held      string // status.heldNodes as name:reason, comma-separated
	}{
		{name: "maxUnavailable 1: one node at a time, by name",
			nodes: []Node{waiting("c"), waiting("a"), waiting("b")}, assign: "a", counts: "3/0/0/0/0/0",
			conds: map[string]string{"Updating": "True/RollingOut", "Updated": "False/NodesNotUpdated", "Halted": "False/WithinFailureBudget", "Degraded": "False/AsExpected"}},
		{name: "maxUnavailable 25% of 10 nodes = 2", pool: mods(maxUnavailable(intstr.FromString("25%"))),
			nodes: names(10, waiting), assign: "n00,n01", counts: "10/0/0/0/0/0"},
		{name: "maxUnavailable 25% of 3 nodes rounds down to 0, at least 1", pool: mods(maxUnavailable(intstr.FromString("25%"))),
			nodes: names(3, waiting), assign: "n00", counts: "3/0/0/0/0/0"},
		{name: "a node in progress takes the only slot",
			nodes: []Node{inTrial("a"), waiting("b"), waiting("c")}, assign: "", counts: "3/0/0/1/0/0", requeue: 29 * time.Minute,
			conds: map[string]string{"Updating": "True/RollingOut"}},
		{name: "a proven node frees its slot",
			nodes: []Node{updated("a"), waiting("b"), waiting("c")}, assign: "b", counts: "3/1/1/0/0/0",
			conds: map[string]string{"Drifted": "False/NoDrift"}},
		{name: "a drifted node is not updated and takes no slot; the pool says which and why",
			nodes: []Node{drifted(updated("a")), updated("b")}, assign: "", counts: "2/1/1/0/0/0",
			conds:   map[string]string{"Drifted": "True/NodesDrifted", "Updated": "False/NodesNotUpdated", "Updating": "False/NothingToAssign"},
			message: map[string]string{"Drifted": "a (WiringRemoved: drop-in gone)", "Updating": "drifted (1)"}},
		{name: "Restore: a drifted node is asked to repair in a free slot",
			pool: mods(restore), nodes: []Node{drifted(updated("a")), updated("b")}, repair: "a", counts: "2/1/1/0/0/0",
			conds:   map[string]string{"Drifted": "True/NodesDrifted", "Updating": "True/RollingOut"},
			message: map[string]string{"Updating": "repairing the drift of a", "Drifted": "repaired once a slot is free"}},
		{name: "Restore: assignments first, then repairs in the slots left",
			pool: mods(restore, maxUnavailable(intstr.FromInt32(2))), nodes: []Node{drifted(updated("a")), drifted(updated("b")), waiting("c")},
			assign: "c", repair: "a", counts: "3/0/0/0/0/0"},
		{name: "Restore: a repair in progress takes the slot",
			pool: mods(restore), nodes: []Node{repairAsked(time.Minute, drifted(updated("a"))), drifted(updated("b"))}, counts: "2/0/0/1/0/0",
			requeue: 29 * time.Minute, conds: map[string]string{"Updating": "True/RollingOut"}},
		{name: "Restore: a flag's drift is reported, not repaired",
			pool: mods(restore), nodes: []Node{flagDrift(updated("a"))}, counts: "1/0/0/0/0/0",
			conds: map[string]string{"Updating": "False/NothingToAssign"}, message: map[string]string{"Drifted": "not repaired"}},
		{name: "Restore: a paused pool repairs nothing",
			pool: mods(restore, paused), nodes: []Node{drifted(updated("a"))}, counts: "1/0/0/0/0/0",
			conds: map[string]string{"Updating": "False/Paused"}},
		{name: "Report: drift is not repaired",
			nodes: []Node{drifted(updated("a"))}, counts: "1/0/0/0/0/0", conds: map[string]string{"Updating": "False/NothingToAssign"}},
		{name: "a Node not Ready takes a slot, in progress or not",
			nodes: []Node{notReady(updated("a")), waiting("b")}, assign: "", counts: "2/1/0/0/0/0",
			conds: map[string]string{"Updating": "True/WaitingForAvailableNodes"}},
		{name: "pending nodes not Ready are skipped", pool: mods(maxUnavailable(intstr.FromInt32(2))),
			nodes: []Node{notReady(waiting("a")), waiting("b"), waiting("c")}, assign: "b", counts: "3/0/0/0/0/0"},
		{name: "paused assigns nothing", pool: mods(paused),
			nodes: []Node{waiting("a")}, assign: "", counts: "1/0/0/0/0/0",
			conds: map[string]string{"Paused": "True/PausedBySpec", "Updating": "False/Paused"}},
		{name: "config invalid assigns nothing", invalid: invalid,
			nodes: []Node{waiting("a")}, assign: "", counts: "1/0/0/0/0/0",
			conds:   map[string]string{"ConfigInvalid": "True/ValidationFailed", "Updating": "False/ConfigInvalid"},
			message: map[string]string{"ConfigInvalid": "cgroupDriver"}},
		{name: "no revision yet (the config never was valid): nothing assigned", target: &Target{},
			invalid: &Invalid{Reason: v1alpha1.ReasonConfigMapNotFound, Message: "configmap kube-system/blue-config not found"},
			nodes:   []Node{waiting("a")}, assign: "", counts: "1/0/0/0/0/0",
			conds: map[string]string{"ConfigInvalid": "True/ConfigMapNotFound", "Updating": "False/ConfigInvalid", "Updated": "False/NodesNotUpdated"}},
		{name: "failures reach maxFailures: halted, nothing more assigned",
			nodes: []Node{rolledBack("a"), waiting("b"), waiting("c")}, assign: "", counts: "3/0/0/0/1/0",
			conds:   map[string]string{"Halted": "True/FailureBudgetExhausted", "Degraded": "True/NodesFailed", "Updating": "False/Halted"},
			message: map[string]string{"Halted": "1 failure counts against maxFailures 1 of revision r2: node a: RolledBack: " + string(nodeconfig.HealthError)}},
		{name: "failures below maxFailures: the rollout goes on", pool: mods(maxFailures(2)),
			nodes: []Node{rolledBack("a"), waiting("b"), waiting("c")}, assign: "b", counts: "3/0/0/0/1/0",
			conds: map[string]string{"Halted": "False/WithinFailureBudget", "Degraded": "True/NodesFailed", "Updating": "True/RollingOut"}},
		{name: "timeout counts as failure", pool: mods(maxFailures(2)),
			nodes: []Node{since(31*time.Minute, assigned("a", status(on, r1, r1, ""))), waiting("b")}, assign: "b", counts: "2/0/0/0/1/0",
			conds:   map[string]string{"Degraded": "True/NodesFailed"},
			message: map[string]string{"Degraded": "node a: Timeout: in progress for 31m0s, past nodeTimeout 30m0s: NotActive"}},
		{name: "timeout reaching maxFailures halts",
			nodes: []Node{since(31*time.Minute, inTrial("a")), waiting("b")}, assign: "", counts: "2/0/0/0/1/0",
			conds: map[string]string{"Halted": "True/FailureBudgetExhausted"}},
		{name: "halted stays halted through other spec changes (resume, maxUnavailable)", pool: mods(failedBefore("a", "r2", 0), maxUnavailable(intstr.FromInt32(5))),
			nodes: []Node{updated("a"), waiting("b")}, assign: "", counts: "2/0/0/0/1/0",
			conds: map[string]string{"Halted": "True/FailureBudgetExhausted", "Paused": "False/NotPaused"}},
		{name: "a new spec.retry: earlier failures stop counting, failed nodes are not assigned again",
			pool:  mods(failedBefore("a", "r2", 0), retry(1)),
			nodes: []Node{rolledBack("a"), waiting("b")}, assign: "b", counts: "2/0/0/0/1/0",
			conds: map[string]string{"Halted": "False/WithinFailureBudget", "Degraded": "True/NodesFailed"}},
		{name: "after a retry, a new failure halts again",
			pool:  mods(failedBefore("a", "r2", 0), retry(1)),
			nodes: []Node{rolledBack("a"), rolledBack("b"), waiting("c")}, assign: "", counts: "3/0/0/0/2/0",
			conds:   map[string]string{"Halted": "True/FailureBudgetExhausted"},
			message: map[string]string{"Halted": "1 failure counts against maxFailures 1 of revision r2: node b: RolledBack: " + string(nodeconfig.HealthError) + "; nothing more"}},
		{name: "a new revision forgets the last one's failures", target: &r3, pool: mods(failedBefore("a", "r2", 0)),
			nodes: []Node{{Name: "a", Ready: true, Status: status(on, r1, r1, nodeconfig.HealthError)}, waiting("b")}, assign: "a", counts: "2/0/0/0/0/0",
			conds: map[string]string{"Halted": "False/WithinFailureBudget", "Degraded": "False/AsExpected"}},
		{name: "a failed node deleted or no longer selected: still halted", pool: mods(failedBefore("x", "r2", 0)),
			nodes: []Node{waiting("a"), waiting("b")}, assign: "", counts: "2/0/0/0/0/0",
			conds:   map[string]string{"Halted": "True/FailureBudgetExhausted", "Degraded": "True/NodesFailed", "Updating": "False/Halted"},
			message: map[string]string{"Halted": "node x (node gone): RolledBack"}},
		{name: "a failed node gone, then a new spec.retry: the rollout goes on", pool: mods(failedBefore("x", "r2", 0), retry(1)),
			nodes: []Node{waiting("a"), waiting("b")}, assign: "a", counts: "2/0/0/0/0/0",
			conds: map[string]string{"Halted": "False/WithinFailureBudget"}},
		{name: "every node updated: Updated, rollout complete",
			nodes: []Node{updated("a"), updated("b")}, assign: "", counts: "2/2/2/0/0/0",
			conds: map[string]string{"Updated": "True/AllNodesUpdated", "Updating": "False/RolloutComplete"}},
		{name: "no node selected: not Updated",
			nodes: nil, assign: "", counts: "0/0/0/0/0/0",
			conds: map[string]string{"Updated": "False/NoNodesSelected"}},
		{name: "only failed or held nodes left: nothing to assign", pool: mods(maxFailures(2)),
			nodes: []Node{updated("a"), rolledBack("b"), byHand(waiting("c"))}, assign: "", counts: "3/1/1/0/1/1",
			conds: map[string]string{"Updated": "False/NodesNotUpdated", "Updating": "False/NothingToAssign"}},
		{name: "two pools select one node: neither touches it, Degraded names both",
			nodes: []Node{others(waiting("a"), "green"), waiting("b")}, assign: "b", counts: "2/0/0/0/0/1",
			conds:   map[string]string{"Degraded": "True/SelectorOverlap"},
			message: map[string]string{"Degraded": "node a is selected by pools blue, green"}},
		{name: "pause between batches: a running batch is waited for", pool: mods(pauseBetweenBatches(5*time.Minute), maxUnavailable(intstr.FromInt32(2)), batch(time.Minute, 0)),
			nodes: []Node{inTrial("a"), waiting("b"), waiting("c")}, assign: "", counts: "3/0/0/1/0/0", requeue: 29 * time.Minute,
			conds:   map[string]string{"Updating": "True/RollingOut"},
			message: map[string]string{"Updating": "the next batch starts when none is"}},
		{name: "pause between batches: a batch just completed starts the pause", pool: mods(pauseBetweenBatches(5*time.Minute), maxUnavailable(intstr.FromInt32(2)), batch(3*time.Minute, 0)),
			nodes: []Node{updated("a"), waiting("b"), waiting("c")}, assign: "", counts: "3/1/1/0/0/0", requeue: 5 * time.Minute,
			conds: map[string]string{"Updating": "True/WaitingBetweenBatches"}},
		{name: "pause between batches: 2 minutes left", pool: mods(pauseBetweenBatches(5*time.Minute), maxUnavailable(intstr.FromInt32(2)), batch(10*time.Minute, 3*time.Minute)),
			nodes: []Node{updated("a"), waiting("b"), waiting("c")}, assign: "", counts: "3/1/1/0/0/0", requeue: 2 * time.Minute},
		{name: "pause between batches: over, the next batch", pool: mods(pauseBetweenBatches(5*time.Minute), maxUnavailable(intstr.FromInt32(2)), batch(10*time.Minute, 6*time.Minute)),
			nodes: []Node{updated("a"), waiting("b"), waiting("c")}, assign: "b,c", counts: "3/1/1/0/0/0"},
		{name: "outside the maintenance windows: nothing; again when the next opens", pool: mods(windowAt("14:00", time.Hour, "")),
			nodes: []Node{waiting("a"), waiting("b")}, assign: "", counts: "2/0/0/0/0/0", requeue: 2 * time.Hour,
			conds: map[string]string{"Updating": "True/WaitingForMaintenanceWindow"}},
		{name: "outside the maintenance windows: a node in progress goes on, no other is assigned", pool: mods(windowAt("14:00", time.Hour, ""), maxUnavailable(intstr.FromInt32(2))),
			nodes: []Node{inTrial("a"), waiting("b")}, assign: "", counts: "2/0/0/1/0/0", requeue: 29 * time.Minute,
			conds: map[string]string{"Updating": "True/WaitingForMaintenanceWindow"}},
		{name: "inside a maintenance window: assigned; again when it closes", pool: mods(windowAt("11:30", time.Hour, "")),
			nodes: []Node{waiting("a"), waiting("b")}, assign: "a", counts: "2/0/0/0/0/0", requeue: 30 * time.Minute,
			conds: map[string]string{"Updating": "True/RollingOut"}},
		{name: "a node still restarting on the previous revision takes the only slot",
			nodes: []Node{onR1("a", status(r1, r0, r0, "")), waiting("b")}, assign: "", counts: "2/0/0/1/0/0", requeue: 29 * time.Minute,
			conds: map[string]string{"Updating": "True/RollingOut"}},
		{name: "a node that proved the previous revision is assigned the target",
			nodes: []Node{onR1("a", status(r1, r1, r1, "")), waiting("b")}, assign: "a", counts: "2/0/0/0/0/0"},
		{name: "a node in progress: look again at its timeout",
			nodes: []Node{since(29*time.Minute, inTrial("a")), waiting("b")}, assign: "", counts: "2/0/0/1/0/0", requeue: time.Minute},
		{name: "a pool over nodes without a sidecar only: nothing to do",
			nodes: []Node{windows(waiting("a")), noStatus(waiting("b"))}, assign: "", counts: "2/0/0/0/0/2",
			conds: map[string]string{"Updating": "False/NothingToAssign", "Halted": "False/WithinFailureBudget", "Degraded": "False/AsExpected"},
			held:  "a:NoSidecar,b:NotReported"},
		{name: "nodes without a sidecar take no slot",
			nodes: []Node{windows(waiting("a")), noStatus(waiting("b")), waiting("c")}, assign: "c", counts: "3/0/0/0/0/2",
			held: "a:NoSidecar,b:NotReported"},
		{name: "a node whose status was lost waits, not timed out, and holds its slot",
			nodes: []Node{since(2*time.Hour, noStatus(inTrial("a"))), waiting("b")}, assign: "", counts: "2/0/0/1/0/0",
			conds: map[string]string{"Halted": "False/WithinFailureBudget", "Updating": "True/RollingOut"}},
		{name: "after a leaderless hour: in progress nodes get nodeTimeout from the leader's start", leaderFor: time.Minute,
			nodes: []Node{since(2*time.Hour, inTrial("a")), waiting("b")}, assign: "", counts: "2/0/0/1/0/0", requeue: 29 * time.Minute,
			conds: map[string]string{"Halted": "False/WithinFailureBudget"}},
		{name: "a leader's nodeTimeout over: failed, the message says from when", leaderFor: 31 * time.Minute,
			nodes: []Node{since(2*time.Hour, assigned("a", status(on, r1, r1, ""))), waiting("b")}, assign: "", counts: "2/0/0/0/1/0",
			conds:   map[string]string{"Halted": "True/FailureBudgetExhausted"},
			message: map[string]string{"Degraded": "node a: Timeout: in progress for 31m0s, past nodeTimeout 30m0s (counted from 2026-11-26T11:29:00Z, when this dkc-server became leader): NotActive"}},
		{name: "a preview waiting: nothing assigned, Updating says why, decided again at its timeout",
			preview: &Preview{Status: &v1alpha1.PreviewStatus{Revision: "r3"}, Waiting: true, Message: "waiting for a, b",
				Wait: 5 * time.Minute, Condition: metav1.Condition{Status: metav1.ConditionUnknown,
					Reason: v1alpha1.ReasonWaitingForPreview, Message: "waiting for a, b"}},
			nodes: []Node{waiting("a"), waiting("b")}, assign: "", counts: "2/0/0/0/0/0", requeue: 5 * time.Minute,
			conds:   map[string]string{"Updating": "True/WaitingForPreview", "Previewed": "Unknown/WaitingForPreview"},
			message: map[string]string{"Updating": "waiting for a, b"}},
		{name: "a preview waiting on a pool without a revision yet: waiting, not invalid", target: &Target{},
			preview: &Preview{Status: &v1alpha1.PreviewStatus{Revision: "r1"}, Waiting: true, Message: "waiting for a"},
			nodes:   []Node{waiting("a")}, assign: "", counts: "1/0/0/0/0/0",
			conds: map[string]string{"Updating": "True/WaitingForPreview", "ConfigInvalid": "False/ConfigValid"}},
		{name: "a preview done: the rollout goes on, Previewed says what was found",
			preview: &Preview{Status: &v1alpha1.PreviewStatus{Revision: "r2"}, Condition: metav1.Condition{
				Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonNoPodsAffected, Message: "2 of 2 nodes asked found nothing"}},
			nodes: []Node{waiting("a"), waiting("b")}, assign: "a", counts: "2/0/0/0/0/0",
			conds: map[string]string{"Updating": "True/RollingOut", "Previewed": "True/NoPodsAffected"}},
		{name: "held nodes listed up to the bound", nodes: names(v1alpha1.MaxHeldNodesListed+5, func(n string) Node { return windows(waiting(n)) }),
			assign: "", counts: fmt.Sprintf("%d/0/0/0/0/%d", v1alpha1.MaxHeldNodesListed+5, v1alpha1.MaxHeldNodesListed+5)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			target := r2
			if tc.target != nil {
				target = *tc.target
			}
			in := Input{Pool: pool(tc.pool...), Target: target, Invalid: tc.invalid, Preview: tc.preview, Nodes: tc.nodes,
				Now: t0}
			if tc.leaderFor > 0 {
				in.TermStart = t0.Add(-tc.leaderFor)
			}
			p := Decide(in)
			var held []string
			for _, h := range p.Status.HeldNodes {
				held = append(held, h.Name+":"+h.Reason)
			}
			if len(held) > v1alpha1.MaxHeldNodesListed {
				t.Errorf("%d heldNodes, want at most %d", len(held), v1alpha1.MaxHeldNodesListed)
			}
			if got := strings.Join(held, ","); tc.held != "" && got != tc.held || tc.held == "" && int(p.Status.Nodes.Held) != len(held) &&
				len(held) != v1alpha1.MaxHeldNodesListed {
				t.Errorf("heldNodes %q, want %q (held %d)", got, tc.held, p.Status.Nodes.Held)
			}
			if got := strings.Join(p.Assign, ","); got != tc.assign {
				t.Errorf("assign %q, want %q", got, tc.assign)
			}
			if got := strings.Join(p.Repair, ","); got != tc.repair {
				t.Errorf("repair %q, want %q", got, tc.repair)
			}
			c := p.Status.Nodes
			if got := fmt.Sprintf("%d/%d/%d/%d/%d/%d", c.Selected, c.Updated, c.Ready, c.InProgress, c.Failed, c.Held); got != tc.counts {
				t.Errorf("counts %s, want %s", got, tc.counts)
			}
			for typ, want := range tc.conds {
				cond := meta.FindStatusCondition(p.Status.Conditions, typ)
				if cond == nil {
					t.Errorf("condition %s missing", typ)
					continue
				}
				if got := string(cond.Status) + "/" + cond.Reason; got != want {
					t.Errorf("condition %s = %s (%s), want %s", typ, got, cond.Message, want)
				}
			}
			for typ, want := range tc.message {
				if cond := meta.FindStatusCondition(p.Status.Conditions, typ); cond == nil || !strings.Contains(cond.Message, want) {
					t.Errorf("condition %s message %+v, want one with %q", typ, cond, want)
				}
			}
			if p.RequeueAfter != tc.requeue {
				t.Errorf("requeue after %v, want %v", p.RequeueAfter, tc.requeue)
			}
			want := 7 // Paused, ConfigInvalid, Halted, Degraded, Updated, Updating, Drifted
			if tc.preview != nil {
				if tc.preview.Condition.Reason != "" {
					want++ // Previewed
				}
				if p.Status.Preview == nil || p.Status.Preview.Revision != tc.preview.Status.Revision {
					t.Errorf("status.preview %+v, want %+v", p.Status.Preview, tc.preview.Status)
				}
			}
			if len(p.Status.Conditions) != want {
				t.Errorf("%d conditions, want all %d", len(p.Status.Conditions), want)
			}
		})
	}
}

func TestRevisionsAndBookkeeping(t *testing.T) {
	p := Decide(Input{Pool: pool(failedBefore("a", "r2", 0)), Target: r3, Nodes: []Node{waiting("a")}, Now: t0})
	if p.Status.CurrentRevision != "r3" || p.Status.PreviousRevision != "r2" {
		t.Errorf("revisions current %q previous %q, want r3 and r2", p.Status.CurrentRevision, p.Status.PreviousRevision)
	}
	if len(p.Status.FailedNodes) != 0 {
		t.Errorf("failedNodes %v kept from the earlier revision", p.Status.FailedNodes)
	}
	if p.Status.ObservedGeneration != 3 {
		t.Errorf("observedGeneration %d, want 3", p.Status.ObservedGeneration)
	}
	if p.Status.LastAssignmentTime == nil || !p.Status.LastAssignmentTime.Time.Equal(t0) {
		t.Errorf("lastAssignmentTime %v, want %v", p.Status.LastAssignmentTime, t0)
	}

	// Same revision: previous stays; a condition that does not change keeps its transition time.
	again := pool(func(pl *v1alpha1.KubeletConfigPool) { pl.Status = p.Status })
	q := Decide(Input{Pool: again, Target: r3, Nodes: []Node{{Name: "a", Assigned: true, AssignedAt: t0, Ready: true, Status: status(r1, r1, r1, "")}}, Now: t0.Add(time.Minute)})
	if q.Status.CurrentRevision != "r3" || q.Status.PreviousRevision != "r2" {
		t.Errorf("revisions current %q previous %q, want r3 and r2", q.Status.CurrentRevision, q.Status.PreviousRevision)
	}
	if c := meta.FindStatusCondition(q.Status.Conditions, v1alpha1.ConditionHalted); c == nil || !c.LastTransitionTime.Time.Equal(t0) {
		t.Errorf("Halted condition %+v: transition time moved though it did not change", c)
	}
	// The input is not modified (it may be an informer's cached object).
	if again.Status.LastAssignmentTime == q.Status.LastAssignmentTime || &again.Status.Conditions[0] == &q.Status.Conditions[0] {
		t.Error("the plan's status shares memory with the pool's")
	}
}

// TestInProgressNeverExceedsMaxUnavailable plays seeded rollouts: nodes move on by chance (sync, restart,
// Ready, trial) towards whatever revision they are assigned, some unrelated nodes go NotReady for a
// while, the controller assigns what the plan says, and halfway through the config is edited (r2 becomes
// r3) while nodes still restart on r2. At every step the nodes really unavailable (not Ready, or not yet
// proven on the revision the pool assigned them — judged from the simulation, not from the plan), counting
// those assigned now, stay within maxUnavailable, and every rollout completes.
func TestInProgressNeverExceedsMaxUnavailable(t *testing.T) {
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 1))
		const size = 200
		pl := pool(maxUnavailable(intstr.FromString("10%")))
		nodes := names(size, waiting)
		now := t0
		target := r2
		done := false
		for step := 0; step < 2000 && !done; step++ {
			for i := range nodes {
				n := &nodes[i]
				// Unrelated outages: 1% of the time a Ready node drops, a dropped one comes back half the time.
				if n.Ready && rng.IntN(100) == 0 || !n.Ready && rng.IntN(2) == 0 {
					n.Ready = !n.Ready
				}
				if n.Revision == "" || rng.IntN(3) != 0 {
					continue
				}
				switch st, src := &n.Status, resolved(n.Source); {
				case !sameSource(st.Assigned, n.Source):
					st.Assigned = src
				case !sameSource(st.Active, n.Source):
					st.Active = src
				default:
					st.LastKnownGood = src
				}
			}
			// The in-place edit, once the first batches are in.
			if target.Revision == "r2" && pl.Status.Nodes.Updated >= size/4 {
				target = r3
				for i := range nodes {
					nodes[i].Assigned = false
				}
			}
			p := Decide(Input{Pool: pl, Target: target, Nodes: nodes, Now: now})
			unavailable := 0
			for _, n := range nodes {
				if !n.Ready || n.Revision != "" && !(sameSource(n.Status.Active, n.Source) && sameSource(n.Status.LastKnownGood, n.Source)) {
					unavailable++
				}
			}
			if unavailable+len(p.Assign) > p.MaxUnavailable && len(p.Assign) > 0 {
				t.Fatalf("seed %d step %d: %d unavailable and %d assigned, maxUnavailable %d", seed, step, unavailable, len(p.Assign), p.MaxUnavailable)
			}
			if p.Status.Nodes.InProgress+int32(len(p.Assign)) > int32(p.MaxUnavailable) {
				t.Fatalf("seed %d step %d: %d in progress + %d assigned > maxUnavailable %d", seed, step, p.Status.Nodes.InProgress, len(p.Assign), p.MaxUnavailable)
			}
			for _, name := range p.Assign {
				i := slices.IndexFunc(nodes, func(n Node) bool { return n.Name == name })
				nodes[i].Assigned, nodes[i].AssignedAt = true, now
				nodes[i].Revision, nodes[i].Source = target.Revision, target.Source
			}
			pl.Status = p.Status
			done = target.Revision == "r3" && p.Status.Nodes.Updated == size
			now = now.Add(10 * time.Second)
		}
		if !done {
			t.Fatalf("seed %d: rollout not complete: %+v", seed, pl.Status.Nodes)
		}
	}
}

// A condition message past metav1.Condition's limit would make the status write fail for ever.
func TestLongMessagesAreCut(t *testing.T) {
	long := strings.Repeat("é", 20000) // 40000 bytes
	p := Decide(Input{Pool: pool(), Target: r2, Invalid: &Invalid{Reason: v1alpha1.ReasonValidationFailed, Message: long},
		Nodes: []Node{waiting("a")}, Now: t0})
	for _, c := range p.Status.Conditions {
		if len(c.Message) > 32768 || !utf8.ValidString(c.Message) {
			t.Errorf("condition %s: message of %d bytes (valid UTF-8: %v)", c.Type, len(c.Message), utf8.ValidString(c.Message))
		}
	}
}

// TestDriftRepairRules: which drifted nodes a pool asks to repair (Plan.Repair, with a free slot) and whose
// standing request it withdraws (Plan.Withdraw).
func TestDriftRepairRules(t *testing.T) {
	asked := func(cause string, before []string, n Node) Node {
		n = repairAsked(time.Minute, n)
		n.Repair.Cause, n.Repair.Asked = cause, before
		return n
	}
	for _, tc := range []struct {
		name             string
		pool             []func(*v1alpha1.KubeletConfigPool)
		node             Node
		repair, withdraw bool
	}{
		{name: "Restore, never asked", pool: mods(restore), node: drifted(updated("a")), repair: true},
		{name: "Restore, asked about this drift: in progress", pool: mods(restore), node: repairAsked(time.Minute, drifted(updated("a")))},
		{name: "Restore, a forged request dated ahead: asked again", pool: mods(restore), node: repairAsked(-time.Hour, drifted(updated("a"))),
			repair: true},
		{name: "Restore, asked for another cause before: asked for this one", pool: mods(restore),
			node: asked(nodeconfig.DriftWiringReplaced, nil, drifted(updated("a"))), repair: true},
		{name: "Restore, this cause asked for two requests ago: found again, not asked", pool: mods(restore),
			node: driftAgain(time.Second, asked(nodeconfig.DriftWiringReplaced, []string{nodeconfig.DriftWiringRemoved}, drifted(updated("a"))))},
		{name: "Report, a request about the standing drift: withdrawn", node: repairAsked(time.Minute, drifted(updated("a"))), withdraw: true},
		{name: "Report, a request about an earlier drift: left alone", node: driftAgain(time.Second, repairAsked(time.Minute, drifted(updated("a"))))},
		{name: "Report, never asked", node: drifted(updated("a"))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := Decide(Input{Pool: pool(tc.pool...), Target: r2, Nodes: []Node{tc.node}, Now: t0})
			if got := len(p.Repair) == 1; got != tc.repair {
				t.Errorf("repair %v, want %v (verdicts %+v)", p.Repair, tc.repair, p.Nodes)
			}
			if got := len(p.Withdraw) == 1; got != tc.withdraw {
				t.Errorf("withdraw %v, want %v", p.Withdraw, tc.withdraw)
			}
		})
	}
}
