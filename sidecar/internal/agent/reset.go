// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"

	"github.com/dkc-dev/dkc/internal/configcheck"
	"github.com/dkc-dev/dkc/internal/disruption"
	"github.com/dkc-dev/dkc/internal/nodeconfig"
	"github.com/dkc-dev/dkc/sidecar/internal/checkpoint"
)

// This file is the kubelet state a config change invalidates (package disruption): the kubelet refuses to
// start with another CPU or memory manager policy (or, under the static policies, other reservations) than
// the one its checkpoint was written under. Before restarting into a config, run (restart.go) asks here
// whether the change needs such state removed, whether the node may lose it (drained for its assignment),
// and has the service manager remove it with the kubelet stopped.

// drainMark is the service's last word on the node's drain (WatchConfigResponse.drained), with the
// assignment it came with.
type drainMark struct {
	src *corev1.NodeConfigSource
	on  bool
}

// of says whether the node is drained for assignment src.
func (m drainMark) of(src *corev1.NodeConfigSource) bool {
	return m.on && nodeconfig.SameSource(m.src, src)
}

// takeDrain takes the drain an update says. It holds for the assignment it came with only: a later
// assignment needs its own drain, and an update without one can only withdraw it. A drain withdrawn for an
// assignment the kubelet already runs (the node uncordoned after the change) changes nothing on the node: it
// only forbids a reset for a later restart into it.
func (a *Agent) takeDrain(d Desired) {
	next := a.drained
	switch {
	case d.Assignment != nil:
		next = drainMark{src: checkpoint.SourceOf(d.Assignment), on: d.Drained}
	case !d.Drained:
		next = drainMark{}
	}
	if next.on != a.drained.on || (next.on && !nodeconfig.SameSource(next.src, a.drained.src)) {
		a.log.Info("node drain for its assignment", append(sourceFields(next.src), zap.Bool("drained", next.on))...)
	}
	a.drained = next
}

// drainState is what a round may do about the kubelet's state.
type drainState struct {
	// assigned is the round's assignment (nil: local), the one a drain is for.
	assigned *corev1.NodeConfigSource
	// drained: the service says the node is drained for assigned.
	drained bool
	// recorded are the files a reset for assigned set out to remove, with no config proven healthy since.
	recorded []string
}

func (a *Agent) drainState(assigned *corev1.NodeConfigSource) drainState {
	ds := drainState{assigned: assigned, drained: a.drained.of(assigned)}
	if r := a.state.s.Reset; r != nil && nodeconfig.SameSource(r.Source, assigned) {
		ds.recorded = r.Files
	}
	return ds
}

// mayReset says whether the kubelet's state may be removed: only while the service says the node is drained
// for its assignment. A reset recorded earlier never allows one by itself: the drain it was made under may
// have been withdrawn since (the node uncordoned on a timeout, an interrupted drain, a pool that released
// it), and pods whose CPUs and memory that state assigns may run again. The record only adds its files to
// a reset the drain allows (toRemove).
func (ds drainState) mayReset() bool { return ds.drained }

// toRemove are the names to remove for a change that invalidates files: those, and, when the node may lose
// its state, the files of a reset recorded for the same assignment (a fallback after a reset, or a sidecar
// restarted in the middle of one, removes them again: what the failed config wrote would make the next
// start refuse too).
func (ds drainState) toRemove(files []string) []string {
	if !ds.mayReset() {
		return files
	}
	return union(files, ds.recorded)
}

// stateReset is the kubelet state to remove before restarting into a config.
type stateReset struct {
	// resets are what the change invalidates, and the fields that do; nil when what the kubelet runs is
	// unknown.
	resets []disruption.Reset
	// files are the names to remove (disruption's), paths the same in the kubelet's root directory.
	files, paths []string
}

func (sr stateReset) fields() []string {
	var out []string
	for _, r := range sr.resets {
		out = append(out, r.Fields...)
	}
	return out
}

func (sr stateReset) String() string {
	if len(sr.resets) == 0 {
		return strings.Join(sr.files, ", ")
	}
	s := make([]string, len(sr.resets))
	for i, r := range sr.resets {
		s[i] = r.String()
	}
	return strings.Join(s, ", ")
}

