//go:build integration

package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
	for serverMetric(t, "dkc_server_connected_nodes") < want {
		if time.Since(start) > limit {
			t.Fatalf("only %v of %v sidecars reconnected within %v", serverMetric(t, "dkc_server_connected_nodes"), want, limit)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return time.Since(start)
}

// TestFaultsDuringRollouts restarts etcd, the apiserver and the config service, partitions the service,
// and lets a ConfigMap vanish in the middle of rollouts over the simulated nodes. Invariants: every Node's
// final status is right, no kubelet restarts without an assignment change, sidecars reconnect within 5s of
// the service coming back, and no status update is lost.
func TestFaultsDuringRollouts(t *testing.T) {
	const sel = "dkc.dev/simulated=true"
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	t.Cleanup(func() {
		_ = cluster.Signal("dkc-server", syscall.SIGCONT)
		_, _, _ = kubectlDKC(t, "reset", "-l", sel)
	})
	header := "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nfailCgroupV1: false\n"
	a := createConfigMap(t, "faults-a", map[string]string{"kubelet": header + "eventRecordQPS: 41\n"})
	if out, errOut, err := kubectlDKC(t, "rollout", "--configmap", "kube-system/faults-a", "-l", sel, "--max-unavailable", "100%"); err != nil {
		t.Fatalf("baseline rollout: %v\n%s\n%s", err, out, errOut)
	}
	an := "faults-a@" + a.ResourceVersion
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
	time.Sleep(3 * time.Second)
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

	// 2. A rollout of b while the service and the apiserver restart under it: it completes, each kubelet
	// restarted exactly once.
	b := createConfigMap(t, "faults-b", map[string]string{"kubelet": header + "eventRecordQPS: 42\n"})
	bn := "faults-b@" + b.ResourceVersion
	done := make(chan error, 1)
	go func() {
		_, _, err := kubectlDKC(t, "rollout", "--configmap", "kube-system/faults-b", "-l", sel, "--max-unavailable", "1", "--timeout", "3m")
		done <- err
	}()
	time.Sleep(1500 * time.Millisecond)
	for _, p := range []string{"dkc-server", "kube-apiserver"} {
		if err := cluster.Restart(ctx, p); err != nil {
			t.Fatalf("restart %s: %v", p, err)
		}
		faults++
	}
	if err := <-done; err != nil {
		t.Fatalf("rollout through restarts: %v", err)
	}
	for _, s := range sims() {
		waitNodeStatus(t, s, bn, bn, "*", "", time.Minute)
	}
	after := restartEventCounts(t)
	for _, s := range sims() {
		if after[s]-events[s] != 1 {
			t.Errorf("%s: %d kubelet restarts for one assignment change", s, after[s]-events[s])
		}
	}

	// 3. The ConfigMap of a rollout vanishes after its first batch: the rollout pauses; nodes that got it
	// keep running it; the others keep b and say they cannot download.
	c := createConfigMap(t, "faults-c", map[string]string{"kubelet": header + "eventRecordQPS: 43\n"})
	cn := "faults-c@" + c.ResourceVersion
	go func() {
		_, _, err := kubectlDKC(t, "rollout", "--configmap", "kube-system/faults-c", "-l", sel, "--max-unavailable", "2", "--timeout", "1m")
		done <- err
	}()
	waitNodeStatus(t, "sim-1", cn, cn, "*", "", time.Minute)
	waitNodeStatus(t, "sim-2", cn, cn, "*", "", time.Minute)
	if err := adminClient(t).CoreV1().ConfigMaps("kube-system").Delete(ctx, "faults-c", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	faults++
	if err := <-done; err == nil || !strings.Contains(err.Error(), "failed to sync: failed to download config") {
		t.Errorf("rollout with a vanished ConfigMap: %v, want a pause on the download error", err)
	}
	const download = "failed to sync: failed to download config, see Kubelet log for details"
	for _, s := range []string{"sim-1", "sim-2"} {
		waitNodeStatus(t, s, cn, cn, "*", download, time.Minute)
	}
	// Whether the rollout reached a later batch before the ConfigMap vanished depends on timing: a node it
	// did not reach runs b with no error; a node it reached after the deletion keeps b and says it cannot
	// download; a node it reached just before the deletion (under load, the second batch can start while
	// the test deletes) was assigned c and may already run it, and also says it cannot download.
	for _, s := range []string{"sim-3", "sim-4", "sim-5"} {
		deadline := time.Now().Add(time.Minute)
		for {
			st := nodeStatus(t, s)
			keptB := srcName(st.Assigned) == bn && srcName(st.Active) == bn && (st.Error == "" || st.Error == download)
			gotC := srcName(st.Assigned) == cn && (srcName(st.Active) == bn || srcName(st.Active) == cn) && st.Error == download
			if keptB || gotC {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: assigned=%s active=%s error=%q; want b with no error or the download error, or c assigned with the download error",
					s, srcName(st.Assigned), srcName(st.Active), st.Error)
			}
			time.Sleep(300 * time.Millisecond)
		}
	}
	t.Logf("faults injected: %d; every node's final status checked; kubelet restarts matched assignment changes", faults)
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
	time.Sleep(5 * time.Second)
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
