// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/dkc-dev/dkc/internal/nodeconfig"
	"github.com/dkc-dev/dkc/internal/poll"
	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
	"github.com/dkc-dev/dkc/sidecar/internal/probe"
)

// static is a config the kubelet refuses on a cpu_manager_state written under the local config's policy
// (none): cpuManagerPolicy none → static.
const static = cfgHeader + "cpuManagerPolicy: static\nreservedSystemCPUs: \"0\"\n"

const (
	cpuState = "/var/lib/kubelet/cpu_manager_state"
	memState = "/var/lib/kubelet/memory_manager_state"
)

// applyDrained is apply with the service's drained.
func (n *node) applyDrained(a *dkcv1.Assignment, drained bool) {
	n.t.Helper()
	defer n.drive()()
	n.agent.Apply(context.Background(), Desired{Assignment: a, Drained: drained})
}

// checkCalls compares the fake's stops, removals and restarts with want; "restart A" stands for the
// checkpoint file of uid u, resourceVersion A, "restart local" for the local config.
func (n *node) checkCalls(want ...string) {
	n.t.Helper()
	var exp []string
	for _, w := range want {
		if rv, ok := strings.CutPrefix(w, "restart "); ok {
			file := n.local
			if rv != "local" {
				file = filepath.Join(n.dir, "checkpoints/u", rv, "kubelet")
			}
			w = "restart " + file
		}
		exp = append(exp, w)
	}
	if got := n.kubelet.callLog(); !slices.Equal(got, exp) {
		n.t.Errorf("calls:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(exp, "\n  "))
	}
}

// TestChangeNeedingADrainWaitsForIt: a change the kubelet would refuse on its CPU manager's state is not
// restarted into while the node is not drained for it: the kubelet keeps its config, the status says what
// to do, and the config is not blamed or retried. The service's word that the node is drained for that
// assignment makes the sidecar stop the kubelet, remove the state file and start it with the config; the
// word withdrawn afterwards (the node uncordoned) changes nothing.
func TestChangeNeedingADrainWaitsForIt(t *testing.T) {
	n := newNode(t)
	n.kubelet.cpuState = "none"
	n.agent.cfg.NodeName = "node-1"
	n.applyDrained(assignment("u", "1", static), false)
	n.expect("1", "local", "local", string(nodeconfig.DrainRequiredError), 0)
	n.checkCalls()
	_, detail := n.agent.Status()
	for _, want := range []string{"cpu_manager_state (cpuManagerPolicy: none → static)", cpuState,
		"kubectl dkc assign node-1 --configmap kube-system/c --key kubelet --drain", "spec.disruption.drain: Allowed"} {
		if !strings.Contains(detail, want) {
			t.Errorf("detail %q does not say %q", detail, want)
		}
	}
	if f := n.agent.state.failure(n.mustAssigned()); f != "" {
		t.Errorf("the config was marked failed for a missing drain: %s", f)
	}
	if n.agent.phase != PhaseWaitingForDrain || n.agent.retry {
		t.Errorf("phase %s, retry %v; want %s, no retry at the ticks", n.agent.phase, n.agent.retry, PhaseWaitingForDrain)
	}
	if f, _ := n.kubelet.env.Get(); f == n.agent.store.ConfigFile(n.mustAssigned().ConfigMap) {
		t.Errorf("env file names the config that waits for a drain: a kubelet restarting by itself would refuse it")
	}
	n.reconcile() // what a tick would do, were one scheduled: still nothing
	n.expect("1", "local", "local", string(nodeconfig.DrainRequiredError), 0)

	n.applyDrained(assignment("u", "1", static), true)
	n.expect("1", "1", "local", "", 1)
	n.checkCalls("stop", "remove "+cpuState, "restart 1")
	if n.agent.state.s.Reset != nil {
		t.Errorf("reset still recorded after the config ran healthy: %+v", n.agent.state.s.Reset)
	}

	n.applyDrained(assignment("u", "1", static), false) // uncordoned
	n.expect("1", "1", "local", "", 1)
	n.checkCalls("stop", "remove "+cpuState, "restart 1")
}

// TestDrainedThroughTheStream: the drained of the service's messages reaches the agent with the
// assignment it came with, through Run.
func TestDrainedThroughTheStream(t *testing.T) {
	n := newNode(t)
	n.kubelet.cpuState = "none"
	defer n.drive()()
	updates := make(chan *dkcv1.WatchConfigResponse)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = n.agent.Run(ctx, updates); close(done) }()
	defer func() { cancel(); <-done }()
	wait := func(what string, ok func(*dkcv1.NodeConfigStatus) bool) {
		t.Helper()
		poll.UntilNil(t, what, func() error {
			if st := n.reporter.lastStatus(); !ok(st) {
				return fmt.Errorf("last status %v", st)
			}
			return nil
		})
	}
	a := assignment("u", "1", static)
	updates <- &dkcv1.WatchConfigResponse{Assignment: a}
	wait("the drain error", func(st *dkcv1.NodeConfigStatus) bool {
		return st.GetError() == string(nodeconfig.DrainRequiredError)
	})
	updates <- &dkcv1.WatchConfigResponse{Assignment: a, Drained: true}
	wait("config 1 active", func(st *dkcv1.NodeConfigStatus) bool {
		return rv(st.GetActive()) == "1" && st.GetError() == ""
	})
	updates <- &dkcv1.WatchConfigResponse{Assignment: a}
	updates <- &dkcv1.WatchConfigResponse{Assignment: a} // taken once the one before is done
	n.checkCalls("stop", "remove "+cpuState, "restart 1")
}

