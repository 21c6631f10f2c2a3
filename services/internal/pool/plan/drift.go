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
// repair it once a slot is free (Verdict.Repair), and counts it in progress until the drift is gone or
// nodeTimeout has passed since it asked. It asks once per cause and assigned version: the same cause found
// again after the request is reported, never repaired in a loop.
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
	asked := ""
	if r != nil {
		asked = r.RequestTime.UTC().Format(time.RFC3339)
	}
	switch {
	case r == nil || r.Cause != n.DriftCause:
		v.Repair = true
		v.Detail += " (repaired once a slot is free: spec.drift.policy Restore)"
	case n.DriftSince.After(r.RequestTime):
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
