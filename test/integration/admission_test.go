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

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/admission/plugin/policy/validating"
	"k8s.io/apiserver/pkg/cel/openapi/resolver"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/dkc-dev/dkc/test/devcluster"
)

// The refusals of the ValidatingAdmissionPolicy of deploy/base/config-source-policy.yaml.
const (
	selfAssignMsg   = `node "node-1" is not allowed to set its own config source (annotation dkc.dev/config-source)`
	viaStatusMsg    = `dkc.dev/config-source may only be changed through the Node, not its status subresource`
	validSource     = `{"configMap":{"namespace":"kube-system","name":"c","kubeletConfigKey":"kubelet"}}`
	malformedSource = `{}`
)

// statusWriterNote is an annotation a nodes/status writer other than dkc may write.
const statusWriterNote = "example.com/status-writer-note"

// annotationPatch is a JSON merge patch setting annotation key to value ("" removes it).
func annotationPatch(key, value string) []byte {
	var v any // nil: JSON null, which removes the key
	if value != "" {
		v = value
	}
	data, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{key: v}}})
	return data
}

// patchSource writes node's config source ("" clears it) as c, through the Node or, with subresource
// "status", through its status; dryRun writes nothing but runs admission all the same.
func patchSource(ctx context.Context, c kubernetes.Interface, node, value string, dryRun bool, subresource ...string) error {
	opts := metav1.PatchOptions{}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	_, err := c.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, annotationPatch("dkc.dev/config-source", value), opts, subresource...)
	return err
}

// wantRefusal fails t unless err is a Forbidden that says msg.
func wantRefusal(t *testing.T, what string, err error, msg string) {
	t.Helper()
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), msg) {
		t.Errorf("%s: err %v, want Forbidden with %q", what, err, msg)
	}
}

// realNodeClient acts with the real node's own kubelet credentials (its client certificate,
// system:node:node-1 in group system:nodes).
func realNodeClient(t *testing.T) kubernetes.Interface {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", cluster.NodeKubeconfigPath(realNode))
	if err != nil {
		t.Fatal(err)
	}
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// clearSourceAtEnd removes node's config source when t ends, in case a write that should have been refused
// went through (the real node would otherwise chase a config that does not exist).
func clearSourceAtEnd(t *testing.T, admin kubernetes.Interface, node string) {
	t.Cleanup(func() { _ = patchSource(context.Background(), admin, node, "", false) })
}

func TestAdmissionRefusesMalformedSourcesAndNodeSelfAssignment(t *testing.T) {
	ctx := testContext(t)
	admin := adminClient(t)
	patch := func(c kubernetes.Interface, node, value string) error {
		v := "null"
		if value != "" {
			v = `"` + strings.ReplaceAll(value, `"`, `\"`) + `"`
		}
		_, err := c.CoreV1().Nodes().Patch(ctx, node, types.StrategicMergePatchType,
			[]byte(`{"metadata":{"annotations":{"dkc.dev/config-source":`+v+`}}}`), metav1.PatchOptions{})
		return err
	}
	simNode(t, "adm-1")
	for _, tc := range []struct{ value, want string }{
		{`{"configMap":{"name":"c","kubeletConfigKey":"kubelet"}}`, "metadata.annotations[dkc.dev/config-source].configMap.namespace: Required value: namespace must be set"},
		{`{"configMap":{"namespace":"kube-system","kubeletConfigKey":"kubelet"}}`, "configMap.name: Required value: name must be set"},
		{`{"configMap":{"namespace":"kube-system","name":"c"}}`, "configMap.kubeletConfigKey: Required value: kubeletConfigKey must be set"},
		{`{"configMap":{"namespace":"kube-system","name":"c","kubeletConfigKey":"k","resourceVersion":"1"}}`, "resourceVersion must not be set in spec"},
		{`{}`, "exactly one reference subfield must be non-nil"},
		{`garbage`, "not the JSON of a NodeConfigSource"},
	} {
		err := patch(admin, "adm-1", tc.value)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("annotation %s: err %v, want refusal with %q", tc.value, err, tc.want)
		}
	}
	valid := `{"configMap":{"namespace":"kube-system","name":"c","kubeletConfigKey":"kubelet"}}`
	if err := patch(admin, "adm-1", valid); err != nil {
		t.Errorf("valid annotation refused: %v", err)
	}

	// The real node's own credential (its kubelet's client certificate).
	nodeClient := realNodeClient(t)
	clearSourceAtEnd(t, admin, realNode)
	err := patch(nodeClient, realNode, valid)
	if err == nil || !strings.Contains(err.Error(), `node "node-1" is not allowed to set its own config source`) {
		t.Errorf("node self-assignment: %v", err)
	}
	if err := patch(nodeClient, realNode, ""); err != nil {
		t.Errorf("a node clearing its own source must stay allowed: %v", err)
	}

	// Clearing a source that is actually assigned, with a node's own credentials (adm-1 has the valid one
	// from above; a kubelet-like certificate, system:node:adm-1 in group system:nodes), stays allowed, as
	// NodeRestriction allowed for spec.configSource. Setting it again is refused.
	cfg, err := cluster.NodeCredentials("adm-1")
	if err != nil {
		t.Fatal(err)
	}
	simNodeClient, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := patch(simNodeClient, "adm-1", ""); err != nil {
		t.Errorf("a node clearing its assigned source must stay allowed: %v", err)
	}
	wantRefusal(t, "node adm-1 sets its own source", patch(simNodeClient, "adm-1", valid),
		`node "adm-1" is not allowed to set its own config source (annotation dkc.dev/config-source)`)
}

