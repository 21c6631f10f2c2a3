// SPDX-License-Identifier: Apache-2.0

package plan

import (
	"fmt"
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dkc-dev/dkc/api/v1alpha1"
	"github.com/dkc-dev/dkc/internal/nodeconfig"
)

// judgeDrift judges a node that proved the target and whose kubelet runs something else since (Node.Drift).
// It is drifted: not updated, and no failure (the config did nothing wrong). With restore
// (spec.drift.policy Restore) and a cause its sidecar repairs (dkc's wiring), the pool asks the sidecar to
// repair it once a slot is free (Verdict.Repair), and counts it in progress while that drift stands, until
// nodeTimeout has passed since it asked. It asks once per cause and assigned version (DriftRepair.Asked): the
// same cause found again — a drift that turned True after the one the pool asked about — is reported, never
// repaired in a loop. A request dated in the future (not the pool's: its clock is now) asks nothing.
func judgeDrift(n Node, c clock, restore bool, v Verdict) Verdict {
	v.State, v.Reason, v.Detail = Drifted, ReasonDrifted, n.Drift
	if !restore {
		return v
	}
	if !nodeconfig.RepairableDrift(n.DriftCause) {
		v.Detail += " (not repaired: dkc repairs only its own wiring of the kubelet, not the node's flags, " +
			"drop-ins or kubelet binary)"
		return v
	}
	r := n.Repair
	if r != nil && r.RequestTime.After(c.now.Add(maxClockSkew)) {
		r = nil
	}
	asked := ""
	if r != nil {
		asked = r.RequestTime.UTC().Format(time.RFC3339)
	}
	switch {
	case r == nil || !r.AskedFor(n.DriftCause):
		v.Repair = true
		v.Detail += " (repaired once a slot is free: spec.drift.policy Restore)"
	case r.Cause != n.DriftCause || !r.DriftSince.Equal(n.DriftSince):
		v.Detail += fmt.Sprintf(" (found again after the repair the pool asked for at %s: not repaired again "+
			"while the node is assigned this revision)", asked)
	case c.now.Before(r.RequestTime.Add(c.timeout)):
		v.State, v.Reason = InProgress, ReasonRepairingDrift
		v.Detail = fmt.Sprintf("its sidecar was asked at %s to repair its drift: %s", asked, n.Drift)
	default:
		v.Detail += fmt.Sprintf(" (the repair the pool asked for at %s did not end it within nodeTimeout %v: "+
			"not repaired again)", asked, c.timeout)
	}
	return v
}

// maxClockSkew is how far in the future a repair request's time may lie and still be taken for the pool's:
// replicas' clocks differ by a little.
const maxClockSkew = time.Minute

// withdrawn are the nodes whose repair request still stands (it is about the drift the node shows now)
// while the pool does not restore drift (the policy changed): the request is withdrawn, so that no sidecar
// restarts a kubelet the pool no longer counts as in progress.
func withdrawn(in Input) []string {
	if in.Pool.Spec.RestoresDrift() {
		return nil
	}
	var out []string
	for _, n := range in.Nodes {
		if r := n.Repair; r != nil && r.Cause == n.DriftCause && r.DriftSince.Equal(n.DriftSince) {
			out = append(out, n.Name)
		}
	}
	slices.Sort(out)
	return out
}

// repairs picks the drifted nodes to ask for a repair now: only while the pool may assign (no invalid
// config or window, not halted or paused, a window open, no preview waited for), in the slots of
// maxUnavailable left after the gate's assignments, and as the PodDisruptionBudgets allow (fit), a repair
// restarting the kubelet as an assignment does. pauseBetweenBatches does not apply: a repair is no batch
// of the rollout.
func repairs(in Input, t tally, g gate, halted bool, w win, maxUnavailable int) []string {
	spec := &in.Pool.Spec
	if len(t.repairable) == 0 || in.Invalid != nil || halted || spec.Paused || w.err != nil || !w.state.Open ||
		(in.Preview != nil && in.Preview.Waiting) {
		return nil
	}
	slots := maxUnavailable - t.unavailable - len(g.assign)
	if slots <= 0 {
		return nil
	}
	rt := t
	rt.pending = t.repairable
	rt.restarting = append(slices.Clone(t.restarting), g.assign...)
	picked, _, _ := fit(in, rt, slots)
	return picked
}

// repairing is the Updating condition with the repairs asked for now: True, as a repair restarts kubelets.
func repairing(g gate, prog string, nodes []string) gate {
	msg := "repairing the drift of " + joinCapped(nodes, ", ") + " (spec.drift.policy Restore)"
	if g.status == metav1.ConditionTrue {
		g.message += "; " + msg
		return g
	}
	g.status, g.reason, g.message = metav1.ConditionTrue, v1alpha1.ReasonRollingOut, prog+"; "+msg
	return g
}
