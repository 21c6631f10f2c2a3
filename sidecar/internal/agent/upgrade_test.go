// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dkc-dev/dkc/internal/configcheck"
	"github.com/dkc-dev/dkc/internal/kubeletcheck"
	"github.com/dkc-dev/dkc/internal/kubeletcheck/checkapi"
	"github.com/dkc-dev/dkc/internal/nodeconfig"
	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
)

// upgradedUnit is the fake systemd of drift_test.go that also runs the kubelet unit's binary with --version
// (binaryVersions) and tells the unit's state (unitStates).
type upgradedUnit struct {
	*systemdKubelet
	vmu      sync.Mutex
	binary   string // what `kubelet --version` prints
	probeErr error  // the version unit fails with it
	probes   int
	failed   bool // the unit is failed (systemd gave up on its start limit)
}

func (u *upgradedUnit) BinaryVersion(_ context.Context, out string) (string, error) {
	u.vmu.Lock()
	defer u.vmu.Unlock()
	u.probes++
	if !strings.HasSuffix(out, "/kubelet-version") {
		return "", fmt.Errorf("output file %s", out)
	}
	if u.probeErr != nil {
		return "", u.probeErr
	}
	return u.binary, nil
}

func (u *upgradedUnit) State(context.Context) (string, string, error) {
	u.vmu.Lock()
	defer u.vmu.Unlock()
	if u.failed {
		return "failed", "start-limit-hit", nil
	}
	return "active", "success", nil
}

func (u *upgradedUnit) Restart(ctx context.Context) error {
	u.vmu.Lock()
	u.failed = false // as systemd.Manager's: reset-failed first
	u.vmu.Unlock()
	return u.systemdKubelet.Restart(ctx)
}

func (u *upgradedUnit) probeCount() int {
	u.vmu.Lock()
	defer u.vmu.Unlock()
	return u.probes
}

// crash is the kubelet restarted by hand on the upgraded binary, exiting at every start until systemd
// gives up (failed) or still restarting it (not failed).
func (u *upgradedUnit) crash(binary string, failed bool) {
	u.vmu.Lock()
	u.binary, u.failed = binary, failed
	u.vmu.Unlock()
	u.mu.Lock()
	u.external++
	u.mu.Unlock()
	k := u.fakeKubelet
	k.mu.Lock()
	k.stopped = true
	k.mu.Unlock()
}

// refusedOn137 marks a config that kubelet 1.37's code refuses, as it refuses featureGates
// {ExecProbeTimeout: false} (the code linked into the tests is of one minor: the checker plays the others).
const refusedOn137 = "maxPods: 77\n"

// upgradeChecker checks with the kubelet code linked in, as of the minor asked for: 1.37 refuses
// refusedOn137 as the kubelet's loader does, 1.38 has no helper.
type upgradeChecker struct{}

func (upgradeChecker) Check(ctx context.Context, req configcheck.Request) (*configcheck.Checked, error) {
	switch checkapi.Minor(req.KubeletVersion) {
	case "1.38":
		return nil, fmt.Errorf("%w: kubelet %s is not supported by this dkc (kubelet minors 1.34–1.37)",
			configcheck.ErrUnsupportedKubelet, req.KubeletVersion)
	case "1.37":
		if data, err := os.ReadFile(req.File); err == nil && strings.Contains(string(data), refusedOn137) {
			return nil, fmt.Errorf("%w: failed to load kubelet config file, path: %s, error: cannot set feature gate "+
				"ExecProbeTimeout to false, feature is locked to true", configcheck.ErrLoad, req.File)
		}
	}
	version := req.KubeletVersion
	req.KubeletVersion = "" // the linked code's own
	r, err := kubeletcheck.InProcess{}.Check(ctx, req)
	if err == nil {
		r.KubeletVersion = version
	}
	return r, err
}

// newUpgradeNode is a drift node under upgradedUnit, on kubelet v1.34.2 as the service says, running
// config (assigned and promoted to last-known-good).
func newUpgradeNode(t *testing.T, config string) (*driftNode, *upgradedUnit) {
	t.Helper()
	d := newDriftNode(t, nil, 0)
	u := &upgradedUnit{systemdKubelet: d.unit, binary: "Kubernetes v1.34.2\n"}
	d.cfg.Service, d.cfg.Checker, d.cfg.TrialDuration = u, upgradeChecker{}, 0
	d.agent = New(d.cfg)
	stop := d.drive()
	err := d.agent.Init(context.Background())
	stop()
	if err != nil {
		t.Fatal(err)
	}
	d.send(&dkcv1.WatchConfigResponse{KubeletVersion: "v1.34.2", Assignment: assignment("u", "1", cfgHeader+config)})
	d.tick() // the trial: last-known-good
	st := d.reporter.lastStatus()
	if rv(st.GetActive()) != "1" || rv(st.GetLastKnownGood()) != "1" || st.GetError() != "" || d.kubelet.count() != 1 {
		t.Fatalf("before the upgrade: %v, %d restarts; want config 1 active and last-known-good", st, d.kubelet.count())
	}
	return d, u
}

