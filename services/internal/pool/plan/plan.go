// SPDX-License-Identifier: Apache-2.0

// Package plan decides a KubeletConfigPool's next step: given the pool, the revision to roll out, the
// selected Nodes as the controller sees them, and the time, which nodes to assign now, what state each
// node is in and why, and the pool's new status (counts, conditions, failed nodes). It is pure — no
// client, no clock — so every rule is a table row in plan_test.go, and docs/design.md's
// "KubeletConfigPool" table is that test's table; each of Decide's steps has a table of its own in
// steps_test.go.
//
// The caller plans on a view that includes its own earlier assignments (a ReplicaSet controller's
// "expectations"): a node assigned a moment ago and not yet seen so in the informer cache would look
// unassigned and free a slot it does not free.
package plan

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/dkc-dev/dkc/api/v1alpha1"
	"github.com/dkc-dev/dkc/internal/nodeconfig"
	"github.com/dkc-dev/dkc/services/internal/pool/window"
)

// Target is the revision the pool rolls out.
type Target struct {
	// Revision is its name (revision.Name); "" while the pool has none (its config never was valid).
	Revision string
	// Source is what a node assigned the revision has as its source: the snapshot (revision.Source). Node
	// statuses are compared with it by namespace, name and key (a snapshot is immutable, and a resolved
	// status source adds UID and ResourceVersion).
	Source corev1.ConfigMapNodeConfigSource
	// PerNode: the pool computes values per node (spec.perNode). Nodes are then each selected node's own
	// revision of Revision, by node name: a node's Revision, Source and Refused are its own there (For). A
	// node missing from it (its own revision is not known now: the config is invalid) is judged against
	// Revision itself.
	PerNode bool
	Nodes   map[string]NodeTarget
	// Refused, on a node's own target (For), says why the node cannot be assigned it: its values could not
	// be computed, or its kubelet's minor refuses its computed config. The node fails it untouched.
	Refused string
}

// Uncomputed is the revision of a node whose values cannot be computed (NodeTarget.Revision): no revision
// name is ever this word, so its failure goes once the node has values again, whatever they make.
const Uncomputed = "uncomputed"

// NodeTarget is one node's own revision of a pool's revision, with its computed values.
type NodeTarget struct {
	Revision string
	Source   corev1.ConfigMapNodeConfigSource
	// Values are the node's computed fields and exceptions, as status.nodeRevisions lists them.
	Values []string
	// Refused: see Target.Refused.
	Refused string
	// NextChange is when the node's values change though nothing else does (an exception expires); zero:
	// never.
	NextChange time.Time
}

// For is node's target: its own revision when the pool computes values per node, else t.
func (t Target) For(node string) Target {
	nt, ok := t.Nodes[node]
	if !ok {
		return Target{Revision: t.Revision, Source: t.Source}
	}
	return Target{Revision: nt.Revision, Source: nt.Source, Refused: nt.Refused}
}

// Revisions are the revisions nodes are judged against: Revision and every node's own.
func (t Target) Revisions() map[string]bool {
	out := map[string]bool{}
	if t.Revision != "" {
		out[t.Revision] = true
	}
	for _, nt := range t.Nodes {
		out[nt.Revision] = true
	}
	return out
}

// Invalid says why the pool's newest config cannot be rolled out; nothing is assigned while it is set.
// Reason is a ConfigInvalid reason (v1alpha1.ReasonConfigMapNotFound, ...).
type Invalid struct {
	Reason  string
	Message string
}

// Preview is where the pool's preview of its new revision stands (the controller asks the selected
// nodes' sidecars what the revision would do there before assigning it to any node).
type Preview struct {
	// Status is status.preview to write.
	Status *v1alpha1.PreviewStatus
	// Condition is the Previewed condition to set: its Status, Reason and Message (Reason "" leaves the
	// condition as it is).
	Condition metav1.Condition
	// Waiting: answers are outstanding. Nothing new is assigned meanwhile (Target is the last revision, if
	// any, and the nodes are still judged against it), and the Updating condition says so with Message.
	Waiting bool
	Message string
	// Wait is when to decide again though nothing changes: the preview's timeout, or its re-check.
	Wait time.Duration
}

// Node is a selected Node as the controller sees it.
type Node struct {
	Name string
	// Assigned: the node's source (resolve.NodeSource) is the target's snapshot.
	Assigned bool
	// AssignedAt is when the pool assigned it (v1alpha1.Assignment.Time) the target, or Revision when it
	// is not assigned the target; zero when unknown, and then no timeout is judged.
	AssignedAt time.Time
	// Revision is the pool revision the node's source names: v1alpha1.Assignment.Revision of its
	// v1alpha1.AnnotationAssignment while its source is still what the pool assigned; "" when the pool
	// never assigned it or it was changed by hand since.
	Revision string
	// Source is Revision's snapshot, the node's source (resolve.NodeSource), when Revision is set.
	Source corev1.ConfigMapNodeConfigSource
	// Status is the node's dkc.dev/config-status (zero: nothing reported yet).
	Status corev1.NodeConfigStatus
	// Ready is the Node's Ready condition.
	Ready bool
	// OtherPools are the other pools whose selector picks the node.
	OtherPools []string
	// HandAssigned: the pool assigned the node (its v1alpha1.AnnotationAssignment) and its source has
	// named something else since.
	HandAssigned bool
	// NoSidecar says why the dkc sidecar does not run on the node, "" when it may: the DaemonSet's own
	// node selection leaves it out (not Linux, or labelled dkc.dev/sidecar=disabled). Nothing there
	// would ever apply an assignment.
	NoSidecar string
	// Detail is the sidecar's account of Status.Error (what its ConfigOK condition says), "" when none: a
	// node that must be drained first names there what stands in the way (state files, pods new eviction
	// thresholds would evict).
	Detail string
	// NoStatus: the Node has no dkc.dev/config-status at all, so its sidecar never reported (not
	// scheduled there, not started yet, never connected), or the annotation was lost. Status is then zero
	// and says nothing.
	NoStatus bool
	// Drift is the Node's ConfigDrift condition when True, as "<cause>: <message>"; "" when its kubelet
	// runs what its sidecar last checked it against.
	Drift string
	// DriftCause is the ConfigDrift condition's reason when Drift is set, and DriftSince when it last
	// turned True.
	DriftCause string
	DriftSince time.Time
	// Repair is the pool's request that the node repair its drift (nodeconfig.DriftRepairAnnotation, or
	// one just made that the cache does not show yet) when it names the node's source; nil otherwise.
	Repair *nodeconfig.DriftRepair
	// Draining says how the pool's drain of the node goes ("" when none runs), for the verdict's detail;
	// DrainFailed why it failed ("" unless it did).
	Draining, DrainFailed string
	// Pods are the pods that ran on the node before it was assigned the target and fared badly since:
	// lost their readiness, or were failed by the kubelet. Nil when the controller did not look (the gate
	// is off, or the node is past it).
	Pods []Pod
}

// Pod is a pod that ran on a node before the pool assigned the node the target, and fared badly since.
type Pod struct {
	// Name is namespace/name.
	Name string
	// NotReadySince is when it lost its readiness, after the assignment; zero when Failed is set.
	NotReadySince time.Time
	// Failed says how the kubelet failed or evicted it after the assignment ("OutOfpods: ..."); "" unless
	// it did.
	Failed string
}

