// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"

	"github.com/dkc-dev/dkc/internal/kubeletcheck/checkapi"
	"github.com/dkc-dev/dkc/internal/nodeconfig"
	"github.com/dkc-dev/dkc/sidecar/internal/systemd"
)

// This file finds a kubelet upgraded in place that does not come up: its binary replaced by a package
// upgrade, then the kubelet restarted by someone else than the sidecar, into a config the new minor refuses
// (a feature gate locked since, a field removed). The kubelet exits at every start, systemd gives up on it,
// and it never registers, so the Node keeps the old version and dkc-server never sends the new one: left to
// the rest of the agent, nothing would happen (the drift check looks only at a running kubelet).
//
// So while the node is settled (driftCheckable), an episode begins when a tick sees the kubelet not running,
// or a drift check fails (it runs, but does not answer); a drift check that succeeds, or a restart the
// sidecar makes, ends it. Only a kubelet seen down, or in another run, during the episode is suspected (it
// crash-loops, as on a config it refuses): one that runs on without answering — the apiserver away during a
// control-plane upgrade, the binary on disk replaced but not restarted — is not, as a running kubelet is
// not refusing its config. Once a suspected episode has lasted --health-timeout, or at once when the unit
// is failed (systemd gave up), the sidecar asks the binary the kubelet unit starts for its version, through
// the node's systemd (systemd.Manager.BinaryVersion: a transient unit dkc-kubelet-version-<random>.service
// running `<ExecStart's program> --version` into <dynamic-config-dir>/kubelet-version, without network),
// once per episode (a probe that fails is made again at the next tick, at most maxProbes times).
//
// A binary of the minor configs are checked with says nothing new: the kubelet is not dkc's to restart. A
// binary of another minor is the node's kubelet version from now on, as if dkc-server had sent it
// (dkc-server sends the Node's, which still names the old one: the version it overrode is ignored when sent
// again), and a round runs with that minor's code, through the rollback rules every round follows:
//   - the new minor refuses the assigned config: it falls back to last-known-good if the new minor accepts
//     that one, else to the node's local config, restarting the kubelet once into it through the restart
//     path (reset-failed first, health wait, /configz proof). The status is the refusal (failed to load or
//     to validate config), its detail naming the upgrade, the minor, the config and the kubelet's error, and
//     what the node runs. A refused config is never run: every round checks it with this minor's code again
//     and refuses it, until something else is assigned or the minor changes again.
//   - the new minor accepts the assigned config: the kubelet runs it as proven before, so the round restarts
//     nothing, and the kubelet is left as it is (its failure is not the config's, as far as dkc can tell):
//     the sidecar reports it as drift of cause KubeletMinorChanged, with a Warn log, until a check finds the
//     kubelet running what it should.

// binaryVersions is a service manager that can ask the kubelet unit's binary its version (systemd.Manager).
type binaryVersions interface {
	// BinaryVersion is `systemd-run --wait --collect --property Type=oneshot --property
	// StandardOutput=truncate:OUT BIN --version`, BIN the kubelet unit's ExecStart program: what it printed.
	BinaryVersion(ctx context.Context, out string) (string, error)
}

// unitStates is a service manager that tells the kubelet unit's state (systemd.Manager).
type unitStates interface {
	// State is `systemctl show --property ActiveState,Result kubelet`.
	State(ctx context.Context) (activeState, result string, err error)
}

// upgradeState is what the agent watches and found of a kubelet that does not come up.
type upgradeState struct {
	// down is when the current episode began (the agent's clock); zero: none.
	down time.Time
	// probed: the binary's version was asked in this episode (or asking failed maxProbes times).
	probed bool
	// failedProbes counts the probes of this episode that failed.
	failedProbes int
	// firstRun is the kubelet's run (kubeletRun) when the episode began, "" when it did not run; crashing:
	// the kubelet was seen not running, or another run, since: what a config it refuses does to it. A
	// kubelet that runs on without answering (the apiserver away, its /configz refused) is not suspected.
	firstRun string
	crashing bool
	// over is the service's kubelet version that the binary's overrode; ignored when the service sends it
	// again, until it sends another.
	over string
	// change is the last minor change the probe found; nil: none.
	change *minorChange
}

