// SPDX-License-Identifier: Apache-2.0

//go:build integration

package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/dkc-dev/dkc/internal/nodeconfig"
	"github.com/dkc-dev/dkc/internal/poll"
	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
	"github.com/dkc-dev/dkc/test/devcluster"
)

// simNode creates a Node object without a kubelet (a simulated node) and mints its sidecar token.
func simNode(t *testing.T, name string) string {
	t.Helper()
	ctx := testContext(t)
	client := adminClient(t)
	if _, err := client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create node %s: %v", name, err)
	}
	t.Cleanup(func() { _ = client.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
	token, err := cluster.NodeToken(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	return token
}

func serviceClient(t *testing.T) dkcv1.ConfigServiceClient {
	t.Helper()
	conn, err := cluster.DialService()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return dkcv1.NewConfigServiceClient(conn)
}

func withToken(ctx context.Context, token string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
}

// watcher collects a WatchConfig stream's messages.
type watcher struct {
	t    *testing.T
	msgs chan *dkcv1.WatchConfigResponse
	errs chan error
}

func watch(t *testing.T, token, node string, lastApplied *dkcv1.AppliedConfig) *watcher {
	t.Helper()
	return watchAt(t, serviceClient(t), token, &dkcv1.WatchConfigRequest{NodeName: node, LastApplied: lastApplied})
}

func (w *watcher) next(what string, ok func(*dkcv1.WatchConfigResponse) bool) *dkcv1.WatchConfigResponse {
	w.t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case m := <-w.msgs:
			if ok(m) {
				return m
			}
		case err := <-w.errs:
			w.t.Fatalf("waiting for %s: stream ended: %v", what, err)
		case <-timeout:
			w.t.Fatalf("waiting for %s: timed out", what)
		}
	}
}

// quiet asserts that no message arrives for d.
func (w *watcher) quiet(d time.Duration) {
	w.t.Helper()
	select {
	case m := <-w.msgs:
		w.t.Fatalf("unexpected message: %v", m)
	case err := <-w.errs:
		w.t.Fatalf("stream ended: %v", err)
	case <-time.After(d):
	}
}