// Input is everything a decision depends on.
type Input struct {
	Pool   *v1alpha1.KubeletConfigPool
	Target Target
	// Invalid, when set, stops new assignments; Target is then the last valid revision, if any, and the
	// nodes are still judged against it.
	Invalid *Invalid
	// Preview, when set, is the preview of the new revision; while it waits, nothing new is assigned.
	Preview *Preview
	Nodes   []Node
	Now     time.Time
	// TermStart is when the current leader's term began (the controller's start as leader). Time before
	// it, when no leader watched the nodes (dkc-server down, or a status annotation not written because
	// no replica ran), counts towards no node's nodeTimeout. Zero: unknown, the assignment time alone.
	TermStart time.Time
	// Budgets, when set, are the PodDisruptionBudgets a batch must keep: no node is assigned whose
	// kubelet's restart, with those of the nodes restarting now, would take a budget below what it allows.
	Budgets Budgets
}

// Budgets is what kubelet restarts cost PodDisruptionBudgets: the Ready pods they would take from Ready
// (a 1.34 kubelet's restart sets every container with a readiness or startup probe not Ready until the
// probe passes again, kubernetes#100277). Decide asks only about the nodes restarting now and the
// candidates of a batch, so the caller reads the pods of no other node.
type Budgets interface {
	// Allowed is how many more of the budget's pods may stop being Ready now (the budget's healthy pods
	// less its desired healthy); budgets are named namespace/name.
	Allowed(budget string) int
	// Most is what the budget allows with every pod it expects healthy (expected less desired healthy).
	Most(budget string) int
	// Takes is how many Ready pods of each budget a restart of node's kubelet takes from Ready (nil: none).
	Takes(node string) map[string]int
}

// State is where a node stands with the target revision.
type State string

const (
	// Pending: not assigned the target yet.
	Pending State = "Pending"
	// InProgress: assigned the target, not yet proven.
	InProgress State = "InProgress"
	// Updated: runs the target and has it as last-known-good.
	Updated State = "Updated"
	// Failed: failed the target (v1alpha1.Failure* says how).
	Failed State = "Failed"
	// Held: the pool leaves it alone.
	Held State = "Held"
	// Drifted: was updated, and its kubelet runs something else since (Node.Drift): not updated, and not
	// the pool's to restart (its sidecar reports the cause).
	Drifted State = "Drifted"
)

// Why a node is in its state (Failed nodes use the v1alpha1.Failure* reasons).
const (
	// Pending
	ReasonNotAssigned = "NotAssigned"
	// InProgress
	ReasonNotActive = "NotActive" // the node does not run it yet: syncing, checking, restarting
	ReasonRetrying  = "Retrying"  // the node reports an error it retries (not the config's fault)
	ReasonNotReady  = "NotReady"  // the node runs it, the Node is not Ready
	ReasonInTrial   = "InTrial"   // runs it, Ready, not yet last-known-good
	// ReasonPodsNotReady: runs it as last-known-good; pods that ran there before are not Ready again yet
	ReasonPodsNotReady = "PodsNotReady"
	// ReasonDraining: its sidecar says the node must be drained first, and the pool drains it.
	ReasonDraining = "Draining"
	// the pool assigned the node an earlier revision (an in-place edit or an undo since), not yet proven
	ReasonPreviousRevision = "PreviousRevision"
	// Updated
	ReasonProven = "Proven"
	// Drifted: its sidecar found the kubelet running something else (Node.Drift says what)
	ReasonDrifted = "KubeletDrifted"
	// InProgress: the pool asked its sidecar to repair its drift (spec.drift.policy Restore)
	ReasonRepairingDrift = "RepairingDrift"
	// Held
	ReasonHandAssigned         = "HandAssigned"
	ReasonSelectedByOtherPools = "SelectedByOtherPools"
	ReasonNoSidecar            = "NoSidecar" // the sidecar DaemonSet does not run on it
	// Held when not assigned: its sidecar never reported, so nothing shows it would apply an assignment.
	// In progress when assigned: not timed out until a status shows where it stands.
	ReasonNotReported = "NotReported"
)

// Verdict is one node's state.
type Verdict struct {
	Name   string
	State  State
	Reason string
	// Detail is for humans: the status error, what an in-progress node waits for, the other pools.
	Detail string
	// Ready is the Node's Ready condition; a node that is not Ready, or in progress, is unavailable.
	Ready bool
	// Changing: a held node whose own config is not settled (syncing, restarting, in its trial): the pool
	// did not start it, but the node may restart or roll back all the same, so it takes a slot.
	Changing bool
	// Repair: a drifted node the pool may ask to repair its drift (spec.drift.policy Restore), once a slot
	// is free.
	Repair bool
}

// Unavailable says whether the node takes one of maxUnavailable's slots.
func (v Verdict) Unavailable() bool { return v.State == InProgress || v.Changing || !v.Ready }

// Plan is a decision.
type Plan struct {
	// Assign are the nodes to assign the target now, by name.
	Assign []string
	// Repair are the drifted nodes whose sidecar to ask now to repair their drift, by name; Withdraw those
	// whose standing request to take back (the pool no longer restores drift).
	Repair, Withdraw []string
	// Nodes are the verdicts, by name.
	Nodes []Verdict
	// Status is the pool's new status.
	Status v1alpha1.KubeletConfigPoolStatus
	// MaxUnavailable is spec.maxUnavailable scaled to the selected nodes.
	MaxUnavailable int
	// RequeueAfter is when to decide again though nothing changes (a node's timeout, the end of a pause
	// between batches); 0: only when something changes.
	RequeueAfter time.Duration
}

