// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"time"
	"unicode"

	"go.uber.org/zap"
	"sigs.k8s.io/yaml"

	"github.com/dkc-dev/dkc/internal/configcheck"
	"github.com/dkc-dev/dkc/internal/kubeletcheck/checkapi"
	"github.com/dkc-dev/dkc/internal/nodeconfig"
	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
	"github.com/dkc-dev/dkc/sidecar/internal/kubeletunit"
	"github.com/dkc-dev/dkc/sidecar/internal/probe"
)

// This file finds drift: the kubelet running something else than it should, while the sidecar did not
// change anything (ReportStatusRequest.drift). The sidecar checks
//   - after every start of the kubelet it did not make itself: the kubelet unit's InvocationID (over D-Bus,
//     as the restart is made), or without one the kubelet's MainPID, changed while the sidecar's own
//     restarts are accounted for (afterOwnStarts). Seen at the loop's tick (TrialCheckInterval, 10s);
//   - every Config.DriftInterval (--drift-interval), the first time at the first tick after the sidecar
//     starts: nothing is kept on disk, a restarted sidecar finds a standing drift again within a tick;
//   - after the sidecar's own restart into a config (its health wait compared /configz with the config
//     with the node's flags applied, not with what the config says by itself), and when the node kubelet's
//     version changes.
//
// Never while a round is unfinished (a retry or an unwritten assignment pending) or the active config is
// not proven: the restart path verifies /configz itself, and the agent's loop runs one thing at a time, so
// a check never overlaps a restart, a health wait or a preview.
//
// What is checked, in this order (the first that finds something names the cause):
//  1. dkc's wiring: the env file holds exactly what the sidecar wrote for the active config; the kubelet
//     unit loads it, through dkc's drop-in (the service manager's EnvironmentFiles and DropInPaths); the
//     drop-in's content, where the sidecar sees its directory (the DaemonSet's main container does not);
//     the running kubelet's --config is the file the env file names. Gone: WiringRemoved; changed:
//     WiringReplaced.
//  2. On a checkpoint (assigned or last-known-good; on the local config nothing of dkc's can drift, and
//     only the wiring is checked): /configz against the config's own values on every field its file sets,
//     and against the value the node's --config-dir drop-ins give on the fields only they set. A
//     difference is named KubeletMinorChanged when the node kubelet's minor is not the one the config was
//     last proven with; else per field: a kubelet flag on the command line that sets it (FlagOverride,
//     naming the flag), a drop-in of --config-dir that sets it (ConfigDirDropIn, naming the file), else
//     Unknown. The drift's cause is the first of those, in that order, that a field has.
//
// The node's local config file is not read here unless the node runs it: kubeadm rewriting it (an
// upgrade) while a checkpoint is active is no drift.

// Drift causes: Drift.cause, and the reason of the Node's ConfigDrift condition (internal/nodeconfig, which
// dkc-server writes them with).
const (
	DriftWiringRemoved       = nodeconfig.DriftWiringRemoved
	DriftWiringReplaced      = nodeconfig.DriftWiringReplaced
	DriftKubeletMinorChanged = nodeconfig.DriftKubeletMinorChanged
	DriftFlagOverride        = nodeconfig.DriftFlagOverride
	DriftConfigDirDropIn     = nodeconfig.DriftConfigDirDropIn
	DriftUnknown             = nodeconfig.DriftUnknown
)

// DriftCauses are every cause, each a series of dkc_sidecar_config_drift.
var DriftCauses = nodeconfig.DriftCauses

const (
	// maxDriftFields bounds Drift.fields: the fields a whole config sets can number a hundred, and the
	// report becomes a Node condition.
	maxDriftFields = 20
	// maxDriftDetails is how many fields the message details (values and who sets them).
	maxDriftDetails = 5
	// maxDriftValue bounds a value quoted in the message.
	maxDriftValue = 60
	// driftTimeout bounds one check: the helper runs and /configz have their own bounds, this keeps a stuck
	// one from holding the agent's loop.
	driftTimeout = 30 * time.Second
)

