// SPDX-License-Identifier: Apache-2.0

//go:build integration

// Package installed tests dkc as users install it: images built from this checkout and imported into every
// node's containerd, deploy/overlays/dev applied with `kubectl apply -k`, dkc-server as a two-replica
// Deployment and dkc-sidecar as a DaemonSet pod restarting its node's kubelet through the node's systemd, on
// a two-node cluster with a controller-manager, a scheduler, kube-proxy, CNI and CoreDNS. Every test ends by
// asserting each node's final status, its ConfigOK condition and how often its kubelet started.
package installed

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/dkc-dev/dkc/internal/poll"
	"github.com/dkc-dev/dkc/test/devcluster"
	"github.com/dkc-dev/dkc/test/devcluster/devclustertest"
)

var cluster *devcluster.Cluster

func TestMain(m *testing.M) {
	os.Exit(devclustertest.MainInstalled(m, "installed", bySlowest, &cluster))
}

var nodes = []string{"node-1", "node-2"}

func admin(t *testing.T) kubernetes.Interface {
	t.Helper()
	c, err := cluster.Client()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// nodeConfig is node's local kubelet config with eventRecordQPS set to qps.
func nodeConfig(t *testing.T, node string, qps int) string {
	t.Helper()
	raw, err := os.ReadFile(cluster.KubeletConfigPath(node))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := yaml.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	m["eventRecordQPS"] = qps
	out, err := yaml.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// createConfig creates kube-system/<name> holding node's local config with eventRecordQPS qps. The installed
// form's nodes share one local config, so such a ConfigMap suits every node (TestKubeletSkew assigns one to
// all); most tests still give each node its own, to follow each node's versions apart.
func createConfig(t *testing.T, name, node string, qps int) *corev1.ConfigMap {
	t.Helper()
	return createConfigData(t, name, nodeConfig(t, node, qps))
}

// createConfigData creates kube-system/<name> with data as its kubelet key, deleted when t ends.
func createConfigData(t *testing.T, name, data string) *corev1.ConfigMap {
	t.Helper()
	cm, err := admin(t).CoreV1().ConfigMaps("kube-system").Create(ctxFor(t), &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Data:       map[string]string{"kubelet": data},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create configmap %s: %v", name, err)
	}
	t.Cleanup(func() {
		_ = admin(t).CoreV1().ConfigMaps("kube-system").Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	return cm
}

// assign points node at cm (or back at its local config when cm is nil) through the annotation.
func assign(t *testing.T, node string, cm *corev1.ConfigMap) {
	t.Helper()
	var value any // JSON null removes the annotation
	if cm != nil {
		src, _ := json.Marshal(map[string]any{"configMap": map[string]string{"name": cm.Name, "namespace": cm.Namespace, "kubeletConfigKey": "kubelet"}})
		value = string(src)
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{"dkc.dev/config-source": value}}})
	// Both dkc-server replicas run on node-1: while its 1.34 kubelet restarts (an earlier assignment) they
	// are not Ready (kubernetes#100277), and the webhook, which fails closed, refuses Node writes for those
	// seconds — as it would a user's. Such a refusal is retried; any other error fails the test.
	poll.ForNil(t, 90*time.Second, time.Second, fmt.Sprintf("assign %s to %s", name(cm), node), func() error {
		_, err := admin(t).CoreV1().Nodes().Patch(ctxFor(t), node, types.MergePatchType, patch, metav1.PatchOptions{})
		if err != nil && strings.Contains(err.Error(), `no endpoints available for service "dkc-server"`) {
			t.Logf("assign %s to %s: %v (retried)", name(cm), node, err)
			return err
		}
		if err != nil {
			t.Fatalf("assign %s to %s: %v", name(cm), node, err)
		}
		return nil
	})
}

func name(cm *corev1.ConfigMap) string {
	if cm == nil {
		return "local"
	}
	return cm.Name + "@" + cm.ResourceVersion
}

func srcName(s *corev1.NodeConfigSource) string {
	if s == nil || s.ConfigMap == nil {
		return "local"
	}
	return s.ConfigMap.Name + "@" + s.ConfigMap.ResourceVersion
}

type nodeView struct {
	status   corev1.NodeConfigStatus
	configOK *corev1.NodeCondition
}

func view(t *testing.T, node string) nodeView {
	t.Helper()
	n, err := admin(t).CoreV1().Nodes().Get(ctxFor(t), node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var v nodeView
	if raw := n.Annotations["dkc.dev/config-status"]; raw != "" {
		if err := json.Unmarshal([]byte(raw), &v.status); err != nil {
			t.Fatalf("status annotation of %s %q: %v", node, raw, err)
		}
	}
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == "ConfigOK" {
			v.configOK = &n.Status.Conditions[i]
		}
	}
	return v
}

func (v nodeView) String() string {
	ok := "none"
	if v.configOK != nil {
		ok = fmt.Sprintf("%s (%s)", v.configOK.Status, v.configOK.Message)
	}
	return fmt.Sprintf("assigned=%s active=%s lkg=%s error=%q ConfigOK=%s", srcName(v.status.Assigned), srcName(v.status.Active),
		srcName(v.status.LastKnownGood), v.status.Error, ok)
}

// waitRunning waits until node's status says cm is assigned and active without error and ConfigOK is True.
func waitRunning(t *testing.T, node string, cm *corev1.ConfigMap, timeout time.Duration) nodeView {
	t.Helper()
	var v nodeView
	what := fmt.Sprintf("node %s: %s assigned and active, ConfigOK True (pod logs: %s/pods)", node, name(cm), cluster.NodeLogDir(node))
	poll.ForNil(t, timeout, 300*time.Millisecond, what, func() error {
		v = view(t, node)
		if srcName(v.status.Assigned) == name(cm) && srcName(v.status.Active) == name(cm) && v.status.Error == "" &&
			v.configOK != nil && v.configOK.Status == corev1.ConditionTrue {
			return nil
		}
		return errors.New(v.String())
	})
	return v
}

// kubeletStarts counts the kubelet's starts on node from its log: one "Kubelet version" line per start.
func kubeletStarts(t *testing.T, node string) int {
	t.Helper()
	return kubeletLogCount(t, node, `"Kubelet version"`)
}

// kubeletLogCount counts what node's kubelet logged that contains s.
func kubeletLogCount(t *testing.T, node, s string) int {
	t.Helper()
	raw, err := os.ReadFile(cluster.NodeLogDir(node) + "/kubelet.log")
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(raw), s)
}

// configzQPS is the running kubelet's eventRecordQPS, through the apiserver's node proxy. A kubelet just
// restarted (by a test, or the sidecar) does not serve /configz for a moment: its answer is waited for.
func configzQPS(t *testing.T, node string) float64 {
	t.Helper()
	var raw []byte
	poll.ForNil(t, time.Minute, 500*time.Millisecond, "configz of "+node, func() error {
		var err error
		raw, err = admin(t).CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes/" + node + "/proxy/configz").DoRaw(ctxFor(t))
		return err
	})
	var c struct {
		KubeletConfig struct {
			EventRecordQPS float64 `json:"eventRecordQPS"`
		} `json:"kubeletconfig"`
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		t.Fatal(err)
	}
	return c.KubeletConfig.EventRecordQPS
}

// resetAll points every node back at its local config and waits for that and for a settled cluster, so
// tests start alike.
func resetAll(t *testing.T) {
	t.Helper()
	for _, n := range nodes {
		assign(t, n, nil)
	}
	for _, n := range nodes {
		waitRunning(t, n, nil, 2*time.Minute)
	}
	waitNodesReady(t)
	waitServerSettled(t)
}

// waitNodesReady waits until every node is Ready. After an apiserver outage (TestSidecarRestartedDuring-
// AnAPIServerOutage) the node lifecycle controller has marked the nodes' pods not ready, until their
// kubelets report again: meanwhile the dkc-server Service has no endpoint, and an assignment is refused by
// the admission webhook (failurePolicy Fail), which is what the next test would see first.
func waitNodesReady(t *testing.T) {
	t.Helper()
	poll.ForNil(t, 3*time.Minute, 500*time.Millisecond, "every node Ready", func() error {
		var notReady []string
		for _, n := range nodes {
			node, err := admin(t).CoreV1().Nodes().Get(ctxFor(t), n, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if !nodeReady(node) {
				notReady = append(notReady, n)
			}
		}
		if len(notReady) > 0 {
			return fmt.Errorf("nodes %v not Ready", notReady)
		}
		return nil
	})
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func serverPods(t *testing.T) []corev1.Pod {
	t.Helper()
	pods, err := admin(t).CoreV1().Pods("kube-system").List(ctxFor(t), metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=dkc-server"})
	if err != nil {
		t.Fatal(err)
	}
	return pods.Items
}

// waitServerSettled waits until the Deployment runs its two replicas, ready, with no pod terminating, and
// returns them.
func waitServerSettled(t *testing.T) []corev1.Pod {
	t.Helper()
	var pods []corev1.Pod
	poll.ForNil(t, 3*time.Minute, 500*time.Millisecond, "dkc-server's 2 pods ready and not terminating", func() error {
		pods = serverPods(t)
		serving := 0
		for _, p := range pods {
			if ready(&p) && p.DeletionTimestamp == nil {
				serving++
			}
		}
		if len(pods) != 2 || serving != 2 {
			return fmt.Errorf("%d pods, %d ready and not terminating", len(pods), serving)
		}
		// A Ready pod is not yet a webhook backend: the EndpointSlice controller adds it a moment later, and
		// until then an assignment meets "no endpoints available" (the webhook fails closed).
		return serverEndpointsReady(t, pods)
	})
	return pods
}

// serverEndpointsReady says whether the dkc-server Service's EndpointSlices list every one of pods as ready.
func serverEndpointsReady(t *testing.T, pods []corev1.Pod) error {
	t.Helper()
	slices, err := admin(t).DiscoveryV1().EndpointSlices("kube-system").List(ctxFor(t), metav1.ListOptions{
		LabelSelector: discoveryv1.LabelServiceName + "=dkc-server",
	})
	if err != nil {
		return fmt.Errorf("list dkc-server's EndpointSlices: %w", err)
	}
	readyPods := map[string]bool{}
	for _, s := range slices.Items {
		for _, e := range s.Endpoints {
			if e.TargetRef != nil && (e.Conditions.Ready == nil || *e.Conditions.Ready) {
				readyPods[e.TargetRef.Name] = true
			}
		}
	}
	for _, p := range pods {
		if !readyPods[p.Name] {
			return fmt.Errorf("pod %s is not a ready endpoint of service dkc-server yet", p.Name)
		}
	}
	return nil
}

// waitRolledOut waits until `kubectl rollout status` says the workload is rolled out.
func waitRolledOut(t *testing.T, kind string) {
	t.Helper()
	if out, err := kubectl(t, "-n", "kube-system", "rollout", "status", kind, "--timeout=3m"); err != nil {
		t.Fatalf("rollout status %s: %v\n%s", kind, err, out)
	}
}

func kubectl(t *testing.T, args ...string) (string, error) {
	t.Helper()
	return runKubectl(ctxFor(t), args...)
}

func runKubectl(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "kubectl", append([]string{"--kubeconfig", cluster.KubeconfigPath()}, args...)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestInstalledFormRunsAsPods: both dkc-server replicas run on the control-plane node (deploy/base requires
// one, and the cluster has one), a sidecar pod on every node installed the kubelet drop-in, and an
// assignment restarts that node's kubelet once, from inside a pod.
func TestInstalledFormRunsAsPods(t *testing.T) {
	resetAfter(t)
	for _, p := range waitServerSettled(t) {
		if p.Spec.NodeName != cluster.ControlPlaneNode() {
			t.Errorf("dkc-server pod %s runs on %s, want the control-plane node %s", p.Name, p.Spec.NodeName, cluster.ControlPlaneNode())
		}
	}
	sidecars, err := admin(t).CoreV1().Pods("kube-system").List(ctxFor(t), metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=dkc-sidecar"})
	if err != nil {
		t.Fatal(err)
	}
	on := map[string]bool{}
	for _, p := range sidecars.Items {
		if p.Status.Phase == corev1.PodRunning {
			on[p.Spec.NodeName] = true
		}
	}
	for _, n := range nodes {
		if !on[n] {
			t.Errorf("no running dkc-sidecar pod on %s", n)
		}
		dropIn, err := os.ReadFile(cluster.NodeDir(n) + "/systemd/kubelet.service.d/20-dkc.conf")
		if err != nil || !strings.Contains(string(dropIn), "EnvironmentFile=-/var/lib/kubelet/dynamic-config/kubelet.env") {
			t.Errorf("node %s: the sidecar pod did not install the kubelet drop-in: %v %q", n, err, dropIn)
		}
	}

	const node = "node-2"
	before := kubeletStarts(t, node)
	cm := createConfig(t, "installed-qps-21", node, 21)
	assign(t, node, cm)
	waitRunning(t, node, cm, 2*time.Minute)
	if got := configzQPS(t, node); got != 21 {
		t.Errorf("configz eventRecordQPS = %v, want 21", got)
	}
	if d := kubeletStarts(t, node) - before; d != 1 {
		t.Errorf("kubelet of %s started %d times for one assignment, want 1", node, d)
	}
	if v := view(t, "node-1"); v.status.Assigned != nil || v.configOK == nil || v.configOK.Status != corev1.ConditionTrue {
		t.Errorf("node-1 was not assigned anything but shows %s", v)
	}
}

// TestServerPodsDeletedWhileAssignmentsChange: each round assigns both nodes a new config and deletes a
// dkc-server pod; the sidecars reconnect to the other replica through the Service, every node ends on its
// last config, and no replica writes an older status over a newer one afterwards.
func TestServerPodsDeletedWhileAssignmentsChange(t *testing.T) {
	resetAfter(t)
	before := map[string]int{}
	for _, n := range nodes {
		before[n] = kubeletStarts(t, n)
	}
	const rounds = 4
	last := map[string]*corev1.ConfigMap{}
	for r := 0; r < rounds; r++ {
		for _, n := range nodes {
			last[n] = createConfig(t, fmt.Sprintf("installed-%s-r%d", n, r), n, 30+r)
			assign(t, n, last[n])
		}
		// One replica lost at a time, as a node failure or an eviction takes it; the next round starts once
		// the Deployment has replaced it (with both gone, assignments wait: the webhook fails closed).
		// The victim is the replica serving one node's stream (the nodes take turns), as the issue asks.
		pods := waitServerSettled(t)
		target := nodes[r%len(nodes)]
		victim, found := servingPod(t, pods, target)
		if !found {
			victim = pods[r%len(pods)]
		}
		if err := admin(t).CoreV1().Pods("kube-system").Delete(ctxFor(t), victim.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatalf("delete %s: %v", victim.Name, err)
		}
		t.Logf("round %d: assigned, deleted %s on %s (serving %s's stream: %v)", r, victim.Name, victim.Spec.NodeName, target, found)
		time.Sleep(2 * time.Second) // the rounds' pace: the next assignments meet the replica being replaced
	}
	for _, n := range nodes {
		waitRunning(t, n, last[n], 3*time.Minute)
		if got := configzQPS(t, n); got != float64(30+rounds-1) {
			t.Errorf("%s: configz eventRecordQPS = %v, want %d", n, got, 30+rounds-1)
		}
		if d := kubeletStarts(t, n) - before[n]; d < 1 || d > rounds {
			t.Errorf("%s: kubelet started %d times for %d assignments, want 1..%d", n, d, rounds, rounds)
		}
	}
	waitRolledOut(t, "deployment/dkc-server")
	// Stale writes would show as an older config coming back: watch the final status stay put.
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(500 * time.Millisecond) {
		for _, n := range nodes {
			if v := view(t, n); srcName(v.status.Active) != name(last[n]) || srcName(v.status.Assigned) != name(last[n]) {
				t.Fatalf("%s: status went back to %s after settling on %s", n, v, name(last[n]))
			}
		}
	}
}

// servingPod is the dkc-server pod whose log last says node's stream opened there (and not since ended).
func servingPod(t *testing.T, pods []corev1.Pod, node string) (corev1.Pod, bool) {
	t.Helper()
	for _, p := range pods {
		raw, err := admin(t).CoreV1().Pods("kube-system").GetLogs(p.Name, &corev1.PodLogOptions{}).DoRaw(ctxFor(t))
		if err != nil {
			continue
		}
		state := ""
		for _, line := range strings.Split(string(raw), "\n") {
			if !strings.Contains(line, `"node":"`+node+`"`) {
				continue
			}
			switch {
			case strings.Contains(line, `"node watching"`):
				state = "open"
			case strings.Contains(line, `"node watch ended"`), strings.Contains(line, "node watch replaced"):
				state = "ended"
			}
		}
		if state == "open" {
			return p, true
		}
	}
	return corev1.Pod{}, false
}