// Decide plans the pool's next step. The rules, in the order they apply to a node:
//
//  1. A failure recorded for the target revision stays (status.failedNodes), whatever the node shows now,
//     and even once the node is gone (deleted, or no longer selected).
//  2. A node another pool also selects is held, and so is one assigned by hand. A held node whose own
//     config is not settled (not running what it was assigned, or in its trial, unless it refused it) is
//     unavailable: it may restart or roll back whoever assigned it. A node the sidecar DaemonSet does not
//     run on is held (unless it already proved the target), and so is one whose sidecar never reported a
//     status and that the pool has not assigned anything: an assignment there would never be applied,
//     and would only wait out nodeTimeout and halt the pool.
//  3. A node the pool assigned an earlier revision (the config changed mid-rollout) that has not proven it
//     yet — not active, not Ready or in its trial — is in progress: it restarts or may roll back, so it
//     takes a slot, and failed once so for nodeTimeout since that assignment. One that refused it is not
//     in progress any more.
//  4. Any other node not assigned the target is pending.
//  5. A node whose status shows an error about the target is failed, unless the error is one the sidecar
//     retries (not the config's fault): then it is in progress.
//  6. A node that runs the target and has it as last-known-good is updated (ready if Ready).
//  7. Otherwise it is in progress — not active, not Ready, or in its trial — and failed once in progress
//     for nodeTimeout since its assignment.
//
// nodeTimeout counts from the assignment or from the start of the current leader's term, whichever is
// later (no time when no leader watched counts), and only fails a node that has a status to judge: one
// whose status annotation is gone stays in progress (NotReported) until a status shows where it stands.
//
// Then the pool: halted when the failures counted (recorded under the current spec.retry) reach
// maxFailures; nothing is assigned while the config or the maintenance windows are invalid, the pool is
// halted or paused, no maintenance window is open, or a batch runs or pauses (pauseBetweenBatches);
// otherwise Ready pending nodes fill the free slots of maxUnavailable, which every unavailable selected
// node takes (in progress, held and changing, or not Ready).
//
// Decide runs them as steps, in this order: judgeNodes (the node rules, TestNodeRules' rows), then for the
// pool count, halt (the failure budget), gates (the Updating condition, and what is assigned) and
// conditions (the others) — each with a table of its own in steps_test.go, and TestPoolRules' rows for
// them together.
func Decide(in Input) Plan {
	pool, now := in.Pool, in.Now
	st := carried(pool, in.Target.Revision)
	j := judgeNodes(in)
	st.FailedNodes = j.failed
	t := count(j.verdicts)
	st.Nodes, st.HeldNodes = t.nodes, t.held
	b := halt(st.FailedNodes, &pool.Spec)
	p := Plan{Nodes: j.verdicts, MaxUnavailable: scaled(pool.Spec.MaxUnavailableOrDefault(), int(t.nodes.Selected))}
	st.BatchCompletionTime = batchCompletion(st, now)
	w := maintenance(pool, now)
	st.MaintenanceWindow = w.status

	g := gates(in, t, b.halted, st.BatchCompletionTime, p.MaxUnavailable, w, j.podWaits)
	if len(g.assign) > 0 {
		p.Assign = g.assign
		st.LastAssignmentTime = &metav1.Time{Time: now}
	}
	p.Withdraw = withdrawn(in)
	if p.Repair = repairs(in, t, g, b.halted, w, p.MaxUnavailable); len(p.Repair) > 0 {
		g = repairing(g, progress(t.nodes), p.Repair)
	}
	setCondition(&st, pool, now, v1alpha1.ConditionUpdating, g.status, g.reason, g.message)
	conditions(&st, in, b, j)
	driftCondition(&st, in, t.drifted)
	var previewWait time.Duration
	if pv := in.Preview; pv != nil {
		st.Preview = pv.Status.DeepCopy()
		if c := pv.Condition; c.Reason != "" {
			setCondition(&st, pool, now, v1alpha1.ConditionPreviewed, c.Status, c.Reason, c.Message)
		}
		previewWait = pv.Wait
	}

	st.NodeRevisions = nodeRevisions(in.Target, j.verdicts)
	p.Status = st
	p.RequeueAfter = soonest(append(j.requeue, g.wait, w.change, previewWait))
	return p
}

// win is where the pool stands with its maintenance windows.
type win struct {
	// err: spec.maintenanceWindows cannot be read; nothing is assigned.
	err error
	// state at the decision's time (open, without windows).
	state window.State
	// status is status.maintenanceWindow: nil without windows.
	status *v1alpha1.MaintenanceWindowStatus
	// change is how long until a window opens or closes (0: never), when the status must be written again.
	change time.Duration
}

// maintenance reads the pool's maintenance windows and where now stands with them.
func maintenance(pool *v1alpha1.KubeletConfigPool, now time.Time) win {
	s, err := window.Parse(pool.Spec.MaintenanceWindows)
	if err != nil {
		return win{err: err}
	}
	w := win{state: s.At(now)}
	if s.Empty() {
		return w
	}
	w.status = &v1alpha1.MaintenanceWindowStatus{Open: w.state.Open}
	if !w.state.Close.IsZero() {
		w.status.CloseTime = &metav1.Time{Time: w.state.Close}
		w.change = w.state.Close.Sub(now)
	}
	if !w.state.Next.IsZero() {
		w.status.NextOpenTime = &metav1.Time{Time: w.state.Next}
		if !w.state.Open {
			w.change = w.state.Next.Sub(now)
		}
	}
	return w
}

// carried is the pool's new status before any node is judged: what the old one carries over (conditions
// keep their transition times until they change), and the target as the current revision.
func carried(pool *v1alpha1.KubeletConfigPool, target string) v1alpha1.KubeletConfigPoolStatus {
	old := &pool.Status
	st := v1alpha1.KubeletConfigPoolStatus{
		ObservedGeneration:  pool.Generation,
		CurrentRevision:     old.CurrentRevision,
		PreviousRevision:    old.PreviousRevision,
		Conditions:          slices.Clone(old.Conditions),
		LastAssignmentTime:  old.LastAssignmentTime.DeepCopy(),
		BatchCompletionTime: old.BatchCompletionTime.DeepCopy(),
		Preview:             old.Preview.DeepCopy(),
	}
	if target != "" && target != old.CurrentRevision {
		if old.CurrentRevision != "" {
			st.PreviousRevision = old.CurrentRevision
		}
		st.CurrentRevision = target
	}
	return st
}

// judged is what judgeNodes makes of the nodes.
type judged struct {
	// verdicts, by node name.
	verdicts []Verdict
	// failed is status.failedNodes: the target's failures, by node name, those of nodes gone included.
	failed []v1alpha1.FailedNode
	// gone are the failed nodes no longer selected.
	gone map[string]bool
	// overlaps say which pools select each node another pool selects too.
	overlaps []string
	// requeue are when in-progress nodes reach nodeTimeout, and podPoll while a node waits for its pods.
	requeue []time.Duration
	// podWaits name the nodes that wait for their pods, and the pods.
	podWaits []string
}

// judgeNodes applies the node rules (judge) to every selected node, in name order, and keeps the
// failures recorded for the target of nodes no longer selected.
func judgeNodes(in Input) judged {
	// Rule 1's record: failures of other revisions are forgotten with them. With per-node values a failure
	// of the target's values stands (its node gone too) while the node's own revision stays what it failed:
	// a node whose values change (a label, an exception, an expression) gets its new revision like any other
	// pending node.
	current := in.Target.Revisions()
	recorded := map[string]v1alpha1.FailedNode{}
	for _, f := range in.Pool.Status.FailedNodes {
		if current[f.Revision] || (in.Target.PerNode && f.PoolRevision != "" && f.PoolRevision == in.Target.Revision) {
			recorded[f.Name] = f
		}
	}

	nodes := slices.Clone(in.Nodes)
	slices.SortFunc(nodes, func(a, b Node) int { return strings.Compare(a.Name, b.Name) })

	timeout := in.Pool.Spec.NodeTimeoutOrDefault()
	clk := clock{timeout: timeout, podReadinessTimeout: in.Pool.Spec.PodReadinessTimeoutOrDefault(),
		termStart: in.TermStart, now: in.Now}
	j := judged{gone: map[string]bool{}}
	for _, n := range nodes {
		t := in.Target.For(n.Name)
		if f, ok := recorded[n.Name]; ok && f.Revision != t.Revision {
			// Its values changed since; but a node whose own revision is not known now (the values cannot be
			// computed while the config is invalid) keeps its failure.
			if _, own := in.Target.Nodes[n.Name]; own || f.PoolRevision == "" || !in.Target.PerNode {
				delete(recorded, n.Name)
			}
		}
		v, failure := judge(n, in.Pool, t, recorded, clk)
		if failure != nil && in.Target.PerNode && failure.PoolRevision == "" {
			failure.PoolRevision = in.Target.Revision
		}
		if nt, ok := in.Target.Nodes[n.Name]; ok && nt.NextChange.After(in.Now) {
			j.requeue = append(j.requeue, nt.NextChange.Sub(in.Now))
		}
		if v.State == InProgress && !n.AssignedAt.IsZero() && !n.NoStatus {
			j.requeue = append(j.requeue, later(n.AssignedAt, in.TermStart).Add(timeout).Sub(in.Now))
		}
		if v.Reason == ReasonRepairingDrift {
			j.requeue = append(j.requeue, n.Repair.RequestTime.Add(timeout).Sub(in.Now))
		}
		if v.Reason == ReasonPodsNotReady {
			j.requeue = append(j.requeue, podPoll)
			j.podWaits = append(j.podWaits, "node "+n.Name+": "+strings.TrimPrefix(v.Detail, podsDetailPrefix))
		}
		if failure != nil {
			j.failed = append(j.failed, *failure)
		}
		if v.Reason == ReasonSelectedByOtherPools {
			j.overlaps = append(j.overlaps, v.Detail)
		}
		j.verdicts = append(j.verdicts, v)
		delete(recorded, n.Name)
	}
	// Failures of nodes no longer selected (deleted, relabelled) stay too: node auto-repair replaces
	// exactly the failed nodes, and dropping their failures would lift the halt and push the bad revision
	// on with no operator action. Only a new revision or spec.retry forgives them.
	for _, name := range slices.Sorted(maps.Keys(recorded)) {
		j.failed = append(j.failed, recorded[name])
		j.gone[name] = true
	}
	slices.SortFunc(j.failed, func(a, b v1alpha1.FailedNode) int { return strings.Compare(a.Name, b.Name) })
	return j
}

