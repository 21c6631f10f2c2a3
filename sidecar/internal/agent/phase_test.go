package agent

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestPhaseIsSavedAndExported: the agent's phase follows the rollback rules through a real agent — trial,
// promotion, rollback, local — and is in the state file (a restarted sidecar resumes from it) and in the
// dkc_sidecar_phase metric, 1 on the current phase only.
func TestPhaseIsSavedAndExported(t *testing.T) {
	n := newNode(t)
	reg := prometheus.NewRegistry()
	n.agent.metrics = NewMetrics(reg)
	check := func(want Phase) {
		t.Helper()
		if n.agent.phase != want {
			t.Errorf("phase %s, want %s", n.agent.phase, want)
		}
		raw, err := os.ReadFile(filepath.Join(n.dir, StateFileName))
		if err != nil {
			t.Fatal(err)
		}
		var saved struct {
			Phase string `json:"phase"`
		}
		if err := json.Unmarshal(raw, &saved); err != nil || saved.Phase != string(want) {
			t.Errorf("state file phase %q (%v), want %q", saved.Phase, err, want)
		}
		for _, p := range Phases {
			v := testutil.ToFloat64(n.agent.metrics.phase.WithLabelValues(string(p)))
			if (p == want) != (v == 1) {
				t.Errorf("dkc_sidecar_phase{phase=%q} = %v with phase %s", p, v, want)
			}
		}
	}
	n.agent.reconcile(context.Background())
	check(PhaseLocal)
	n.apply(assignment("u", "1", cfgHeader+"eventRecordQPS: 7\n"), "")
	check(PhaseTrial)
	n.clock.Step(11 * time.Minute)
	n.agent.CheckTrial(context.Background())
	check(PhaseGood)
	n.apply(assignment("u", "2", cfgHeader+"maxPods: 13\n"), "")
	check(PhaseRolledBack)
	n.start()
	if n.agent.phase != PhaseRolledBack {
		t.Errorf("restarted sidecar resumes from phase %s, want %s", n.agent.phase, PhaseRolledBack)
	}
	n.agent.metrics = NewMetrics(prometheus.NewRegistry()) // the restarted sidecar's
	n.apply(&dkcv1.Assignment{}, "")                       // reset
	n.agent.reconcile(context.Background())
	check(PhaseLocal)
}

// TestStateFileWithoutPhase: a state file written by an older sidecar (no phase) loads as Unknown and keeps
// everything else; the next round records the phase beside the older fields.
func TestStateFileWithoutPhase(t *testing.T) {
	n := newNode(t)
	older := `{"kubeletFlags":[],"active":{},"incarnation":3,"nodeUID":"uid-1"}`
	if err := os.WriteFile(filepath.Join(n.dir, StateFileName), []byte(older), 0o644); err != nil {
		t.Fatal(err)
	}
	n.start()
	if n.agent.phase != PhaseLocal {
		t.Errorf("phase %s after the first round, want %s", n.agent.phase, PhaseLocal)
	}
	if n.agent.nodeUID != "uid-1" || n.agent.state.s.Incarnation != 3 {
		t.Errorf("older fields lost: nodeUID %q, incarnation %d", n.agent.nodeUID, n.agent.state.s.Incarnation)
	}
	raw, err := os.ReadFile(filepath.Join(n.dir, StateFileName))
	if err != nil {
		t.Fatal(err)
	}
	var saved map[string]any
	if err := json.Unmarshal(raw, &saved); err != nil || saved["phase"] != string(PhaseLocal) || saved["nodeUID"] != "uid-1" {
		t.Errorf("state file %s: want phase %s beside the older fields", raw, PhaseLocal)
	}
}
