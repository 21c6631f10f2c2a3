package agent

import (
	"context"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"

	"github.com/dkc-dev/dkc/internal/nodeconfig"
)

// CheckTrial promotes the assigned config to last-known-good once it has run healthy for the trial
// duration. No restart is needed: the kubelet already runs it.
func (a *Agent) CheckTrial(ctx context.Context) {
	// Every node asks every second: memory answers first. trialOver needs the kubelet proven on the assigned
	// config with that config's trial recorded d ago; without such a trial of what runs, it is false
	// whatever the store holds.
	if start := a.state.trialStart(a.active); !a.activeKnown || start.IsZero() || a.clock.Now().Sub(start) < a.cfg.TrialDuration {
		return
	}
	assigned, err := a.store.Assigned()
	if err != nil {
		return
	}
	lkg, err := a.store.LastKnownGood()
	if err != nil {
		return
	}
	if !trialOver(trial{assigned: assigned, lkg: lkg, active: a.active, activeKnown: a.activeKnown, start: a.state.trialStart(assigned)},
		a.clock.Now(), a.cfg.TrialDuration) {
		return
	}
	flags, err := a.kubeletFlags(ctx)
	if err != nil {
		return
	}
	c, err := a.load(ctx, assigned, flags)
	if err != nil {
		return
	}
	if err := a.kubelet.Healthz(ctx, c.config); err != nil {
		a.log.Info("trial over but kubelet not healthy now; not promoting yet", zap.Error(err))
		return
	}
	if err := a.store.SetLastKnownGood(assigned); err != nil {
		a.log.Error("write last-known-good", zap.Error(err))
		return
	}
	a.log.Info("updated last-known-good config", sourceFields(assigned)...)
	a.gc(assigned, assigned)
	a.setPhase(PhaseGood, assigned)
	a.report()
}

func (a *Agent) gc(assigned, lkg *corev1.NodeConfigSource) {
	removed, err := a.store.GC([]*corev1.NodeConfigSource{assigned, lkg, a.active}, a.cfg.KeepCheckpoints)
	if err != nil {
		a.log.Warn("checkpoint garbage collection failed", zap.Error(err))
	}
	if len(removed) > 0 {
		a.log.Info("removed unreferenced checkpoints", zap.Strings("checkpoints", removed))
	}
}

// trial is what decides a promotion.
type trial struct {
	assigned, lkg, active *corev1.NodeConfigSource
	activeKnown           bool      // active proven by this process
	start                 time.Time // zero: no trial recorded for assigned
}

// trialOver says whether the assigned config has run its trial: it is what this process proved the
// kubelet runs, it is not last-known-good yet, and its recorded trial began at least d ago. The kubelet's
// health now is checked after (CheckTrial).
func trialOver(t trial, now time.Time, d time.Duration) bool {
	return t.assigned != nil && t.activeKnown && nodeconfig.SameSource(t.active, t.assigned) &&
		!nodeconfig.SameSource(t.assigned, t.lkg) && !t.start.IsZero() && now.Sub(t.start) >= d
}
