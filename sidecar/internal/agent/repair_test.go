// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
	"github.com/dkc-dev/dkc/sidecar/internal/kubeletunit"
	"github.com/dkc-dev/dkc/sidecar/internal/systemd"
)

// InstallFile is the transient unit's copy, on the fake systemd: what systemd.Manager would refuse to send
// is refused, else dst gets src's content (the tests see the unit directory).
func (u *systemdKubelet) InstallFile(_ context.Context, src, dst string) error {
	u.mu.Lock()
	hook, fail := u.onInstall, u.failInstall
	u.mu.Unlock()
	if hook != nil {
		hook(src, dst)
	}
	if _, err := systemd.InstallUnitProperties(src, dst); err != nil {
		return err
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	u.installs = append(u.installs, src+" "+dst)
	if fail {
		return errors.New("install: start dkc-restore-kubelet-dropin-1.service: job did not complete: failed")
	}
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, data, 0o644)
}

// Reload is `systemctl daemon-reload` on the fake systemd: the unit loads the drop-in last installed, and
// through it dkc's env file if it names it.
func (u *systemdKubelet) Reload(context.Context) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.reloads++
	if len(u.installs) == 0 {
		return nil
	}
	_, dst, _ := strings.Cut(u.installs[len(u.installs)-1], " ")
	data, err := os.ReadFile(dst)
	if err != nil {
		u.dropIns, u.loadsEnv = nil, false
		return nil
	}
	u.dropIns = []string{dst}
	u.loadsEnv = strings.Contains(string(data), "EnvironmentFile=-"+u.env.Path+"\n")
	return nil
}

// requestRepair is an update from the service with a pool's drift repair request (and assignment as, nil
// for none).
func (d *driftNode) requestRepair(as *dkcv1.Assignment, id, cause string) {
	d.t.Helper()
	defer d.drive()()
	d.agent.Apply(context.Background(), Desired{Assignment: as, DriftRepair: &dkcv1.DriftRepair{Id: id, Cause: cause}})
}

// restartSidecar starts a new agent over the same node, as after a crash or upgrade, with fresh logs and
// metrics.
func (d *driftNode) restartSidecar() {
	d.t.Helper()
	core, logs := observer.New(zap.InfoLevel)
	d.logs, d.metrics = logs, NewMetrics(prometheus.NewRegistry())
	d.reporter = &recordingReporter{}
	cfg := d.cfg
	cfg.Log, cfg.Metrics, cfg.Reporter = zap.New(core), d.metrics, d.reporter
	d.agent = New(cfg)
	defer d.drive()()
	if err := d.agent.Init(context.Background()); err != nil {
		d.t.Fatal(err)
	}
}

// repairs is dkc_sidecar_drift_repairs_total{result}.
func (d *driftNode) repairs(result string) int {
	return int(testutil.ToFloat64(d.metrics.driftRepairs.WithLabelValues(result)))
}

// saved is the state file on disk.
func (d *driftNode) saved() persisted {
	d.t.Helper()
	data, err := os.ReadFile(filepath.Join(d.dir, StateFileName))
	if err != nil {
		d.t.Fatal(err)
	}
	var s persisted
	if err := json.Unmarshal(data, &s); err != nil {
		d.t.Fatal(err)
	}
	return s
}

func (u *systemdKubelet) installCount() (installs, reloads int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.installs), u.reloads
}

// repairedNode is a node assigned u/1, running it, whose wiring broke as breakWiring breaks it, with the
// drift found.
func repairedNode(t *testing.T, breakWiring func(t *testing.T, d *driftNode), cause string) *driftNode {
	t.Helper()
	d := newDriftNode(t, nil, time.Hour)
	d.apply(assignment("u", "1", cfgHeader+"maxPods: 110\n"), "")
	d.expect("1", "1", "local", "", 1)
	d.tick()
	breakWiring(t, d)
	d.clock.Step(time.Hour)
	d.tick()
	d.expectDrift(cause, nil)
	return d
}

