// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"

	"github.com/dkc-dev/dkc/internal/nodeconfig"
)

// trialSaveInterval is how often a running trial's elapsed time is saved: each save is a durable write (two
// fsyncs), and a sidecar that crashes loses at most this much of the trial, which then lasts as much longer.
const trialSaveInterval = time.Minute

// CheckTrial promotes the assigned config to last-known-good once it has run healthy for the trial
// duration. No restart is needed: the kubelet already runs it.
func (a *Agent) CheckTrial(ctx context.Context) {
	a.saveTrial(false)
	// Every node asks every second: memory answers first. trialOver needs the kubelet proven on the assigned
	// config with that config's trial run for d; without such a trial of what runs, it is false whatever
	// the store holds.
	if elapsed, ok := a.state.trialElapsed(a.active, a.trial.Now()); !a.activeKnown || !ok ||
		elapsed < a.cfg.TrialDuration {
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
	elapsed, ok := a.state.trialElapsed(assigned, a.trial.Now())
	if !trialOver(trial{assigned: assigned, lkg: lkg, active: a.active, activeKnown: a.activeKnown, recorded: ok,
		elapsed: elapsed}, a.cfg.TrialDuration) {
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
	// A standing preview's checkpoint is kept (the kubelet's check reads it); it goes with the preview
	// (dropPreviewCheckpoint).
	removed, err := a.store.GC([]*corev1.NodeConfigSource{assigned, lkg, a.active, a.previewSource()},
		a.cfg.KeepCheckpoints)
	if err != nil {
		a.log.Warn("checkpoint garbage collection failed", zap.Error(err))
	}
	if len(removed) > 0 {
		a.log.Info("removed unreferenced checkpoints", zap.Strings("checkpoints", removed))
	}
}

// saveTrial saves the running trial's elapsed time when at least trialSaveInterval of it is not on disk
// (or any of it, if all), until the saved time reaches the trial duration: past it, nothing more is
// learned. A failed save is retried at the next check; what was measured stays in memory meanwhile.
func (a *Agent) saveTrial(all bool) {
	now := a.trial.Now()
	unsaved := a.state.trialUnsaved(now)
	if unsaved == 0 || (!all && unsaved < trialSaveInterval) {
		return
	}
	if e := a.state.s.TrialElapsed; e != nil && e.Duration >= a.cfg.TrialDuration {
		return
	}
	if err := a.state.saveTrial(now); err != nil {
		a.log.Warn("persist the trial's elapsed time; retried at the next check", zap.Error(err))
	}
}

// trial is what decides a promotion.
type trial struct {
	assigned, lkg, active *corev1.NodeConfigSource
	activeKnown           bool          // active proven by this process
	recorded              bool          // a trial is recorded for assigned
	elapsed               time.Duration // how long it has run
}

// trialOver says whether the assigned config has run its trial: it is what this process proved the
// kubelet runs, it is not last-known-good yet, and its recorded trial has run at least d. The kubelet's
// health now is checked after (CheckTrial).
func trialOver(t trial, d time.Duration) bool {
	return t.assigned != nil && t.activeKnown && nodeconfig.SameSource(t.active, t.assigned) &&
		!nodeconfig.SameSource(t.assigned, t.lkg) && t.recorded && t.elapsed >= d
}