// send is an update from the service, as the agent's loop takes it.
func (d *driftNode) send(u *dkcv1.WatchConfigResponse) {
	d.t.Helper()
	defer d.drive()()
	d.agent.take(context.Background(), u)
}

func TestKubeletUpgradedInPlace(t *testing.T) {
	for _, tc := range []struct {
		name   string
		config string
		binary string
		failed bool // the unit is failed; else the kubelet is down, its unit restarting it
		// probeFails: so many probes fail first (retried at the next ticks, nothing changed meanwhile).
		probeFails int
		// want: the kubelet's restarts by the sidecar after the upgrade, the file it runs ("" local,
		// "1" the assigned), the status error, what the detail says, the phase and the drift's cause.
		restarts   int
		runs       string
		status     nodeconfig.StatusError
		detail     []string
		phase      Phase
		driftCause string
		version    string // the version configs are checked with afterwards
	}{{
		name: "refused by the new minor: local once", config: refusedOn137, binary: "Kubernetes v1.37.0\n", failed: true,
		restarts: 1, runs: "", status: nodeconfig.LoadError, phase: PhaseLocalFallback, version: "v1.37.0",
		detail: []string{"kubelet upgraded in place from 1.34 to 1.37, which refuses configmap kube-system/c (UID u, " +
			"resourceVersion 1", "cannot set feature gate ExecProbeTimeout to false", "; running the node's local config"},
	}, {
		name: "refused while the unit still restarts it", config: refusedOn137, binary: "Kubernetes v1.37.0\n",
		restarts: 1, runs: "", status: nodeconfig.LoadError, phase: PhaseLocalFallback, version: "v1.37.0",
		detail: []string{"from 1.34 to 1.37", "; running the node's local config"},
	}, {
		name: "refused after two failed probes", config: refusedOn137, binary: "Kubernetes v1.37.0\n", failed: true,
		probeFails: 2, restarts: 1, runs: "", status: nodeconfig.LoadError, phase: PhaseLocalFallback, version: "v1.37.0",
		detail: []string{"from 1.34 to 1.37", "; running the node's local config"},
	}, {
		name: "no helper for the new minor: left alone", config: "maxPods: 78\n", binary: "Kubernetes v1.38.1\n",
		failed: true, runs: "1", status: nodeconfig.UnsupportedKubeletError, phase: PhaseHeld, version: "v1.38.1",
		detail: []string{"from 1.34 to 1.38, for which this dkc cannot check configmap", "not supported by this dkc", "; the kubelet is left alone"},
	}, {
		name: "accepted by the new minor: not restarted, drift", config: "maxPods: 78\n", binary: "Kubernetes v1.37.0\n",
		failed: true, runs: "1", phase: PhaseGood, driftCause: DriftKubeletMinorChanged, version: "v1.37.0",
	}, {
		name: "same minor: nothing", config: refusedOn137, binary: "Kubernetes v1.34.9\n", failed: true,
		runs: "1", phase: PhaseGood, version: "v1.34.2",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			d, u := newUpgradeNode(t, tc.config)
			before := d.kubelet.count()
			u.crash(tc.binary, tc.failed)
			if tc.probeFails > 0 {
				u.probeErr = errors.New("dkc-kubelet-version-x.service: job failed")
			}
			if !tc.failed {
				d.tick() // the episode begins; the probe waits for --health-timeout
				if n := u.probeCount(); n != 0 {
					t.Fatalf("%d probes before --health-timeout, want none", n)
				}
				d.clock.Step(d.cfg.HealthTimeout)
			}
			for i := 0; i < tc.probeFails; i++ {
				d.tick()
				if n, r := u.probeCount(), d.kubelet.count()-before; n != i+1 || r != 0 || d.agent.kubeletVersion != "v1.34.2" {
					t.Fatalf("after %d failed probes: %d probes, %d restarts, version %s; want a probe each tick, nothing changed",
						i+1, n, r, d.agent.kubeletVersion)
				}
			}
			u.vmu.Lock()
			u.probeErr = nil
			u.vmu.Unlock()
			for range 5 { // no loop: ticks after the first change nothing
				d.tick()
			}
			d.send(&dkcv1.WatchConfigResponse{KubeletVersion: "v1.34.2"}) // the Node still names the old kubelet
			d.tick()
			if n := u.probeCount(); n != tc.probeFails+1 {
				t.Errorf("%d probes, want %d", n, tc.probeFails+1)
			}
			if r := d.kubelet.count() - before; r != tc.restarts {
				t.Errorf("%d restarts by the sidecar after the upgrade, want %d (%v)", r, tc.restarts, d.kubelet.restarts)
			}
			st := d.reporter.lastStatus()
			t.Logf("status %v; detail %q; drift %v", st, d.agent.detail, d.agent.Drift())
			if rv(st.GetActive()) != map[string]string{"": "local", "1": "1"}[tc.runs] || st.GetError() != string(tc.status) {
				t.Errorf("status %v, want active %q, error %q", st, tc.runs, tc.status)
			}
			for _, s := range tc.detail {
				if !strings.Contains(d.agent.detail, s) {
					t.Errorf("detail %q does not say %q", d.agent.detail, s)
				}
			}
			if d.agent.phase != tc.phase {
				t.Errorf("phase %s, want %s", d.agent.phase, tc.phase)
			}
			if got := d.agent.Drift().GetCause(); got != tc.driftCause {
				t.Errorf("drift %q (%s), want %q", got, d.agent.Drift().GetMessage(), tc.driftCause)
			}
			if d.agent.kubeletVersion != tc.version {
				t.Errorf("configs checked with %s, want %s", d.agent.kubeletVersion, tc.version)
			}
			// The Node registers the new kubelet: nothing more happens, and the detail still says why.
			d.send(&dkcv1.WatchConfigResponse{KubeletVersion: strings.TrimSpace(strings.TrimPrefix(tc.binary, "Kubernetes "))})
			d.tick()
			if r := d.kubelet.count() - before; r != tc.restarts {
				t.Errorf("%d restarts after the Node names the new version, want %d", r, tc.restarts)
			}
			for _, s := range tc.detail {
				if !strings.Contains(d.agent.detail, s) {
					t.Errorf("after the Node names the new version: detail %q does not say %q", d.agent.detail, s)
				}
			}
			// Downgraded again: the Node's old version is taken this time.
			d.send(&dkcv1.WatchConfigResponse{KubeletVersion: "v1.34.2"})
			if d.agent.kubeletVersion != "v1.34.2" {
				t.Errorf("after a downgrade: configs checked with %s, want v1.34.2", d.agent.kubeletVersion)
			}
		})
	}
}

