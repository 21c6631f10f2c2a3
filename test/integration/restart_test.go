// SPDX-License-Identifier: Apache-2.0

//go:build integration

package integration

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	godbus "github.com/godbus/dbus/v5"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dkc-dev/dkc/internal/poll"
)

// TestBurstOfReassignmentsKeepsTheKubeletAlive is the burst a new user tried on the real node: twenty
// reassignments alternating between two good ConfigMaps, a few hundred milliseconds apart. The dev node's
// kubelet.service keeps systemd's default start limit (5 starts in 10 s, as many distributions' units do),
// which restarting once per reassignment exceeds: the unit ended "failed" with Result=start-limit-hit, the
// kubelet dead, every later config marked failed for good and rolled back. Now the burst coalesces (the
// latest target wins), restarts are paced inside the limit, and the kubelet ends running the last config,
// its unit active, ConfigOK True, nothing marked failed.
func TestBurstOfReassignmentsKeepsTheKubeletAlive(t *testing.T) {
	times := burst(t, realNode)
	// Paced inside the unit's start limit: never 5 of dkc's restarts (StartLimitBurst) within its 10 s
	// (StartLimitIntervalSec) window. Event times have whole seconds, so 5 restarts at most 8 s apart on
	// them are surely inside one window.
	for i := 0; i+4 < len(times); i++ {
		if span := times[i+4].Sub(times[i]); span <= 8*time.Second {
			t.Errorf("5 kubelet restarts within %v (from %s): systemd's default start limit is 5 in 10s; restarts %v",
				span, times[i].Format(time.TimeOnly), times)
			break
		}
	}
}

// burst makes twenty reassignments of node, alternating between two good ConfigMaps 300 ms apart, and
// checks the outcome: the last config active in the running kubelet, its unit active, ConfigOK True, fewer
// restarts than reassignments, and the first config still usable (never marked failed). It returns the
// times of the restarts.
func burst(t *testing.T, node string) []time.Time {
	t.Helper()
	client := adminClient(t)
	resetNode(t, node)
	t.Cleanup(func() { resetNode(t, node) })
	ctx := testContext(t)
	before := restartEvents(t, node)
	began := time.Now()

	names := map[int]string{}
	for i, qps := range []int{31, 32} {
		cm := createConfigMap(t, fmt.Sprintf("burst-%d", i), map[string]string{"kubelet": kubeletConfigOf(t, node, fmt.Sprintf("eventRecordQPS: %d\n", qps))})
		names[i] = cm.Name + "@" + cm.ResourceVersion
	}
	const reassignments = 20
	for i := 0; i < reassignments; i++ {
		setSource(t, client, node, cmSource(fmt.Sprintf("burst-%d", i%2)))
		time.Sleep(300 * time.Millisecond) // the burst's pace: not a wait for anything
	}
	// The end state: the last assignment active in the status AND in the running kubelet. Both are polled
	// together, because while the burst drains the status may for a moment still show an earlier cycle.
	last := names[(reassignments-1)%2]
	const settle = 3 * time.Minute
	deadline := time.Now().Add(settle)
	poll.ForNil(t, settle, 300*time.Millisecond, "the last assignment active in the status and in the kubelet", func() error {
		st := waitNodeStatus(t, node, last, last, "*", "", time.Until(deadline))
		if got := configz(t, node)["eventRecordQPS"]; got != float64(32) {
			return fmt.Errorf("status %s active but configz eventRecordQPS = %v, want 32 (the last assignment)", srcName(st.Active), got)
		}
		return nil
	})
	state, result, err := cluster.KubeletUnitState(ctx, node)
	if err != nil {
		t.Fatal(err)
	}
	if state != "active" || result != "success" {
		t.Errorf("kubelet.service is %s (Result=%s) after the burst, want active (success)", state, result)
	}
	if c := configOK(t, node); c.Status != "True" {
		t.Errorf("ConfigOK %s: %s", c.Status, c.Message)
	}
	// Coalescing: far fewer restarts than reassignments, and at least the one that brought the last config.
	n := restartEvents(t, node) - before
	if n < 1 || n >= reassignments {
		t.Errorf("%d kubelet restarts for %d reassignments; want between 1 and %d (bursts coalesce)", n, reassignments, reassignments-1)
	}
	t.Logf("%d reassignments, %d kubelet restarts, unit %s/%s", reassignments, n, state, result)
	times := restartTimes(t, node, began)

	// Going back to the first config still works: it was never marked failed.
	setSource(t, client, node, cmSource("burst-0"))
	waitNodeStatus(t, node, names[0], names[0], "*", "", 2*time.Minute)
	return times
}