// driftState is what the drift check found and what it watches.
type driftState struct {
	// current is the drift the last check found; nil: none, or no check yet.
	current *dkcv1.Drift
	// checked: a check has succeeded since the sidecar started, so that no drift (current nil) is a
	// finding the reports say (noDrift), not the absence of one.
	checked bool
	// last is when the last check ended (the agent's clock); zero: none since the sidecar started.
	last time.Time
	// due: check at the next tick.
	due bool
	// run identifies the kubelet's run last seen (kubeletRun); "" unknown.
	run string
	// ownStarts counts the kubelet starts the sidecar made (counted just before each); seenOwn is its value
	// when run was last taken after them.
	ownStarts, seenOwn int
	// minor is the kubelet minor whose code checked the active config when the kubelet was last proven
	// to run it (or found running it as it should); "" unknown.
	minor string
}

// invocations is a service manager that tells the kubelet unit's runs apart (systemd.Manager).
type invocations interface {
	// InvocationID is `systemctl show --property InvocationID kubelet`: new at every start.
	InvocationID(ctx context.Context) (string, error)
}

// unitWiring is a service manager that shows how the kubelet unit is set up (systemd.Manager).
type unitWiring interface {
	// LoadsEnvironmentFile is `systemctl show --property EnvironmentFiles kubelet` naming path.
	LoadsEnvironmentFile(ctx context.Context, path string) (bool, error)
	// DropInPaths is `systemctl show --property DropInPaths kubelet`.
	DropInPaths(ctx context.Context) ([]string, error)
}

// finding is a drift one check found.
type finding struct {
	cause   string
	fields  []string // all that differ, sorted
	message string
	flags   []string // the kubelet flags named, for the log
	files   []string // the files named, for the log
}

// provenWith records the kubelet minor whose code checked target, which the kubelet now runs proven.
func (a *Agent) provenWith(target candidate) {
	if target.config != nil {
		if m := checkapi.Minor(target.config.KubeletVersion); m != "" {
			a.drift.minor = m
		}
	}
}

// afterOwnStarts takes the kubelet's run after a round in which the sidecar started it, so that the start
// is not taken for someone else's, and has the new config checked for drift at the next tick.
func (a *Agent) afterOwnStarts(ctx context.Context) {
	if a.drift.ownStarts == a.drift.seenOwn {
		return
	}
	a.drift.seenOwn = a.drift.ownStarts
	a.upgradeEpisodeOver()
	if run := a.kubeletRun(ctx); run != "" {
		// Not running (its start failed): the run that comes next is systemd's doing (Restart=) or
		// someone's, and checked as such.
		a.drift.run = run
	}
	a.drift.due = true
}

// kubeletRun identifies the kubelet's current run: the unit's InvocationID, else the kubelet's PID; ""
// when the kubelet does not run or cannot be asked.
func (a *Agent) kubeletRun(ctx context.Context) string {
	if inv, ok := a.svc.(invocations); ok {
		if id, err := inv.InvocationID(ctx); err == nil && id != "" {
			if pid, err := a.svc.MainPID(ctx); err == nil && pid == 0 {
				return "" // the unit's last run, stopped
			}
			return "invocation " + id
		}
	}
	pid, err := a.svc.MainPID(ctx)
	if err != nil || pid == 0 {
		return ""
	}
	return fmt.Sprintf("pid %d", pid)
}

// driftCheckable says whether the node is settled enough to be checked: the active config proven by this
// process, no round left unfinished.
func (a *Agent) driftCheckable() bool {
	if !a.activeKnown || a.retry || a.unsynced != nil {
		return false
	}
	switch a.phase {
	case PhaseRetrying, PhaseUnknown, PhaseWaitingForKubeletVersion:
		return false
	}
	return true
}

// watchDrift checks for drift when a check is due: the kubelet started without the sidecar, the interval
// has passed, or something asked for one.
func (a *Agent) watchDrift(ctx context.Context) {
	if !a.driftCheckable() {
		return
	}
	run := a.kubeletRun(ctx)
	if run == "" {
		// Not running: the next run is a start, checked once it runs. Long down, its binary is asked
		// whether it was upgraded in place (upgrade.go).
		a.watchDown(ctx, "not running", "")
		return
	}
	started := a.drift.run != "" && run != a.drift.run
	a.drift.run = run
	periodic := a.cfg.DriftInterval > 0 && (a.drift.last.IsZero() || a.clock.Since(a.drift.last) >= a.cfg.DriftInterval)
	if !started && !periodic && !a.drift.due {
		if a.upgrade.watching() {
			a.watchDown(ctx, "running, not answering", run)
		}
		return
	}
	if started {
		a.log.Info("kubelet started, not by the sidecar; checking it for drift", zap.String("node", a.cfg.NodeName),
			zap.String("run", run))
	}
	if !a.checkDrift(ctx) && ctx.Err() == nil {
		a.watchDown(ctx, "running, not answering", run)
	}
}

