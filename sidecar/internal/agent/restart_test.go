// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/dkc-dev/dkc/internal/nodeconfig"
)

// A restart the service manager refuses (a failed job, e.g. the unit over its start limit) is not the
// config's fault: the node says the restart failed, keeps the config assigned and unblamed, and the next
// reconcile restarts into it.
func TestFailedRestartIsNotTheConfigsFault(t *testing.T) {
	n := newNode(t)
	n.kubelet.failRestarts = 1
	n.apply(assignment("u", "1", cfgHeader+"eventRecordQPS: 7\n"), "")
	st := n.reporter.lastStatus()
	if st.GetError() != string(nodeconfig.RestartError) {
		t.Fatalf("error %q after a refused restart, want %q", st.GetError(), string(nodeconfig.RestartError))
	}
	if rv(st.GetAssigned()) != "1" {
		t.Fatalf("assigned %s, want 1", rv(st.GetAssigned()))
	}
	if f := n.agent.state.failure(n.mustAssigned()); f != "" {
		t.Fatalf("the config was marked failed for a refused restart: %s", f)
	}
	if !n.agent.retry {
		t.Fatal("no retry scheduled after a refused restart")
	}
	n.reconcile()
	n.expect("1", "1", "local", "", 1) // the fake counts the restarts that happened
}

// TestKubeletThatExitsAtStartIsTheConfigsFault: on a Type=notify unit the restart job itself fails when
// the kubelet exits before it is ready; restarted into a new config, that is the config's fault as much as a
// kubelet that never becomes healthy: rolled back to last-known-good, never left stopped and retried.
func TestKubeletThatExitsAtStartIsTheConfigsFault(t *testing.T) {
	n := newNode(t)
	n.kubelet.exitOnStart = 1
	n.apply(assignment("u", "1", cfgHeader+"eventRecordQPS: 7\n"), "")
	n.expect("1", "local", "local", string(nodeconfig.HealthError), 2) // the failed start, then the rollback
	if f := n.agent.state.failure(n.mustAssigned()); f == "" {
		t.Fatal("the config the kubelet exited with was not marked failed")
	}
	if n.agent.retry {
		t.Error("a retry is scheduled: the failed config would be restarted into again")
	}
	if got := len(n.reporter.restarts); got != 2 {
		t.Errorf("%d restart Events, want 2 (into the config, back to local)", got)
	}
}

// TestKubeletThatExitsOnAForeignAddressNamesIt: a kubelet told to listen on an address that is not the
// node's exits. When the service manager counted it started first, /configz is refused for the address (the
// integration test TestConfigPointingTheKubeletOffTheNodeGetsNoToken); when it did not, the restart job
// fails, and the failure names the address all the same (this test).
func TestKubeletThatExitsOnAForeignAddressNamesIt(t *testing.T) {
	n := newNode(t)
	n.kubelet.exitOnStart = 1
	n.apply(assignment("u", "1", cfgHeader+"address: 203.0.113.9\n"), "")
	n.expect("1", "local", "local", string(nodeconfig.HealthError), 2)
	f := n.agent.state.failure(n.mustAssigned())
	for _, want := range []string{"address 203.0.113.9 is neither loopback", "the kubelet's process failed starting"} {
		if !strings.Contains(f, want) {
			t.Errorf("failure %q does not say %q", f, want)
		}
	}
}

// A kubelet that is not running while its env file already names the target (its unit failed after the
// last restart, or was stopped) is started again, not waited for until the config is blamed.
func TestStoppedKubeletIsStartedNotBlamed(t *testing.T) {
	n := newNode(t)
	n.apply(assignment("u", "1", cfgHeader+"eventRecordQPS: 7\n"), "")
	n.expect("1", "1", "local", "", 1)
	n.kubelet.mu.Lock()
	n.kubelet.stopped = true
	n.kubelet.mu.Unlock()
	n.start() // a sidecar restart finds the kubelet dead
	n.reconcile()
	n.expect("1", "1", "local", "", 2)
	if f := n.agent.state.failure(n.mustAssigned()); f != "" {
		t.Fatalf("the config was marked failed because the kubelet was stopped: %s", f)
	}
}

// Stopping the sidecar (SIGTERM) in the middle of the post-restart health wait says nothing about the
// config: it is not marked failed and nothing is rolled back.
func TestStopDuringHealthWaitBlamesNothing(t *testing.T) {
	n := newNode(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	n.agent.Apply(ctx, Desired{Assignment: assignment("u", "1", cfgHeader+"maxPods: 13\n")})
	if f := n.agent.state.failure(n.mustAssigned()); f != "" {
		t.Fatalf("the config was marked failed by a stop during the health wait: %s", f)
	}
	if n.kubelet.count() > 1 {
		t.Fatalf("%d restarts: a stopped sidecar rolled back", n.kubelet.count())
	}
}

func (n *node) mustAssigned() *corev1.NodeConfigSource {
	n.t.Helper()
	src, err := n.agent.store.Assigned()
	if err != nil || src == nil {
		n.t.Fatalf("assigned: %v, %v", src, err)
	}
	return src
}

// reconcile runs what the agent's retry tick runs.
func (n *node) reconcile() {
	n.t.Helper()
	defer n.drive()()
	n.agent.reconcile(context.Background())
}
