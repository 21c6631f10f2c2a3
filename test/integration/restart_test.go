//go:build integration

package integration

import (
	"fmt"
	"sort"
	"testing"
	"time"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	godbus "github.com/godbus/dbus/v5"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestBurstOfReassignmentsKeepsTheKubeletAlive is the burst a new user tried on the real node: twenty
// reassignments alternating between two good ConfigMaps, a few hundred milliseconds apart. The dev node's
// kubelet.service keeps systemd's default start limit (5 starts in 10 s, as many distributions' units do),
// which restarting once per reassignment exceeds: the unit ended "failed" with Result=start-limit-hit, the
// kubelet dead, every later config marked failed for good and rolled back. Now the burst coalesces (the
// latest target wins), restarts are paced inside the limit, and the kubelet ends running the last config,
// its unit active, ConfigOK True, nothing marked failed.
func TestBurstOfReassignmentsKeepsTheKubeletAlive(t *testing.T) {
	client := adminClient(t)
	resetRealNode(t)
	t.Cleanup(func() { resetRealNode(t) })
	ctx := testContext(t)
	before := restartEvents(t, realNode)
	began := time.Now()

	names := map[int]string{}
	for i, qps := range []int{31, 32} {
		cm := createConfigMap(t, fmt.Sprintf("burst-%d", i), map[string]string{"kubelet": kubeletConfig(t, fmt.Sprintf("eventRecordQPS: %d\n", qps))})
		names[i] = cm.Name + "@" + cm.ResourceVersion
	}
	const reassignments = 20
	for i := 0; i < reassignments; i++ {
		setSource(t, client, realNode, cmSource(fmt.Sprintf("burst-%d", i%2)))
		time.Sleep(300 * time.Millisecond)
	}
	last := names[(reassignments-1)%2]
	waitNodeStatus(t, realNode, last, last, "*", "", 3*time.Minute)
	if got := configz(t, realNode)["eventRecordQPS"]; got != float64(32) {
		t.Errorf("configz eventRecordQPS = %v, want 32 (the last assignment)", got)
	}
	state, result, err := cluster.KubeletUnitState(ctx, realNode)
	if err != nil {
		t.Fatal(err)
	}
	if state != "active" || result != "success" {
		t.Errorf("kubelet.service is %s (Result=%s) after the burst, want active (success)", state, result)
	}
	if c := configOK(t, realNode); c.Status != "True" {
		t.Errorf("ConfigOK %s: %s", c.Status, c.Message)
	}
	// Coalescing: far fewer restarts than reassignments, and at least the one that brought the last config.
	n := restartEvents(t, realNode) - before
	if n < 1 || n >= reassignments {
		t.Errorf("%d kubelet restarts for %d reassignments; want between 1 and %d (bursts coalesce)", n, reassignments, reassignments-1)
	}
	t.Logf("%d reassignments, %d kubelet restarts, unit %s/%s", reassignments, n, state, result)
	// Paced inside the unit's start limit: never 5 of dkc's restarts (StartLimitBurst) within its 10 s
	// (StartLimitIntervalSec) window. Event times have whole seconds, so 5 restarts at most 8 s apart on
	// them are surely inside one window.
	times := restartTimes(t, realNode, began)
	for i := 0; i+4 < len(times); i++ {
		if span := times[i+4].Sub(times[i]); span <= 8*time.Second {
			t.Errorf("5 kubelet restarts within %v (from %s): systemd's default start limit is 5 in 10s; restarts %v",
				span, times[i].Format(time.TimeOnly), times)
			break
		}
	}

	// Going back to the first config still works: it was never marked failed.
	setSource(t, client, realNode, cmSource("burst-0"))
	waitNodeStatus(t, realNode, names[0], names[0], "*", "", 2*time.Minute)
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

	conn, err := sddbus.NewConnection(func() (*godbus.Conn, error) {
		c, err := godbus.Dial(cluster.BusAddress(realNode), godbus.WithContext(ctx))
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
		t.Fatal(err)
	}
	defer conn.Close()
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
