// SPDX-License-Identifier: Apache-2.0

//go:build integration

package integration

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/kubectl/pkg/util/hash"

	"github.com/dkc-dev/dkc/internal/nodeconfig"
	"github.com/dkc-dev/dkc/internal/poll"
	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
	"github.com/dkc-dev/dkc/test/devcluster"
)

// churnGauges are dkc-server's gauges of what it holds per Node and per ConfigMap.
var churnGauges = []string{
	"dkc_server_resolved_configs",   // resolved ConfigMap versions (each up to 1 MiB of data)
	"dkc_server_resolved_nodes",     // the assignment table
	"dkc_server_watched_configmaps", // per-ConfigMap informers
	"dkc_server_reported_nodes",     // the status writer's latest reports
	"dkc_server_connected_nodes",    // open WatchConfig streams
}

// serverGauges reads every churn gauge in one scrape; a gauge dkc-server does not expose fails the test.
// settledGauges are serverGauges once dkc-server holds a state for exactly the Nodes that exist: a Node an
// earlier test deleted as it ended may still be in the count for a moment, and would be missing from it by
// the end of this test.
func settledGauges(ctx context.Context, t *testing.T, client kubernetes.Interface) map[string]float64 {
	t.Helper()
	var g map[string]float64
	poll.ForNil(t, time.Minute, 500*time.Millisecond, "dkc-server to hold a state for exactly the Nodes that exist", func() error {
		list, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if g = serverGauges(t); g["dkc_server_resolved_nodes"] != float64(len(list.Items)) {
			return fmt.Errorf("dkc_server_resolved_nodes %v, %d Nodes", g["dkc_server_resolved_nodes"], len(list.Items))
		}
		return nil
	})
	return g
}

func serverGauges(t *testing.T) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + cluster.MetricsAddress() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), " ")
		if !ok || strings.HasPrefix(name, "#") {
			continue
		}
		if v, err := strconv.ParseFloat(value, 64); err == nil {
			got[name] = v
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	for _, g := range churnGauges {
		if _, ok := got[g]; !ok {
			t.Fatalf("dkc-server does not expose %s", g)
		}
	}
	return got
}

// waitGauges polls the gauges until each one in want has its value, or the deadline passes; it reports
// whether they got there and logs the last values seen.
func waitGauges(t *testing.T, phase string, want map[string]float64, limit time.Duration) bool {
	t.Helper()
	start := time.Now()
	var off []string
	// Not poll.ForNil: a phase that misses is reported, and the test goes on to the next.
	if wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, limit, true, func(context.Context) (bool, error) {
		got := serverGauges(t)
		off = nil
		for name, v := range want {
			if got[name] != v {
				off = append(off, fmt.Sprintf("%s=%v (want %v)", name, got[name], v))
			}
		}
		return len(off) == 0, nil
	}) != nil {
		t.Errorf("%s: after %v: %s", phase, limit, strings.Join(off, ", "))
		return false
	}
	t.Logf("%s: gauges reached in %v", phase, time.Since(start).Round(time.Millisecond))
	return true
}

// hashedConfigMap is a KubeletConfiguration ConfigMap named as `kubectl create configmap --append-hash` and
// kustomize name it: base name, dash, hash of its content.
func hashedConfigMap(t *testing.T, i int) *corev1.ConfigMap {
	t.Helper()
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "churn-config", Namespace: "kube-system"},
		Data: map[string]string{"kubelet": fmt.Sprintf("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nfailCgroupV1: false\n"+
			"eventRecordQPS: %d\n", i+1)},
	}
	h, err := hash.ConfigMapHash(cm)
	if err != nil {
		t.Fatal(err)
	}
	cm.Name += "-" + h
	return cm
}