// checkDrift makes one check and takes its finding; it reports whether the check was made. A check that
// cannot be made keeps what the last one found.
func (a *Agent) checkDrift(ctx context.Context) bool {
	cctx, cancel := context.WithTimeout(ctx, driftTimeout)
	f, err := a.findDrift(cctx)
	cancel()
	if ctx.Err() != nil {
		return false // stopping: what failed says nothing of the kubelet
	}
	if err != nil {
		// Still due, at the next tick: a check a kubelet start asked for must not wait for the interval
		// because the kubelet was not serving /configz yet.
		a.drift.due = true
		a.metrics.driftChecked(driftCheckError)
		a.log.Info("drift check could not be made; the last finding stands, checking again at the next tick",
			zap.String("node", a.cfg.NodeName), zap.Error(err))
		return false
	}
	a.upgradeEpisodeOver() // the kubelet answered
	a.drift.last, a.drift.due = a.clock.Now(), false
	if !a.drift.checked {
		a.drift.checked = true
		if f == nil && a.drift.current == nil {
			a.report() // "none found" replaces a drift a Node may still show from before this sidecar started
		}
	}
	if f == nil {
		a.metrics.driftChecked(driftCheckNone)
	} else {
		a.metrics.driftChecked(driftCheckDrift)
	}
	a.takeDrift(f)
	return true
}

// takeDrift makes f the standing drift (nil: none) and, when that changed, logs and reports it. A drift of
// the same cause and fields keeps the time it was first found.
func (a *Agent) takeDrift(f *finding) {
	old := a.drift.current
	if f == nil {
		if old == nil {
			return
		}
		a.drift.current = nil
		a.metrics.setDrift("")
		a.log.Info("kubelet config drift gone", zap.String("node", a.cfg.NodeName), zap.String("cause", old.GetCause()),
			zap.Strings("fields", old.GetFields()), zap.Time("detectedTime", old.GetDetectedTime().AsTime()))
		a.report()
		return
	}
	if note := a.repairNote(f.cause); note != "" {
		f.message += "; " + note
	}
	fields := f.fields
	if len(fields) > maxDriftFields {
		fields = fields[:maxDriftFields]
	}
	next := &dkcv1.Drift{Cause: f.cause, Fields: fields, Message: truncateMessage(f.message),
		DetectedTime: timestamp(a.clock.Now())}
	if old != nil && old.GetCause() == next.GetCause() && slices.Equal(old.GetFields(), next.GetFields()) {
		next.DetectedTime = old.GetDetectedTime()
		if old.GetMessage() == next.GetMessage() {
			return
		}
	}
	a.drift.current = next
	a.metrics.setDrift(next.GetCause())
	a.log.Warn("kubelet config drift", zap.String("node", a.cfg.NodeName), zap.String("cause", f.cause),
		zap.Strings("fields", f.fields), zap.Strings("flags", f.flags), zap.Strings("files", f.files),
		zap.String("message", f.message), zap.Time("detectedTime", next.GetDetectedTime().AsTime()))
	a.report()
}

// Drift is the drift the last check found; nil when it found none or none was made.
func (a *Agent) Drift() *dkcv1.Drift { return a.drift.current }

// noDrift is what reports carry once a check found none: a Drift without a cause.
var noDrift = &dkcv1.Drift{}

// driftReport is what the node's reports say of drift: the drift found, noDrift once a check found none,
// nil before any check succeeded (dkc-server then leaves the Node's ConfigDrift condition as it is).
func (a *Agent) driftReport() *dkcv1.Drift {
	switch {
	case a.drift.current != nil:
		return a.drift.current
	case a.drift.checked:
		return noDrift
	}
	return nil
}

