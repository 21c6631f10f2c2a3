// SPDX-License-Identifier: Apache-2.0

//go:build integration

package integration

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/dkc-dev/dkc/api/v1alpha1"
	"github.com/dkc-dev/dkc/internal/nodeconfig"
	"github.com/dkc-dev/dkc/internal/nodedrain"
	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
	"github.com/dkc-dev/dkc/test/devcluster"
)

// The status error of a source outside dkc-server's --config-namespaces (default kube-system).
const namespaceNotAllowed = "failed to sync: config namespace not allowed, see dkc-server log for details"

// otherNamespace creates the namespace "other" with a ConfigMap "elsewhere" holding a kubelet config.
func otherNamespace(t *testing.T, admin kubernetes.Interface) {
	t.Helper()
	ctx := testContext(t)
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "other"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	// No kube-controller-manager runs in the dev cluster to finalize a deleted namespace: delete the
	// ConfigMap, keep the (empty) namespace.
	if _, err := admin.CoreV1().ConfigMaps("other").Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "elsewhere", Namespace: "other"}, Data: map[string]string{"kubelet": "eventRecordQPS: 3"},
	}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = admin.CoreV1().ConfigMaps("other").Delete(context.Background(), "elsewhere", metav1.DeleteOptions{})
	})
}

const elsewhereSource = `{"configMap":{"namespace":"other","name":"elsewhere","kubeletConfigKey":"kubelet"}}`