// minorChange is a kubelet upgraded (or downgraded) in place, found by the version probe.
type minorChange struct {
	from, to string                   // the minors
	src      *corev1.NodeConfigSource // the node's assignment then
}

// watching says whether an episode stands in which the binary was not asked yet.
func (u *upgradeState) watching() bool { return !u.down.IsZero() && !u.probed }

// upgradeEpisodeOver ends an episode: the kubelet answered, or the sidecar restarted it.
func (a *Agent) upgradeEpisodeOver() {
	a.upgrade.down, a.upgrade.probed, a.upgrade.failedProbes = time.Time{}, false, 0
	a.upgrade.firstRun, a.upgrade.crashing = "", false
}

// maxProbes bounds the failed version probes of one episode: a binary path the probe refuses, or a
// systemd that cannot run it, would fail at every tick.
const maxProbes = 3

// watchDown counts a tick at which the kubelet does not run, or runs without answering, and asks the binary
// its version when the episode is due (see the file's comment).
func (a *Agent) watchDown(ctx context.Context, why, run string) {
	u := &a.upgrade
	switch {
	case u.down.IsZero():
		u.down, u.firstRun, u.crashing = a.clock.Now(), run, run == ""
	case run == "" || run != u.firstRun:
		u.crashing = true
	}
	if u.probed || !u.crashing {
		return
	}
	failed := false
	if s, ok := a.svc.(unitStates); ok {
		if state, _, err := s.State(ctx); err == nil && state == "failed" {
			failed, why = true, "its unit failed"
		}
	}
	if !failed && a.clock.Since(u.down) < a.cfg.HealthTimeout {
		return
	}
	a.probeVersion(ctx, why)
}

// probeVersion asks the binary the kubelet unit starts for its version, and takes a new minor.
func (a *Agent) probeVersion(ctx context.Context, why string) {
	bv, ok := a.svc.(binaryVersions)
	if !ok {
		a.upgrade.probed = true // this service manager cannot run it: nothing to ask in this episode
		return
	}
	out := filepath.Join(a.store.Dir(), systemd.VersionFileName)
	cctx, cancel := context.WithTimeout(ctx, driftTimeout)
	text, err := bv.BinaryVersion(cctx, out)
	cancel()
	if ctx.Err() != nil {
		return
	}
	log := a.log.With(zap.String("node", a.cfg.NodeName), zap.String("reason", why),
		zap.Duration("down", a.clock.Since(a.upgrade.down)))
	if err != nil {
		if a.upgrade.failedProbes++; a.upgrade.failedProbes >= maxProbes {
			a.upgrade.probed = true
			log.Warn("kubelet not running healthy; cannot ask its binary its version, not asking again until it "+
				"runs", zap.Int("attempts", a.upgrade.failedProbes), zap.Error(err))
			return
		}
		log.Info("kubelet not running healthy; cannot ask its binary its version, asking again at the next tick",
			zap.Error(err))
		return
	}
	a.upgrade.probed = true
	version := binaryVersion(text)
	if version == "" {
		log.Warn("kubelet not running healthy; its binary's --version names no version", zap.String("output", short(text)))
		return
	}
	a.takeBinaryVersion(ctx, log, version)
}

// binaryVersion is the version `kubelet --version` printed ("Kubernetes v1.37.2"); "" if none.
func binaryVersion(text string) string {
	for _, f := range strings.Fields(text) {
		if strings.HasPrefix(f, "v") && checkapi.Minor(f) != "" {
			return f
		}
	}
	return ""
}