// TestKubeletDownWithoutAnUpgradeIsLeftAlone: a kubelet stopped by hand is asked its version once, and
// nothing else happens; it is asked again only after it ran again.
func TestKubeletDownWithoutAnUpgradeIsLeftAlone(t *testing.T) {
	d, u := newUpgradeNode(t, "maxPods: 78\n")
	u.crash("Kubernetes v1.34.2\n", false)
	for range 3 {
		d.tick()
		d.clock.Step(time.Second)
	}
	if n, r := u.probeCount(), d.kubelet.count(); n != 1 || r != 1 {
		t.Fatalf("%d probes, %d restarts; want 1 probe, no restart after the first", n, r)
	}
	u.startElsewhere(nil)
	d.tick() // a check that succeeds ends the episode
	u.crash("Kubernetes v1.34.2\n", true)
	d.tick()
	if n := u.probeCount(); n != 2 {
		t.Fatalf("%d probes after the kubelet ran and failed again, want 2", n)
	}
}

// TestRunningKubeletNotAnsweringIsNoUpgrade: the package replaced the binary on disk (a minor that refuses
// the config) but nobody restarted the kubelet, and its /configz does not answer (the apiserver away during
// a control-plane upgrade): the kubelet that runs is not suspected — no probe, no restart — however long it
// does not answer. Restarted and crash-looping, it is.
func TestRunningKubeletNotAnsweringIsNoUpgrade(t *testing.T) {
	d, u := newUpgradeNode(t, refusedOn137)
	u.vmu.Lock()
	u.binary = "Kubernetes v1.37.2\n"
	u.vmu.Unlock()
	d.kubelet.mu.Lock()
	d.kubelet.configzErr = errors.New("401 Unauthorized")
	d.kubelet.mu.Unlock()
	d.agent.drift.due = true
	for range 5 {
		d.tick()
		d.clock.Step(d.cfg.HealthTimeout)
	}
	if n, r := u.probeCount(), d.kubelet.count(); n != 0 || r != 1 {
		t.Fatalf("%d probes, %d restarts while the kubelet ran on without answering; want none", n, r)
	}
	if got := d.agent.kubeletVersion; got != "v1.34.2" {
		t.Errorf("configs checked with %s, want the running kubelet's v1.34.2", got)
	}
	u.crash("Kubernetes v1.37.2\n", true)
	d.tick()
	if n := u.probeCount(); n != 1 {
		t.Fatalf("%d probes once the kubelet crash-loops with its unit failed, want 1", n)
	}
}

// TestFailingProbesStop: a probe that keeps failing (a binary path the probe refuses, a systemd that cannot
// run it) is tried maxProbes times in an episode, not at every tick.
func TestFailingProbesStop(t *testing.T) {
	d, u := newUpgradeNode(t, "maxPods: 78\n")
	u.vmu.Lock()
	u.probeErr = errors.New("refused path")
	u.vmu.Unlock()
	u.crash("Kubernetes v1.37.2\n", true)
	for range 2 * maxProbes {
		d.tick()
		d.clock.Step(time.Second)
	}
	if n := u.probeCount(); n != maxProbes {
		t.Fatalf("%d probes, want %d", n, maxProbes)
	}
}
