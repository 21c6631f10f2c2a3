// SPDX-License-Identifier: Apache-2.0

//go:build integration

package installed

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/dkc-dev/dkc/internal/kubeletcheck/checkapi"
	"github.com/dkc-dev/dkc/internal/nodeconfig"
	"github.com/dkc-dev/dkc/internal/poll"
)

// kubeletMinors are the nodes' kubelet minors as their Node objects report them (the version dkc-server
// sends each sidecar), and the nodes of the oldest and the newest.
func kubeletMinors(t *testing.T) (minors map[string]string, oldest, newest string) {
	t.Helper()
	minors = map[string]string{}
	for _, n := range nodes {
		node, err := admin(t).CoreV1().Nodes().Get(ctxFor(t), n, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		minors[n] = checkapi.Minor(node.Status.NodeInfo.KubeletVersion)
		if oldest == "" || checkapi.CompareMinors(minors[n], minors[oldest]) < 0 {
			oldest = n
		}
		if newest == "" || checkapi.CompareMinors(minors[n], minors[newest]) > 0 {
			newest = n
		}
	}
	return minors, oldest, newest
}

// crashLoopBackOffConfig is the nodes' local config with eventRecordQPS qps and a field only kubelets
// from 1.35 run by default: crashLoopBackOff.maxContainerRestartPeriod. The field exists in v1.34's schema,
// but v1.34's validation refuses it unless the KubeletCrashLoopBackOffMax gate (alpha there, beta and on
// from 1.35) is set: a v1.34 kubelet given this file exits with "invalid configuration". It is what
// `kubectl dkc dump` of a current kubelet writes.
func crashLoopBackOffConfig(t *testing.T, node string, qps int) string {
	t.Helper()
	var m map[string]any
	if err := yaml.Unmarshal([]byte(nodeConfig(t, node, qps)), &m); err != nil {
		t.Fatal(err)
	}
	m["crashLoopBackOff"] = map[string]any{"maxContainerRestartPeriod": "2m"}
	out, err := yaml.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// TestKubeletSkew: on a control plane of the newest minor with nodes of older kubelet minors (the
// installed suite's cluster: node-1 runs the oldest kubelet dkc supports), each sidecar validates with the
// code of its own kubelet's minor. One ConfigMap valid for every minor runs on every node (proven through
// /configz) and, after its trial, is every node's last-known-good; one ConfigMap that only newer kubelets
// run is refused up front on the older node — "failed to validate config", no kubelet restart, no health
// rollback, the node stays on its last-known-good — and runs on the newer.
// Validating every node with one version's code fails this test either way: with the newest minor's code
// the older kubelet is restarted into a config it refuses and rolled back; with the oldest's, the newer
// node refuses a config its kubelet runs.
func TestKubeletSkew(t *testing.T) {
	resetAfter(t)
	minors, oldest, newest := kubeletMinors(t)
	if minors[oldest] == minors[newest] {
		t.Fatalf("kubelet minors %v: the installed suite's cluster must run kubelets of different minors (KUBELET_VERSIONS)", minors)
	}
	if checkapi.CompareMinors(minors[oldest], "1.35") >= 0 {
		t.Fatalf("oldest kubelet %s: this test needs a kubelet older than 1.35 (KUBELET_VERSIONS=%s=1.34)", minors[oldest], oldest)
	}
	t.Logf("kubelets: %v", minors)

	// A config every minor runs.
	common := createConfigData(t, "skew-common", nodeConfig(t, oldest, 23))
	for _, n := range nodes {
		assign(t, n, common)
	}
	for _, n := range nodes {
		waitRunning(t, n, common, 3*time.Minute)
		if q := configzQPS(t, n); q != 23 {
			t.Errorf("node %s (kubelet %s): configz eventRecordQPS = %v, want 23", n, minors[n], q)
		}
	}
	// A refused config makes a node run its last-known-good (the original's rule): wait until that is
	// the common config, so that the refusal needs no restart.
	for _, n := range nodes {
		waitLastKnownGood(t, n, common, 2*time.Minute)
	}

	// A config only the newer kubelets run.
	starts := map[string]int{}
	for _, n := range nodes {
		starts[n] = kubeletStarts(t, n)
	}
	newer := createConfigData(t, "skew-newer", crashLoopBackOffConfig(t, newest, 31))
	for _, n := range nodes {
		assign(t, n, newer)
	}
	waitRunning(t, newest, newer, 3*time.Minute)
	if got := configzField(t, newest, "crashLoopBackOff"); !strings.Contains(got, `"maxContainerRestartPeriod":"2m0s"`) {
		t.Errorf("node %s (kubelet %s): configz crashLoopBackOff = %s, want maxContainerRestartPeriod 2m0s", newest, minors[newest], got)
	}
	v := waitStatusError(t, oldest, newer, nodeconfig.ValidateError, 2*time.Minute)
	if srcName(v.status.Active) != name(common) {
		t.Errorf("node %s: active %s, want it to stay on %s", oldest, srcName(v.status.Active), name(common))
	}
	if v.configOK == nil || !strings.Contains(v.configOK.Message, "MaxContainerRestartPeriod") {
		t.Errorf("node %s: ConfigOK %+v; want the kubelet %s validation message (MaxContainerRestartPeriod)", oldest, v.configOK, minors[oldest])
	}
	if q := configzQPS(t, oldest); q != 23 {
		t.Errorf("node %s: configz eventRecordQPS = %v, want the common config's 23", oldest, q)
	}
	// Refused before any restart on the older node; one restart into it on the newer.
	if got := kubeletStarts(t, oldest) - starts[oldest]; got != 0 {
		t.Errorf("node %s: kubelet started %d times for a config refused up front, want 0", oldest, got)
	}
	if got := kubeletStarts(t, newest) - starts[newest]; got != 1 {
		t.Errorf("node %s: kubelet started %d times, want 1", newest, got)
	}

	// kubectl dkc dump and diff speak each node's minor: a node's own dump, as a ConfigMap, differs from
	// what it runs in nothing; the newer-only config is refused for the older node with its own minor's
	// validation, and shown field by field for the newer.
	for _, n := range nodes {
		dumped, err := kubectlDKC(ctxFor(t), "dump", n)
		if err != nil {
			t.Fatalf("kubectl dkc dump %s: %v\n%s", n, err, dumped)
		}
		cm := createConfigData(t, "skew-dump-"+n, dumped)
		out, err := kubectlDKC(ctxFor(t), "diff", n, "--configmap", "kube-system/"+cm.Name, "--kubelet-check-dir", cluster.KubeletCheckDir())
		if err != nil || !strings.Contains(out, "no changes") {
			t.Errorf("kubectl dkc diff %s against its own dump (kubelet %s): %v\n%s", n, minors[n], err, out)
		}
	}
	out, err := kubectlDKC(ctxFor(t), "diff", oldest, "--configmap", "kube-system/skew-newer", "--kubelet-check-dir", cluster.KubeletCheckDir())
	if err == nil || !strings.Contains(err.Error()+out, "failed to validate config") || !strings.Contains(err.Error()+out, "MaxContainerRestartPeriod") {
		t.Errorf("kubectl dkc diff %s --configmap skew-newer: err %v, output %s; want kubelet %s's validation error", oldest, err, out, minors[oldest])
	}
	assign(t, newest, common)
	waitRunning(t, newest, common, 3*time.Minute)
	out, err = kubectlDKC(ctxFor(t), "diff", newest, "--configmap", "kube-system/skew-newer", "--kubelet-check-dir", cluster.KubeletCheckDir())
	if err != nil || !strings.Contains(out, "crashLoopBackOff") || !strings.Contains(out, "eventRecordQPS") {
		t.Errorf("kubectl dkc diff %s --configmap skew-newer: %v\n%s; want crashLoopBackOff and eventRecordQPS changed", newest, err, out)
	}
}

// waitLastKnownGood waits until node's status says cm is its last-known-good (its trial passed).
func waitLastKnownGood(t *testing.T, node string, cm *corev1.ConfigMap, timeout time.Duration) {
	t.Helper()
	poll.ForNil(t, timeout, time.Second, fmt.Sprintf("node %s: %s last-known-good after its trial", node, name(cm)), func() error {
		if v := view(t, node); srcName(v.status.LastKnownGood) != name(cm) {
			return errors.New(v.String())
		}
		return nil
	})
}

// waitStatusError waits until node's status says cm is assigned and refused with want, ConfigOK False.
func waitStatusError(t *testing.T, node string, cm *corev1.ConfigMap, want nodeconfig.StatusError, timeout time.Duration) nodeView {
	t.Helper()
	var v nodeView
	what := fmt.Sprintf("node %s: %s assigned, error %q, ConfigOK False (pod logs: %s/pods)", node, name(cm), want, cluster.NodeLogDir(node))
	poll.ForNil(t, timeout, 300*time.Millisecond, what, func() error {
		v = view(t, node)
		if srcName(v.status.Assigned) == name(cm) && v.status.Error == string(want) && v.configOK != nil && v.configOK.Status == corev1.ConditionFalse {
			return nil
		}
		return errors.New(v.String())
	})
	return v
}

// configzField is one field of the running kubelet's config as JSON, through the apiserver's node proxy.
func configzField(t *testing.T, node, field string) string {
	t.Helper()
	raw, err := admin(t).CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes/" + node + "/proxy/configz").DoRaw(ctxFor(t))
	if err != nil {
		t.Fatalf("configz of %s: %v", node, err)
	}
	var c struct {
		KubeletConfig map[string]json.RawMessage `json:"kubeletconfig"`
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		t.Fatal(err)
	}
	return string(c.KubeletConfig[field])
}