// TestStateResets: what is removed before a restart, table-driven from a node running its local config
// (cpuManagerPolicy none, its cpu_manager_state written under it) through the assignments given, each with
// the service's drained.
func TestStateResets(t *testing.T) {
	type step struct {
		a       *dkcv1.Assignment
		drained bool
	}
	for _, tc := range []struct {
		name  string
		setup func(n *node)
		steps []step
		// status after the last step: assigned, active, error
		assigned, active string
		err              nodeconfig.StatusError
		calls            []string
	}{
		{name: "drained with nothing to reset: a plain restart",
			steps:    []step{{assignment("u", "1", cfgHeader+"eventRecordQPS: 7\n"), true}},
			assigned: "1", active: "1", calls: []string{"restart 1"}},
		{name: "a drain is for its assignment only",
			steps: []step{{assignment("u", "1", cfgHeader+"eventRecordQPS: 7\n"), true},
				{assignment("u", "2", static), false}},
			assigned: "2", active: "1", err: nodeconfig.DrainRequiredError, calls: []string{"restart 1"}},
		{name: "fallback after a reset removes the same file again",
			steps:    []step{{assignment("u", "1", static+"maxPods: 13\n"), true}},
			assigned: "1", active: "local", err: nodeconfig.HealthError,
			calls: []string{"stop", "remove " + cpuState, "restart 1", "stop", "remove " + cpuState, "restart local"}},
		{name: "running config unknown and drained: every state file",
			setup: func(n *node) { n.kubelet.configzErr = probe.ErrRefused },
			steps: []step{{assignment("u", "1", static), true}},
			// /configz stays refused after the restart: what runs is not proven.
			assigned: "1", active: "local", err: nodeconfig.VerifyError,
			calls: []string{"stop", "remove " + cpuState + " " + memState, "restart 1"}},
		{name: "running config unknown and not drained: restarted as before then refused and rolled back",
			setup: func(n *node) { n.kubelet.configzErr = probe.ErrRefused },
			steps: []step{{assignment("u", "1", static), false}},
			// The kubelet refuses cpu_manager_state and exits; local runs again on it (unproven: /configz
			// stays refused).
			assigned: "1", active: "local", err: nodeconfig.VerifyError, calls: []string{"restart 1", "restart local"}},
		{name: "a service manager that cannot stop the kubelet: nothing touched and retried",
			setup:    func(n *node) { n.agent.svc = plainService{n.kubelet} },
			steps:    []step{{assignment("u", "1", static), true}},
			assigned: "1", active: "local", err: nodeconfig.RestartError},
		{name: "the kubelet's --root-dir",
			setup:    func(n *node) { n.agent.cfg.KubeletFlags = []string{"--root-dir", "/srv/kubelet/"} },
			steps:    []step{{assignment("u", "1", static), true}},
			assigned: "1", active: "1", calls: []string{"stop", "remove /srv/kubelet/cpu_manager_state", "restart 1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNode(t)
			n.kubelet.cpuState = "none"
			if tc.setup != nil {
				tc.setup(n)
			}
			for _, s := range tc.steps {
				n.applyDrained(s.a, s.drained)
			}
			st := n.reporter.lastStatus()
			if rv(st.GetAssigned()) != tc.assigned || rv(st.GetActive()) != tc.active || st.GetError() != string(tc.err) {
				t.Errorf("status assigned=%s active=%s error=%q; want %s %s %q", rv(st.GetAssigned()),
					rv(st.GetActive()), st.GetError(), tc.assigned, tc.active, tc.err)
			}
			n.checkCalls(tc.calls...)
		})
	}
}

// plainService is a ServiceManager that restarts the kubelet and nothing more (systemd.Signal).
type plainService struct{ ServiceManager }