// TestChurnLeavesNoStateBehind: dkc-server's memory follows the live cluster. 100 Nodes each move through
// two of 200 hash-suffixed ConfigMaps (what --append-hash and kustomize produce: every edit is a new name),
// report status, and some keep a WatchConfig stream open; then all Nodes and ConfigMaps are deleted, and a
// few late reports arrive for Nodes already gone. Every gauge of per-Node and per-ConfigMap state must come
// back to where it started.
func TestChurnLeavesNoStateBehind(t *testing.T) {
	const (
		nodes    = 100
		configs  = 2 * nodes
		watchers = 10
		limit    = time.Minute
	)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cfg, err := cluster.RESTConfig()
	if err != nil {
		t.Fatal(err)
	}
	cfg.QPS, cfg.Burst = 200, 400 // 1,000 requests, not at client-go's default 5 a second
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	base := settledGauges(ctx, t, client)
	for _, g := range churnGauges {
		t.Logf("baseline %s %v", g, base[g])
	}
	at := func(d float64) map[string]float64 {
		want := map[string]float64{}
		for _, g := range churnGauges[:4] {
			want[g] = base[g] + d
		}
		return want
	}

	cms := make([]*corev1.ConfigMap, configs)
	nodeNames := make([]string, nodes)
	for i := range nodeNames {
		nodeNames[i] = fmt.Sprintf("churn-%03d", i)
	}
	t.Cleanup(func() {
		bg := context.Background()
		for _, n := range nodeNames {
			_ = client.CoreV1().Nodes().Delete(bg, n, metav1.DeleteOptions{})
		}
		for _, cm := range cms {
			_ = client.CoreV1().ConfigMaps(cm.Namespace).Delete(bg, cm.Name, metav1.DeleteOptions{})
		}
	})
	parallel := func(n int, f func(i int) error) {
		t.Helper()
		var g errgroup.Group
		g.SetLimit(16)
		for i := range n {
			g.Go(func() error { return f(i) })
		}
		if err := g.Wait(); err != nil {
			t.Fatal(err)
		}
	}
	for i := range cms {
		cms[i] = hashedConfigMap(t, i)
	}
	start := time.Now()
	parallel(configs, func(i int) error {
		_, err := client.CoreV1().ConfigMaps("kube-system").Create(ctx, cms[i], metav1.CreateOptions{})
		return err
	})
	// Node i starts on ConfigMap i and moves to ConfigMap nodes+i.
	parallel(nodes, func(i int) error {
		_, err := client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeNames[i],
			Annotations: map[string]string{nodeconfig.SourceAnnotation: cmSource(cms[i].Name)}}}, metav1.CreateOptions{})
		return err
	})
	t.Logf("created %d ConfigMaps (e.g. %s) and %d Nodes in %v", configs, cms[0].Name, nodes, time.Since(start).Round(time.Millisecond))
	waitGauges(t, "assigned", map[string]float64{
		"dkc_server_resolved_nodes": base["dkc_server_resolved_nodes"] + nodes, "dkc_server_watched_configmaps": base["dkc_server_watched_configmaps"] + nodes,
	}, limit)

	// Every node reports, as its sidecar would; some keep a stream open through their Node's deletion.
	tokens := make([]string, nodes)
	parallel(nodes, func(i int) error {
		var err error
		tokens[i], err = devcluster.MintToken(ctx, client, devcluster.SidecarNamespace, devcluster.SidecarServiceAccount, devcluster.TokenAudience, nodeNames[i], "")
		return err
	})
	svc := serviceClient(t)
	// The service reviews only so many new tokens a second from one address (this test's, for 100 nodes):
	// calls refused for that are made again.
	retry := func(call func() error) error {
		for {
			err := call()
			if status.Code(err) != codes.ResourceExhausted || ctx.Err() != nil {
				return err
			}
			time.Sleep(200 * time.Millisecond) // paces the retries of a call the service's token-review limit refused
		}
	}
	report := func(i int) error {
		return retry(func() error {
			_, err := svc.ReportStatus(withToken(ctx, tokens[i]), &dkcv1.ReportStatusRequest{NodeName: nodeNames[i],
				Status: &dkcv1.NodeConfigStatus{}, ObservedTime: nowProto()})
			return err
		})
	}
	start = time.Now()
	for i := range nodes {
		if err := report(i); err != nil {
			t.Fatalf("ReportStatus(%s): %v", nodeNames[i], err)
		}
	}
	t.Logf("%d Nodes reported in %v", nodes, time.Since(start).Round(time.Millisecond))
	streamCtx, closeStreams := context.WithCancel(ctx)
	defer closeStreams()
	for i := range watchers {
		var stream dkcv1.ConfigService_WatchConfigClient
		conn := serviceClient(t) // a connection each, as sidecars have: dkc-server allows 4 calls on one
		err := retry(func() error {
			var err error
			if stream, err = conn.WatchConfig(withToken(streamCtx, tokens[i]), &dkcv1.WatchConfigRequest{NodeName: nodeNames[i]}); err != nil {
				return err
			}
			_, err = stream.Recv() // the node's state: the stream is up
			return err
		})
		if err != nil {
			t.Fatalf("WatchConfig(%s): %v", nodeNames[i], err)
		}
		go func() {
			for {
				if _, err := stream.Recv(); err != nil {
					return
				}
			}
		}()
	}
	peak := at(nodes)
	peak["dkc_server_connected_nodes"] = base["dkc_server_connected_nodes"] + watchers
	waitGauges(t, "reported", peak, limit)

	start = time.Now()
	parallel(nodes, func(i int) error {
		_, err := client.CoreV1().Nodes().Patch(ctx, nodeNames[i], types.MergePatchType,
			annotationPatch(nodeconfig.SourceAnnotation, cmSource(cms[nodes+i].Name)), metav1.PatchOptions{})
		return err
	})
	t.Logf("reassigned %d Nodes in %v", nodes, time.Since(start).Round(time.Millisecond))
	// A reassignment makes the writer look at each node again; it keeps the report of a node that streams
	// from this replica and drops the others' (another replica, or none, serves them: writing their reports
	// unprompted could put an older status back), so only the watchers' reports remain.
	reassigned := at(nodes)
	reassigned["dkc_server_reported_nodes"] = base["dkc_server_reported_nodes"] + watchers
	waitGauges(t, "reassigned", reassigned, limit)

	start = time.Now()
	parallel(nodes, func(i int) error { return client.CoreV1().Nodes().Delete(ctx, nodeNames[i], metav1.DeleteOptions{}) })
	parallel(configs, func(i int) error {
		return client.CoreV1().ConfigMaps("kube-system").Delete(ctx, cms[i].Name, metav1.DeleteOptions{})
	})
	t.Logf("deleted %d Nodes and %d ConfigMaps in %v", nodes, configs, time.Since(start).Round(time.Millisecond))
	// Reports in flight when a Node goes: the service may still accept the node's token for a while.
	var late []string
	for i := range watchers {
		late = append(late, status.Code(report(i)).String())
	}
	t.Logf("late reports: %v", late)
	waitGauges(t, "deleted, streams still open", at(0), limit)
	closeStreams()
	back := at(0)
	back["dkc_server_connected_nodes"] = base["dkc_server_connected_nodes"]
	waitGauges(t, "streams closed", back, limit)
}