// tally is what count makes of the verdicts.
type tally struct {
	// nodes is status.nodes.
	nodes v1alpha1.NodeCounts
	// held is status.heldNodes: the first v1alpha1.MaxHeldNodesListed held nodes.
	held []v1alpha1.HeldNode
	// pending are the pending nodes that are Ready, the only ones that may be assigned, by name.
	pending []string
	// unavailable are the nodes that take one of maxUnavailable's slots (Verdict.Unavailable).
	unavailable int
	// restarting are the nodes whose kubelet restarts or may restart now, by name: in progress, or held
	// and changing.
	restarting []string
	// drifted are the drifted nodes, as "name (cause: message)".
	drifted []string
	// repairable are the drifted nodes that are Ready and may be asked to repair their drift, by name.
	repairable []string
}

// notAssigned are the selected nodes not assigned the target: pending, Ready or not.
func (t tally) notAssigned() int {
	n := t.nodes
	return int(n.Selected - n.Updated - n.Drifted - n.InProgress - n.Failed - n.Held)
}

// progress is how far the rollout is, for the Updating and Updated conditions' messages.
func progress(n v1alpha1.NodeCounts) string {
	if n.Drifted > 0 {
		return fmt.Sprintf("%d of %d nodes updated, %d in progress, %d drifted", n.Updated, n.Selected, n.InProgress,
			n.Drifted)
	}
	return fmt.Sprintf("%d of %d nodes updated, %d in progress", n.Updated, n.Selected, n.InProgress)
}

// count counts the verdicts by state. An updated node counts as ready only when Ready; a pending one is
// assignable only when Ready, as a node down already takes a slot and would then take it twice.
func count(verdicts []Verdict) tally {
	var t tally
	for _, v := range verdicts {
		t.nodes.Selected++
		switch v.State {
		case Updated:
			t.nodes.Updated++
			if v.Ready {
				t.nodes.Ready++
			}
		case InProgress:
			t.nodes.InProgress++
		case Drifted:
			t.nodes.Drifted++
			t.drifted = append(t.drifted, v.Name+" ("+v.Detail+")")
			if v.Repair && v.Ready {
				t.repairable = append(t.repairable, v.Name)
			}
		case Failed:
			t.nodes.Failed++
		case Held:
			t.nodes.Held++
			if len(t.held) < v1alpha1.MaxHeldNodesListed {
				t.held = append(t.held, v1alpha1.HeldNode{Name: v.Name, Reason: v.Reason})
			}
		case Pending:
			if v.Ready {
				t.pending = append(t.pending, v.Name)
			}
		}
		if v.Unavailable() {
			t.unavailable++
		}
		if v.State == InProgress || v.Changing {
			t.restarting = append(t.restarting, v.Name)
		}
	}
	return t
}

// budget is the failure budget, spec.maxFailures, against the failures that count.
type budget struct {
	// counted are the failures recorded under the current spec.retry: a retry forgives the earlier ones
	// without forgetting them (the nodes stay failed).
	counted []v1alpha1.FailedNode
	max     int
	halted  bool
}

// halt says whether the failures that count exhaust maxFailures.
func halt(failed []v1alpha1.FailedNode, spec *v1alpha1.KubeletConfigPoolSpec) budget {
	b := budget{max: int(spec.MaxFailuresOrDefault())}
	for _, f := range failed {
		if f.Retry == spec.Retry {
			b.counted = append(b.counted, f)
		}
	}
	b.halted = len(b.counted) >= b.max
	return b
}

// summary is the budget for the Halted condition's message.
func (b budget) summary() string {
	if len(b.counted) == 1 {
		return fmt.Sprintf("1 failure counts against maxFailures %d", b.max)
	}
	return fmt.Sprintf("%d failures count against maxFailures %d", len(b.counted), b.max)
}

// batchCompletion is status.batchCompletionTime: a batch is complete the first time the pool sees nothing
// in progress after its last assignment, and pauseBetweenBatches counts from then.
func batchCompletion(st v1alpha1.KubeletConfigPoolStatus, now time.Time) *metav1.Time {
	if st.Nodes.InProgress == 0 && st.LastAssignmentTime != nil &&
		(st.BatchCompletionTime == nil || !st.BatchCompletionTime.After(st.LastAssignmentTime.Time)) {
		return &metav1.Time{Time: now}
	}
	return st.BatchCompletionTime
}

// gate is what gates decides: the Updating condition, the nodes to assign now, and how long the pause
// between batches has left (0: none).
type gate struct {
	status  metav1.ConditionStatus
	reason  string
	message string
	assign  []string
	wait    time.Duration
}

