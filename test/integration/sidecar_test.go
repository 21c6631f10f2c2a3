// SPDX-License-Identifier: Apache-2.0

//go:build integration

package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dkc-dev/dkc/internal/nodeconfig"
	"github.com/dkc-dev/dkc/internal/poll"
	"github.com/dkc-dev/dkc/test/devcluster/devclustertest"
)

const realNode = "node-1"

// nodeStatus is the dkc.dev/config-status annotation of a node, decoded.
func nodeStatus(t *testing.T, node string) corev1.NodeConfigStatus {
	t.Helper()
	n, err := adminClient(t).CoreV1().Nodes().Get(testContext(t), node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var st corev1.NodeConfigStatus
	if raw := n.Annotations["dkc.dev/config-status"]; raw != "" {
		if err := json.Unmarshal([]byte(raw), &st); err != nil {
			t.Fatalf("status annotation %q: %v", raw, err)
		}
	}
	return st
}

func srcName(s *corev1.NodeConfigSource) string {
	if s == nil || s.ConfigMap == nil {
		return "local"
	}
	return s.ConfigMap.Name + "@" + s.ConfigMap.ResourceVersion
}

// waitNodeStatus waits until the node's status is exactly assigned/active/lkg (names as "name@rv" or
// "local"; lkg "*" for any) with an error containing errPart ("" = no error).
func waitNodeStatus(t *testing.T, node, assigned, active, lkg, errPart string, timeout time.Duration) corev1.NodeConfigStatus {
	t.Helper()
	var st corev1.NodeConfigStatus
	what := fmt.Sprintf("node %s status assigned=%s active=%s lkg=%s error %q (logs: %s)",
		node, assigned, active, lkg, errPart, cluster.NodeLogDir(node))
	poll.ForNil(t, timeout, 300*time.Millisecond, what, func() error {
		st = nodeStatus(t, node)
		ok := srcName(st.Assigned) == assigned && srcName(st.Active) == active && (lkg == "*" || srcName(st.LastKnownGood) == lkg) &&
			((errPart == "" && st.Error == "") || (errPart != "" && strings.Contains(st.Error, errPart)))
		if !ok {
			return fmt.Errorf("assigned=%s active=%s lkg=%s error=%q", srcName(st.Assigned), srcName(st.Active), srcName(st.LastKnownGood), st.Error)
		}
		return nil
	})
	return st
}

// configz returns the running kubelet's config through the apiserver's node proxy (the seed's recipe).
func configz(t *testing.T, node string) map[string]any {
	t.Helper()
	// A kubelet restarted a moment ago may not answer the node proxy yet (503 "unable to handle the
	// request"): ask again for a while, as a user would.
	var raw []byte
	poll.ForNil(t, 30*time.Second, 500*time.Millisecond, "configz of "+node, func() error {
		var err error
		raw, err = adminClient(t).CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes/" + node + "/proxy/configz").DoRaw(testContext(t))
		if err != nil && !apierrors.IsServiceUnavailable(err) {
			t.Fatalf("configz of %s: %v", node, err)
		}
		return err
	})
	var c struct {
		KubeletConfig map[string]any `json:"kubeletconfig"`
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		t.Fatal(err)
	}
	return c.KubeletConfig
}

// kubeletConfig is a valid config for the real node: its local config with overrides. The dev node runs
// without QoS cgroups, so enforceNodeAllocatable must stay empty (configz omits the empty list, the trap
// in the seed's configz recipe).
func kubeletConfig(t *testing.T, extra string) string {
	t.Helper()
	return kubeletConfigOf(t, realNode, extra)
}

// kubeletConfigOf is a valid config for the real node node: its local config with overrides.
func kubeletConfigOf(t *testing.T, node, extra string) string {
	t.Helper()
	local, err := os.ReadFile(cluster.KubeletConfigPath(node))
	if err != nil {
		t.Fatal(err)
	}
	return string(local) + extra
}

func restartEvents(t *testing.T, node string) int {
	t.Helper()
	evs, err := adminClient(t).CoreV1().Events("default").List(testContext(t), metav1.ListOptions{
		FieldSelector: "involvedObject.name=" + node + ",reason=KubeletConfigChanged"})
	if err != nil {
		t.Fatal(err)
	}
	return len(evs.Items)
}

func kubeletPID(t *testing.T) int {
	t.Helper()
	pid, err := cluster.KubeletMainPID(testContext(t), realNode)
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

func resetRealNode(t *testing.T) {
	t.Helper()
	resetNode(t, realNode)
}

// TestRealNodeConfigLifecycle walks the seed's paths on the real node, whose kubelet is a systemd unit
// restarted by the sidecar over D-Bus, checking status, /configz and restarts at every step.
func TestRealNodeConfigLifecycle(t *testing.T) {
	client := adminClient(t)
	resetRealNode(t)
	t.Cleanup(func() { resetRealNode(t) })
	events := restartEvents(t, realNode)

	// A valid config reaches the running kubelet.
	good := createConfigMap(t, "real-good", map[string]string{"kubelet": kubeletConfig(t, "eventRecordQPS: 7\n")})
	goodName := "real-good@" + good.ResourceVersion
	setSource(t, client, realNode, cmSource("real-good"))
	waitNodeStatus(t, realNode, goodName, goodName, "local", "", 2*time.Minute)
	if got := configz(t, realNode)["eventRecordQPS"]; got != float64(7) {
		t.Fatalf("configz eventRecordQPS = %v, want 7", got)
	}
	if n := restartEvents(t, realNode) - events; n != 1 {
		t.Errorf("KubeletConfigChanged events = %d, want 1", n)
	}
	pid := kubeletPID(t)

	// After the (short, test) trial it becomes last-known-good, without a restart.
	waitNodeStatus(t, realNode, goodName, goodName, goodName, "", devclustertest.TrialDuration+time.Minute)
	if kubeletPID(t) != pid {
		t.Error("promotion to last-known-good restarted the kubelet")
	}

	// An invalid config never reaches the kubelet; status says why; no restart.
	createConfigMap(t, "real-invalid", map[string]string{"kubelet": kubeletConfig(t, "eventRecordQPS: -1\n")})
	setSource(t, client, realNode, cmSource("real-invalid"))
	st := waitNodeStatus(t, realNode, "real-invalid@"+mustRV(t, "real-invalid"), goodName, goodName, string(nodeconfig.ValidateError), time.Minute)
	if got := configz(t, realNode)["eventRecordQPS"]; got != float64(7) || kubeletPID(t) != pid {
		t.Errorf("invalid config changed the kubelet: eventRecordQPS %v, pid %d→%d", got, pid, kubeletPID(t))
	}
	_ = st
	cond := configOK(t, realNode)
	if cond.Status != corev1.ConditionFalse || !strings.Contains(cond.Message, "eventRecordQPS") {
		t.Errorf("ConfigOK = %s %q, want False naming eventRecordQPS", cond.Status, cond.Message)
	}

	// An unparsable config: load error, same fallback.
	createConfigMap(t, "real-garbage", map[string]string{"kubelet": "{{{ not yaml"})
	setSource(t, client, realNode, cmSource("real-garbage"))
	waitNodeStatus(t, realNode, "real-garbage@"+mustRV(t, "real-garbage"), goodName, goodName, string(nodeconfig.LoadError), time.Minute)

	// A config that validates but keeps the kubelet from starting is rolled back to last-known-good.
	createConfigMap(t, "real-broken", map[string]string{"kubelet": kubeletConfig(t, "containerRuntimeEndpoint: unix:///run/dkc-no-such-runtime.sock\n")})
	setSource(t, client, realNode, cmSource("real-broken"))
	// While the sidecar waits for the kubelet to come up healthy, dkc-server writes the restart in progress
	// once --restarting-status-delay (10s, under HealthTimeout) has passed without an outcome.
	waitNodeStatus(t, realNode, "real-broken@"+mustRV(t, "real-broken"), goodName, goodName, "", devclustertest.HealthTimeout+time.Minute)
	waitNodeStatus(t, realNode, "real-broken@"+mustRV(t, "real-broken"), goodName, goodName, string(nodeconfig.HealthError), devclustertest.HealthTimeout+2*time.Minute)
	if got := configz(t, realNode)["eventRecordQPS"]; got != float64(7) {
		t.Errorf("after rollback configz eventRecordQPS = %v, want 7 (last-known-good)", got)
	}

	// Back to the good config: it is already running (it is last-known-good), so no restart is needed.
	before := restartEvents(t, realNode)
	pid = kubeletPID(t)
	setSource(t, client, realNode, cmSource("real-good"))
	waitNodeStatus(t, realNode, goodName, goodName, goodName, "", time.Minute)
	if kubeletPID(t) != pid || restartEvents(t, realNode) != before {
		t.Error("reassigning the running config restarted the kubelet")
	}

	// The same config re-assigned, a ConfigMap resync, a no-op update: no restart either.
	cm, err := client.CoreV1().ConfigMaps("kube-system").Get(testContext(t), "real-good", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().ConfigMaps("kube-system").Update(testContext(t), cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second) // proves a negative: the update restarts no kubelet meanwhile
	if kubeletPID(t) != pid {
		t.Error("a no-op ConfigMap update restarted the kubelet")
	}
}

func mustRV(t *testing.T, name string) string {
	t.Helper()
	cm, err := adminClient(t).CoreV1().ConfigMaps("kube-system").Get(testContext(t), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return cm.ResourceVersion
}

func configOK(t *testing.T, node string) corev1.NodeCondition {
	t.Helper()
	n, err := adminClient(t).CoreV1().Nodes().Get(testContext(t), node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range n.Status.Conditions {
		if c.Type == "ConfigOK" {
			return c
		}
	}
	t.Fatalf("node %s has no ConfigOK condition", node)
	return corev1.NodeCondition{}
}

// TestSidecarRestartWithServiceAndAPIServerDown restarts the sidecar while the config service and the
// apiserver are frozen (SIGSTOP: unreachable, as in a partition): the kubelet keeps running its config and
// is not restarted; when they come back, status is reported again.
func TestSidecarRestartWithServiceAndAPIServerDown(t *testing.T) {
	client := adminClient(t)
	resetRealNode(t)
	t.Cleanup(func() { resetRealNode(t) })
	createConfigMap(t, "real-partition", map[string]string{"kubelet": kubeletConfig(t, "eventRecordQPS: 11\n")})
	name := "real-partition@" + mustRV(t, "real-partition")
	setSource(t, client, realNode, cmSource("real-partition"))
	waitNodeStatus(t, realNode, name, name, "*", "", 2*time.Minute)
	pid := kubeletPID(t)
	env, err := os.ReadFile(filepath.Join(cluster.DynamicConfigDir(realNode), "kubelet.env"))
	if err != nil {
		t.Fatal(err)
	}

	for _, p := range []string{"dkc-server", "kube-apiserver"} {
		if err := cluster.Signal(p, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			for _, p := range []string{"kube-apiserver", "dkc-server"} {
				_ = cluster.Signal(p, syscall.SIGCONT)
			}
		}
	}
	t.Cleanup(resume)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := cluster.RestartSidecar(ctx, realNode); err != nil {
		t.Fatal(err)
	}
	time.Sleep(8 * time.Second) // proves a negative: the sidecar, initialising meanwhile, restarts no kubelet
	if got, err := cluster.KubeletMainPID(ctx, realNode); err != nil || got != pid {
		t.Errorf("kubelet pid %d → %d (%v): the sidecar restart restarted the kubelet", pid, got, err)
	}
	if after, _ := os.ReadFile(filepath.Join(cluster.DynamicConfigDir(realNode), "kubelet.env")); string(after) != string(env) {
		t.Errorf("kubelet.env changed while the service was down:\n%s\n→\n%s", env, after)
	}
	resume()
	waitNodeStatus(t, realNode, name, name, "*", "", time.Minute)
	if got, _ := cluster.KubeletMainPID(ctx, realNode); got != pid {
		t.Errorf("kubelet restarted after the service came back (pid %d → %d)", pid, got)
	}
}

// TestKubeletThatCannotAuthenticateIsNotRolledBack: with the apiserver unreachable, a freshly started kubelet
// (nothing in its webhook authentication cache, as after an outage longer than the cache) is healthy but
// answers the sidecar's /configz with 401. The sidecar, restarted meanwhile, must neither blame the config
// nor restart the kubelet into last-known-good while it cannot read /configz, for longer than its health
// timeout; once the apiserver is back the config is proven active again.
func TestKubeletThatCannotAuthenticateIsNotRolledBack(t *testing.T) {
	client := adminClient(t)
	resetRealNode(t)
	t.Cleanup(func() { resetRealNode(t) })
	createConfigMap(t, "real-noauth", map[string]string{"kubelet": kubeletConfig(t, "eventRecordQPS: 12\n")})
	name := "real-noauth@" + mustRV(t, "real-noauth")
	setSource(t, client, realNode, cmSource("real-noauth"))
	waitNodeStatus(t, realNode, name, name, "*", "", 2*time.Minute)
	env, err := os.ReadFile(filepath.Join(cluster.DynamicConfigDir(realNode), "kubelet.env"))
	if err != nil {
		t.Fatal(err)
	}

	if err := cluster.Signal("kube-apiserver", syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			_ = cluster.Signal("kube-apiserver", syscall.SIGCONT)
		}
	}
	t.Cleanup(resume)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pid := restartKubeletThenSidecar(ctx, t)
	time.Sleep(devclustertest.HealthTimeout + 15*time.Second) // proves a negative: no rollback past the health timeout
	expectUntouched(ctx, t, pid, env, "while /configz was refused")
	resume()
	waitNodeStatus(t, realNode, name, name, "*", "", 2*time.Minute)
	if got, _ := cluster.KubeletMainPID(ctx, realNode); got != pid {
		t.Errorf("kubelet restarted after the apiserver came back (pid %d → %d)", pid, got)
	}
}

// TestKubeletWhoseAPIServerDropsPacketsIsNotRolledBack: as above, but the apiserver is unreachable the way
// a partition makes it — the node's packets to it are dropped, so a freshly started kubelet's webhook
// authentication waits and retries instead of refusing, and /configz does not answer within the sidecar's
// check. That says nothing about the config either: no rollback, no restart, the status says /configz was
// not answered; once packets pass again the config is proven active.
func TestKubeletWhoseAPIServerDropsPacketsIsNotRolledBack(t *testing.T) {
	client := adminClient(t)
	resetRealNode(t)
	t.Cleanup(func() { resetRealNode(t) })
	createConfigMap(t, "real-dropped", map[string]string{"kubelet": kubeletConfig(t, "eventRecordQPS: 13\n")})
	name := "real-dropped@" + mustRV(t, "real-dropped")
	setSource(t, client, realNode, cmSource("real-dropped"))
	waitNodeStatus(t, realNode, name, name, "*", "", 2*time.Minute)
	env, err := os.ReadFile(filepath.Join(cluster.DynamicConfigDir(realNode), "kubelet.env"))
	if err != nil {
		t.Fatal(err)
	}

	// Drop the node's packets to the apiserver, in the node's own network namespace (the cluster's).
	st := cluster.State()
	rule := []string{"OUTPUT", "-p", "tcp", "-d", st.Network.GatewayIP, "--dport", strconv.Itoa(st.APIServerPort), "-j", "DROP"}
	iptables := func(op string) error {
		out, err := exec.Command("ip", append([]string{"netns", "exec", st.Nodes[0].Netns, "iptables", op}, rule...)...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("iptables %s %v in %s: %w: %s", op, rule, st.Nodes[0].Netns, err, out)
		}
		return nil
	}
	if err := iptables("-I"); err != nil {
		t.Fatal(err)
	}
	dropping := true
	undrop := func() {
		if dropping {
			dropping = false
			if err := iptables("-D"); err != nil {
				t.Error(err)
			}
		}
	}
	t.Cleanup(undrop)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pid := restartKubeletThenSidecar(ctx, t)
	// The sidecar can still reach dkc-server (another port), so its status shows what it concluded.
	waitNodeStatus(t, realNode, name, name, "*", string(nodeconfig.VerifyTimeoutError), devclustertest.HealthTimeout+time.Minute)
	time.Sleep(devclustertest.HealthTimeout) // proves a negative: it stays so past the health timeout
	expectUntouched(ctx, t, pid, env, "while /configz did not answer")
	undrop()
	waitNodeStatus(t, realNode, name, name, "*", "", 2*time.Minute)
	if got, _ := cluster.KubeletMainPID(ctx, realNode); got != pid {
		t.Errorf("kubelet restarted after the apiserver became reachable (pid %d → %d)", pid, got)
	}
}

// restartKubeletThenSidecar restarts the real node's kubelet over D-Bus (a new kubelet: an empty
// authentication cache), then its sidecar; it returns the new kubelet's PID.
func restartKubeletThenSidecar(ctx context.Context, t *testing.T) int {
	t.Helper()
	if err := cluster.RestartUnit(ctx, realNode, "kubelet.service"); err != nil {
		t.Fatal(err)
	}
	pid := kubeletPID(t)
	if err := cluster.RestartSidecar(ctx, realNode); err != nil {
		t.Fatal(err)
	}
	return pid
}

// expectUntouched checks that the real node's kubelet still runs as pid and its env file still says env:
// no restart, no rollback, while what says.
func expectUntouched(ctx context.Context, t *testing.T, pid int, env []byte, while string) {
	t.Helper()
	if got, err := cluster.KubeletMainPID(ctx, realNode); err != nil || got != pid {
		t.Errorf("kubelet pid %d → %d (%v): the sidecar restarted the kubelet %s", pid, got, err, while)
	}
	if after, _ := os.ReadFile(filepath.Join(cluster.DynamicConfigDir(realNode), "kubelet.env")); string(after) != string(env) {
		t.Errorf("kubelet.env changed %s (a rollback):\n%s\n→\n%s", while, env, after)
	}
}

// TestSimulatedNodesShareOneConfigMap assigns one ConfigMap key to every simulated node (real sidecar code,
// signal mode, stand-in kubelets whose ports are flags, as on real nodes) and checks each applies it, then
// that an in-place update reaches all of them.
func TestSimulatedNodesShareOneConfigMap(t *testing.T) {
	client := adminClient(t)
	var sims []string
	for i := 1; i <= devclustertest.SimNodes; i++ {
		sims = append(sims, fmt.Sprintf("sim-%d", i))
	}
	header := "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nfailCgroupV1: false\n"
	cm := createConfigMap(t, "sim-shared", map[string]string{"kubelet": header + "eventRecordQPS: 21\n"})
	for _, s := range sims {
		setSource(t, client, s, cmSource("sim-shared"))
	}
	t.Cleanup(func() {
		for _, s := range sims {
			setSource(t, client, s, "")
		}
	})
	for _, s := range sims {
		n := "sim-shared@" + cm.ResourceVersion
		waitNodeStatus(t, s, n, n, "*", "", time.Minute)
	}
	cm.Data = map[string]string{"kubelet": header + "eventRecordQPS: 22\n"}
	updated, err := client.CoreV1().ConfigMaps("kube-system").Update(testContext(t), cm, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range sims {
		n := "sim-shared@" + updated.ResourceVersion
		waitNodeStatus(t, s, n, n, "*", "", time.Minute)
	}
}