// The status subresource keeps annotation changes and NodeRestriction ignores annotations, so without the
// policy a kubelet could point its own Node at any ConfigMap through nodes/status (issue 14 item 1).
func TestAdmissionNodeCannotSetItsOwnSourceThroughStatus(t *testing.T) {
	ctx := testContext(t)
	admin := adminClient(t)
	node := realNodeClient(t)
	clearSourceAtEnd(t, admin, realNode)
	wantRefusal(t, "node sets its own source through nodes/status", patchSource(ctx, node, realNode, validSource, false, "status"), viaStatusMsg)
	wantRefusal(t, "node sets its own source through the Node", patchSource(ctx, node, realNode, validSource, false), selfAssignMsg)

	// The refusal is about the source, not status writes: the node's other annotation writes go through.
	const note = "dkc.dev/test-note"
	t.Cleanup(func() {
		_, _ = admin.CoreV1().Nodes().Patch(context.Background(), realNode, types.MergePatchType, annotationPatch(note, ""), metav1.PatchOptions{})
	})
	if _, err := node.CoreV1().Nodes().Patch(ctx, realNode, types.MergePatchType, annotationPatch(note, "x"), metav1.PatchOptions{}, "status"); err != nil {
		t.Errorf("node writing another annotation through nodes/status: %v", err)
	}
	n, err := admin.CoreV1().Nodes().Get(ctx, realNode, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := n.Annotations["dkc.dev/config-source"]; ok {
		t.Errorf("node-1 has a config source it set itself: %s", v)
	}
}

// Anyone else who may write nodes/status (CNI agents, node-problem-detector, cloud controllers) must not
// reconfigure a node either; neither may the admin through that path. Status writes that leave the source
// alone go through.
func TestAdmissionStatusWritersCannotChangeSources(t *testing.T) {
	ctx := testContext(t)
	admin := adminClient(t)
	const node, ns, name = "adm-status", "adm-status-writer", "node-status-writer"
	simNode(t, node)

	// A ServiceAccount that may write Node status and nothing else.
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })
	if _, err := admin.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "dkc-test-" + name},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes/status"}, Verbs: []string{"patch", "update"}}},
	}
	if _, err := admin.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = admin.RbacV1().ClusterRoles().Delete(context.Background(), role.Name, metav1.DeleteOptions{})
	})
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role.Name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: name}},
	}
	if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = admin.RbacV1().ClusterRoleBindings().Delete(context.Background(), binding.Name, metav1.DeleteOptions{})
	})
	token, err := devcluster.MintToken(ctx, admin, ns, name, devcluster.APIAudience, "", "")
	if err != nil {
		t.Fatal(err)
	}
	adminCfg, err := cluster.RESTConfig()
	if err != nil {
		t.Fatal(err)
	}
	cfg := rest.AnonymousClientConfig(adminCfg) // the CA, no client certificate
	cfg.BearerToken = token
	writer, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}

	// An annotation of its own through nodes/status (dkc.dev/config-status is dkc-server's alone,
	// test/installed TestNodeStatusCannotBeForged). Polled: RBAC takes a moment to see the new binding.
	status := annotationPatch(statusWriterNote, "{}")
	var last error
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, last = writer.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, status, metav1.PatchOptions{}, "status")
		return last == nil, nil
	}); err != nil {
		t.Fatalf("status writer cannot write %s: %v", statusWriterNote, last)
	}

	wantRefusal(t, "status writer sets a source", patchSource(ctx, writer, node, validSource, false, "status"), viaStatusMsg)
	if err := patchSource(ctx, admin, node, validSource, false); err != nil {
		t.Fatalf("admin assigns through the Node: %v", err)
	}
	other := strings.Replace(validSource, `"name":"c"`, `"name":"other"`, 1)
	wantRefusal(t, "status writer changes a source", patchSource(ctx, writer, node, other, false, "status"), viaStatusMsg)
	wantRefusal(t, "status writer removes a source", patchSource(ctx, writer, node, "", false, "status"), viaStatusMsg)
	wantRefusal(t, "admin changes a source through nodes/status", patchSource(ctx, admin, node, other, false, "status"), viaStatusMsg)

	// With a source assigned, status writes that leave it alone still go through, and leave it as it was.
	if _, err := writer.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, annotationPatch(statusWriterNote, `{"error":"x"}`), metav1.PatchOptions{}, "status"); err != nil {
		t.Errorf("status write beside an assigned source: %v", err)
	}
	n, err := admin.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := n.Annotations["dkc.dev/config-source"]; got != validSource {
		t.Errorf("source after refused status writes = %q, want %q", got, validSource)
	}
}