// gates decides whether anything is assigned now, and why not: the first gate that holds decides, in the
// order of what an operator must act on first (an invalid config or window, a halt, a pause), then what
// only waits (a closed maintenance window, a running batch, a pause between batches, no free slot).
// batchDone is status.batchCompletionTime after this decision's nodes (batchCompletion); podWaits name the
// nodes in progress that wait for their pods (judged.podWaits).
func gates(in Input, t tally, halted bool, batchDone *metav1.Time, maxUnavailable int, w win, podWaits []string) gate {
	spec, now, n := &in.Pool.Spec, in.Now, t.nodes
	prog := progress(n)
	pause := spec.PauseBetweenBatchesOrDefault()
	slots := maxUnavailable - t.unavailable
	stopped := func(reason, msg string) gate {
		return gate{status: metav1.ConditionFalse, reason: reason, message: msg}
	}
	rolling := func(reason, msg string) gate {
		return gate{status: metav1.ConditionTrue, reason: reason, message: msg}
	}
	// inProgress: what runs must finish first; when nodes wait for their pods, the reason says so.
	inProgress := func(msg string) gate {
		if len(podWaits) > 0 {
			return rolling(v1alpha1.ReasonWaitingForPods, msg+"; pods that ran before their kubelet restarted are "+
				"not Ready again: "+joinCapped(podWaits, "; "))
		}
		return rolling(v1alpha1.ReasonRollingOut, msg)
	}
	switch {
	case in.Invalid != nil:
		return stopped(v1alpha1.ReasonConfigInvalid, "the config cannot be rolled out: "+in.Invalid.Message)
	case in.Target.Revision == "" && (in.Preview == nil || !in.Preview.Waiting):
		return stopped(v1alpha1.ReasonConfigInvalid, "the pool has no revision to roll out yet")
	case w.err != nil:
		return stopped(v1alpha1.ReasonInvalidMaintenanceWindow, "nothing is assigned: "+w.err.Error())
	case halted:
		return stopped(v1alpha1.ReasonHalted, "the pool is halted: "+prog)
	case spec.Paused:
		return stopped(v1alpha1.ReasonPaused, "spec.paused: "+prog)
	case in.Preview != nil && in.Preview.Waiting:
		// Before any node is touched: a finding may refuse the revision. The target is still the last one.
		return rolling(v1alpha1.ReasonWaitingForPreview, in.Preview.Message)
	case t.notAssigned() == 0 && n.InProgress == 0:
		if n.Updated == n.Selected {
			return stopped(v1alpha1.ReasonRolloutComplete, prog)
		}
		return stopped(v1alpha1.ReasonNothingToAssign,
			fmt.Sprintf("%s; the others are failed (%d), held (%d) or drifted (%d)", prog, n.Failed, n.Held, n.Drifted))
	case t.notAssigned() == 0:
		return inProgress(prog)
	case !w.state.Open:
		g := rolling(v1alpha1.ReasonWaitingForMaintenanceWindow,
			fmt.Sprintf("%s; outside the pool's maintenance windows: nothing new is assigned until the next opens at %s",
				prog, w.state.Next.UTC().Format(time.RFC3339)))
		g.wait = w.state.Next.Sub(now)
		return g
	case pause > 0 && n.InProgress > 0:
		return inProgress(prog + "; the next batch starts when none is")
	case pause > 0 && batchDone != nil && now.Before(batchDone.Add(pause)):
		g := rolling(v1alpha1.ReasonWaitingBetweenBatches,
			fmt.Sprintf("%s; the next batch starts at %s (pauseBetweenBatches %v)",
				prog, batchDone.Add(pause).UTC().Format(time.RFC3339), pause))
		g.wait = batchDone.Add(pause).Sub(now)
		return g
	case slots <= 0 || len(t.pending) == 0:
		if n.InProgress > 0 {
			return inProgress(prog)
		}
		return rolling(v1alpha1.ReasonWaitingForAvailable,
			fmt.Sprintf("%s; %d selected nodes are not Ready (maxUnavailable %d): nothing is assigned until one is",
				prog, t.unavailable, maxUnavailable))
	default:
		assign, held, alone := fit(in, t, slots)
		if len(assign) == 0 && len(podWaits) > 0 {
			g := inProgress(prog)
			if len(held) > 0 {
				g.message += "; held back by PodDisruptionBudgets: " + joinCapped(held, "; ")
			}
			return g
		}
		if len(assign) == 0 {
			g := rolling(v1alpha1.ReasonWaitingForDisruptionBudget,
				fmt.Sprintf("%s; no node can restart now without taking a PodDisruptionBudget below what it allows: %s",
					prog, joinCapped(held, "; ")))
			g.wait = podPoll
			return g
		}
		g := rolling(v1alpha1.ReasonRollingOut,
			fmt.Sprintf("%s; assigning %d: %s", prog, len(assign), joinCapped(assign, ", ")))
		if len(alone) > 0 {
			g.message += "; " + joinCapped(alone, "; ")
		}
		if len(held) > 0 {
			// The budgets move with pods elsewhere (no event the pool watches): look again soon.
			g.message += "; held back by PodDisruptionBudgets: " + joinCapped(held, "; ")
			g.wait = podPoll
		}
		g.assign = assign
		return g
	}
}

// maxBudgetCandidates bounds how many pending nodes one decision weighs against the PodDisruptionBudgets:
// each costs a read of the node's pods.
const maxBudgetCandidates = 50

// fit picks up to slots of the Ready pending nodes, in order, whose kubelet restarts the
// PodDisruptionBudgets allow on top of the nodes restarting now: each budget's allowed disruptions less
// its Ready pods on the restarting nodes (about to lose their readiness, or lost it and Ready again — a
// moment of caution until the node is through), less those of the nodes picked before. held says, of each
// node left out, which budgets hold it. Without budgets the first slots are picked.
//
// A node that runs more of a budget's pods than the budget allows even with all of them healthy (both
// replicas of a two-replica Deployment with minAvailable 1, as dkc-server's own on a cluster with one
// control-plane node) could never restart by that rule, though an eviction-based drain would get through
// one pod at a time. It restarts alone among that budget's pods instead — the least disruption there is:
// when the budget has all the room it ever has (no node restarting now, nor picked before, takes from it),
// and then takes it all, so no other node that takes from it goes until it is through; alone says so. A
// budget that allows nothing at all (maxUnavailable 0) still holds it, as it holds a drain.
func fit(in Input, t tally, slots int) (assign, held, alone []string) {
	if in.Budgets == nil {
		return t.pending[:min(slots, len(t.pending))], nil, nil
	}
	left := map[string]int{}
	room := func(b string) int {
		if _, ok := left[b]; !ok {
			left[b] = in.Budgets.Allowed(b)
		}
		return left[b]
	}
	take := func(takes map[string]int) {
		for b, k := range takes {
			left[b] = room(b) - k
		}
	}
	for _, n := range t.restarting {
		take(in.Budgets.Takes(n))
	}
	for i, n := range t.pending {
		if len(assign) == slots || i == maxBudgetCandidates {
			break
		}
		takes := in.Budgets.Takes(n)
		var short, over []string
		for _, b := range slices.Sorted(maps.Keys(takes)) {
			k := takes[b]
			if k <= room(b) {
				continue
			}
			if most := in.Budgets.Most(b); most >= 1 && k > most {
				if room(b) >= most {
					over = append(over, fmt.Sprintf("%s (%d of its pods, it allows %d)", b, k, most))
					continue
				}
				short = append(short, fmt.Sprintf("%s allows %d more not Ready, its restart takes %d, more than "+
					"it ever allows (%d): it restarts alone once no other node restarting takes from it and its pods "+
					"are all healthy", b, max(room(b), 0), k, most))
				continue
			}
			short = append(short, fmt.Sprintf("%s allows %d more not Ready, its restart takes %d", b, max(room(b), 0), k))
		}
		if len(short) > 0 {
			held = append(held, "node "+n+": PodDisruptionBudget "+strings.Join(short, ", "))
			continue
		}
		take(takes)
		assign = append(assign, n)
		if len(over) > 0 {
			alone = append(alone, "node "+n+" restarts alone among the pods of PodDisruptionBudget "+
				strings.Join(over, ", ")+": it runs more of them than the budget allows at once")
		}
	}
	return assign, held, alone
}

