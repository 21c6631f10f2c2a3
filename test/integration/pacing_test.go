// SPDX-License-Identifier: Apache-2.0

//go:build integration

package integration

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"os"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
	"github.com/dkc-dev/dkc/test/devcluster"
)

// replicaClient is a ConfigService client of server, trusting the cluster's CA; closed when t ends.
func replicaClient(t *testing.T, server *devcluster.ServiceReplica) dkcv1.ConfigServiceClient {
	t.Helper()
	ca, err := os.ReadFile(cluster.CAFile())
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	conn, err := grpc.NewClient(server.Address(), grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return dkcv1.NewConfigServiceClient(conn)
}

// TestDirectChangesArePaced: on a dkc-server with --max-direct-config-changes=1, two Ready nodes pointed at one
// ConfigMap together are sent it one after the other: the second is sent nothing while the first has not
// reported the outcome (dkc_direct_config_changes_in_flight 1, _waiting 1), and is sent it once the first's
// status shows it runs it.
func TestDirectChangesArePaced(t *testing.T) {
	ctx := testContext(t)
	client := adminClient(t)
	server, err := cluster.StartServiceReplica(ctx, "pacing", "--max-direct-config-changes=1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := server.Stop(); err != nil {
			t.Error(err)
		}
	})
	svc := replicaClient(t, server)
	nodes := []string{"sim-paced-a", "sim-paced-b"}
	tokens := map[string]string{}
	watchers := map[string]*watcher{}
	for _, n := range nodes {
		tokens[n] = simNode(t, n)
		markReady(t, n) // a node that is not Ready is not paced: it is out of service already
		watchers[n] = watchAt(t, svc, tokens[n], &dkcv1.WatchConfigRequest{NodeName: n})
		watchers[n].next("first state", func(*dkcv1.WatchConfigResponse) bool { return true })
	}
	cm := createConfigMap(t, "paced", map[string]string{"kubelet": "eventRecordQPS: 3"})
	for _, n := range nodes {
		setSource(t, client, n, cmSource("paced"))
	}

	// One of them is sent the ConfigMap; the other waits.
	first, second := "", ""
	var sent *dkcv1.WatchConfigResponse
	timeout := time.After(30 * time.Second)
	for first == "" {
		select {
		case m := <-watchers[nodes[0]].msgs:
			if hasConfigMap("paced", cm.ResourceVersion)(m) {
				first, second, sent = nodes[0], nodes[1], m
			}
		case m := <-watchers[nodes[1]].msgs:
			if hasConfigMap("paced", cm.ResourceVersion)(m) {
				first, second, sent = nodes[1], nodes[0], m
			}
		case <-timeout:
			t.Fatal("neither node was sent the ConfigMap within 30s")
		}
	}
	// Nothing to wait on for an absence: the second node's stream stays quiet a while, though the server
	// resolved both nodes within milliseconds of each other.
	watchers[second].quiet(3 * time.Second)
	for series, want := range map[string]float64{"dkc_direct_config_changes_in_flight": 1, "dkc_direct_config_changes_waiting": 1} {
		if got := metricAt(t, server.MetricsAddress(), series); got != want {
			t.Errorf("%s = %v while %s changes and %s waits, want %v", series, got, first, second, want)
		}
	}

	// The first reports that it runs the config: the second is sent it.
	src := sent.GetAssignment().GetSource()
	if _, err := svc.ReportStatus(withToken(ctx, tokens[first]), &dkcv1.ReportStatusRequest{NodeName: first,
		Status: &dkcv1.NodeConfigStatus{Assigned: src, Active: src, LastKnownGood: src}, ObservedTime: timestamppb.Now()}); err != nil {
		t.Fatalf("ReportStatus(%s): %v", first, err)
	}
	watchers[second].next("the ConfigMap once "+first+" runs it", hasConfigMap("paced", cm.ResourceVersion))
	if got := metricAt(t, server.MetricsAddress(), "dkc_direct_config_changes_waiting"); got != 0 {
		t.Errorf("dkc_direct_config_changes_waiting = %v once both were sent it, want 0", got)
	}
	t.Logf("%s was sent the ConfigMap first; %s only once %s reported it running", first, second, first)
}

// markReady sets node's Ready condition True, as its kubelet would (a simulated node has no kubelet).
func markReady(t *testing.T, node string) {
	t.Helper()
	now := metav1.Now()
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.NodeCondition{{
		Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", Message: "a simulated node",
		LastHeartbeatTime: now, LastTransitionTime: now}}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := adminClient(t).CoreV1().Nodes().PatchStatus(testContext(t), node, patch); err != nil {
		t.Fatalf("mark node %s Ready: %v", node, err)
	}
}
