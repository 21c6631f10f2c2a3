// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/dkc-dev/dkc/internal/nodeconfig"
	"github.com/dkc-dev/dkc/sidecar/internal/checkpoint"
)

// TestNewAssignmentAndTheStateFile: a new assignment forgets the previous trial and failures, except the
// failures of the last-known-good it falls back to, and says so when that cannot be written down.
func TestNewAssignmentAndTheStateFile(t *testing.T) {
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, n *node)
	}{
		{"a last-known-good seen failing is not restarted into again", func(t *testing.T, n *node) {
			n.apply(assignment("u", "1", cfgHeader+"eventRecordQPS: 7\n"), "")
			n.clock.Step(11 * time.Minute)
			n.agent.CheckTrial(context.Background())
			n.expect("1", "1", "1", "", 1)
			// Last-known-good later failed to run (in a rollback to it); the state file records that.
			lkg, err := n.agent.store.LastKnownGood()
			if err != nil || lkg == nil {
				t.Fatalf("last-known-good = %v, %v", lkg, err)
			}
			n.agent.state.markFailed(lkg, "not healthy after restart")
			if err := n.agent.state.save(); err != nil {
				t.Fatal(err)
			}
			// A new assignment that does not run falls back past it, to the local config.
			n.apply(assignment("u", "2", cfgHeader+"maxPods: 13\n"), "")
			n.expect("2", "local", "1", string(nodeconfig.HealthError), 3)
			if got := n.kubelet.restarts[2]; got != n.local {
				t.Errorf("rolled back into %s, want the local config %s", got, n.local)
			}
			n.start() // and the record survives a sidecar restart
			n.expect("2", "local", "1", string(nodeconfig.HealthError), 3)
		}},
		{"a state file that cannot be written is reported", func(t *testing.T, n *node) {
			// A directory in the state file's place (written at Init, recording the active config): every
			// write of it fails.
			if err := os.Remove(filepath.Join(n.dir, StateFileName)); err != nil {
				t.Fatal(err)
			}
			if err := os.Mkdir(filepath.Join(n.dir, StateFileName), 0o755); err != nil {
				t.Fatal(err)
			}
			// A config that failed before: the new assignment forgets it, so it must write the file (with
			// nothing to forget it writes nothing).
			n.agent.state.markFailed(checkpoint.SourceOf(assignment("u", "9", "")), "not healthy after restart")
			n.apply(assignment("u", "1", cfgHeader+"eventRecordQPS: 7\n"), "")
			n.expect("1", "1", "local", string(nodeconfig.SyncInternalError), 1)
			if _, detail := n.agent.Status(); !strings.Contains(detail, StateFileName) {
				t.Errorf("status detail %q does not name the state file", detail)
			}
			// The retry tick tries again until it can be written (the original re-synced every 10s).
			if n.agent.unsynced == nil {
				t.Fatal("the assignment is not kept for the retry tick")
			}
			if err := os.Remove(filepath.Join(n.dir, StateFileName)); err != nil {
				t.Fatal(err)
			}
			n.agent.Apply(context.Background(), Desired{Assignment: n.agent.unsynced})
			n.expect("1", "1", "local", "", 1)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, newNode(t)) })
	}
}

// TestClearAssigned pins what clearAssigned forgets and keeps, that it writes only a change, and that
// memory follows only a durable write.
func TestClearAssigned(t *testing.T) {
	lkg, other, third := checkpoint.SourceOf(assignment("u", "1", "")), checkpoint.SourceOf(assignment("u", "2", "")),
		checkpoint.SourceOf(assignment("u", "3", ""))
	now := time.Now()
	for _, tc := range []struct {
		name       string
		trialOf    *corev1.NodeConfigSource // whose trial is recorded
		src, lkg   *corev1.NodeConfigSource // assigned now; nil src: a reset to local
		noFailures bool                     // nothing failed before
		unwritable bool
		wantFailed int
		wantTrial  bool // trialOf's trial still recorded
		wantErr    bool
	}{
		{"config assigned again: its trial and failure forgotten, last-known-good's kept", other, other, lkg, false, false, 1, false, false},
		// meta/assigned names the new config before this runs: a crash in between would otherwise keep
		// other's trial for when other is assigned again.
		{"another config's unpromoted trial goes", other, third, lkg, false, false, 1, false, false},
		{"the promoted trial stays; nothing else to forget: nothing written", lkg, third, lkg, true, true, 0, true, false},
		{"last-known-good assigned again: its trial goes", lkg, lkg, lkg, true, false, 0, false, false},
		{"reset forgets every failure and the trial", other, nil, nil, false, false, 0, false, false},
		{"write fails: nothing changes", other, other, lkg, false, true, 2, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			f := &stateFile{path: filepath.Join(dir, StateFileName)}
			f.startTrial(tc.trialOf, now, now)
			if !tc.noFailures {
				f.markFailed(lkg, "lkg failed")
				f.markFailed(other, "other failed")
			}
			if err := f.save(); err != nil {
				t.Fatal(err)
			}
			if tc.unwritable {
				f.path = filepath.Join(dir, "no-such-dir", StateFileName)
			}
			err := f.clearAssigned(tc.src, tc.lkg)
			if (err != nil) != tc.wantErr {
				t.Fatalf("clearAssigned: %v, want error %v", err, tc.wantErr)
			}
			if len(f.s.Failed) != tc.wantFailed {
				t.Errorf("failures in memory = %+v, want %d", f.s.Failed, tc.wantFailed)
			}
			if tc.wantFailed == 1 && f.failure(lkg) == "" {
				t.Errorf("last-known-good's failure forgotten: %+v", f.s.Failed)
			}
			if _, got := f.trialElapsed(tc.trialOf, now); got != tc.wantTrial {
				t.Errorf("trial recorded = %v, want %v", got, tc.wantTrial)
			}
			if tc.wantErr || tc.unwritable {
				return
			}
			disk := &stateFile{path: f.path}
			if err := disk.load(); err != nil {
				t.Fatal(err)
			}
			if _, trial := disk.trialElapsed(tc.trialOf, now); len(disk.s.Failed) != tc.wantFailed || trial != tc.wantTrial {
				t.Errorf("on disk: %+v, want %d failures and the trial %v", disk.s, tc.wantFailed, tc.wantTrial)
			}
		})
	}
}