// conditions sets the pool's conditions other than Updating (gates): Paused, ConfigInvalid, Halted,
// Degraded and Updated, from st's counts and failed nodes.
func conditions(st *v1alpha1.KubeletConfigPoolStatus, in Input, b budget, j judged) {
	pool, spec, target := in.Pool, &in.Pool.Spec, in.Target.Revision
	set := func(typ string, status metav1.ConditionStatus, reason, msg string) {
		setCondition(st, pool, in.Now, typ, status, reason, msg)
	}
	set(v1alpha1.ConditionPaused, boolStatus(spec.Paused),
		pick(spec.Paused, v1alpha1.ReasonPausedBySpec, v1alpha1.ReasonNotPaused), "")
	if in.Invalid != nil {
		set(v1alpha1.ConditionConfigInvalid, metav1.ConditionTrue, in.Invalid.Reason, in.Invalid.Message)
	} else {
		set(v1alpha1.ConditionConfigInvalid, metav1.ConditionFalse, v1alpha1.ReasonConfigValid, "")
	}
	if b.halted {
		set(v1alpha1.ConditionHalted, metav1.ConditionTrue, v1alpha1.ReasonFailureBudgetExhausted,
			fmt.Sprintf("%s of revision %s: %s; nothing more is assigned until the config changes or spec.retry does "+
				"(kubectl dkc rollout retry)", b.summary(), target, failedList(b.counted, j.gone)))
	} else {
		set(v1alpha1.ConditionHalted, metav1.ConditionFalse, v1alpha1.ReasonWithinFailureBudget, b.summary())
	}
	var degraded []string
	if len(st.FailedNodes) > 0 {
		degraded = append(degraded, "failed revision "+target+": "+failedList(st.FailedNodes, j.gone))
	}
	if len(j.overlaps) > 0 {
		degraded = append(degraded, "nodes selected by more than one pool, which none of them touches: "+
			joinCapped(j.overlaps, "; "))
	}
	switch {
	case len(st.FailedNodes) > 0:
		set(v1alpha1.ConditionDegraded, metav1.ConditionTrue, v1alpha1.ReasonNodesFailed, strings.Join(degraded, "; "))
	case len(j.overlaps) > 0:
		set(v1alpha1.ConditionDegraded, metav1.ConditionTrue, v1alpha1.ReasonSelectorOverlap, strings.Join(degraded, "; "))
	default:
		set(v1alpha1.ConditionDegraded, metav1.ConditionFalse, v1alpha1.ReasonAsExpected, "")
	}
	switch {
	case st.Nodes.Selected == 0:
		set(v1alpha1.ConditionUpdated, metav1.ConditionFalse, v1alpha1.ReasonNoNodesSelected,
			"the pool's nodeSelector matches no node")
	case target != "" && st.Nodes.Updated == st.Nodes.Selected:
		set(v1alpha1.ConditionUpdated, metav1.ConditionTrue, v1alpha1.ReasonAllNodesUpdated,
			fmt.Sprintf("all %d selected nodes run revision %s", st.Nodes.Selected, target))
	default:
		set(v1alpha1.ConditionUpdated, metav1.ConditionFalse, v1alpha1.ReasonNodesNotUpdated, progress(st.Nodes))
	}
}

// driftCondition sets the Drifted condition: True naming the drifted nodes and why, False when none is.
func driftCondition(st *v1alpha1.KubeletConfigPoolStatus, in Input, drifted []string) {
	if len(drifted) == 0 {
		setCondition(st, in.Pool, in.Now, v1alpha1.ConditionDrifted, metav1.ConditionFalse, v1alpha1.ReasonNoDrift,
			"every updated node's kubelet runs the revision as it was proven")
		return
	}
	setCondition(st, in.Pool, in.Now, v1alpha1.ConditionDrifted, metav1.ConditionTrue, v1alpha1.ReasonNodesDrifted,
		fmt.Sprintf("%d nodes updated to revision %s run something else than it (their ConfigDrift condition): %s",
			len(drifted), in.Target.Revision, joinCapped(drifted, "; ")))
}

// soonest is the shortest of ds that is positive, 0 if none is.
func soonest(ds []time.Duration) time.Duration {
	var out time.Duration
	for _, d := range ds {
		if d > 0 && (out == 0 || d < out) {
			out = d
		}
	}
	return out
}

// clock is what nodeTimeout and podReadinessTimeout are judged with.
type clock struct {
	timeout             time.Duration
	podReadinessTimeout time.Duration
	termStart           time.Time
	now                 time.Time
}

// podsDetailPrefix starts the detail of a node in progress for its pods.
const podsDetailPrefix = "the node runs it; waiting for pods that ran there before its kubelet restarted " +
	"to be Ready again: "

// podPoll is how often a pool with a node waiting for its pods decides again: a pod's readiness is no
// Node event, so nothing else would wake it.
const podPoll = 5 * time.Second

// failedPods names the pods the kubelet failed, "" when none.
func failedPods(pods []Pod) string {
	var items []string
	for _, p := range pods {
		if p.Failed != "" {
			items = append(items, p.Name+" ("+p.Failed+")")
		}
	}
	return joinCapped(items, ", ")
}

// notReadyPods names the pods not Ready again, "" when none, and when the first of them lost readiness.
func notReadyPods(pods []Pod) (string, time.Time) {
	var items []string
	var since time.Time
	for _, p := range pods {
		if p.Failed != "" || p.NotReadySince.IsZero() {
			continue
		}
		items = append(items, p.Name)
		if since.IsZero() || p.NotReadySince.Before(since) {
			since = p.NotReadySince
		}
	}
	return joinCapped(items, ", "), since
}

// later is the later of two times.
func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// timedOut says whether a node in progress since it was assigned at assignedAt has been so for nodeTimeout,
// counting only the current term and only when the node has a status (noStatus false) to judge; and, for
// the failure's message, for how long and from when.
func (c clock) timedOut(assignedAt time.Time, noStatus bool) (bool, string) {
	if assignedAt.IsZero() || noStatus {
		return false, ""
	}
	start, since := assignedAt, ""
	if c.termStart.After(assignedAt) {
		start = c.termStart
		since = " (counted from " + c.termStart.UTC().Format(time.RFC3339) + ", when this dkc-server became leader)"
	}
	in := c.now.Sub(start)
	if in < c.timeout {
		return false, ""
	}
	return true, fmt.Sprintf("in progress for %v, past nodeTimeout %v%s", in.Round(time.Second), c.timeout, since)
}

// judge applies the node rules (Decide's 1–7). It returns the failure to record, if the node failed.
func judge(n Node, p *v1alpha1.KubeletConfigPool, t Target, recorded map[string]v1alpha1.FailedNode,
	c clock) (Verdict, *v1alpha1.FailedNode) {
	pool, retry := p.Name, p.Spec.Retry
	v := Verdict{Name: n.Name, Ready: n.Ready}
	if f, ok := recorded[n.Name]; ok {
		v.State, v.Reason, v.Detail = Failed, f.Reason, f.Error
		return v, &f
	}
	if held, ok := hold(n, pool, t, v); ok {
		return held, nil
	}
	switch {
	case t.Refused != "" && !n.Assigned && !(n.Revision != "" && n.Revision != t.Revision && !settled(n.Status, n.Source)):
		// Never assigned: what its kubelet would refuse is not sent to it, and it keeps what it runs.
		v.State, v.Reason, v.Detail = Failed, v1alpha1.FailureConfigRefused, t.Refused
		return v, &v1alpha1.FailedNode{Name: n.Name, Revision: t.Revision, Reason: v1alpha1.FailureConfigRefused,
			Error: t.Refused, Retry: retry, Time: metav1.Time{Time: c.now}}
	case !n.Assigned && n.Revision != "" && n.Revision != t.Revision && !settled(n.Status, n.Source):
		v.State, v.Reason, v.Detail = InProgress, ReasonPreviousRevision,
			"the pool assigned it revision "+n.Revision+", not yet proven: "+waitsFor(n, n.Source)
		if out, why := c.timedOut(n.AssignedAt, n.NoStatus); out {
			// Recorded against the target: the failure must outlive the earlier revision to keep the node
			// (stuck, maybe restarting) out of the rollout.
			msg := fmt.Sprintf("%s: %s: %s", why, v.Reason, v.Detail)
			v.State, v.Reason, v.Detail = Failed, v1alpha1.FailureTimeout, msg
			return v, &v1alpha1.FailedNode{Name: n.Name, Revision: t.Revision, Reason: v1alpha1.FailureTimeout,
				Error: msg, Retry: retry, Time: metav1.Time{Time: c.now}}
		}
		return v, nil
	case !n.Assigned || t.Revision == "":
		v.State, v.Reason = Pending, ReasonNotAssigned
		if !n.Ready {
			v.Detail = "not Ready: assigned once it is"
		}
		return v, nil
	}
	return judgeTarget(n, t, c, retry, p.Spec.MayDrain(), p.Spec.RestoresDrift(), v)
}