// findDrift makes one check: nil when the kubelet runs what it should, wired as dkc wired it.
func (a *Agent) findDrift(ctx context.Context) (*finding, error) {
	file := a.configFile(a.active)
	if f, err := a.checkWiring(ctx, file); f != nil || err != nil {
		return f, err
	}
	if a.active == nil || a.active.ConfigMap == nil {
		return nil, nil // the node's own config: nothing of dkc's to drift from
	}
	flags, err := a.kubeletFlags(ctx)
	if err != nil {
		return nil, fmt.Errorf("the kubelet's flags: %w", err)
	}
	return a.compareFields(ctx, file, flags)
}

// checkWiring finds dkc's wiring gone or changed: the env file, the unit loading it through dkc's
// drop-in, the drop-in itself, and the --config the kubelet runs.
func (a *Agent) checkWiring(ctx context.Context, file string) (*finding, error) {
	env := a.env.Path
	data, err := os.ReadFile(env)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return &finding{cause: DriftWiringRemoved, files: []string{env}, message: fmt.Sprintf("dkc's env file %s is "+
			"gone: the kubelet's next start runs the config its unit names, not %s", env, file)}, nil
	case err != nil:
		return nil, fmt.Errorf("read the env file: %w", err)
	case string(data) != kubeletunit.EnvContent(file):
		return &finding{cause: DriftWiringReplaced, files: []string{env}, message: fmt.Sprintf("dkc's env file %s "+
			"does not hold what dkc wrote (--config=%s) but %s", env, file, short(string(data)))}, nil
	}
	dropIn := a.cfg.KubeletDropIn
	if u, ok := a.svc.(unitWiring); ok {
		loads, err := u.LoadsEnvironmentFile(ctx, env)
		if err != nil {
			return nil, err
		}
		paths, err := u.DropInPaths(ctx)
		if err != nil {
			return nil, err
		}
		listed := dropIn != "" && slices.Contains(paths, dropIn)
		switch {
		case !loads && listed:
			return &finding{cause: DriftWiringReplaced, files: []string{dropIn}, message: fmt.Sprintf("dkc's "+
				"drop-in %s no longer makes the kubelet unit load %s: the kubelet's next start does not run %s",
				dropIn, env, file)}, nil
		case !loads:
			return &finding{cause: DriftWiringRemoved, files: []string{dropIn}, message: fmt.Sprintf("the kubelet unit "+
				"no longer loads dkc's drop-in %s, nor %s: the kubelet's next start does not run %s", dropIn, env,
				file)}, nil
		case listed:
			// The file systemd loaded, as it is now: only where the sidecar sees its directory (the
			// DaemonSet's main container does not; its init container writes there). A unit wired through a
			// drop-in of another name (loads, not listed) is wired all the same.
			if f := a.checkDropInFile(dropIn, env); f != nil {
				return f, nil
			}
		}
	}
	if a.cfg.KubeletFlags == nil {
		if pid, err := a.svc.MainPID(ctx); err == nil && pid > 0 {
			if args, err := kubeletunit.CommandLine(a.procDir(), pid); err == nil && len(args) > 0 {
				if config, _ := configcheck.ConfigFlag(args[1:]); config != "" &&
					filepath.Clean(config) != filepath.Clean(file) {
					return &finding{cause: DriftWiringReplaced, flags: []string{"--config=" + config},
						message: fmt.Sprintf("the kubelet runs --config=%s, not %s, which dkc's env file %s names",
							config, file, env)}, nil
				}
			}
		}
	}
	return nil, nil
}

// checkDropInFile finds dkc's drop-in, which the kubelet unit loaded, gone or changed since; nil when it is
// as dkc installed it, or its directory is not seen.
func (a *Agent) checkDropInFile(dropIn, env string) *finding {
	if _, err := os.Stat(filepath.Dir(dropIn)); err != nil {
		return nil
	}
	got, err := os.ReadFile(dropIn)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return &finding{cause: DriftWiringRemoved, files: []string{dropIn}, message: fmt.Sprintf("dkc's drop-in %s is "+
			"gone: after the node's next daemon-reload the kubelet unit no longer loads %s", dropIn, env)}
	case err != nil:
		return nil // unreadable here (permissions of the mount): systemd's word above stands
	case string(got) != kubeletunit.DropIn(a.store.Dir()):
		return &finding{cause: DriftWiringReplaced, files: []string{dropIn}, message: fmt.Sprintf("dkc's drop-in %s "+
			"does not hold what dkc installed but %s", dropIn, short(string(got)))}
	}
	return nil
}