func removeEnvFile(t *testing.T, d *driftNode) {
	if err := os.Remove(d.kubelet.env.Path); err != nil {
		t.Fatal(err)
	}
}

func removeDropIn(t *testing.T, d *driftNode) {
	if err := os.Remove(d.dropIn); err != nil {
		t.Fatal(err)
	}
}

// TestDriftRepair: a request for the drift that stands puts back what is gone or changed, restarts the
// kubelet once into its assigned config, and the drift is gone; the repair is on disk before anything is
// touched; the same cause found again for the assignment is reported, not repaired again.
func TestDriftRepair(t *testing.T) {
	for _, tc := range []struct {
		name     string
		breakIt  func(t *testing.T, d *driftNode)
		cause    string
		restored func(d *driftNode) []string
		installs int
		// envFile: the env file is broken, which any round puts right by itself, restarting the kubelet (run),
		// at the service's next update: also the one that brings a request refused.
		envFile bool
	}{
		{name: "env_file_removed", breakIt: removeEnvFile, cause: DriftWiringRemoved, envFile: true,
			restored: func(d *driftNode) []string { return []string{d.kubelet.env.Path} }},
		{name: "env_file_replaced", breakIt: func(t *testing.T, d *driftNode) {
			if err := os.WriteFile(d.kubelet.env.Path, []byte(kubeletunit.Variable+"=--config="+d.local+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, cause: DriftWiringReplaced, envFile: true,
			restored: func(d *driftNode) []string { return []string{d.kubelet.env.Path} }},
		{name: "drop-in_file_removed", breakIt: removeDropIn, cause: DriftWiringRemoved,
			restored: func(d *driftNode) []string { return []string{d.dropIn} }, installs: 1},
		{name: "drop-in_removed_and_reloaded", breakIt: func(t *testing.T, d *driftNode) {
			removeDropIn(t, d)
			d.unit.mu.Lock()
			d.unit.loadsEnv, d.unit.dropIns = false, nil
			d.unit.mu.Unlock()
		}, cause: DriftWiringRemoved, restored: func(d *driftNode) []string { return []string{d.dropIn} }, installs: 1},
		{name: "drop-in_replaced", breakIt: func(t *testing.T, d *driftNode) {
			if err := os.WriteFile(d.dropIn, []byte("[Service]\nEnvironment=FOO=bar\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, cause: DriftWiringReplaced, restored: func(d *driftNode) []string { return []string{d.dropIn} }, installs: 1},
		{name: "env_file_and_drop-in_removed", breakIt: func(t *testing.T, d *driftNode) {
			removeEnvFile(t, d)
			removeDropIn(t, d)
		}, cause: DriftWiringRemoved, envFile: true, restored: func(d *driftNode) []string {
			return []string{d.kubelet.env.Path, d.dropIn}
		}, installs: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := repairedNode(t, tc.breakIt, tc.cause)
			// Recorded before anything is put back.
			d.unit.onInstall = func(string, string) {
				if r := d.saved().DriftRepairs; len(r) != 1 || r[0].ID != "r1" || r[0].Result != "" {
					t.Errorf("when the drop-in is installed, the state file holds repairs %+v, want r1 under way", r)
				}
			}
			d.requestRepair(assignment("u", "1", cfgHeader+"maxPods: 110\n"), "r1", tc.cause)
			d.expect("1", "1", "1", "", 2)
			d.expectDrift("", nil)
			if got := d.kubelet.callLog(); got[len(got)-1] != "restart "+filepath.Join(d.dir, "checkpoints/u/1/kubelet") {
				t.Errorf("last call %v, want the restart into the assigned config", got)
			}
			if n := len(d.reporter.restarts); n != 2 {
				t.Errorf("%d restarts reported, want 2 (the assignment's, the repair's)", n)
			}
			if data, _ := os.ReadFile(d.dropIn); string(data) != kubeletunit.DropIn(d.dir) {
				t.Errorf("drop-in holds %q", data)
			}
			if f, _ := d.kubelet.env.Get(); f != filepath.Join(d.dir, "checkpoints/u/1/kubelet") {
				t.Errorf("env file names %q", f)
			}
			installs, reloads := d.unit.installCount()
			if installs != tc.installs || reloads != tc.installs {
				t.Errorf("%d installs, %d reloads; want %d each", installs, reloads, tc.installs)
			}
			if tc.installs > 0 {
				want := filepath.Join(d.dir, kubeletunit.DropInCopyName) + " " + d.dropIn
				if d.unit.installs[0] != want {
					t.Errorf("installed %q, want %q", d.unit.installs[0], want)
				}
			}
			lines := d.logs.FilterMessage("drift repaired: dkc's wiring back, the kubelet restarted healthy into its " +
				"assigned config").All()
			if len(lines) != 1 || lines[0].ContextMap()["requestID"] != "r1" || lines[0].ContextMap()["node"] != "node-1" ||
				lines[0].ContextMap()["cause"] != tc.cause {
				t.Fatalf("repair log lines %v", lines)
			}
			if files, _ := lines[0].ContextMap()["files"].([]any); len(files) != len(tc.restored(d)) {
				t.Errorf("files put back %v, want %v", files, tc.restored(d))
			}
			rec := d.saved().DriftRepairs
			if len(rec) != 1 || rec[0].ID != "r1" || rec[0].Cause != tc.cause || rec[0].UID != "u" ||
				rec[0].ResourceVersion != "1" || rec[0].Result != repairRepaired || rec[0].Time.IsZero() {
				t.Errorf("recorded %+v", rec)
			}
			if d.repairs(repairRepaired) != 1 || d.repairs(repairFailed) != 0 {
				t.Errorf("repairs: %d repaired, %d failed", d.repairs(repairRepaired), d.repairs(repairFailed))
			}

			// The request stands on: nothing more happens.
			d.tick()
			d.requestRepair(assignment("u", "1", cfgHeader+"maxPods: 110\n"), "r1", tc.cause)
			d.expect("1", "1", "1", "", 2)

			// Found again: reported, saying so; neither the request acted on nor a new one repairs it.
			d.unit.onInstall = nil
			tc.breakIt(t, d)
			d.clock.Step(time.Hour)
			d.tick()
			d.tick()
			d.expectDrift(tc.cause, nil, "found again after dkc repaired it at "+rec[0].Time.Format(time.RFC3339),
				"not repaired again while the node is assigned this config")
			d.requestRepair(nil, "r2", tc.cause)
			d.tick()
			restarts := 2
			if tc.envFile {
				restarts++ // the update's round, not a repair (no record, no install, nothing counted)
			}
			d.expect("1", "1", "1", "", restarts)
			if installs, _ := d.unit.installCount(); installs != tc.installs {
				t.Errorf("%d installs, want %d (the repair's)", installs, tc.installs)
			}
			if r := d.saved().DriftRepairs; len(r) != 1 || r[0].ID != "r1" {
				t.Errorf("recorded %+v, want r1 alone", r)
			}
			if d.repairs(repairRefusedRepeat) != 2 || d.repairs(repairRepaired) != 1 {
				t.Errorf("repairs: %d refused, %d repaired; want 2 refused (r1, r2), 1 repaired",
					d.repairs(repairRefusedRepeat), d.repairs(repairRepaired))
			}
			refused := d.logs.FilterMessage("drift found again after dkc repaired it; not repairing it again while the " +
				"node is assigned this config").All()
			if len(refused) != 2 || refused[0].ContextMap()["requestID"] != "r1" || refused[1].ContextMap()["requestID"] != "r2" ||
				refused[1].ContextMap()["repairedBy"] != "r1" {
				t.Errorf("refusal log lines %v, want one for r1, one for r2", refused)
			}
		})
	}
}

// TestDriftRepairRecordSurvivesSidecarRestart: a restarted sidecar finds the repair on disk; the drift
// found again is reported as such and not repaired again.
func TestDriftRepairRecordSurvivesSidecarRestart(t *testing.T) {
	d := repairedNode(t, removeDropIn, DriftWiringRemoved)
	d.requestRepair(nil, "r1", DriftWiringRemoved)
	d.expect("1", "1", "1", "", 2)
	d.expectDrift("", nil)

	removeDropIn(t, d)
	d.restartSidecar()
	d.tick() // the first check of the new sidecar
	d.expectDrift(DriftWiringRemoved, nil, "found again after dkc repaired it at")
	d.requestRepair(assignment("u", "1", cfgHeader+"maxPods: 110\n"), "r1", DriftWiringRemoved) // sent again on the new stream
	d.requestRepair(nil, "r2", DriftWiringRemoved)
	d.tick()
	d.expect("1", "1", "1", "", 2)
	if installs, _ := d.unit.installCount(); installs != 1 {
		t.Errorf("%d installs, want the first repair's", installs)
	}
	if d.repairs(repairRefusedRepeat) != 2 || d.repairs(repairRepaired) != 0 {
		t.Errorf("repairs: %d refused, %d repaired", d.repairs(repairRefusedRepeat), d.repairs(repairRepaired))
	}
}

// TestDriftRepairedAgainUnderANewAssignment: a new assignment drops the records; its own drift of the same
// cause is repaired once, and a request acted on before is still never acted on again.
func TestDriftRepairedAgainUnderANewAssignment(t *testing.T) {
	d := repairedNode(t, removeDropIn, DriftWiringRemoved)
	d.requestRepair(nil, "r1", DriftWiringRemoved)
	d.expect("1", "1", "1", "", 2)

	a2 := assignment("u", "2", cfgHeader+"maxPods: 100\n")
	d.apply(a2, "")
	d.expect("2", "2", "1", "", 3)
	d.tick()
	if s := d.saved(); len(s.DriftRepairs) != 0 || !slices.Equal(s.DriftRepairIDs, []string{"r1"}) {
		t.Errorf("after a new assignment the state file holds repairs %+v, ids %v; want none, [r1]", s.DriftRepairs,
			s.DriftRepairIDs)
	}
	removeDropIn(t, d)
	d.clock.Step(time.Hour)
	d.tick()
	d.expectDrift(DriftWiringRemoved, nil)
	if strings.Contains(d.agent.Drift().GetMessage(), "repaired") {
		t.Errorf("drift message %q speaks of a repair of another assignment", d.agent.Drift().GetMessage())
	}
	d.requestRepair(a2, "r1", DriftWiringRemoved) // a request acted on: never again
	d.expect("2", "2", "2", "", 3)
	d.requestRepair(a2, "r3", DriftWiringRemoved)
	d.expect("2", "2", "2", "", 4)
	d.expectDrift("", nil)
	if d.repairs(repairRepaired) != 2 {
		t.Errorf("%d repaired, want 2", d.repairs(repairRepaired))
	}
	if r := d.saved().DriftRepairs; len(r) != 1 || r[0].ID != "r3" || r[0].ResourceVersion != "2" {
		t.Errorf("recorded %+v, want r3 for u/2", r)
	}
}

// TestDriftRepairIgnored: requests the node does not act on, each logged once however often it is looked
// at, with nothing touched.
func TestDriftRepairIgnored(t *testing.T) {
	for _, tc := range []struct {
		name    string
		flags   []string
		breakIt func(t *testing.T, d *driftNode)
		cause   string // standing
		asked   string
		reason  string
	}{
		{name: "another_cause_stands", breakIt: removeDropIn, cause: DriftWiringRemoved, asked: DriftWiringReplaced,
			reason: "no drift of this cause stands"},
		{name: "no_drift_stands", breakIt: func(*testing.T, *driftNode) {}, asked: DriftWiringRemoved,
			reason: "no drift of this cause stands"},
		{name: "not_repairable", flags: []string{"--max-pods=50"}, breakIt: func(*testing.T, *driftNode) {},
			cause: DriftFlagOverride, asked: DriftFlagOverride, reason: "not a cause the sidecar repairs: only dkc's wiring of the kubelet"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newDriftNode(t, tc.flags, time.Hour)
			d.apply(assignment("u", "1", cfgHeader+"maxPods: 110\n"), "")
			d.tick()
			tc.breakIt(t, d)
			d.clock.Step(time.Hour)
			d.tick()
			if tc.cause != "" {
				d.expectDrift(tc.cause, d.agent.Drift().GetFields())
			} else {
				d.expectDrift("", nil)
			}
			d.requestRepair(nil, "r1", tc.asked)
			for range 3 {
				d.tick()
			}
			d.expect("1", "1", "1", "", 1)
			if installs, _ := d.unit.installCount(); installs != 0 {
				t.Errorf("%d installs", installs)
			}
			lines := d.logs.FilterMessage("drift repair request ignored").All()
			if len(lines) != 1 || lines[0].ContextMap()["reason"] != tc.reason || lines[0].ContextMap()["requestID"] != "r1" ||
				lines[0].ContextMap()["cause"] != tc.asked || lines[0].ContextMap()["node"] != "node-1" {
				t.Errorf("log lines %v, want one saying %q", lines, tc.reason)
			}
			if s := d.saved(); len(s.DriftRepairs) != 0 {
				t.Errorf("recorded %+v", s.DriftRepairs)
			}
			for _, r := range []string{repairRepaired, repairFailed, repairRefusedRepeat} {
				if d.repairs(r) != 0 {
					t.Errorf("dkc_sidecar_drift_repairs_total{result=%q} = %d", r, d.repairs(r))
				}
			}
		})
	}
}

// TestDriftRepairFailed: a repair that cannot put the drop-in back does not restart the kubelet (it would
// not run its config, which would be blamed), and one whose restart does not come back healthy rolls back as
// any restart does; either is recorded as failed, said in the drift found again, and not made again.
func TestDriftRepairFailed(t *testing.T) {
	t.Run("drop-in_not_installed", func(t *testing.T) {
		d := repairedNode(t, removeDropIn, DriftWiringRemoved)
		d.unit.failInstall = true
		d.requestRepair(nil, "r1", DriftWiringRemoved)
		d.expect("1", "1", "1", "", 1)
		d.expectDrift(DriftWiringRemoved, nil, "dkc's repair of it at", "failed", "not made again")
		d.requestRepair(nil, "r2", DriftWiringRemoved)
		d.expect("1", "1", "1", "", 1)
		if d.repairs(repairFailed) != 1 || d.repairs(repairRefusedRepeat) != 1 {
			t.Errorf("repairs: %d failed, %d refused", d.repairs(repairFailed), d.repairs(repairRefusedRepeat))
		}
		if r := d.saved().DriftRepairs; len(r) != 1 || r[0].Result != repairFailed || !strings.Contains(r[0].Error, "job did not complete") {
			t.Errorf("recorded %+v", r)
		}
		if l := d.logs.FilterMessage("drift repair failed; not made again while the node is assigned this config").Len(); l != 1 {
			t.Errorf("%d failure log lines", l)
		}
	})
	t.Run("kubelet_not_healthy_after_the_restart", func(t *testing.T) {
		d := repairedNode(t, removeEnvFile, DriftWiringRemoved)
		d.kubelet.mu.Lock()
		d.kubelet.exitOnStart = 1
		d.kubelet.mu.Unlock()
		d.requestRepair(nil, "r1", DriftWiringRemoved)
		// Rolled back: the assigned config, also last-known-good, is marked failed; the node runs its local config.
		d.expect("1", "local", "1", "failed to run kubelet with config, rolled back, see dkc-sidecar log for details", 3)
		if d.repairs(repairFailed) != 1 || d.repairs(repairRepaired) != 0 {
			t.Errorf("repairs: %d failed, %d repaired", d.repairs(repairFailed), d.repairs(repairRepaired))
		}
		if r := d.saved().DriftRepairs; len(r) != 1 || r[0].Result != repairFailed {
			t.Errorf("recorded %+v", r)
		}
	})
}