// TestEveryRestartIsReported: a reconcile that restarts the kubelet into the assigned config and then back
// to the fallback reports both restarts, in order — each is an Event.
func TestEveryRestartIsReported(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(n *node)
		want  []string // restart targets (resourceVersion or "local"), in order
	}{
		{"rolled back to local", func(n *node) {}, []string{"2", "local"}},
		{"rolled back to last-known-good", func(n *node) {
			n.apply(assignment("u", "1", cfgHeader+"eventRecordQPS: 7\n"), "")
			n.clock.Step(11 * time.Minute)
			n.agent.CheckTrial(context.Background())
			n.expect("1", "1", "1", "", 1)
		}, []string{"1", "2", "1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNode(t)
			tc.setup(n)
			n.apply(assignment("u", "2", cfgHeader+"maxPods: 13\n"), "")
			var got []string
			ids := map[string]bool{}
			for _, r := range n.reporter.restarts {
				got = append(got, rv(r.GetTarget()))
				ids[r.GetId()] = true
			}
			if strings.Join(got, ",") != strings.Join(tc.want, ",") {
				t.Errorf("reported restarts to %v, want %v", got, tc.want)
			}
			if len(ids) != len(n.reporter.restarts) {
				t.Errorf("restart ids not unique: %v", n.reporter.restarts)
			}
		})
	}
}

// TestNextIncarnation: each start's incarnation is above the last one's, whatever the node's clock says,
// and the agent keeps it when it rewrites the state file.
func TestNextIncarnation(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	for _, tc := range []struct {
		name  string
		saved string // state file content; "" for none
		now   time.Time
		want  uint64
	}{
		{"first start takes the clock", "", now, 1_700_000_000},
		{"next start counts on", `{"incarnation": 1700000000}`, now, 1_700_000_001},
		{"clock stepped back", `{"incarnation": 1700000000}`, now.Add(-48 * time.Hour), 1_700_000_001},
		{"clock moved on", `{"incarnation": 1700000000}`, now.Add(time.Hour), 1_700_003_600},
		{"clock before 1970", "", time.Unix(-5, 0), 1},
		{"unreadable state starts from the clock", `{`, now, 1_700_000_000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "dynamic-config") // created by NextIncarnation
			if tc.saved != "" {
				if err := os.MkdirAll(dir, 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(dir, StateFileName), []byte(tc.saved), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			got, err := NextIncarnation(dir, tc.now)
			if err != nil || got != tc.want {
				t.Fatalf("NextIncarnation = %d, %v; want %d", got, err, tc.want)
			}
			again, err := NextIncarnation(dir, tc.now)
			if err != nil || again != got+1 {
				t.Fatalf("the start after = %d, %v; want %d", again, err, got+1)
			}
		})
	}

	// The agent loads and rewrites the state file; the incarnation survives it.
	dir := t.TempDir()
	if _, err := NextIncarnation(dir, now); err != nil {
		t.Fatal(err)
	}
	f := &stateFile{path: filepath.Join(dir, StateFileName)}
	if err := f.load(); err != nil {
		t.Fatal(err)
	}
	f.setFlags([]string{"--v=2"})
	if err := f.save(); err != nil {
		t.Fatal(err)
	}
	if got, _ := NextIncarnation(dir, now); got != 1_700_000_001 {
		t.Errorf("after the agent rewrote the state file: incarnation %d, want 1700000001", got)
	}
}
