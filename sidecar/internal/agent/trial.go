package agent

import (
	"context"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"

	"github.com/dkc-dev/dkc/internal/nodeconfig"
)

// CheckTrial promotes the assigned config to last-known-good once it has run healthy for the trial
// duration. No restart is needed: the kubelet already runs it.
func (a *Agent) CheckTrial(ctx context.Context) {
	assigned, err := a.store.Assigned()
	if err != nil || assigned == nil || !a.activeKnown || !nodeconfig.SameSource(a.active, assigned) {
		return
	}
	lkg, err := a.store.LastKnownGood()
	if err != nil || nodeconfig.SameSource(assigned, lkg) {
		return
	}
	start := a.state.trialStart(assigned)
	if start.IsZero() || a.clock.Since(start) < a.cfg.TrialDuration {
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