// compareFields compares /configz with the config in file (a checkpoint) as the kubelet should run it with
// these flags, and names the cause of what differs.
func (a *Agent) compareFields(ctx context.Context, file string, flags []string) (*finding, error) {
	content, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", file, err)
	}
	var set map[string]any
	if err := yaml.Unmarshal(content, &set); err != nil {
		return nil, fmt.Errorf("parse %s: %w", file, err)
	}
	version := a.checkVersion()
	// What the config says by itself: the kubelet's code with no flag and no drop-in (the same check as
	// the next one without flags). Asked first: the prober learns the kubelet's --cert-dir from each
	// check's flags, and this one has none.
	var own *configcheck.Checked
	var ownErr error
	if len(flags) > 0 {
		own, ownErr = a.cfg.Checker.Check(ctx, configcheck.Request{File: file, KubeletVersion: version})
	}
	// What the kubelet runs with the node's flags and drop-ins, as the restart path verified it.
	eff, err := a.cfg.Checker.Check(ctx, configcheck.Request{File: file, Flags: flags, KubeletVersion: version})
	if err != nil {
		return nil, fmt.Errorf("check %s as the kubelet runs it: %w", file, err)
	}
	if own == nil {
		own = eff
	} else if ownErr != nil {
		// E.g. a config that validates only with a feature gate the command line sets: compared with what
		// the node makes of it, a flag's or drop-in's value is not seen as a difference.
		a.log.Debug("drift: the config does not check without the kubelet's flags; compared as the node runs it",
			zap.String("file", file), zap.Error(ownErr))
		own = eff
	}
	running, err := a.kubelet.Configz(ctx, eff)
	if err != nil {
		return nil, fmt.Errorf("read the kubelet's /configz: %w", err)
	}
	var paths []string
	for k := range set {
		if k != "apiVersion" && k != "kind" {
			diffLeaves(k, own.Fields[k], running[k], &paths)
		}
	}
	for _, k := range eff.DropInKeys {
		if _, ok := set[k]; !ok {
			diffLeaves(k, eff.Fields[k], running[k], &paths)
		}
	}
	sort.Strings(paths)
	minor := checkapi.Minor(eff.KubeletVersion)
	if minor == "" {
		minor = checkapi.Minor(version)
	}
	if len(paths) == 0 {
		if minor != "" && minor != a.drift.minor {
			if a.drift.minor != "" {
				a.log.Info("the active config runs as it should under the kubelet's new minor",
					zap.String("node", a.cfg.NodeName), zap.String("minor", minor), zap.String("was", a.drift.minor))
			}
			a.drift.minor = minor // checked with this minor's code, and running as it says
		}
		return nil, nil
	}
	want := func(path string) any {
		k := topKey(path)
		if _, ok := set[k]; ok {
			return leaf(own.Fields, path)
		}
		return leaf(eff.Fields, path)
	}
	describeField := func(path, by string) string {
		s := fmt.Sprintf("%s: expected %s, running %s", path, short(jsonValue(want(path))), short(jsonValue(leaf(running,
			path))))
		if by != "" {
			s += " (" + by + ")"
		}
		return s
	}
	if a.drift.minor != "" && minor != "" && minor != a.drift.minor {
		details := make([]string, 0, maxDriftDetails)
		for _, p := range paths[:min(len(paths), maxDriftDetails)] {
			details = append(details, describeField(p, ""))
		}
		return &finding{cause: DriftKubeletMinorChanged, fields: paths, message: fmt.Sprintf("the kubelet is of minor "+
			"%s, the config %s was proven running under %s: %s%s", minor, describe(a.active), a.drift.minor,
			strings.Join(details, "; "), more(len(paths)))}, nil
	}
	return a.nameCauses(ctx, file, flags, paths, own, eff, running, describeField), nil
}

