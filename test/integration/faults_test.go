// SPDX-License-Identifier: Apache-2.0

//go:build integration

package integration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dkc-dev/dkc/api/v1alpha1"
	"github.com/dkc-dev/dkc/cli/plugin"
	"github.com/dkc-dev/dkc/internal/poll"
	"github.com/dkc-dev/dkc/test/devcluster/devclustertest"
)

func sims() []string {
	var s []string
	for i := 1; i <= devclustertest.SimNodes; i++ {
		s = append(s, fmt.Sprintf("sim-%d", i))
	}
	return s
}

func simKubeletPIDs(t *testing.T) map[string]string {
	t.Helper()
	pids := map[string]string{}
	for _, s := range sims() {
		b, err := os.ReadFile(cluster.NodeDir(s) + "/kubelet.pid")
		if err != nil {
			t.Fatal(err)
		}
		pids[s] = strings.TrimSpace(string(b))
	}
	return pids
}

func restartEventCounts(t *testing.T) map[string]int {
	t.Helper()
	counts := map[string]int{}
	for _, s := range sims() {
		counts[s] = restartEvents(t, s)
	}
	return counts
}

// waitConnected waits until the service has a stream from every node with a sidecar and returns how long
// that took.
func waitConnected(t *testing.T, limit time.Duration) time.Duration {
	t.Helper()
	want := float64(1 + devclustertest.SimNodes)
	start := time.Now()
	poll.ForNil(t, limit, 50*time.Millisecond, "every sidecar to reconnect", func() error {
		if got := serverMetric(t, "dkc_server_connected_nodes"); got < want {
			return fmt.Errorf("%v of %v reconnected", got, want)
		}
		return nil
	})
	return time.Since(start)
}