// planReset compares the config the kubelet runs (its /configz) with target's and returns the state to
// remove before restarting into target (none: restart as always), or an outcome that stops the restart
// before anything is touched: OutcomeCannotReset when this node's service manager cannot remove that state,
// OutcomeNeedsDrain when the node may not lose it (or, for the assignment, when the restarted kubelet would
// fail or evict running pods: evict.go), OutcomeTransient when it cannot be removed here. current is the
// config file the kubelet was last started with.
//
// The service manager's capability is asked before the drain: a node that can never make the change must
// not have a pool drain it for nothing, nor wait for a drain that changes nothing.
func (a *Agent) planReset(ctx context.Context, current string, target candidate, ds drainState) (stateReset,
	Outcome, error) {
	var sr stateReset
	_, canReset := a.svc.(StateResetter)
	running, listening, err := a.runningFields(ctx, current, target)
	switch {
	case err == nil:
		// Both are complete v1beta1 configs as JSON values, as disruption wants them: /configz shows the
		// kubelet's, and target's Fields are the kubelet code's defaulted config with the node's flags and
		// drop-ins applied, converted to v1beta1 the same way (kubeletcheck.ToV1beta1JSON).
		sr.resets = disruption.Resets(running, target.config.Fields)
		for _, r := range sr.resets {
			sr.files = append(sr.files, r.File)
		}
		if len(sr.resets) == 0 && !ds.drained && nodeconfig.SameSource(target.src, ds.assigned) {
			// (A change that needs a drain for the resource managers' state gets one, which also empties the
			// node of the pods new thresholds would evict. A fallback — last-known-good or the local config
			// after the assignment failed — goes back to what ran before: the way back waits for no drain.)
			if err := a.admission(ctx, listening, running, target, ds); err != nil {
				a.log.Warn("the kubelet would fail running pods when it admits them again under the config, and the "+
					"node is not drained for its assignment; leaving the kubelet alone",
					append(sourceFields(target.src), zap.String("node", a.cfg.NodeName), zap.Error(err))...)
				return sr, OutcomeNeedsDrain, err
			}
			if err := a.evictions(ctx, listening, running, target, ds); err != nil {
				a.log.Warn("the kubelet would evict pods under the config's eviction thresholds, and the node is not "+
					"drained for its assignment; leaving the kubelet alone",
					append(sourceFields(target.src), zap.String("node", a.cfg.NodeName), zap.Error(err))...)
				return sr, OutcomeNeedsDrain, err
			}
		}
	case canReset && ds.mayReset():
		// What the kubelet runs is unknown (stopped, crash-looping, /configz refused), and so is what its
		// state was written under. The node is drained for its assignment: it loses nothing by losing every
		// resource manager's state, while a file the kubelet refuses would fail the restart and blame the config.
		sr.files = disruption.Files()
		a.log.Info("running kubelet config unknown, node drained for its assignment: removing every resource "+
			"manager state file before the restart", append(a.resetFields(target, sr), zap.Error(err))...)
	default:
		// Unknown, and not drained (or nothing here could remove the state anyway): restart as dkc always
		// has. A reset recorded for this assignment does not change that (mayReset). Holding a node whose
		// kubelet may be down on a guess would be worse: if the kubelet refuses its state, the health wait
		// says so and the node rolls back to what ran before (which that state was written under).
		a.log.Info("running kubelet config unknown; not compared with the resource managers' state",
			append(sourceFields(target.src), zap.Error(err))...)
		return sr, 0, nil
	}
	sr.files = ds.toRemove(sr.files)
	if len(sr.files) == 0 {
		return sr, 0, nil
	}
	root := rootDir(target.flags)
	paths, err := statePaths(root, sr.files)
	if err != nil {
		return sr, OutcomeTransient, err
	}
	sr.paths = paths
	if !canReset {
		err := a.cannotReset(target, sr)
		a.log.Error("the kubelet would refuse the config on its resource managers' state, and this restart mode "+
			"cannot remove it; the config is marked failed", append(a.resetFields(target, sr), zap.Error(err))...)
		return sr, OutcomeCannotReset, err
	}
	if !ds.mayReset() {
		err := a.drainRequired(target, ds, sr)
		a.log.Warn("the kubelet would refuse the config on its resource managers' state, and the node is not "+
			"drained for its assignment; leaving the kubelet alone", append(a.resetFields(target, sr), zap.Error(err))...)
		return sr, OutcomeNeedsDrain, err
	}
	return sr, 0, nil
}