// nameCauses names the cause of each differing field: a flag on the kubelet's command line that sets it,
// a drop-in of --config-dir that sets it, else Unknown; the drift's cause is the first of those a field
// has.
func (a *Agent) nameCauses(ctx context.Context, file string, flags, paths []string, own, eff *configcheck.Checked,
	running map[string]any, describeField func(path, by string) string) *finding {
	configDir := probe.FlagValue(flags, "config-dir", "")
	if configDir != "" && !filepath.IsAbs(configDir) {
		configDir = filepath.Join("/", configDir) // as the kubelet's unit walks it (kubeletcheck.ConfigDir)
	}
	setBy := dropInKeys(configDir)
	var dirOnly *configcheck.Checked // the config with the drop-ins and no flag; asked once, if needed
	causeOf := func(path string) (cause, by, flag, file string) {
		k := topKey(path)
		if f := flagFor(path, flags); f != "" {
			return DriftFlagOverride, "set by the kubelet flag " + f, f, ""
		}
		if f := setBy[k]; f != "" {
			return DriftConfigDirDropIn, "set by the drop-in " + f, "", f
		}
		if own == eff || !reflect.DeepEqual(leaf(running, path), leaf(eff.Fields, path)) {
			return DriftUnknown, "", "", ""
		}
		// The kubelet runs what the node's flags and drop-ins make of the config, but neither names the field:
		// a flag of another name, or merging the drop-ins (which drops the file's empty lists).
		if configDir == "" {
			return DriftFlagOverride, "set by a flag on the kubelet's command line", "", ""
		}
		if dirOnly == nil {
			c, err := a.cfg.Checker.Check(ctx, configcheck.Request{File: file, Flags: configDirFlags(configDir),
				KubeletVersion: a.checkVersion()})
			if err != nil {
				c = eff
			}
			dirOnly = c
		}
		if reflect.DeepEqual(leaf(dirOnly.Fields, path), leaf(eff.Fields, path)) {
			return DriftConfigDirDropIn, "as the kubelet merges the drop-ins of " + configDir, "", configDir
		}
		return DriftFlagOverride, "set by a flag on the kubelet's command line", "", ""
	}
	rank := map[string]int{DriftFlagOverride: 0, DriftConfigDirDropIn: 1, DriftUnknown: 2}
	f := &finding{cause: DriftUnknown, fields: paths}
	var details []string
	for _, p := range paths {
		cause, by, flag, file := causeOf(p)
		if rank[cause] < rank[f.cause] {
			f.cause = cause
		}
		if flag != "" && !slices.Contains(f.flags, flag) {
			f.flags = append(f.flags, flag)
		}
		if file != "" && !slices.Contains(f.files, file) {
			f.files = append(f.files, file)
		}
		if len(details) < maxDriftDetails {
			details = append(details, describeField(p, by))
		}
	}
	f.message = fmt.Sprintf("the kubelet does not run %s as it says: %s%s", describe(a.active),
		strings.Join(details, "; "), more(len(paths)))
	return f
}

// more is the message's tail for fields not detailed.
func more(n int) string {
	if n <= maxDriftDetails {
		return ""
	}
	return fmt.Sprintf("; and %d more", n-maxDriftDetails)
}

// diffLeaves appends the JSON paths under path where running differs from want. Objects are compared key by
// key on the keys want has (a key only the running config has is not set by what it should run, e.g. a
// feature gate a flag adds); anything else as a whole.
func diffLeaves(path string, want, running any, out *[]string) {
	w, wok := want.(map[string]any)
	r, rok := running.(map[string]any)
	if wok && rok && len(w) > 0 {
		keys := make([]string, 0, len(w))
		for k := range w {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			diffLeaves(path+"."+k, w[k], r[k], out)
		}
		return
	}
	if !reflect.DeepEqual(want, running) {
		*out = append(*out, path)
	}
}

// leaf is the value at a diffLeaves path in fields; nil if absent. Keys may hold dots themselves
// (evictionHard's "memory.available"): the longest key that matches is taken at each level.
func leaf(fields map[string]any, path string) any {
	var cur any = fields
	for path != "" {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		found := false
		for i := len(path); i > 0; i-- {
			if i < len(path) && path[i] != '.' {
				continue
			}
			if v, ok := m[path[:i]]; ok {
				cur, path, found = v, strings.TrimPrefix(path[i:], "."), true
				break
			}
		}
		if !found {
			return nil
		}
	}
	return cur
}

// topKey is the top-level field of a path.
func topKey(path string) string {
	k, _, _ := strings.Cut(path, ".")
	return k
}