func createConfigMap(t *testing.T, name string, data map[string]string) *corev1.ConfigMap {
	t.Helper()
	client := adminClient(t)
	cm, err := client.CoreV1().ConfigMaps("kube-system").Create(testContext(t), &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "kube-system"}, Data: data,
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create configmap %s: %v", name, err)
	}
	t.Cleanup(func() {
		_ = client.CoreV1().ConfigMaps("kube-system").Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	return cm
}

func setSource(t *testing.T, client kubernetes.Interface, node, value string) {
	t.Helper()
	v := "null"
	if value != "" {
		b, _ := json.Marshal(value)
		v = string(b)
	}
	patch := fmt.Sprintf(`{"metadata":{"annotations":{"dkc.dev/config-source":%s}}}`, v)
	if _, err := client.CoreV1().Nodes().Patch(testContext(t), node, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatalf("set config source of %s: %v", node, err)
	}
}

func cmSource(name string) string {
	return fmt.Sprintf(`{"configMap":{"namespace":"kube-system","name":%q,"kubeletConfigKey":"kubelet"}}`, name)
}

func hasConfigMap(name, rv string) func(*dkcv1.WatchConfigResponse) bool {
	return func(m *dkcv1.WatchConfigResponse) bool {
		cm := m.GetAssignment().GetSource().GetConfigMap()
		return cm.GetName() == name && (rv == "" || cm.GetResourceVersion() == rv) && m.GetSyncError() == ""
	}
}

func TestWatchResolvesAnnotationAndResets(t *testing.T) {
	client := adminClient(t)
	token := simNode(t, "sim-resolve")
	w := watch(t, token, "sim-resolve", nil)
	w.next("local config for a node without source", func(m *dkcv1.WatchConfigResponse) bool {
		return m.GetAssignment() != nil && m.GetAssignment().GetSource() == nil && m.GetSyncError() == ""
	})
	cm := createConfigMap(t, "resolve-a", map[string]string{"kubelet": "kind: KubeletConfiguration\napiVersion: kubelet.config.k8s.io/v1beta1\n", "extra.pem": "x"})
	setSource(t, client, "sim-resolve", cmSource("resolve-a"))
	m := w.next("the ConfigMap assignment", hasConfigMap("resolve-a", cm.ResourceVersion))
	src := m.GetAssignment().GetSource().GetConfigMap()
	if src.GetUid() != string(cm.UID) || src.GetKubeletConfigKey() != "kubelet" || len(m.GetAssignment().GetFiles()) != 2 ||
		!strings.HasPrefix(m.GetAssignment().GetContentHash(), "sha256:") {
		t.Errorf("assignment not fully resolved: %v", m)
	}
	setSource(t, client, "sim-resolve", "")
	w.next("reset to local", func(m *dkcv1.WatchConfigResponse) bool {
		return m.GetAssignment() != nil && m.GetAssignment().GetSource() == nil
	})
}

func TestInvalidSourceIsReportedWithAPIServerMessage(t *testing.T) {
	client := adminClient(t)
	token := simNode(t, "sim-invalid")
	// The admission webhook would refuse these sources; the service must still report them when they get
	// in (set while the webhook was down, or before dkc was installed).
	skip := fmt.Sprintf(`{"metadata":{"labels":{%q:"skip"}}}`, devcluster.AdmissionSkipLabel)
	if _, err := client.CoreV1().Nodes().Patch(testContext(t), "sim-invalid", types.StrategicMergePatchType, []byte(skip), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	w := watch(t, token, "sim-invalid", nil)
	w.next("local", func(m *dkcv1.WatchConfigResponse) bool { return m.GetAssignment() != nil })
	for _, tc := range []struct{ source, want string }{
		{`{"configMap":{"name":"x","kubeletConfigKey":"kubelet"}}`, "configMap.namespace: Required value: namespace must be set"},
		{`{"configMap":{"namespace":"kube-system","name":"x","kubeletConfigKey":"kubelet","uid":"1"}}`, "configMap.uid: Forbidden: uid must not be set in spec"},
		{`{}`, "failed to sync: invalid NodeConfigSource, exactly one subfield must be non-nil, but all were nil"},
		{`not json`, "not the JSON of a NodeConfigSource"},
	} {
		setSource(t, client, "sim-invalid", tc.source)
		m := w.next("sync error "+tc.want, func(m *dkcv1.WatchConfigResponse) bool { return strings.Contains(m.GetSyncError(), tc.want) })
		if m.GetAssignment() != nil && m.GetAssignment().GetSource() != nil {
			t.Errorf("an invalid source changed the assignment: %v", m.GetAssignment())
		}
	}
}

func TestInPlaceUpdateReachesEveryNode(t *testing.T) {
	client := adminClient(t)
	cm := createConfigMap(t, "shared", map[string]string{"kubelet": "eventRecordQPS: 1"})
	var watchers []*watcher
	for i := range 3 {
		node := fmt.Sprintf("sim-shared-%d", i)
		token := simNode(t, node)
		setSource(t, client, node, cmSource("shared"))
		watchers = append(watchers, watch(t, token, node, nil))
	}
	var hash string
	for _, w := range watchers {
		hash = w.next("first version", hasConfigMap("shared", cm.ResourceVersion)).GetAssignment().GetContentHash()
	}
	cm.Data["kubelet"] = "eventRecordQPS: 2"
	updated, err := client.CoreV1().ConfigMaps("kube-system").Update(testContext(t), cm, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range watchers {
		m := w.next("updated version", hasConfigMap("shared", updated.ResourceVersion))
		if m.GetAssignment().GetContentHash() == hash || m.GetAssignment().GetFiles()["kubelet"] != "eventRecordQPS: 2" {
			t.Errorf("update not delivered: %v", m)
		}
	}
	// A no-op update keeps the ResourceVersion and pushes nothing.
	if _, err := client.CoreV1().ConfigMaps("kube-system").Update(testContext(t), updated, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	watchers[0].quiet(2 * time.Second)
}

func TestMissingConfigMapKeepsAssignmentAndRecovers(t *testing.T) {
	client := adminClient(t)
	token := simNode(t, "sim-missing")
	setSource(t, client, "sim-missing", cmSource("comes-later"))
	w := watch(t, token, "sim-missing", nil)
	const download = "failed to sync: failed to download config, see Kubelet log for details"
	w.next("download error", func(m *dkcv1.WatchConfigResponse) bool { return m.GetSyncError() == download })

	first := createConfigMap(t, "comes-later", map[string]string{"kubelet": "a"})
	w.next("assignment once created", hasConfigMap("comes-later", first.ResourceVersion))

	if err := client.CoreV1().ConfigMaps("kube-system").Delete(testContext(t), "comes-later", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	m := w.next("download error after delete", func(m *dkcv1.WatchConfigResponse) bool { return m.GetSyncError() == download })
	if got := m.GetAssignment().GetSource().GetConfigMap().GetUid(); got != string(first.UID) {
		t.Errorf("after delete the node should keep the last good assignment (UID %s), got %q", first.UID, got)
	}
	second := createConfigMap(t, "comes-later", map[string]string{"kubelet": "b"})
	m = w.next("re-created ConfigMap", hasConfigMap("comes-later", second.ResourceVersion))
	if m.GetAssignment().GetSource().GetConfigMap().GetUid() == string(first.UID) {
		t.Error("re-created ConfigMap kept the old UID")
	}
}

func TestResumeDoesNotRedeliver(t *testing.T) {
	client := adminClient(t)
	token := simNode(t, "sim-resume")
	cm := createConfigMap(t, "resume", map[string]string{"kubelet": "a"})
	setSource(t, client, "sim-resume", cmSource("resume"))
	m := watch(t, token, "sim-resume", nil).next("assignment", hasConfigMap("resume", cm.ResourceVersion))

	applied := &dkcv1.AppliedConfig{Source: m.GetAssignment().GetSource(), ContentHash: m.GetAssignment().GetContentHash()}
	w := watch(t, token, "sim-resume", applied)
	w.quiet(2 * time.Second)
	cm.Data["kubelet"] = "b"
	updated, err := client.CoreV1().ConfigMaps("kube-system").Update(testContext(t), cm, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w.next("the change after resuming", hasConfigMap("resume", updated.ResourceVersion))

	// A node that says it applied something else gets the current assignment at once.
	stale := &dkcv1.AppliedConfig{Source: applied.GetSource(), ContentHash: "sha256:stale"}
	watch(t, token, "sim-resume", stale).next("current assignment for a stale node", hasConfigMap("resume", updated.ResourceVersion))
}

func TestNodeIdentityIsEnforced(t *testing.T) {
	ctx := testContext(t)
	client := adminClient(t)
	tokenA := simNode(t, "sim-ident-a")
	simNode(t, "sim-ident-b")
	svc := serviceClient(t)
	expectCode := func(what string, want codes.Code, err error) {
		t.Helper()
		if status.Code(err) != want {
			t.Errorf("%s: code %v (%v), want %v", what, status.Code(err), err, want)
		}
	}
	recvErr := func(ctx context.Context, node string) error {
		stream, err := svc.WatchConfig(ctx, &dkcv1.WatchConfigRequest{NodeName: node})
		if err != nil {
			return err
		}
		_, err = stream.Recv()
		return err
	}
	report := func(ctx context.Context, node string) error {
		_, err := svc.ReportStatus(ctx, &dkcv1.ReportStatusRequest{NodeName: node, Status: &dkcv1.NodeConfigStatus{}})
		return err
	}
	expectCode("A watches B", codes.PermissionDenied, recvErr(withToken(ctx, tokenA), "sim-ident-b"))
	expectCode("A reports for B", codes.PermissionDenied, report(withToken(ctx, tokenA), "sim-ident-b"))
	expectCode("no token", codes.Unauthenticated, recvErr(ctx, "sim-ident-a"))
	expectCode("garbage token", codes.Unauthenticated, report(withToken(ctx, "not-a-token"), "sim-ident-a"))

	wrongAudience, err := devcluster.MintToken(ctx, client, "kube-system", "dkc-sidecar", "not-dkc", "sim-ident-a", "")
	if err != nil {
		t.Fatal(err)
	}
	expectCode("wrong audience", codes.Unauthenticated, report(withToken(ctx, wrongAudience), "sim-ident-a"))

	if _, err := client.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "intruder"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	otherSA, err := devcluster.MintToken(ctx, client, "default", "intruder", "dkc", "sim-ident-a", "")
	if err != nil {
		t.Fatal(err)
	}
	expectCode("other service account", codes.PermissionDenied, report(withToken(ctx, otherSA), "sim-ident-a"))
	unbound, err := devcluster.MintToken(ctx, client, "kube-system", "dkc-sidecar", "dkc", "", "")
	if err != nil {
		t.Fatal(err)
	}
	expectCode("token without node claim", codes.PermissionDenied, report(withToken(ctx, unbound), "sim-ident-a"))
	expectCode("own node", codes.OK, report(withToken(ctx, tokenA), "sim-ident-a"))
}

func statusWrites(t *testing.T) float64 {
	t.Helper()
	return serverMetric(t, `dkc_server_node_status_writes_total{result="written"}`)
}

// serverMetric reads one sample of the service's /metrics.
func serverMetric(t *testing.T, series string) float64 {
	t.Helper()
	return metricAt(t, cluster.MetricsAddress(), series)
}

// TestStatusWriteBack reports an assignment's two steps (checkpointed, then active after a restart) as a
// sidecar does, and checks annotation, condition, Event and the number of Node writes on the v1.34 apiserver:
// one, as the first step (a restart in progress) waits --restarting-status-delay for the second.
func TestStatusWriteBack(t *testing.T) {
	ctx := testContext(t)
	client := adminClient(t)
	// Both queues count what passes through them, under client-go's workqueue metric names.
	nodesQueued, statusQueued := serverMetric(t, `workqueue_adds_total{name="nodes"}`), serverMetric(t, `workqueue_adds_total{name="nodestatus"}`)
	token := simNode(t, "sim-status")
	cm := createConfigMap(t, "status-cm", map[string]string{"kubelet": "a"})
	setSource(t, client, "sim-status", cmSource("status-cm"))
	m := watch(t, token, "sim-status", nil).next("assignment", hasConfigMap("status-cm", cm.ResourceVersion))
	src := m.GetAssignment().GetSource()
	svc := serviceClient(t)
	rctx := withToken(ctx, token)
	before := statusWrites(t)
	heldBefore := serverMetric(t, `dkc_server_node_status_writes_total{result="held"}`)

	reportAt := func(st *dkcv1.NodeConfigStatus, restart *dkcv1.KubeletRestart, at time.Time) {
		t.Helper()
		if _, err := svc.ReportStatus(rctx, &dkcv1.ReportStatusRequest{NodeName: "sim-status", Status: st, Restart: restart, ObservedTime: timestamppb.New(at)}); err != nil {
			t.Fatalf("ReportStatus: %v", err)
		}
	}
	t0 := time.Now()
	reportAt(&dkcv1.NodeConfigStatus{Assigned: src}, nil, t0)
	restart := &dkcv1.KubeletRestart{Id: "r1" + fmt.Sprint(t0.UnixNano()), Target: src, Time: timestamppb.New(t0)}
	active := &dkcv1.NodeConfigStatus{Assigned: src, Active: src}
	reportAt(active, restart, t0.Add(time.Second))
	reportAt(active, restart, t0.Add(2*time.Second))             // a retry: no new write, no second Event
	reportAt(&dkcv1.NodeConfigStatus{}, nil, t0.Add(-time.Hour)) // stale: ignored

	node, err := client.CoreV1().Nodes().Get(ctx, "sim-status", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var got corev1.NodeConfigStatus
	if err := json.Unmarshal([]byte(node.Annotations[nodeconfig.StatusAnnotation]), &got); err != nil {
		t.Fatalf("status annotation %q: %v", node.Annotations[nodeconfig.StatusAnnotation], err)
	}
	if got.Active == nil || got.Active.ConfigMap.UID != cm.UID || got.Assigned == nil || got.Error != "" {
		t.Errorf("status annotation = %+v", got)
	}
	if node.Status.Config != nil {
		t.Errorf("status.config kept by a v1.34 apiserver: %+v", node.Status.Config)
	}
	var cond *corev1.NodeCondition
	for i := range node.Status.Conditions {
		if node.Status.Conditions[i].Type == "ConfigOK" {
			cond = &node.Status.Conditions[i]
		}
	}
	if cond == nil || cond.Status != corev1.ConditionTrue || !strings.HasPrefix(cond.Message, "using current (kube-system/status-cm, UID: "+string(cm.UID)) {
		t.Errorf("ConfigOK condition = %+v", cond)
	}
	// Writes carry field manager dkc-server. Checked on the real node (its sidecar reported at start): the
	// apiserver returned no managedFields at all for Nodes created by this test, a puzzle left for later.
	real, err := client.CoreV1().Nodes().Get(ctx, "node-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	managed := false
	for _, mf := range real.ManagedFields {
		if mf.Manager == "dkc-server" && mf.Subresource == "status" {
			managed = true
		}
	}
	if !managed {
		t.Errorf("node-1: no status fields managed by dkc-server: %+v", real.ManagedFields)
	}
	if n := statusWrites(t) - before; n != 1 {
		t.Errorf("Node writes for one assignment = %v, want 1 (the restart in progress held, then replaced by the outcome)", n)
	}
	if n := serverMetric(t, `dkc_server_node_status_writes_total{result="held"}`) - heldBefore; n < 1 {
		t.Errorf("the restart in progress was not held (held writes %v)", n)
	}
	if n := serverMetric(t, `workqueue_adds_total{name="nodes"}`) - nodesQueued; n < 1 {
		t.Errorf("workqueue_adds_total{name=\"nodes\"} grew by %v after a Node was created and assigned, want ≥ 1", n)
	}
	if n := serverMetric(t, `workqueue_adds_total{name="nodestatus"}`) - statusQueued; n < 1 {
		t.Errorf("workqueue_adds_total{name=\"nodestatus\"} grew by %v after status reports, want ≥ 1", n)
	}
	events, err := client.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=sim-status,reason=KubeletConfigChanged"})
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("Kubelet restarting to use /api/v1/namespaces/kube-system/configmaps/status-cm, UID: %s, ResourceVersion: %s, KubeletConfigKey: kubelet", cm.UID, cm.ResourceVersion)
	if len(events.Items) != 1 || events.Items[0].Message != want {
		t.Errorf("events = %+v, want one with %q", events.Items, want)
	}

	// A sync error replaces the reported error on the Node while it lasts.
	if err := client.CoreV1().ConfigMaps("kube-system").Delete(ctx, "status-cm", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.ForNil(t, 30*time.Second, 200*time.Millisecond, "the download error to reach the Node", func() error {
		node, err = client.CoreV1().Nodes().Get(ctx, "sim-status", metav1.GetOptions{})
		if err == nil && !strings.Contains(node.Annotations[nodeconfig.StatusAnnotation], "failed to sync: failed to download config") {
			err = fmt.Errorf("annotations %v", node.Annotations)
		}
		return err
	})
}

// TestOnlyReferencedConfigMapsAreWatched: unrelated ConfigMaps cost the service nothing; a referenced one
// is watched while some Node references it.
func TestOnlyReferencedConfigMapsAreWatched(t *testing.T) {
	client := adminClient(t)
	for i := range 20 {
		createConfigMap(t, fmt.Sprintf("unrelated-%d", i), map[string]string{"x": "y"})
	}
	base := serverMetric(t, "dkc_server_watched_configmaps")
	simNode(t, "sim-watched")
	createConfigMap(t, "watched-one", map[string]string{"kubelet": "a"})
	setSource(t, client, "sim-watched", cmSource("watched-one"))
	waitMetric := func(want float64) {
		t.Helper()
		poll.ForNil(t, 10*time.Second, 100*time.Millisecond, fmt.Sprintf("%v watched configmaps", want), func() error {
			if got := serverMetric(t, "dkc_server_watched_configmaps"); got != want {
				return fmt.Errorf("watched configmaps = %v", got)
			}
			return nil
		})
	}
	waitMetric(base + 1)
	setSource(t, client, "sim-watched", "")
	waitMetric(base)
}