// The skip label exempts a Node from the webhook's validation, never from the identity rules (issue 14
// item 5): anyone who may patch Nodes can set it.
func TestAdmissionSkipLabelExemptsValidationOnly(t *testing.T) {
	ctx := testContext(t)
	admin := adminClient(t)
	node := realNodeClient(t)
	label := func(value string) {
		t.Helper()
		var v any
		if value != "" {
			v = value
		}
		data, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]any{devcluster.AdmissionSkipLabel: v}}})
		if _, err := admin.CoreV1().Nodes().Patch(ctx, realNode, types.MergePatchType, data, metav1.PatchOptions{}); err != nil {
			t.Fatalf("label %s %s=%q: %v", realNode, devcluster.AdmissionSkipLabel, value, err)
		}
	}
	clearSourceAtEnd(t, admin, realNode)
	t.Cleanup(func() {
		data := []byte(fmt.Sprintf(`{"metadata":{"labels":{%q:null}}}`, devcluster.AdmissionSkipLabel))
		_, _ = admin.CoreV1().Nodes().Patch(context.Background(), realNode, types.MergePatchType, data, metav1.PatchOptions{})
	})
	label("skip")

	wantRefusal(t, "skip-labelled node sets its own source", patchSource(ctx, node, realNode, validSource, false), selfAssignMsg)
	wantRefusal(t, "skip-labelled node sets its own malformed source", patchSource(ctx, node, realNode, malformedSource, false), selfAssignMsg)
	wantRefusal(t, "skip-labelled node sets its own source through nodes/status", patchSource(ctx, node, realNode, validSource, false, "status"), viaStatusMsg)

	// The admin may still put a malformed source on a labelled Node. A dry run: admission runs all the same,
	// and the real node does not chase a source that cannot work.
	if err := patchSource(ctx, admin, realNode, malformedSource, true); err != nil {
		t.Errorf("admin sets a malformed source on a skip-labelled node: %v", err)
	}
	label("")
	if err := patchSource(ctx, admin, realNode, malformedSource, true); err == nil || !strings.Contains(err.Error(), "exactly one reference subfield must be non-nil") {
		t.Errorf("without the label the webhook must refuse the malformed source: %v", err)
	}
}

// The policy's expressions type-check against the apiserver's own Node schema. A typo in a field name would
// otherwise show only as refusals of every matching write (failurePolicy Fail) or as silent passes. The dev
// cluster runs no kube-controller-manager, whose status controller would write this into the policy's
// status.typeChecking, so the test runs the same checker against the apiserver's OpenAPI.
func TestAdmissionPolicyTypeChecks(t *testing.T) {
	ctx := testContext(t)
	admin := adminClient(t)
	cfg, err := cluster.RESTConfig()
	if err != nil {
		t.Fatal(err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	checker := &validating.TypeChecker{
		SchemaResolver: &resolver.ClientDiscoveryResolver{Discovery: dc},
		RestMapper:     restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc)),
	}
	// Check reports the validations and message expressions only; an unknown field in a variable would just
	// make the variable dyn. So each variable is checked as an expression of its own too.
	check := func(policy *admissionregistrationv1.ValidatingAdmissionPolicy) []string {
		var warnings []string
		for _, w := range checker.Check(policy) {
			warnings = append(warnings, w.FieldRef+": "+w.Warning)
		}
		tc := checker.CreateContext(policy)
		for i, v := range policy.Spec.Variables {
			if r := checker.CheckExpression(tc, v.Expression); len(r) > 0 {
				warnings = append(warnings, fmt.Sprintf("spec.variables[%d] (%s): %s", i, v.Name, r))
			}
		}
		return warnings
	}
	for _, name := range []string{"dkc-config-source", "dkc-node-status-writers"} {
		policy, err := admin.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range check(policy) {
			t.Errorf("%s: %s", name, w)
		}
		// The check does see the Node's fields: a typo is reported.
		broken := policy.DeepCopy()
		for i, v := range broken.Spec.Variables {
			broken.Spec.Variables[i].Expression = strings.ReplaceAll(v.Expression, "object.metadata.", "object.metadata.annotationz.")
		}
		if w := check(broken); len(w) == 0 || !strings.Contains(fmt.Sprint(w), "annotationz") {
			t.Errorf("%s: a misspelt field went unnoticed: %v", name, w)
		}
	}
}