// jsonValue is v as JSON, for a message.
func jsonValue(v any) string {
	if v == nil {
		return "unset"
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

// short cuts s to maxDriftValue bytes, at a UTF-8 boundary, on one line.
func short(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) <= maxDriftValue {
		return s
	}
	cut := maxDriftValue
	for cut > 0 && s[cut]&0xC0 == 0x80 {
		cut--
	}
	return s[:cut] + "…"
}

// dropInKeys maps each top-level field the drop-ins of dir (--config-dir; "": none) set to the last one
// that sets it, in the order the kubelet merges them (every *.conf, subdirectories too, lexical). Only to
// name a cause: what the drop-ins make of the config is the kubelet's code's (kubeletcheck.MergeDropIns,
// through the checker). Files that cannot be read or parsed are skipped: the checker reports them.
func dropInKeys(dir string) map[string]string {
	setBy := map[string]string{}
	if dir == "" {
		return setBy
	}
	_ = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || filepath.Ext(d.Name()) != ".conf" {
			return nil //nolint:nilerr // an unreadable entry names nothing; the checker reports it
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return nil //nolint:nilerr // as above
		}
		var fields map[string]any
		if yaml.Unmarshal(data, &fields) != nil {
			return nil
		}
		for k := range fields {
			if k != "apiVersion" && k != "kind" {
				setBy[k] = path
			}
		}
		return nil
	})
	return setBy
}

// configDirFlags is a command line with --config-dir alone.
func configDirFlags(dir string) []string { return []string{"--config-dir=" + dir} }

// flagFor is the kubelet flag on the command line (flags) that sets the field at path, "" if none does.
// The kubelet names most of its config flags after the field (maxPods: --max-pods); the others are listed.
func flagFor(path string, flags []string) string {
	const absent = "\x00"
	var names []string
	for prefix, name := range irregularFlags {
		if path == prefix || strings.HasPrefix(path, prefix+".") {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		names = []string{kebab(topKey(path))}
	}
	for _, name := range names {
		if probe.FlagValue(flags, name, absent) != absent {
			return "--" + name
		}
	}
	return ""
}

// irregularFlags are the kubelet's config flags not named after their field (cmd/kubelet/app/options,
// AddKubeletConfigFlags), by field path.
var irregularFlags = map[string]string{
	"kubeAPIQPS":                                 "kube-api-qps",
	"kubeAPIBurst":                               "kube-api-burst",
	"staticPodPath":                              "pod-manifest-path",
	"staticPodURL":                               "manifest-url",
	"staticPodURLHeader":                         "manifest-url-header",
	"imageGCHighThresholdPercent":                "image-gc-high-threshold",
	"imageGCLowThresholdPercent":                 "image-gc-low-threshold",
	"authentication.x509.clientCAFile":           "client-ca-file",
	"authentication.anonymous.enabled":           "anonymous-auth",
	"authentication.webhook.enabled":             "authentication-token-webhook",
	"authentication.webhook.cacheTTL":            "authentication-token-webhook-cache-ttl",
	"authorization.mode":                         "authorization-mode",
	"authorization.webhook.cacheAuthorizedTTL":   "authorization-webhook-cache-authorized-ttl",
	"authorization.webhook.cacheUnauthorizedTTL": "authorization-webhook-cache-unauthorized-ttl",
	"podPidsLimit":                               "pod-max-pids",
	"eventRecordQPS":                             "event-qps",
	"registryPullQPS":                            "registry-qps",
	"contentType":                                "kube-api-content-type",
	"makeIPTablesUtilChains":                     "make-iptables-util-chains",
	"reservedSystemCPUs":                         "reserved-cpus",
	"enableContentionProfiling":                  "contention-profiling",
}

// kebab is the flag name for a field name: maxPods → max-pods, podCIDR → pod-cidr, cpuCFSQuota →
// cpu-cfs-quota.
func kebab(field string) string {
	r := []rune(field)
	var b strings.Builder
	for i, c := range r {
		if unicode.IsUpper(c) && i > 0 {
			prevLower := unicode.IsLower(r[i-1]) || unicode.IsDigit(r[i-1])
			nextLower := i+1 < len(r) && unicode.IsLower(r[i+1])
			if prevLower || (unicode.IsUpper(r[i-1]) && nextLower) {
				b.WriteByte('-')
			}
		}
		b.WriteRune(unicode.ToLower(c))
	}
	return b.String()
}