// hold applies rule 2: whether the pool leaves the node alone, and why. It comes before the node's own
// state, as the pool must not act on a node it does not own, nor wait on one nothing applies its
// assignments on.
func hold(n Node, pool string, t Target, v Verdict) (Verdict, bool) {
	switch {
	case len(n.OtherPools) > 0:
		pools := append([]string{pool}, n.OtherPools...)
		slices.Sort(pools)
		v.State, v.Reason = Held, ReasonSelectedByOtherPools
		v.Detail = fmt.Sprintf("node %s is selected by pools %s", n.Name, strings.Join(slices.Compact(pools), ", "))
		v.Changing = changing(n.Status)
	case n.HandAssigned:
		v.State, v.Reason, v.Detail = Held, ReasonHandAssigned,
			"its source was set by hand after the pool assigned it; remove the annotation "+
				v1alpha1.AnnotationAssignment+" to give it back"
		v.Changing = changing(n.Status)
	case n.NoSidecar != "" && !(n.Assigned && proven(n.Status, t.Source)):
		// Nothing on the node applies an assignment: it keeps what it runs, so it is not changing either.
		v.State, v.Reason, v.Detail = Held, ReasonNoSidecar, "the dkc sidecar does not run on it: "+n.NoSidecar
	case n.NoStatus && !n.Assigned && n.Revision == "":
		v.State, v.Reason, v.Detail = Held, ReasonNotReported,
			"its sidecar has not reported a status ("+nodeconfig.StatusAnnotation+"): assigned once it has"
	default:
		return v, false
	}
	return v, true
}

// judgeTarget applies rules 5–7 to a node assigned the target: its status decides, and nodeTimeout.
func judgeTarget(n Node, t Target, c clock, retry int64, mayDrain, restore bool, v Verdict) (Verdict,
	*v1alpha1.FailedNode) {
	st := n.Status
	fail := func(reason, msg string) (Verdict, *v1alpha1.FailedNode) {
		v.State, v.Reason, v.Detail = Failed, reason, msg
		return v, &v1alpha1.FailedNode{Name: n.Name, Revision: t.Revision, Reason: reason, Error: msg, Retry: retry,
			Time: metav1.Time{Time: c.now}}
	}
	aboutTarget := sameSource(st.Assigned, t.Source)
	if aboutTarget && st.Error == string(nodeconfig.DrainRequiredError) {
		// The sidecar refused before touching the kubelet: it keeps what it runs until it is drained.
		switch {
		case !mayDrain:
			msg := st.Error + " (spec.disruption.drain is Never)"
			if n.Detail != "" {
				msg += ": " + n.Detail
			}
			return fail(v1alpha1.FailureDrainRequired, msg)
		case n.DrainFailed != "":
			return fail(v1alpha1.FailureDrainFailed, n.DrainFailed)
		}
		v.State, v.Reason, v.Detail = InProgress, ReasonDraining, n.Draining
		if v.Detail == "" {
			v.Detail = "the node must be drained first: draining it"
		}
		if out, why := c.timedOut(n.AssignedAt, n.NoStatus); out {
			return fail(v1alpha1.FailureTimeout, fmt.Sprintf("%s: %s: %s", why, v.Reason, v.Detail))
		}
		return v, nil
	}
	if aboutTarget && st.Error != "" && !retried(nodeconfig.StatusError(st.Error)) {
		if st.Error == string(nodeconfig.HealthError) {
			return fail(v1alpha1.FailureRolledBack, st.Error)
		}
		return fail(v1alpha1.FailureConfigRefused, st.Error)
	}
	pods := n.Pods
	if c.podReadinessTimeout == 0 {
		pods = nil // the gate is off
	}
	if failed := failedPods(pods); failed != "" {
		return fail(v1alpha1.FailurePodsFailed, "the kubelet failed pods that ran on the node before it was assigned "+
			"the revision: "+failed)
	}
	if sameSource(st.Active, t.Source) && sameSource(st.LastKnownGood, t.Source) {
		waiting, since := notReadyPods(pods)
		switch {
		case waiting == "" && n.Drift != "":
			// Proven once; what its kubelet runs now is not what was proven.
			return judgeDrift(n, c, restore, v), nil
		case waiting == "":
			v.State, v.Reason = Updated, ReasonProven
			return v, nil
		}
		// As nodeTimeout, only time a leader watched counts: after an outage of dkc-server its sidecars'
		// pods (Ready while their stream is open) are not Ready until they reconnect to the new leader.
		since = later(since, c.termStart)
		if !c.now.Before(since.Add(c.podReadinessTimeout)) {
			return fail(v1alpha1.FailurePodsNotReady, fmt.Sprintf("pods that ran on the node before its kubelet "+
				"restarted are not Ready again %v after they lost readiness (podReadinessTimeout %v): %s",
				c.now.Sub(since).Round(time.Second), c.podReadinessTimeout, waiting))
		}
		v.State, v.Reason, v.Detail = InProgress, ReasonPodsNotReady,
			podsDetailPrefix+waiting
		if out, why := c.timedOut(n.AssignedAt, n.NoStatus); out {
			return fail(v1alpha1.FailureTimeout, fmt.Sprintf("%s: %s: %s", why, v.Reason, v.Detail))
		}
		return v, nil
	}

	v.State = InProgress
	switch {
	case n.NoStatus:
		v.Reason, v.Detail = ReasonNotReported, "the node has no status ("+nodeconfig.StatusAnnotation+
			"): its sidecar is not connected, or the annotation was lost; not timed out until it reports"
	case !sameSource(st.Active, t.Source) && aboutTarget && st.Error != "":
		v.Reason, v.Detail = ReasonRetrying, st.Error
	case !sameSource(st.Active, t.Source):
		v.Reason, v.Detail = ReasonNotActive, "the node does not run it yet"
	case !n.Ready:
		v.Reason, v.Detail = ReasonNotReady, "the node runs it and is not Ready"
	default:
		v.Reason, v.Detail = ReasonInTrial, "the node runs it, in its last-known-good trial"
	}
	if out, why := c.timedOut(n.AssignedAt, n.NoStatus); out {
		return fail(v1alpha1.FailureTimeout, fmt.Sprintf("%s: %s: %s", why, v.Reason, v.Detail))
	}
	return v, nil
}

