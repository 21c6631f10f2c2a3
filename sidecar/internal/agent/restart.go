// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"reflect"
	"strings"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"

	"github.com/dkc-dev/dkc/internal/nodeconfig"
	"github.com/dkc-dev/dkc/internal/nodeconfig/wire"
	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
	"github.com/dkc-dev/dkc/sidecar/internal/probe"
)

// run makes the kubelet run target: it restarts the kubelet only when the env file must change, or when the
// kubelet demonstrably does not run what the env file says (a crash between writing the file and restarting).
// The outcome says whom a failure blames; the error says what failed, for the status's detail and the log.
// Before a restart it removes the kubelet state the change invalidates, if the node is drained for its
// assignment (drain), or leaves the kubelet alone if not (OutcomeNeedsDrain, also for pods new eviction
// thresholds would evict: evict.go) or if this service manager cannot remove it (OutcomeCannotReset;
// reset.go).
func (a *Agent) run(ctx context.Context, target candidate, drain drainState) (Outcome, error) {
	current, err := a.env.Get()
	if err != nil {
		a.log.Warn("kubelet env file unreadable; rewriting it", zap.Error(err))
	}
	if current == "" && err == nil {
		// No env file yet (first start on this node): the drop-in ignores a missing file, so the kubelet
		// runs its local config.
		current = a.cfg.LocalConfig
		if target.src == nil {
			if err := a.env.Set(target.file); err != nil {
				return a.unblamed(ctx, fmt.Errorf("write kubelet env file: %w", err))
			}
		}
	}
	// A drift repair restarts the kubelet once into the config it runs (repair.go): through all of what
	// follows, as any restart into it.
	forced := a.repair.restart != nil && nodeconfig.SameSource(a.repair.restart, target.src)
	if forced {
		a.repair.restart = nil
	}
	if !forced && current == target.file && a.activeKnown && nodeconfig.SameSource(a.active, target.src) {
		return OutcomeHealthy, nil
	}
	if !forced && current == target.file {
		if pid, err := a.svc.MainPID(ctx); err == nil && pid == 0 {
			// Not running at all (stopped, or its unit failed, e.g. on its start limit): waiting for it to
			// become healthy would only blame the config for what the service manager did.
			a.log.Info("kubelet is not running; starting it", sourceFields(target.src)...)
		} else if err := a.verify(ctx, target, a.cfg.HealthTimeout, true); err == nil {
			a.setActive(target.src)
			a.provenWith(target)
			return OutcomeHealthy, nil
		} else if !errors.Is(err, errMismatch) {
			return a.judge(ctx, target, err)
		} else {
			a.log.Info("kubelet runs another config than its env file names; restarting it", sourceFields(target.src)...)
		}
	}
	// Decided before the env file changes: a kubelet left running its config must not start into target if
	// it restarts by itself meanwhile.
	reset, outcome, err := a.planReset(ctx, current, target, drain)
	if err != nil {
		if outcome == OutcomeTransient {
			return a.unblamed(ctx, err)
		}
		return outcome, err
	}
	// With a reset, the order is stop, remove, write the env file, start: until the files are gone the env
	// file keeps naming the config the kubelet ran, so a failure on the way (or a sidecar that dies there)
	// leaves nothing that would start the kubelet into target on the state it refuses, and resetState starts
	// the kubelet it stopped again on that config.
	if len(reset.paths) > 0 {
		if err := a.resetState(ctx, target, drain, reset); err != nil {
			return a.unblamed(ctx, err)
		}
	}
	if err := a.env.Set(target.file); err != nil {
		err = fmt.Errorf("write kubelet env file: %w", err)
		if len(reset.paths) > 0 {
			// Stopped for the reset: start it again. A write that failed after its rename (syncing the
			// directory) names target already; the kubelet then starts into it on a drained node, its
			// state gone, and the next round verifies what it runs.
			err = a.startAgain(ctx, err)
		}
		return a.unblamed(ctx, err)
	}
	restartCtx := ctx
	if len(reset.paths) > 0 {
		// The restart starts the kubelet the reset stopped (a restart of a stopped unit is a start, paced and
		// judged as every restart is), also when the sidecar is stopping meanwhile: never left stopped.
		var cancel context.CancelFunc
		restartCtx, cancel = context.WithTimeout(context.WithoutCancel(ctx), startAgainTimeout)
		defer cancel()
	}
	restart := &dkcv1.KubeletRestart{Id: newRestartID(), Target: wire.SourceFromCore(target.src), Time: nil}
	a.log.Info("restarting kubelet to use config", append(sourceFields(target.src), zap.String("file", target.file))...)
	a.drift.ownStarts++ // this start is the sidecar's, not one the drift check looks into (drift.go)
	if err := a.svc.Restart(restartCtx); err != nil {
		if kubeletFailed(err) {
			// The kubelet was stopped and started, and failed running this config: a restart that happened
			// (its Event), and the config's fault as a kubelet that does not become healthy is.
			restart.Time = timestamp(a.clock.Now())
			a.pendingRestarts = append(a.pendingRestarts, restart)
			a.metrics.restarted()
			err = fmt.Errorf("restart kubelet: %w", err)
			// A kubelet told to listen on an address that is not this node's exits once it tries, before or
			// after the service manager counts it started: the status names the address either way.
			if ferr := a.kubelet.Foreign(target.config); ferr != nil {
				err = fmt.Errorf("%w; %w", ferr, err)
			}
			return OutcomeConfigFault, err
		}
		return a.unblamed(ctx, fmt.Errorf("restart kubelet: %w", err))
	}
	// Stamped when the restart job is done, not when it was asked for: the service manager may first wait
	// for room in the unit's start limit, and the Event must say when the kubelet really restarted.
	start := a.clock.Now()
	restart.Time = timestamp(start)
	a.pendingRestarts = append(a.pendingRestarts, restart)
	a.metrics.restarted()
	if err := a.verify(ctx, target, a.cfg.HealthTimeout, false); err != nil {
		return a.judge(ctx, target, err)
	}
	a.setActive(target.src)
	a.provenWith(target)
	a.log.Info("kubelet healthy with config",
		append(sourceFields(target.src), zap.Duration("took", a.clock.Since(start)))...)
	return OutcomeHealthy, nil
}

