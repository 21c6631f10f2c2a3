// SPDX-License-Identifier: Apache-2.0

//go:build integration

package integration

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dkc-dev/dkc/internal/poll"
	"github.com/dkc-dev/dkc/test/devcluster"
	"github.com/dkc-dev/dkc/test/devcluster/devclustertest"
)

// The kubeadm-style node's kubelet --config-dir (TestKubeadmStyleNode): two drop-ins set the same nested key
// of the node's local config (authentication, which the file sets), the later one in lexical order winning,
// one sets a key the assignment below sets too, and a file not named *.conf is no drop-in at all (the kubelet
// ignores it, unparsable as it is).
//
// 00-dev-node.conf is what any drop-in costs the dev node: the kubelet (1.34 and later) merges through v1beta1 JSON, where
// the file's empty enforceNodeAllocatable is omitted and so defaulted back to [pods], which the node's
// cgroupsPerQOS: false makes invalid (the kubelet refuses to start); a drop-in's own empty list survives.
var testDropIns = map[string]string{
	"00-dev-node.conf": "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nenforceNodeAllocatable: []\n",
	"10-webhook-cache.conf": "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n" +
		"authentication:\n  webhook:\n    cacheTTL: 45s\nmaxPods: 90\n",
	"20-webhook-cache.conf": "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n" +
		"authentication:\n  webhook:\n    cacheTTL: 30s\n",
	"README": "only *.conf files are drop-ins {{{ not yaml",
}

// configDirDropIns: the kubeadm-style node's kubelet merges --config-dir drop-ins over its config, as the
// kubelet (1.34 and later) does and kubeadm's and distributions' units use it. The sidecar must validate and
// compare what the kubelet really runs (file, then drop-ins, then flags): it used to compare the file alone
// with /configz, found the drop-in's value, restarted the kubelet and gave up on the node's own config with a
// health error at every start. Now the sidecar starts without touching the kubelet, an assignment becomes
// active with one restart, /configz shows the drop-ins' values over the assignment's, and a sidecar restart
// leaves the kubelet alone. It runs first on the node: it counts every kubelet restart since the node started.
func configDirDropIns(ctx context.Context, t *testing.T, c *devcluster.Cluster, node string) {
	// The sidecar's first start: the kubelet runs the node's local config with the drop-ins merged, which
	// the sidecar proves through /configz without restarting it.
	waitNodeStatus(t, node, "local", "local", "local", "", time.Minute)
	if cond := configOK(t, node); cond.Status != "True" {
		t.Errorf("ConfigOK %s after the sidecar started: %s", cond.Status, cond.Message)
	}
	if n := restartEvents(t, node); n != 0 {
		t.Errorf("%d kubelet restarts when the sidecar started, want none: the kubelet already ran its config", n)
	}
	wantDropIns(t, node, 90)

	// An assignment: applied with one restart, active, its own fields running, and the drop-ins' over it.
	cm := createConfigMap(t, "dropin-assigned", map[string]string{"kubelet": kubeletConfigOf(t, node, "eventRecordQPS: 9\nmaxPods: 50\n")})
	name := cm.Name + "@" + cm.ResourceVersion
	setSource(t, adminClient(t), node, cmSource(cm.Name))
	waitNodeStatus(t, node, name, name, "*", "", 2*time.Minute)
	if cond := configOK(t, node); cond.Status != "True" {
		t.Errorf("ConfigOK %s with the assignment active: %s", cond.Status, cond.Message)
	}
	if got := configz(t, node)["eventRecordQPS"]; got != float64(9) {
		t.Errorf("configz eventRecordQPS = %v, want the assignment's 9", got)
	}
	wantDropIns(t, node, 90) // the drop-in's maxPods, not the assignment's 50: the kubelet merges drop-ins last
	if n := restartEvents(t, node); n != 1 {
		t.Errorf("%d kubelet restarts in all, want the 1 the assignment needs", n)
	}
	if state, result, err := c.KubeletUnitState(ctx, node); err != nil || state != "active" {
		t.Errorf("kubelet.service is %s (Result=%s, %v), want active", state, result, err)
	}

	// A sidecar restart proves the assignment active again, without restarting the kubelet.
	pid, err := c.KubeletMainPID(ctx, node)
	if err != nil {
		t.Fatal(err)
	}
	restarted := time.Now()
	if err := c.RestartSidecar(ctx, node); err != nil {
		t.Fatal(err)
	}
	// The new sidecar's gauges are set by its first reconcile: wait for them in its own /metrics.
	var m map[string]float64
	poll.ForNil(t, devclustertest.HealthTimeout+time.Minute, 300*time.Millisecond, "the restarted sidecar to report "+name+" active", func() error {
		m = sidecarMetrics(t, c, node)
		if m["process_start_time_seconds"] >= float64(restarted.Unix()-1) && activeIs(m, cm.ResourceVersion) {
			return nil
		}
		return fmt.Errorf("metrics %v", m)
	})
	if n := m["dkc_sidecar_kubelet_restarts_total"]; n != 0 || m["dkc_node_config_error"] != 0 {
		t.Errorf("the restarted sidecar restarted the kubelet %v times (error gauge %v), want 0", n, m["dkc_node_config_error"])
	}
	if got, err := c.KubeletMainPID(ctx, node); err != nil || got != pid {
		t.Errorf("kubelet pid %d → %d (%v): the sidecar restart restarted the kubelet", pid, got, err)
	}
	waitNodeStatus(t, node, name, name, "*", "", time.Minute)
	if n := restartEvents(t, node); n != 1 {
		t.Errorf("%d kubelet restarts in all after the sidecar restart, want still 1", n)
	}
}

// wantDropIns checks that node's running kubelet shows the drop-ins' values: the later drop-in's cacheTTL,
// merged into the file's authentication, and maxPods.
func wantDropIns(t *testing.T, node string, maxPods float64) {
	t.Helper()
	running := configz(t, node)
	authn, _ := running["authentication"].(map[string]any)
	webhook, _ := authn["webhook"].(map[string]any)
	if webhook["cacheTTL"] != "30s" || webhook["enabled"] != true {
		t.Errorf("configz authentication.webhook = %v, want cacheTTL 30s (20-webhook-cache.conf over 10-) and enabled (the file's)", webhook)
	}
	if running["maxPods"] != maxPods {
		t.Errorf("configz maxPods = %v, want %v", running["maxPods"], maxPods)
	}
}

// sidecarMetrics scrapes node's sidecar /metrics: series (name and labels as written) → value.
func sidecarMetrics(t *testing.T, c *devcluster.Cluster, node string) map[string]float64 {
	t.Helper()
	var addr string
	for _, n := range c.State().Nodes {
		if n.Name == node {
			addr = net.JoinHostPort(n.IP, strconv.Itoa(n.SidecarMetricsPort))
		}
	}
	m := map[string]float64{}
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return m // restarting
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(body), "\n") {
		if i := strings.LastIndexByte(line, ' '); i > 0 && !strings.HasPrefix(line, "#") {
			var v float64
			if _, err := fmt.Sscanf(line[i+1:], "%g", &v); err == nil {
				m[line[:i]] = v
			}
		}
	}
	return m
}

// activeIs says whether the sidecar's dkc_node_config_active gauge names the ConfigMap version rv.
func activeIs(m map[string]float64, rv string) bool {
	for series, v := range m {
		if strings.HasPrefix(series, "dkc_node_config_active{") && strings.Contains(series, `node_config_resource_version="`+rv+`"`) && v == 1 {
			return true
		}
	}
	return false
}