// resetNode points node back at its local config and waits until it runs it.
func resetNode(t *testing.T, node string) {
	t.Helper()
	setSource(t, adminClient(t), node, "")
	waitNodeStatus(t, node, "local", "local", "local", "", time.Minute)
}

// TestKubeletLeftAtItsStartLimitIsRecovered stops the real node's kubelet the way systemd does when
// something restarts it too often: restarted over D-Bus until the unit is "failed" with
// Result=start-limit-hit, the kubelet dead. The next assignment must bring it back (reset-failed, then
// start) and run the config, instead of failing the config for what the service manager did.
func TestKubeletLeftAtItsStartLimitIsRecovered(t *testing.T) {
	client := adminClient(t)
	resetRealNode(t)
	t.Cleanup(func() { resetRealNode(t) })
	ctx := testContext(t)

	conn := nodeBus(ctx, t, realNode)
	for i := 0; i < 20; i++ {
		done := make(chan string, 1)
		if _, err := conn.RestartUnitContext(ctx, "kubelet.service", "replace", done); err != nil {
			t.Fatal(err)
		}
		if <-done != "done" {
			break
		}
	}
	state, result, err := cluster.KubeletUnitState(ctx, realNode)
	if err != nil {
		t.Fatal(err)
	}
	if state != "failed" || result != "start-limit-hit" {
		t.Fatalf("kubelet.service is %s (Result=%s) after 20 quick restarts; the test needs start-limit-hit", state, result)
	}

	cm := createConfigMap(t, "after-limit", map[string]string{"kubelet": kubeletConfig(t, "eventRecordQPS: 33\n")})
	name := cm.Name + "@" + cm.ResourceVersion
	setSource(t, client, realNode, cmSource(cm.Name))
	waitNodeStatus(t, realNode, name, name, "*", "", 2*time.Minute)
	if got := configz(t, realNode)["eventRecordQPS"]; got != float64(33) {
		t.Errorf("configz eventRecordQPS = %v, want 33", got)
	}
	if state, result, err := cluster.KubeletUnitState(ctx, realNode); err != nil || state != "active" {
		t.Errorf("kubelet.service is %s (Result=%s, %v), want active", state, result, err)
	}
}

// restartTimes are the times of node's KubeletConfigChanged Events since (whole seconds), oldest first.
func restartTimes(t *testing.T, node string, since time.Time) []time.Time {
	t.Helper()
	evs, err := adminClient(t).CoreV1().Events("default").List(testContext(t), metav1.ListOptions{
		FieldSelector: "involvedObject.name=" + node + ",reason=KubeletConfigChanged"})
	if err != nil {
		t.Fatal(err)
	}
	var times []time.Time
	for _, e := range evs.Items {
		if !e.FirstTimestamp.Time.Before(since.Truncate(time.Second)) {
			times = append(times, e.FirstTimestamp.Time)
		}
	}
	sort.Slice(times, func(i, j int) bool { return times[i].Before(times[j]) })
	return times
}