// runningFields is the config the kubelet runs, from its /configz, reached where the config it was started
// with (current) makes it listen and with the certificate that config makes it serve; where that config
// does not check any more, as target would.
func (a *Agent) runningFields(ctx context.Context, current string, target candidate) (map[string]any,
	*configcheck.Checked, error) {
	startedWith := current
	if current == target.file && a.activeRecorded {
		// The env file names target, but the kubelet was not restarted into it since (or not successfully):
		// it runs what was last proven.
		startedWith = a.configFile(a.active)
	}
	kc := target.config
	if startedWith != "" && startedWith != target.file {
		c, err := a.cfg.Checker.Check(ctx, configcheck.Request{File: startedWith, Flags: target.flags,
			KubeletVersion: a.checkVersion()})
		if err == nil {
			kc = c
		} else {
			a.log.Debug("the kubelet's running config does not check; asking its /configz as the target config "+
				"would listen", zap.String("file", startedWith), zap.Error(err))
		}
	}
	fields, err := a.kubelet.Configz(ctx, kc)
	return fields, kc, err
}

// configFile is the file the kubelet runs src from.
func (a *Agent) configFile(src *corev1.NodeConfigSource) string {
	if src == nil || src.ConfigMap == nil {
		return a.cfg.LocalConfig
	}
	return a.store.ConfigFile(src.ConfigMap)
}

// statePaths are files in the kubelet's root directory root. Names come from disruption's list alone, never
// from a config or payload, and each path is absolute, clean, and directly in root.
func statePaths(root string, files []string) ([]string, error) {
	if !filepath.IsAbs(root) {
		return nil, fmt.Errorf("kubelet --root-dir %q is not an absolute path: its state files cannot be removed", root)
	}
	root = filepath.Clean(root)
	known := disruption.Files()
	paths := make([]string, 0, len(files))
	for _, f := range files {
		p := filepath.Join(root, f)
		if !slices.Contains(known, f) || filepath.Dir(p) != root {
			return nil, fmt.Errorf("refusing to remove %q: not a kubelet state file dkc knows (%s)", f,
				strings.Join(known, ", "))
		}
		paths = append(paths, p)
	}
	return paths, nil
}

// drainRequired says what stands in the way, and what to do.
func (a *Agent) drainRequired(target candidate, ds drainState, sr stateReset) error {
	return fmt.Errorf("%w: the kubelet would refuse to start with %s on the state its resource managers "+
		"checkpointed under the config it runs: %s; it keeps running that config. To make the change, %s",
		errNeedsDrain, describe(target.src), sr,
		a.drainHow(ds, "stops the kubelet, removes "+strings.Join(sr.paths, " ")+" and starts it"))
}

// drainHow says how to drain the node for its assignment, after which the sidecar does then (and the
// kubelet runs the config).
func (a *Agent) drainHow(ds drainState, then string) string {
	node := a.cfg.NodeName
	if node == "" {
		node = "NODE"
	}
	if ds.assigned != nil && ds.assigned.ConfigMap != nil {
		cm := ds.assigned.ConfigMap
		return fmt.Sprintf("drain the node for this assignment: kubectl dkc assign %s --configmap %s/%s --key %s "+
			"--drain, or a KubeletConfigPool with spec.disruption.drain: Allowed; the sidecar then %s with the config",
			node, cm.Namespace, cm.Name, cm.KubeletConfigKey, then)
	}
	return fmt.Sprintf("drain the node for this assignment: kubectl dkc reset %s --drain; the sidecar then %s "+
		"with its local config", node, then)
}

var errNeedsDrain = errors.New("node not drained")