// A Node pointed at a ConfigMap outside --config-namespaces is refused by the webhook (naming the allowed
// namespaces) and, when the source gets in anyway (skip label, set before dkc was installed), the node's
// status says so with dkc's own sync error; its config does not change and the ConfigMap is never read.
func TestConfigOutsideConfigNamespacesIsRefused(t *testing.T) {
	ctx := testContext(t)
	admin := adminClient(t)
	otherNamespace(t, admin)
	const node = "sim-other-ns"
	token := simNode(t, node)

	err := patchSource(ctx, admin, node, elsewhereSource, true)
	if err == nil || !strings.Contains(err.Error(), `namespace "other" is not one dkc-server reads configs from; allowed: kube-system`) {
		t.Errorf("webhook must refuse a source in namespace other, naming kube-system: %v", err)
	}

	skip := fmt.Sprintf(`{"metadata":{"labels":{%q:"skip"}}}`, devcluster.AdmissionSkipLabel)
	if _, err := admin.CoreV1().Nodes().Patch(ctx, node, types.StrategicMergePatchType, []byte(skip), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	w := watch(t, token, node, nil)
	w.next("local", func(m *dkcv1.WatchConfigResponse) bool { return m.GetAssignment() != nil })
	// The node reports (as its sidecar would), so that dkc-server writes its status.
	if _, err := serviceClient(t).ReportStatus(withToken(ctx, token), &dkcv1.ReportStatusRequest{
		NodeName: node, Status: &dkcv1.NodeConfigStatus{}, ObservedTime: nowProto()}); err != nil {
		t.Fatalf("ReportStatus: %v", err)
	}
	watchedBefore := serverMetric(t, "dkc_server_watched_configmaps")

	setSource(t, admin, node, elsewhereSource)
	m := w.next("namespace sync error", func(m *dkcv1.WatchConfigResponse) bool { return m.GetSyncError() != "" })
	if m.GetSyncError() != namespaceNotAllowed {
		t.Errorf("sync error %q, want %q", m.GetSyncError(), namespaceNotAllowed)
	}
	if m.GetAssignment() != nil && m.GetAssignment().GetSource().GetConfigMap() != nil {
		t.Errorf("a source outside --config-namespaces changed the assignment: %v", m.GetAssignment())
	}
	st := waitNodeStatus(t, node, "local", "local", "*", namespaceNotAllowed, 30*time.Second)
	if st.Error != namespaceNotAllowed {
		t.Errorf("node status error %q, want exactly %q", st.Error, namespaceNotAllowed)
	}
	if got := serverMetric(t, "dkc_server_watched_configmaps"); got != watchedBefore {
		t.Errorf("watched configmaps %v -> %v: dkc-server watched a ConfigMap outside --config-namespaces", watchedBefore, got)
	}

	// Back to a source in kube-system: the error clears.
	cm := createConfigMap(t, "inside-ns", map[string]string{"kubelet": "a"})
	setSource(t, admin, node, cmSource("inside-ns"))
	w.next("assignment in kube-system", hasConfigMap("inside-ns", cm.ResourceVersion))
}

func nowProto() *timestamppb.Timestamp { return timestamppb.Now() }

// dkc-server's own identity (the dev cluster grants it deploy/base/server-rbac.yaml) reads and writes
// ConfigMaps only in kube-system, writes Events only in default, gets and updates only its own Lease, and
// holds no verb its code does not call.
func TestServerIdentityIsConfinedToConfigNamespaces(t *testing.T) {
	ctx := testContext(t)
	otherNamespace(t, adminClient(t))
	cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(cluster.Dir(), "dkc-server.kubeconfig"))
	if err != nil {
		t.Fatal(err)
	}
	server, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := server.CoreV1().ConfigMaps("kube-system").List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("dkc-server lists ConfigMaps in kube-system: %v", err)
	}
	for _, ns := range []string{"other", metav1.NamespaceAll} {
		if _, err := server.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("dkc-server lists ConfigMaps in %q: err %v, want Forbidden", ns, err)
		}
	}
	for _, tc := range []struct {
		ns, verb, group, resource, sub, name string
		allowed                              bool
	}{
		{"kube-system", "list", "", "configmaps", "", "", true},
		{"kube-system", "watch", "", "configmaps", "", "", true},
		{"other", "watch", "", "configmaps", "", "", false},
		{"", "watch", "", "configmaps", "", "", false},
		{"kube-system", "get", "", "configmaps", "", "", false}, // informers list and watch; nothing gets one by name
		// The pools' revision snapshots; the admission policy confines these to ConfigMaps labelled
		// dkc.dev/pool (below). Snapshots are immutable: no update or patch.
		{"kube-system", "create", "", "configmaps", "", "", true},
		{"kube-system", "delete", "", "configmaps", "", "", true},
		{"kube-system", "update", "", "configmaps", "", "", false},
		{"kube-system", "patch", "", "configmaps", "", "", false},
		{"kube-system", "deletecollection", "", "configmaps", "", "", false},
		{"other", "create", "", "configmaps", "", "", false},
		{"default", "create", "", "events", "", "", true},
		{"default", "patch", "", "events", "", "", true}, // the event recorder counts repeats
		{"kube-system", "create", "", "events", "", "", false},
		{"", "list", "", "nodes", "", "", true},
		{"", "watch", "", "nodes", "", "", true},
		{"", "get", "", "nodes", "", "", true},   // a pool's drain reads the Node it cordons and releases
		{"", "patch", "", "nodes", "", "", true}, // pool assignments; the Node policy narrows the fields (below)
		// A pool's drain (kubectl's drain library): a node's pods, their evictions, their DaemonSets.
		{"", "list", "", "pods", "", "", true},
		{"", "get", "", "pods", "", "", true},
		{"", "create", "", "pods", "eviction", "", true},
		{"", "delete", "", "pods", "", "", false},
		{"", "get", "apps", "daemonsets", "", "", true},
		{"", "list", "apps", "daemonsets", "", "", false},
		// Batches that keep PodDisruptionBudgets read them; the Eviction API alone enforces them.
		{"", "list", "policy", "poddisruptionbudgets", "", "", true},
		{"", "watch", "policy", "poddisruptionbudgets", "", "", true},
		{"", "get", "policy", "poddisruptionbudgets", "", "", false},
		{"", "update", "policy", "poddisruptionbudgets", "", "", false},
		{"", "update", "", "nodes", "", "", false},
		{"", "delete", "", "nodes", "", "", false},
		{"", "patch", "", "nodes", "status", "", true},
		{"kube-system", "get", "", "secrets", "", "", false},
		// Leader election: its one Lease by name; create cannot be limited by name.
		{"kube-system", "create", "coordination.k8s.io", "leases", "", "", true},
		{"kube-system", "get", "coordination.k8s.io", "leases", "", "dkc-server-pools", true},
		{"kube-system", "update", "coordination.k8s.io", "leases", "", "dkc-server-pools", true},
		{"kube-system", "get", "coordination.k8s.io", "leases", "", "kube-controller-manager", false},
		{"kube-system", "update", "coordination.k8s.io", "leases", "", "kube-scheduler", false},
		{"kube-system", "list", "coordination.k8s.io", "leases", "", "", false},
		{"kube-system", "delete", "coordination.k8s.io", "leases", "", "dkc-server-pools", false},
		{"default", "create", "coordination.k8s.io", "leases", "", "", false},
		{"", "list", "dkc.dev", "kubeletconfigpools", "", "", true},
		{"", "watch", "dkc.dev", "kubeletconfigpools", "", "", true},
		{"", "get", "dkc.dev", "kubeletconfigpools", "", "", false},
		{"", "patch", "dkc.dev", "kubeletconfigpools", "", "", false}, // no finalizer to set
		{"", "update", "dkc.dev", "kubeletconfigpools", "", "", false},
		{"", "create", "dkc.dev", "kubeletconfigpools", "", "", false},
		{"", "delete", "dkc.dev", "kubeletconfigpools", "", "", false},
		{"", "update", "dkc.dev", "kubeletconfigpools", "status", "", true},
		{"", "patch", "dkc.dev", "kubeletconfigpools", "status", "", false},
	} {
		ssar, err := server.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
			Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
				Namespace: tc.ns, Verb: tc.verb, Group: tc.group, Resource: tc.resource, Subresource: tc.sub, Name: tc.name}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if ssar.Status.Allowed != tc.allowed {
			t.Errorf("dkc-server may %s %s/%s %q in %q: %v, want %v (%s)", tc.verb, tc.resource, tc.sub, tc.name, tc.ns, ssar.Status.Allowed, tc.allowed, ssar.Status.Reason)
		}
	}
}

