// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"

	"github.com/dkc-dev/dkc/internal/configcheck"
	"github.com/dkc-dev/dkc/internal/nodeconfig"
)

// candidate is a config the kubelet could run.
type candidate struct {
	src    *corev1.NodeConfigSource // nil: local
	file   string
	config *configcheck.Checked
	flags  []string // the kubelet's flags it was checked with
}

// load checks src's config as the kubelet would run it on this node, and logs the check's warnings.
func (a *Agent) load(ctx context.Context, src *corev1.NodeConfigSource, flags []string) (candidate, error) {
	c, err := a.checkConfig(ctx, src, flags)
	if err != nil {
		return c, err
	}
	for _, w := range c.config.Warnings {
		a.log.Warn("kubelet config warning", zap.String("file", c.file), zap.String("warning", w))
	}
	return c, nil
}

// checkConfig is load without logging: src's config file (its checkpoint, or the local config) checked with
// the kubelet's code of the node kubelet's minor, the node's flags and drop-ins applied.
func (a *Agent) checkConfig(ctx context.Context, src *corev1.NodeConfigSource, flags []string) (candidate, error) {
	c := candidate{src: src, file: a.cfg.LocalConfig, flags: flags}
	if src != nil {
		c.file = a.store.ConfigFile(src.ConfigMap)
	}
	r, err := a.cfg.Checker.Check(ctx, configcheck.Request{File: c.file, Flags: flags, KubeletVersion: a.checkVersion()})
	if err != nil {
		return c, err
	}
	c.config = r
	return c, nil
}

// checkVersion is the kubelet version configs are checked for: the operator's, else the service's.
func (a *Agent) checkVersion() string {
	if a.cfg.KubeletVersion != "" {
		return a.cfg.KubeletVersion
	}
	return a.kubeletVersion
}

// reconcile decides the target config and brings the kubelet to it, then reports. The decisions are
// round.next's (decide.go); this carries them out.
func (a *Agent) reconcile(ctx context.Context) {
	defer a.report()
	defer a.afterOwnStarts(ctx) // before the report: a start the sidecar made is not drift (drift.go)
	a.retry = false
	assigned, err := a.store.Assigned()
	if err != nil {
		a.configError, a.detail = nodeconfig.InternalError, err.Error()
		a.log.Error("read meta/assigned", zap.Error(err))
		a.retry = true
		a.setPhaseUnknownSource(PhaseRetrying)
		return
	}
	lkg, err := a.store.LastKnownGood()
	if err != nil {
		a.log.Error("read meta/last-known-good; treating it as local", zap.Error(err))
		lkg = nil
	}
	flags, err := a.kubeletFlags(ctx)
	if err != nil {
		a.configError, a.detail = nodeconfig.InternalError, err.Error()
		a.log.Error("kubelet command line unknown or not dkc's to manage; not changing the kubelet, will retry",
			zap.Error(err))
		a.retry = true
		a.setPhase(PhaseRetrying, assigned) // what the next round starts with
		return
	}

	r := round{assigned: assigned, lkg: lkg}
	r.failed[slotAssigned], r.failed[slotLastKnownGood] = a.state.failure(assigned), a.state.failure(lkg)
	if assigned == nil {
		r.failed[slotAssigned] = ""
	}
	if lkg == nil {
		r.failed[slotLastKnownGood] = ""
	}
	var candidates [numSlots]candidate
	drain := a.drainState(assigned)
	// Each step fills one of the round's finite records (a check, a run or a failure per slot), so the
	// round ends; the bound only guards against a broken rule.
	for step := 0; step < 4*int(numSlots); step++ {
		d := r.next()
		src := r.source(d.slot)
		switch d.action {
		case actCheck:
			c, err := a.load(ctx, src, flags)
			r.checked[d.slot] = &err
			candidates[d.slot] = c
			if err != nil {
				switch d.slot {
				case slotAssigned:
					a.log.Warn("assigned config unusable; falling back",
						append(sourceFields(src), zap.Stringer("status", statusFor(err)), zap.Error(err))...)
				case slotLastKnownGood:
					a.log.Error("last-known-good config unusable; falling back to local", append(sourceFields(src), zap.Error(err))...)
				default:
					a.log.Error("local kubelet config unusable; leaving the kubelet alone", zap.String("file", a.cfg.LocalConfig),
						zap.Error(err))
				}
			}
		case actRun:
			outcome, err := a.run(ctx, candidates[d.slot], drain)
			drain = a.drainState(assigned) // a reset in the run is recorded: a fallback removes the same files
			r.ran[d.slot] = &ranResult{outcome: outcome, err: err}
			switch outcome {
			case OutcomeHealthy:
			case OutcomeConfigFault:
				a.log.Error("kubelet did not come back healthy with the target config",
					append(sourceFields(src), zap.Error(err))...)
			case OutcomeUnverifiable:
				a.log.Warn("kubelet healthy but /configz refused or unanswered; the config is not blamed, verifying again",
					append(sourceFields(src), zap.Error(err))...)
			case OutcomeTransient:
				a.log.Error("could not make the kubelet run the target config; retrying, the config is not blamed",
					append(sourceFields(src), zap.Error(err))...)
			}
		case actMarkFailed:
			a.state.markFailed(src, d.detail)
			if err := a.state.save(); err != nil {
				a.log.Error("persist failed config", zap.Error(err))
			}
			r.markFailed(d.slot, d.detail)
		case actDone:
			a.finish(r, d)
			return
		}
	}
	a.log.Error("reconcile did not settle; retrying")
	a.retry = true
}

// finish applies a round's result.
func (a *Agent) finish(r round, d decision) {
	a.configError, a.detail = d.status, d.detail
	if detail := a.upgradeDetail(r, d); detail != "" {
		a.detail = detail // the new minor refuses the assigned config: say so (upgrade.go)
	}
	a.retry = a.retry || d.retry
	if d.activeUnknown {
		a.activeKnown = false // what runs now is unknown until a round proves it through /configz
	}
	if d.healthy && r.assigned != nil && d.slot != slotLocal && nodeconfig.SameSource(r.source(d.slot), r.assigned) {
		if a.state.startTrial(r.assigned, a.clock.Now(), a.trial.Now()) {
			a.state.s.Phase = string(d.phase) // saved with the trial start: one write
			if err := a.state.save(); err != nil {
				a.log.Error("persist trial start", zap.Error(err))
			}
			a.log.Info("assigned config active; trial started",
				append(sourceFields(r.assigned), zap.Duration("trialDuration", a.cfg.TrialDuration))...)
		}
	}
	if d.healthy {
		a.gc(r.assigned, r.lkg)
	}
	if d.phase != "" {
		a.setPhase(d.phase, r.source(d.slot))
	}
}