// cannotReset says why target cannot run on this node as it stands. The service manager (--restart-mode=signal:
// another supervisor restarts the kubelet at once) can neither hold the kubelet stopped nor remove files, so
// no drain would help, and a retry would find the same state: the outcome is final, the config marked
// failed and rolled back from as a config the kubelet does not run (HealthError) — what the kubelet would
// make of it, without the restart. (Not DrainRequiredError, which would have a pool drain the node for
// nothing; not RestartError, retried at every tick for ever; not ValidateError: the config is valid, only
// not on this node's state.)
func (a *Agent) cannotReset(target candidate, sr stateReset) error {
	return fmt.Errorf("%w: the kubelet would refuse to start with %s on the state its resource managers "+
		"checkpointed under the config it runs: %s. This restart mode (%T) cannot stop the kubelet and remove "+
		"%s; run the sidecar with --restart-mode=systemd, which does on a drained node, or stop the kubelet, "+
		"remove the files and start it yourself", errCannotReset, describe(target.src), sr, a.svc,
		strings.Join(sr.paths, " "))
}

var errCannotReset = errors.New("kubelet state cannot be reset by this restart mode")

func describe(src *corev1.NodeConfigSource) string {
	if src == nil || src.ConfigMap == nil {
		return "the local config"
	}
	cm := src.ConfigMap
	return fmt.Sprintf("configmap %s/%s (UID %s, resourceVersion %s, key %s)", cm.Namespace, cm.Name, cm.UID,
		cm.ResourceVersion, cm.KubeletConfigKey)
}

// resetFields are the log fields of a state reset: the node, the config, the files, the fields that
// invalidate them and the paths.
func (a *Agent) resetFields(target candidate, sr stateReset) []zap.Field {
	return append([]zap.Field{zap.String("node", a.cfg.NodeName)}, append(sourceFields(target.src),
		zap.Strings("files", sr.files), zap.Strings("fields", sr.fields()), zap.Strings("paths", sr.paths))...)
}

// resetState removes sr's files with the kubelet stopped: recorded first (a sidecar restarted in the middle
// knows which files it set out to remove, and removes them again once drained), then `systemctl stop
// kubelet`, then rm in a transient unit of the node's systemd. On success the kubelet is left stopped, for
// the caller to write the env file and start it; on failure it is started again (startAgain) on the
// config it ran, the env file untouched.
func (a *Agent) resetState(ctx context.Context, target candidate, ds drainState, sr stateReset) error {
	rs := a.svc.(StateResetter) // planReset checked it
	if err := a.state.recordReset(ds.assigned, sr.files); err != nil {
		return fmt.Errorf("record the kubelet state reset before making it: %w", err)
	}
	a.log.Info("stopping kubelet to remove the resource manager state the config invalidates",
		a.resetFields(target, sr)...)
	a.drift.ownStarts++ // the kubelet's next start is the sidecar's (drift.go)
	if err := rs.Stop(ctx); err != nil {
		// A failed stop job may have stopped it all the same: start it either way (a start of a running
		// unit restarts it on the same config, harmless on a drained node; one left stopped is not).
		return a.startAgain(ctx, fmt.Errorf("stop kubelet to remove %s: %w", strings.Join(sr.paths, " "), err))
	}
	if err := rs.RemoveFiles(ctx, sr.paths); err != nil {
		return a.startAgain(ctx, fmt.Errorf("remove kubelet state with the kubelet stopped: %w", err))
	}
	a.log.Info("removed kubelet state", a.resetFields(target, sr)...)
	return nil
}

// startAgainTimeout bounds starting a kubelet stopped for a reset that failed: the service manager may first
// wait for room in the unit's start limit.
const startAgainTimeout = 2 * time.Minute

// startAgain starts the kubelet a failed reset stopped, on the config it ran before (the env file is
// written only once the files are gone), and returns the failure, with what became of the start: a
// transient error the next tick retries, with the kubelet running meanwhile — never a kubelet left stopped
// until someone notices. It survives the caller's cancellation (the sidecar stopping mid-reset): a stopped
// kubelet is worse than a late sidecar exit.
func (a *Agent) startAgain(ctx context.Context, cause error) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), startAgainTimeout)
	defer cancel()
	a.log.Warn("kubelet state reset failed; starting the kubelet again with the config it ran", zap.Error(cause))
	a.drift.ownStarts++
	if err := a.svc.Restart(ctx); err != nil {
		a.log.Error("could not start the kubelet again after a failed state reset", zap.Error(err))
		return fmt.Errorf("%w; starting the kubelet again with the config it ran failed too: %w", cause, err)
	}
	return fmt.Errorf("%w; the kubelet was started again with the config it ran", cause)
}