// judge names the outcome of a kubelet that did not verify healthy with target: stopped in the middle of
// the health wait is not the config's fault; healthy but with /configz refused or unanswered is not either,
// as long as target authenticates like the local config; anything else is.
func (a *Agent) judge(ctx context.Context, target candidate, err error) (Outcome, error) {
	switch {
	case ctx.Err() != nil:
		return OutcomeStopped, err
	case probe.Unverifiable(err) && a.authLikeLocal(ctx, target):
		return OutcomeUnverifiable, err
	default:
		return OutcomeConfigFault, err
	}
}

// unblamed names the outcome of a failure that says nothing about the config.
func (a *Agent) unblamed(ctx context.Context, err error) (Outcome, error) {
	if ctx.Err() != nil {
		return OutcomeStopped, err
	}
	return OutcomeTransient, err
}

// kubeletFailed says whether a Restart error says the kubelet's own process failed starting (see
// ServiceManager).
func kubeletFailed(err error) bool {
	var f interface{ KubeletFailed() bool }
	return errors.As(err, &f) && f.KubeletFailed()
}

// authLikeLocal says whether target authenticates and authorizes requests as the node's local config does
// (effective values). Only then does a kubelet refusing the sidecar's /configz say nothing about the config; a
// config that changes authentication (webhook off, another client CA) may itself be why the kubelet refuses.
// Asked only after a refusal, so the local config is checked again only then.
func (a *Agent) authLikeLocal(ctx context.Context, target candidate) bool {
	if target.src == nil {
		return true
	}
	local, err := a.load(ctx, nil, target.flags)
	if err != nil {
		return false // unknown: a refusal may be the config's doing
	}
	for _, f := range []string{"authentication", "authorization"} {
		if !reflect.DeepEqual(target.config.Fields[f], local.config.Fields[f]) {
			return false
		}
	}
	return true
}

// setActive records that the kubelet was proven to run src, on disk too for the next sidecar's first status.
// A state reset made before is over: the kubelet runs healthy, and may run pods again.
func (a *Agent) setActive(src *corev1.NodeConfigSource) {
	if !nodeconfig.SameSource(a.active, src) {
		a.preview.due = a.preview.req != nil // judged against what the kubelet runs: that changed
	}
	a.active, a.activeKnown, a.activeRecorded = src, true, true
	changed := a.state.setActive(src)
	if a.state.s.Reset != nil {
		a.state.s.Reset, changed = nil, true
	}
	if changed {
		if err := a.state.save(); err != nil {
			// A restarted sidecar's first status depends on it, until it proves the active config again; a
			// reset left on disk only adds its files to a later reset while the node is drained for the
			// same assignment (drainState.toRemove).
			a.log.Warn("persist active config", zap.Error(err))
		}
	}
}

var errMismatch = errors.New("kubelet runs another config")

// verify waits until the kubelet is healthy and its configz shows the target's fields. With
// mismatchIsFinal, a healthy kubelet reporting another config returns errMismatch at once.
func (a *Agent) verify(ctx context.Context, target candidate, timeout time.Duration, mismatchIsFinal bool) error {
	content, err := os.ReadFile(target.file)
	if err != nil {
		return fmt.Errorf("read %s: %w", target.file, err)
	}
	deadline := a.clock.Now().Add(timeout)
	var last error
	for {
		last = a.check(ctx, target, content)
		if last == nil {
			return nil
		}
		if mismatchIsFinal && errors.Is(last, errMismatch) {
			return last
		}
		if a.clock.Now().After(deadline) {
			return fmt.Errorf("not healthy with %s after %v: %w", target.file, timeout, last)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-a.clock.After(500 * time.Millisecond):
		}
	}
}

func (a *Agent) check(ctx context.Context, target candidate, content []byte) error {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := a.kubelet.Healthz(cctx, target.config); err != nil {
		return fmt.Errorf("healthz: %w", err)
	}
	running, err := a.kubelet.Configz(cctx, target.config)
	if err != nil {
		return fmt.Errorf("configz: %w", err)
	}
	diff, err := probe.Mismatch(target.config, content, running)
	if err != nil {
		return err
	}
	if len(diff) > 0 {
		return fmt.Errorf("%w: %s", errMismatch, strings.Join(diff, "; "))
	}
	return nil
}

func newRestartID() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