// What RBAC grants dkc-server on ConfigMaps and Nodes, the admission policies narrow: it creates and
// deletes only revision snapshots (not coredns, kube-proxy, a user's ConfigMap labelled dkc.dev/pool...), and through a Node changes
// only its source, pool assignment record and a pool drain's cordon and marks — no label, taint or other
// annotation — and through its status only
// its status report. Dry runs: admission runs,
// nothing is written.
func TestServerWritesAreNarrowedByAdmission(t *testing.T) {
	ctx := testContext(t)
	admin := adminClient(t)
	cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(cluster.Dir(), "dkc-server.kubeconfig"))
	if err != nil {
		t.Fatal(err)
	}
	server, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dry := []string{metav1.DryRunAll}
	other := createConfigMap(t, "not-a-snapshot", map[string]string{"kubelet": "a"})
	const node = "sim-server-rights"
	simNode(t, node)

	// The policy takes effect once the apiserver has seen it: poll for the first refusal.
	unlabelled := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "server-probe", Namespace: "kube-system"}}
	var last error
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, last = server.CoreV1().ConfigMaps("kube-system").Create(ctx, unlabelled, metav1.CreateOptions{DryRun: dry})
		return apierrors.IsForbidden(last), nil
	}); err != nil {
		t.Fatalf("dkc-server creates an unlabelled ConfigMap: err %v, want Forbidden by the policy", last)
	}
	const createRule, deleteRule = "dkc-server may create only revision snapshots", "dkc-server may delete only revision snapshots"
	wantRefusal(t, "create an unlabelled ConfigMap", last, createRule)
	err = server.CoreV1().ConfigMaps("kube-system").Delete(ctx, other.Name, metav1.DeleteOptions{DryRun: dry})
	wantRefusal(t, "delete a ConfigMap that is no snapshot", err, deleteRule)
	// A user's ConfigMap labelled dkc.dev/pool (a pool's source, say) is no snapshot either.
	labelled := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "server-probe", Namespace: "kube-system",
		Labels: map[string]string{v1alpha1.LabelPool: "probe"}}}
	_, err = server.CoreV1().ConfigMaps("kube-system").Create(ctx, labelled, metav1.CreateOptions{DryRun: dry})
	wantRefusal(t, "create a labelled ConfigMap that is no snapshot", err, createRule)
	mark := fmt.Sprintf(`{"metadata":{"labels":{%q:"probe"}}}`, v1alpha1.LabelPool)
	if _, err := admin.CoreV1().ConfigMaps("kube-system").Patch(ctx, other.Name, types.MergePatchType, []byte(mark), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	err = server.CoreV1().ConfigMaps("kube-system").Delete(ctx, other.Name, metav1.DeleteOptions{DryRun: dry})
	wantRefusal(t, "delete a labelled ConfigMap that is no snapshot", err, deleteRule)
	immutable := true
	snapshot := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "probe-x", Namespace: "kube-system",
		Labels: map[string]string{v1alpha1.LabelPool: "probe", v1alpha1.LabelRevision: "x"}}, Immutable: &immutable}
	if _, err := server.CoreV1().ConfigMaps("kube-system").Create(ctx, snapshot, metav1.CreateOptions{DryRun: dry}); err != nil {
		t.Errorf("dkc-server creates a snapshot: %v", err)
	}

	const nodeRule = "dkc-server may change only a Node's annotations"
	for _, patch := range []string{
		`{"metadata":{"labels":{"node-role.kubernetes.io/control-plane":""}}}`,
		`{"metadata":{"annotations":{"other":"x"}}}`,
		`{"spec":{"taints":[{"key":"k","effect":"NoSchedule"}]}}`,
	} {
		_, err := server.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, []byte(patch), metav1.PatchOptions{DryRun: dry})
		wantRefusal(t, "dkc-server patches "+patch, err, nodeRule)
		// An administrator is not narrowed by it.
		if _, err := admin.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, []byte(patch), metav1.PatchOptions{DryRun: dry}); err != nil {
			t.Errorf("admin patches %s: %v", patch, err)
		}
	}
	assign := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q,%q:%q}}}`, nodeconfig.SourceAnnotation, cmSource(other.Name),
		v1alpha1.AnnotationAssignment, `{"pool":"probe","revision":"x","time":"2026-01-01T00:00:00Z"}`)
	if _, err := server.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, []byte(assign), metav1.PatchOptions{DryRun: dry}); err != nil {
		t.Errorf("dkc-server assigns a node: %v", err)
	}
	cordon := fmt.Sprintf(`{"metadata":{"annotations":{%q:"pool/probe",%q:"{}"}},"spec":{"unschedulable":true}}`,
		nodedrain.CordonedAnnotation, nodeconfig.DrainedAnnotation)
	if _, err := server.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, []byte(cordon), metav1.PatchOptions{DryRun: dry}); err != nil {
		t.Errorf("dkc-server cordons a node for a pool's drain: %v", err)
	}
	// The Node status strategy resets spec, not metadata: through status, too, dkc-server changes no label or
	// other annotation.
	for _, patch := range []string{
		`{"metadata":{"labels":{"node-role.kubernetes.io/control-plane":""}}}`,
		`{"metadata":{"annotations":{"other":"x"}}}`,
	} {
		_, err := server.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, []byte(patch), metav1.PatchOptions{DryRun: dry}, "status")
		wantRefusal(t, "dkc-server patches status with "+patch, err, "dkc-server may change only a Node's annotation dkc.dev/config-status")
	}
	status := fmt.Sprintf(`{"metadata":{"annotations":{%q:"{}"}}}`, nodeconfig.StatusAnnotation)
	if _, err := server.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, []byte(status), metav1.PatchOptions{DryRun: dry}, "status"); err != nil {
		t.Errorf("dkc-server writes a node's status: %v", err)
	}
}
