//go:build integration

package installed

import (
	"testing"
	"time"
)

// TestSystemBusRestartedUnderTheSidecar: node-1's dbus-daemon is restarted under its running sidecar, as a
// package upgrade does; the sidecar's bus connection closes. The next assignment still restarts the kubelet,
// once, through a new connection, and the node ends on it with ConfigOK; node-2 is not touched.
func TestSystemBusRestartedUnderTheSidecar(t *testing.T) {
	const node = "node-1"
	t.Cleanup(func() { resetAll(t) })
	before := map[string]int{}
	for _, n := range nodes {
		before[n] = kubeletStarts(t, n)
	}
	if err := cluster.RestartBus(ctxFor(t), node); err != nil {
		t.Fatal(err)
	}
	cm := createConfig(t, "installed-bus", node, 91)
	assign(t, node, cm)
	waitRunning(t, node, cm, 2*time.Minute)
	if d := kubeletStarts(t, node) - before[node]; d != 1 {
		t.Errorf("%s: kubelet started %d times for one assignment after the bus restart, want 1", node, d)
	}
	if got := configzQPS(t, node); got != 91 {
		t.Errorf("%s: configz eventRecordQPS = %v, want 91", node, got)
	}
	if d := kubeletStarts(t, "node-2") - before["node-2"]; d != 0 {
		t.Errorf("node-2: kubelet started %d times, want 0", d)
	}
}
