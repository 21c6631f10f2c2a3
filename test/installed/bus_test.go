// SPDX-License-Identifier: Apache-2.0

//go:build integration

package installed

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dkc-dev/dkc/internal/poll"
)

// TestSystemBusRestartedDuringAKubeletRestart: node-1's bus is restarted (dbus.socket, as an upgrade of the
// dbus package does: every connection closes and the socket file is made anew) while its sidecar waits for
// the result of the kubelet's restart job; the kubelet's unit is made to wait 8s before starting, so that
// the job is still queued when the bus goes. The sidecar must reconnect (through the directory it mounts,
// the new socket), find out that the kubelet was restarted, and go on: one kubelet start, the config active
// with ConfigOK, the sidecar container not restarted; node-2 untouched.
func TestSystemBusRestartedDuringAKubeletRestart(t *testing.T) {
	const node = "node-1"
	resetAfter(t)
	undo, err := cluster.SlowKubeletStart(ctxFor(t), node, 8*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := undo(context.Background()); err != nil {
			t.Errorf("remove the slow start: %v", err)
		}
	})
	before := map[string]int{}
	for _, n := range nodes {
		before[n] = kubeletStarts(t, n)
	}
	pod := sidecarPod(t, node)
	logged := sidecarLogLines(t, node, pod, "restarting kubelet to use config")
	cm := createConfig(t, "installed-bus", node, 91)
	assign(t, node, cm)
	poll.For(t, time.Minute, 50*time.Millisecond, "the sidecar to log the kubelet restart", func() bool {
		return sidecarLogLines(t, node, pod, "restarting kubelet to use config") != logged
	})
	if err := cluster.RestartBus(ctxFor(t), node); err != nil {
		t.Fatal(err)
	}
	if kubeletStarts(t, node) != before[node] {
		t.Fatal("the kubelet started before the bus was back: the restart job was not pending while the bus restarted")
	}
	waitRunning(t, node, cm, 2*time.Minute)
	if d := kubeletStarts(t, node) - before[node]; d != 1 {
		t.Errorf("%s: kubelet started %d times for one assignment, want 1", node, d)
	}
	if got := configzQPS(t, node); got != 91 {
		t.Errorf("%s: configz eventRecordQPS = %v, want 91", node, got)
	}
	if d := kubeletStarts(t, "node-2") - before["node-2"]; d != 0 {
		t.Errorf("node-2: kubelet started %d times, want 0", d)
	}
	p, err := admin(t).CoreV1().Pods("kube-system").Get(ctxFor(t), pod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range p.Status.ContainerStatuses {
		if s.RestartCount != 0 {
			t.Errorf("%s: container %s restarted %d times; the sidecar must reconnect to the bus, not crash", pod, s.Name, s.RestartCount)
		}
	}
}