// settled says whether a node that the pool assigned source s is done with it: it runs s as
// last-known-good (Ready or not: a Node not Ready is unavailable anyway, and a later outage is not s's
// doing), or it refused s (then it runs its last-known-good and will not try s again).
func settled(st corev1.NodeConfigStatus, s corev1.ConfigMapNodeConfigSource) bool {
	if sameSource(st.Assigned, s) && st.Error != "" && !retried(nodeconfig.StatusError(st.Error)) {
		return true
	}
	return sameSource(st.Active, s) && sameSource(st.LastKnownGood, s)
}

// proven says whether a node runs s as its last-known-good.
func proven(st corev1.NodeConfigStatus, s corev1.ConfigMapNodeConfigSource) bool {
	return sameSource(st.Active, s) && sameSource(st.LastKnownGood, s)
}

// Unsettled says whether a node may restart its kubelet soon, whatever assigned it: its source src (nil:
// its local config) is not what its status shows assigned yet (its sidecar has yet to act on it), or its
// own config is not settled (changing).
func Unsettled(src *corev1.NodeConfigSource, st corev1.NodeConfigStatus) bool {
	return !equalSource(src, st.Assigned) || changing(st)
}

// changing says whether a node's own config is not settled, whatever its source: it does not run what it
// was assigned (syncing, restarting; unless it refused it for good, and then it runs its last-known-good),
// or runs it in its last-known-good trial.
func changing(st corev1.NodeConfigStatus) bool {
	if !equalSource(st.Assigned, st.Active) {
		return st.Error == "" || retried(nodeconfig.StatusError(st.Error))
	}
	return !equalSource(st.Active, st.LastKnownGood)
}

// equalSource compares two status sources by namespace, name and key; nil (or no ConfigMap) is the local
// config.
func equalSource(a, b *corev1.NodeConfigSource) bool {
	if a == nil || a.ConfigMap == nil || b == nil || b.ConfigMap == nil {
		return (a == nil || a.ConfigMap == nil) == (b == nil || b.ConfigMap == nil)
	}
	return sameSource(a, *b.ConfigMap)
}

// waitsFor says what a node assigned s waits for, for a verdict's detail.
func waitsFor(n Node, s corev1.ConfigMapNodeConfigSource) string {
	switch {
	case !sameSource(n.Status.Active, s):
		return "the node does not run it yet"
	case !n.Ready:
		return "the node runs it and is not Ready"
	default:
		return "the node runs it, in its last-known-good trial"
	}
}

// retried says whether a node's status error is one the sidecar or the service retries by itself, which
// does not blame the config (docs/design.md, "Where status is written"); every other error about the
// target fails the node. An error dkc does not know yet fails it too: halting on a new kind of failure is
// safer than pushing through it.
func retried(e nodeconfig.StatusError) bool {
	switch e {
	case nodeconfig.RestartError, nodeconfig.VerifyError, nodeconfig.VerifyTimeoutError,
		nodeconfig.InternalError, nodeconfig.SyncInternalError, nodeconfig.DownloadError:
		return true
	}
	return false
}

// sameSource says whether a status source (resolved: with UID and ResourceVersion) is the target's
// snapshot. Name, namespace and key are enough: a snapshot is immutable and named by its content.
func sameSource(s *corev1.NodeConfigSource, t corev1.ConfigMapNodeConfigSource) bool {
	if s == nil || s.ConfigMap == nil {
		return false
	}
	c := s.ConfigMap
	return c.Namespace == t.Namespace && c.Name == t.Name && c.KubeletConfigKey == t.KubeletConfigKey
}

// scaled is maxUnavailable of selected nodes: a percentage rounds down, as a Deployment's maxUnavailable
// and `kubectl dkc rollout --max-unavailable` do, and the result is at least 1 (a pool has no surge to
// make progress with 0).
func scaled(v intstr.IntOrString, selected int) int {
	n, err := intstr.GetScaledValueFromIntOrPercent(&v, selected, false)
	if err != nil {
		// The schema refuses such a value; a pool built in code gets the safest reading.
		return 1
	}
	return max(n, 1)
}

// maxListed bounds the nodes a condition message names; failedNodes has them all.
const maxListed = 10

// failedList names the failures fs; gone are the nodes no longer selected.
func failedList(fs []v1alpha1.FailedNode, gone map[string]bool) string {
	items := make([]string, 0, len(fs))
	for _, f := range fs {
		name := f.Name
		if gone[f.Name] {
			name += " (node gone)"
		}
		items = append(items, fmt.Sprintf("node %s: %s: %s", name, f.Reason, f.Error))
	}
	return joinCapped(items, "; ")
}

func joinCapped(items []string, sep string) string {
	if len(items) <= maxListed {
		return strings.Join(items, sep)
	}
	return strings.Join(items[:maxListed], sep) + fmt.Sprintf("%sand %d more", sep, len(items)-maxListed)
}

// maxMessage is metav1.Condition's limit on a message (the CRD's schema refuses a longer one).
const maxMessage = 32768

func truncate(msg string) string { return truncateTo(msg, maxMessage) }

func setCondition(st *v1alpha1.KubeletConfigPoolStatus, pool *v1alpha1.KubeletConfigPool, now time.Time,
	typ string, status metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{
		Type: typ, Status: status, Reason: reason, Message: truncate(msg),
		ObservedGeneration: pool.Generation, LastTransitionTime: metav1.Time{Time: now},
	})
}

func boolStatus(b bool) metav1.ConditionStatus {
	if b {
		return metav1.ConditionTrue
	}
	return metav1.ConditionFalse
}

func pick(b bool, yes, no string) string {
	if b {
		return yes
	}
	return no
}

// maxValueShown bounds each value status.nodeRevisions shows (the snapshot holds it whole).
const maxValueShown = 256

// truncateTo is s cut at a rune boundary to at most n bytes, marked " …" when cut.
func truncateTo(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const tail = " …"
	cut := n - len(tail)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + tail
}

// maxNodeRevisions bounds status.nodeRevisions.
const maxNodeRevisions = 100

// nodeRevisions is status.nodeRevisions: with per-node values, each node revision of the target with its
// values, the selected nodes to run it and those that do (Updated), by revision name.
func nodeRevisions(t Target, verdicts []Verdict) []v1alpha1.NodeRevision {
	if !t.PerNode {
		return nil
	}
	by := map[string]*v1alpha1.NodeRevision{}
	for _, v := range verdicts {
		nt, ok := t.Nodes[v.Name]
		if !ok || nt.Revision == Uncomputed {
			continue // no revision of its own: its values could not be computed
		}
		r := by[nt.Revision]
		if r == nil {
			r = &v1alpha1.NodeRevision{Revision: nt.Revision}
			for _, val := range nt.Values {
				r.Values = append(r.Values, truncateTo(val, maxValueShown))
			}
			by[nt.Revision] = r
		}
		r.Nodes++
		if v.State == Updated {
			r.Updated++
		}
	}
	out := make([]v1alpha1.NodeRevision, 0, len(by))
	for _, name := range slices.Sorted(maps.Keys(by)) {
		out = append(out, *by[name])
	}
	if len(out) > maxNodeRevisions {
		out = out[:maxNodeRevisions]
	}
	return out
}