// TestResetFinishedAfterASidecarRestart: the removal fails after the kubelet was stopped (or the sidecar
// dies there); the sidecar that starts next — before the service has said anything of the drain — finds
// the reset recorded and makes it, rather than starting the kubelet on the state it refuses.
func TestResetFinishedAfterASidecarRestart(t *testing.T) {
	n := newNode(t)
	n.kubelet.cpuState = "none"
	n.kubelet.failRemove = 1
	n.applyDrained(assignment("u", "1", static), true)
	n.expect("1", "local", "local", string(nodeconfig.RestartError), 0)
	if r := n.agent.state.s.Reset; r == nil || !slices.Equal(r.Files, []string{"cpu_manager_state"}) {
		t.Fatalf("reset recorded %+v, want cpu_manager_state", r)
	}
	n.start()
	n.expect("1", "1", "local", "", 1)
	// Stopped, the kubelet says nothing of what it ran: every state file goes.
	n.checkCalls("stop", "remove "+cpuState, "stop", "remove "+cpuState+" "+memState, "restart 1")
	if f := n.agent.state.failure(n.mustAssigned()); f != "" {
		t.Errorf("the config was marked failed: %s", f)
	}
}

// TestResetRecord: a reset is recorded durably with the files of an earlier one for the same assignment,
// and a new assignment forgets it (its drain is its own).
func TestResetRecord(t *testing.T) {
	n := newNode(t)
	a := n.agent
	src := func(rv string) *corev1.NodeConfigSource {
		return &corev1.NodeConfigSource{ConfigMap: &corev1.ConfigMapNodeConfigSource{Namespace: "kube-system", Name: "c",
			UID: "u", ResourceVersion: rv, KubeletConfigKey: "kubelet"}}
	}
	if err := a.state.recordReset(src("1"), []string{"memory_manager_state"}); err != nil {
		t.Fatal(err)
	}
	if err := a.state.recordReset(src("1"), []string{"cpu_manager_state"}); err != nil {
		t.Fatal(err)
	}
	disk := &stateFile{path: a.state.path}
	if err := disk.load(); err != nil || disk.s.Reset == nil ||
		!slices.Equal(disk.s.Reset.Files, []string{"memory_manager_state", "cpu_manager_state"}) ||
		!nodeconfig.SameSource(disk.s.Reset.Source, src("1")) {
		t.Fatalf("recorded %+v (%v)", disk.s.Reset, err)
	}
	if ds := a.drainState(src("1")); !ds.mayReset() || ds.drained {
		t.Errorf("drain state %+v for the recorded assignment: want a reset allowed by the record alone", ds)
	}
	if ds := a.drainState(src("2")); ds.mayReset() {
		t.Errorf("drain state %+v for another assignment: want no reset", ds)
	}
	if err := a.state.clearAssigned(src("2"), nil); err != nil {
		t.Fatal(err)
	}
	disk = &stateFile{path: a.state.path}
	if err := disk.load(); err != nil || disk.s.Reset != nil {
		t.Errorf("a new assignment kept the reset record %+v (%v)", disk.s.Reset, err)
	}
}

func TestRootDir(t *testing.T) {
	for _, tc := range []struct {
		flags []string
		want  string
	}{
		{nil, "/var/lib/kubelet"},
		{[]string{"--root-dir=/srv/k"}, "/srv/k"},
		{[]string{"--root_dir", "/srv/k", "--v=2"}, "/srv/k"},
		{[]string{"--root-dir=/a", "--root-dir=/b"}, "/b"},
		{[]string{"--", "--root-dir=/a"}, "/var/lib/kubelet"},
		{[]string{"--root-dir"}, "/var/lib/kubelet"},
	} {
		if got := rootDir(tc.flags); got != tc.want {
			t.Errorf("rootDir(%q) = %s, want %s", tc.flags, got, tc.want)
		}
	}
}

func TestStatePaths(t *testing.T) {
	got, err := statePaths("/var/lib/kubelet/", []string{"cpu_manager_state", "memory_manager_state"})
	if err != nil || !slices.Equal(got, []string{cpuState, memState}) {
		t.Errorf("statePaths = %v, %v", got, err)
	}
	for _, bad := range []struct {
		root  string
		files []string
	}{
		{"var/lib/kubelet", []string{"cpu_manager_state"}},
		{"/var/lib/kubelet", []string{"pki/kubelet.key"}},
		{"/var/lib/kubelet", []string{"../cpu_manager_state"}},
		{"/var/lib/kubelet", []string{"kubeconfig"}},
	} {
		if got, err := statePaths(bad.root, bad.files); err == nil {
			t.Errorf("statePaths(%s, %v) = %v, want refused", bad.root, bad.files, got)
		}
	}
}