// TestFaultsDuringRollouts restarts etcd, the apiserver and the config service (whose pool controller
// drives the rollouts), partitions the service, and lets a pool's ConfigMap vanish in the middle of rollouts
// of a KubeletConfigPool over the simulated nodes. Invariants: every Node's final status is right, no
// kubelet restarts without an assignment change, sidecars reconnect within 5s of the service coming back,
// and no status update is lost.
func TestFaultsDuringRollouts(t *testing.T) {
	const pool = "faults"
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	t.Cleanup(func() { _ = cluster.Signal("dkc-server", syscall.SIGCONT) })
	usePoolOn(t, pool, sims())
	rollout := func(cm, maxUnavailable string) error {
		out, errOut, err := kubectlDKC(t, "rollout", pool, "--configmap", "kube-system/"+cm, "-l", poolSelector, "--max-unavailable", maxUnavailable, "--timeout", "3m")
		if err != nil {
			return fmt.Errorf("%w\n%s\n%s", err, out, errOut)
		}
		return nil
	}
	current := func() string {
		rev := getPool(t, pool).Status.CurrentRevision
		return snapshotOf(t, pool, rev)
	}
	header := "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nfailCgroupV1: false\n"
	createConfigMap(t, "faults-a", map[string]string{"kubelet": header + "eventRecordQPS: 41\n"})
	if err := rollout("faults-a", "100%"); err != nil {
		t.Fatalf("baseline rollout: %v", err)
	}
	an := current()
	pids, events := simKubeletPIDs(t), restartEventCounts(t)
	faults := 0

	// 1. Restarts of etcd, the apiserver and the service, and a partition of the service, with no
	// assignment change: nothing may restart a kubelet.
	for _, p := range []string{"etcd", "kube-apiserver", "dkc-server"} {
		if err := cluster.Restart(ctx, p); err != nil {
			t.Fatalf("restart %s: %v", p, err)
		}
		faults++
	}
	took := waitConnected(t, 5*time.Second)
	t.Logf("sidecars reconnected %v after dkc-server came back", took)
	if err := cluster.Signal("dkc-server", syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second) // the partition's length: not a wait for anything
	if err := cluster.Signal("dkc-server", syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	faults++
	for _, s := range sims() {
		waitNodeStatus(t, s, an, an, "*", "", time.Minute)
	}
	if got := simKubeletPIDs(t); fmt.Sprint(got) != fmt.Sprint(pids) {
		t.Errorf("kubelets restarted without an assignment change: %v → %v", pids, got)
	}

	// 2. A rollout of b, two nodes at a time, while the service (and its pool controller) and the apiserver
	// restart under it: it completes, each kubelet restarted exactly once.
	createConfigMap(t, "faults-b", map[string]string{"kubelet": header + "eventRecordQPS: 42\n"})
	done := make(chan error, 1)
	revA := getPool(t, pool).Status.CurrentRevision
	go func() { done <- rollout("faults-b", "2") }()
	// The restarts come once the rollout is under way. A rollout that fails before that fails the test with
	// its own error, not after the wait's minute.
	var rolloutErr error
	ended := false
	poll.For(t, time.Minute, 200*time.Millisecond, "the pool to roll out b", func() bool {
		if !ended {
			select {
			case rolloutErr = <-done:
				ended = true
			default:
			}
		}
		if ended && rolloutErr != nil {
			t.Fatalf("rollout of b, before it was under way: %v", rolloutErr)
		}
		return getPool(t, pool).Status.CurrentRevision != revA
	})
	for _, p := range []string{"dkc-server", "kube-apiserver"} {
		if err := cluster.Restart(ctx, p); err != nil {
			t.Fatalf("restart %s: %v", p, err)
		}
		faults++
	}
	if !ended {
		rolloutErr = <-done
	}
	if rolloutErr != nil {
		t.Fatalf("rollout through restarts: %v", rolloutErr)
	}
	bn := current()
	for _, s := range sims() {
		waitNodeStatus(t, s, bn, bn, "*", "", time.Minute)
	}
	after := restartEventCounts(t)
	for _, s := range sims() {
		if after[s]-events[s] != 1 {
			t.Errorf("%s: %d kubelet restarts for one assignment change", s, after[s]-events[s])
		}
	}

	// 3. The pool's ConfigMap vanishes while its first batch is in its trial: the pool stops (ConfigInvalid,
	// ConfigMapNotFound) before the next batch. The nodes keep what they run, with no error: those that got
	// c run its revision's snapshot, which the pool made and which did not vanish; the others keep b.
	createConfigMap(t, "faults-c", map[string]string{"kubelet": header + "eventRecordQPS: 43\n"})
	go func() { done <- rollout("faults-c", "2") }()
	var cn string
	poll.ForNil(t, time.Minute, 200*time.Millisecond, "the first batch of c to run it", func() error {
		p := getPool(t, pool)
		if p.Status.CurrentRevision != "" {
			if cn = snapshotOf(t, pool, p.Status.CurrentRevision); cn != bn && len(runningOn(t, cn)) >= 2 {
				return nil
			}
		}
		return fmt.Errorf("%+v", p.Status)
	})
	if err := adminClient(t).CoreV1().ConfigMaps("kube-system").Delete(ctx, "faults-c", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	faults++
	var stopped *plugin.ErrRolloutStopped
	if err := <-done; !errors.As(err, &stopped) || stopped.Reason != v1alpha1.ReasonConfigMapNotFound {
		t.Errorf("rollout whose ConfigMap vanished: %v, want the pool stopped with %s", err, v1alpha1.ReasonConfigMapNotFound)
	}
	// The nodes assigned c now stay the only ones: a pool that went on would assign more.
	assigned, _ := simsOn(t, strings.Split(cn, "@")[0])
	time.Sleep(5 * time.Second) // proves a negative: the stopped pool assigns no more meanwhile
	if later, _ := simsOn(t, strings.Split(cn, "@")[0]); len(later) != len(assigned) || len(assigned) < 2 {
		t.Errorf("nodes assigned c: %v when the pool stopped, %v later; want the first batch's, unchanged", assigned, later)
	}
	for _, s := range sims() {
		want := bn
		if slices.Contains(assigned, s) {
			want = cn
		}
		waitNodeStatus(t, s, want, want, "*", "", time.Minute)
	}
	t.Logf("faults injected: %d; every node's final status checked; kubelet restarts matched assignment changes", faults)
}

// runningOn are the simulated nodes whose active config is name ("cm@rv").
func runningOn(t *testing.T, name string) []string {
	t.Helper()
	var out []string
	for _, s := range sims() {
		if srcName(nodeStatus(t, s).Active) == name {
			out = append(out, s)
		}
	}
	return out
}

// TestNetworkCutOfTheRealNode takes the real node's link down (the veth of its network namespace, which we
// created), assigns a new config while the sidecar cannot reach the service, and brings the link back: the
// assignment arrives once the network does, and the kubelet restarts exactly once for it.
func TestNetworkCutOfTheRealNode(t *testing.T) {
	client := adminClient(t)
	resetRealNode(t)
	t.Cleanup(func() { resetRealNode(t) })
	veth := cluster.State().Nodes[0].HostVeth
	ip := func(state string) {
		t.Helper()
		if out, err := exec.Command("ip", "link", "set", veth, state).CombinedOutput(); err != nil {
			t.Fatalf("ip link set %s %s: %v\n%s", veth, state, err, out)
		}
	}
	before := restartEvents(t, realNode)
	pid := kubeletPID(t)
	ip("down")
	up := false
	t.Cleanup(func() {
		if !up {
			ip("up")
		}
	})
	createConfigMap(t, "cut-config", map[string]string{"kubelet": kubeletConfig(t, "eventRecordQPS: 17\n")})
	name := "cut-config@" + mustRV(t, "cut-config")
	setSource(t, client, realNode, cmSource("cut-config"))
	time.Sleep(5 * time.Second) // proves a negative: the cut-off node's kubelet does not restart meanwhile
	if kubeletPID(t) != pid {
		t.Fatal("the kubelet restarted while its node was cut off")
	}
	ip("up")
	up = true
	waitNodeStatus(t, realNode, name, name, "*", "", 2*time.Minute)
	if got := configz(t, realNode)["eventRecordQPS"]; got != float64(17) {
		t.Errorf("configz eventRecordQPS = %v, want 17", got)
	}
	if n := restartEvents(t, realNode) - before; n != 1 {
		t.Errorf("%d kubelet restarts for one assignment across a network cut", n)
	}
}