// TestReassignmentWhileARestartJobIsQueued: the sidecar restarts the kubelet into config A, and systemd
// holds that restart job (the kubelet stopped, its start waiting behind a unit ordered before it, as
// behind a slow dependency at boot); meanwhile the node is reassigned to B. The job runs when it can; the
// kubelet ends running B, its unit active, ConfigOK True, with two restarts (A's, then B's) and A never
// blamed for the wait (reassigning A afterwards runs it).
func TestReassignmentWhileARestartJobIsQueued(t *testing.T) {
	client := adminClient(t)
	resetRealNode(t)
	t.Cleanup(func() { resetRealNode(t) })
	ctx := testContext(t)
	conn := nodeBus(ctx, t, realNode)

	a := createConfigMap(t, "queued-a", map[string]string{"kubelet": kubeletConfig(t, "eventRecordQPS: 41\n")})
	b := createConfigMap(t, "queued-b", map[string]string{"kubelet": kubeletConfig(t, "eventRecordQPS: 42\n")})
	nameA, nameB := a.Name+"@"+a.ResourceVersion, b.Name+"@"+b.ResourceVersion
	before := restartEvents(t, realNode)

	// A oneshot unit ordered before kubelet.service, starting for 8 s: a kubelet start job queued meanwhile
	// waits for it.
	const hold = 8 * time.Second
	blocker := fmt.Sprintf("dkc-test-hold-%d.service", time.Now().UnixNano())
	if _, err := conn.StartTransientUnitContext(ctx, blocker, "replace", []sddbus.Property{
		sddbus.PropType("oneshot"),
		sddbus.PropExecStart([]string{"/bin/sleep", fmt.Sprint(hold.Seconds())}, false),
		{Name: "Before", Value: godbus.MakeVariant([]string{"kubelet.service"})},
	}, nil); err != nil {
		t.Fatalf("start %s: %v", blocker, err)
	}
	setSource(t, client, realNode, cmSource(a.Name))
	// Wait until the sidecar's restart job is queued: kubelet.service has a job and is not running.
	poll.For(t, hold, 100*time.Millisecond, "a kubelet.service job after assigning "+nameA, func() bool {
		jobs, err := conn.ListJobsContext(ctx)
		if err != nil {
			t.Fatal(err)
		}
		queued := false
		for _, j := range jobs {
			if j.Unit == "kubelet.service" {
				queued = true
				t.Logf("queued: job %d %s %s", j.Id, j.JobType, j.Status)
			}
		}
		return queued
	})
	setSource(t, client, realNode, cmSource(b.Name))

	waitNodeStatus(t, realNode, nameB, nameB, "*", "", 2*time.Minute)
	if got := configz(t, realNode)["eventRecordQPS"]; got != float64(42) {
		t.Errorf("configz eventRecordQPS = %v, want 42 (B)", got)
	}
	if state, result, err := cluster.KubeletUnitState(ctx, realNode); err != nil || state != "active" || result != "success" {
		t.Errorf("kubelet.service is %s (Result=%s, %v), want active (success)", state, result, err)
	}
	if c := configOK(t, realNode); c.Status != "True" {
		t.Errorf("ConfigOK %s: %s", c.Status, c.Message)
	}
	if n := restartEvents(t, realNode) - before; n != 2 {
		t.Errorf("%d kubelet restarts, want 2 (into A, whose job was queued, then into B)", n)
	}
	// A was not blamed for its queued job: assigning it again runs it.
	setSource(t, client, realNode, cmSource(a.Name))
	waitNodeStatus(t, realNode, nameA, nameA, "*", "", 2*time.Minute)
}

// nodeBus connects to node's systemd over its D-Bus socket, as root (EXTERNAL auth uid 0), until the test ends.
func nodeBus(ctx context.Context, t *testing.T, node string) *sddbus.Conn {
	t.Helper()
	conn, err := sddbus.NewConnection(func() (*godbus.Conn, error) {
		c, err := godbus.Dial(cluster.BusAddress(node), godbus.WithContext(ctx))
		if err != nil {
			return nil, err
		}
		if err := c.Auth([]godbus.Auth{godbus.AuthExternal("0")}); err != nil {
			c.Close()
			return nil, err
		}
		return c, c.Hello()
	})
	if err != nil {
		t.Fatalf("connect to the systemd of %s: %v", node, err)
	}
	t.Cleanup(conn.Close)
	return conn
}