// takeBinaryVersion acts on the version of the binary the kubelet unit starts (see the file's comment).
func (a *Agent) takeBinaryVersion(ctx context.Context, log *zap.Logger, version string) {
	minor, checking := checkapi.Minor(version), checkapi.Minor(a.checkVersion())
	log = log.With(zap.String("binaryVersion", version), zap.String("kubeletVersion", a.checkVersion()))
	switch {
	case minor == checking:
		log.Info("kubelet not running healthy; its binary is of the minor its configs are checked with, so it is " +
			"not dkc's to restart")
		return
	case a.cfg.KubeletVersion != "":
		log.Warn("kubelet not running healthy; its binary is of another minor than --kubelet-version, which configs " +
			"are still checked with as told")
		return
	}
	from := a.drift.minor
	if from == "" {
		from = checking
	}
	assigned, _ := a.store.Assigned()
	log.Warn("kubelet upgraded in place: the binary its unit starts is of another minor, and the kubelet does not run "+
		"healthy; checking the node's configs with that minor's code", zap.String("from", from), zap.String("to", minor))
	a.upgrade.change = &minorChange{from: from, to: minor, src: assigned}
	if a.upgrade.over == "" {
		a.upgrade.over = a.kubeletVersion
	}
	a.setKubeletVersion(version)
	a.reconcile(ctx)
	if a.configError != "" || assigned == nil || !nodeconfig.SameSource(a.active, assigned) {
		return // refused (the status says so), or rolled back
	}
	// The new minor accepts what the kubelet should run, and it was proven running before: nothing to
	// change, and nothing of the config's to blame. Said as drift, which stands until the kubelet runs it.
	log.Warn("the kubelet's new minor accepts its config, and it does not run healthy; dkc does not restart it",
		sourceFields(assigned)...)
	a.takeDrift(&finding{cause: DriftKubeletMinorChanged, message: fmt.Sprintf("the kubelet was upgraded in place from "+
		"%s to %s, whose code accepts %s, but it has not run healthy since; dkc does not restart it: see the kubelet's log",
		from, minor, describe(assigned))})
}

// setKubeletVersion makes version the node kubelet's, which configs are checked with, and records it.
func (a *Agent) setKubeletVersion(version string) {
	a.kubeletVersion = version
	a.drift.due = true // what the kubelet should run is judged with this minor's code now
	if a.state.s.KubeletVersion != version {
		a.state.s.KubeletVersion = version
		if err := a.state.save(); err != nil {
			a.log.Warn("cannot record the kubelet's version; an uninstall would not validate the local config with it",
				zap.Error(err))
		}
	}
}

// serviceVersion says whether the kubelet version the service sent is to be taken: not the one the binary's
// version overrode, sent again while the Node still shows it. Any other version the service sends (the
// Node registered by the new kubelet, or one downgraded since) ends the override.
func (a *Agent) serviceVersion(v string) bool {
	if a.upgrade.over != "" && v == a.upgrade.over {
		return false
	}
	a.upgrade.over = ""
	return true
}

// upgradeDetail is the detail of a round's status that names a minor change the probe found, when the
// status is the assigned config's refusal by the new minor; "" otherwise.
func (a *Agent) upgradeDetail(r round, d decision) string {
	c := a.upgrade.change
	if c == nil || r.assigned == nil || !nodeconfig.SameSource(r.assigned, c.src) ||
		checkapi.Minor(a.checkVersion()) != c.to {
		return ""
	}
	switch d.status {
	case nodeconfig.LoadError, nodeconfig.ValidateError, nodeconfig.UnsupportedKubeletError:
	default:
		return ""
	}
	var runs string
	switch d.phase {
	case PhaseLocalFallback:
		runs = "; running the node's local config"
	case PhaseRolledBack:
		runs = "; running its last-known-good " + describe(r.lkg)
	case PhaseHeld:
		runs = "; the kubelet is left alone"
	}
	if d.status == nodeconfig.UnsupportedKubeletError {
		return fmt.Sprintf("kubelet upgraded in place from %s to %s, for which this dkc cannot check %s: %s%s", c.from,
			c.to, describe(r.assigned), d.detail, runs)
	}
	return fmt.Sprintf("kubelet upgraded in place from %s to %s, which refuses %s: %s%s", c.from, c.to,
		describe(r.assigned), d.detail, runs)
}
