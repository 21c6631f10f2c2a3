// SPDX-License-Identifier: Apache-2.0

package devcluster

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/admission/plugin/cel"
	"k8s.io/apiserver/pkg/admission/plugin/policy/validating"
	"k8s.io/apiserver/pkg/admission/plugin/webhook/matchconditions"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	k8suser "k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/cel/environment"
)

// The dev cluster grants its dkc-server what deploy/base/server-rbac.yaml grants, no more: no ClusterRole
// rule on ConfigMaps, Events or Leases, ConfigMaps and the leader election's Lease only in kube-system,
// Events only in default, to the User dkc-server.
func TestServerRBACFileAsTheDevClusterApplies(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", ServerRBACFile))
	if err != nil {
		t.Fatal(err)
	}
	r, err := decodeServerRBAC(data)
	if err != nil {
		t.Fatal(err)
	}
	user := rbacv1.Subject{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: ServiceUser}
	for _, cr := range r.clusterRoles {
		for _, rule := range cr.Rules {
			for _, res := range rule.Resources {
				if res == "configmaps" || res == "events" || res == "leases" {
					t.Errorf("ClusterRole %s grants %v on %s cluster-wide", cr.Name, rule.Verbs, res)
				}
			}
		}
	}
	want := map[string]string{"dkc-server-configs": "kube-system", "dkc-server-events": "default", "dkc-server-leader-election": "kube-system",
		"dkc-server-sidecar-tokens": "kube-system"}
	for _, role := range r.roles {
		if ns, ok := want[role.Name]; !ok || role.Namespace != ns {
			t.Errorf("Role %s/%s; want only %v", role.Namespace, role.Name, want)
		}
	}
	// Narrowed where RBAC can: the Lease by name (create cannot be), and no update or patch of ConfigMaps
	// (snapshots are immutable; create and delete are confined to them by ServerConfigMapPolicyFile).
	for _, role := range r.roles {
		for _, rule := range role.Rules {
			for _, res := range rule.Resources {
				for _, v := range rule.Verbs {
					switch {
					case res == "leases" && v != "create" && !slices.Equal(rule.ResourceNames, []string{"dkc-server-pools"}):
						t.Errorf("Role %s grants %s on leases %v, want only dkc-server-pools", role.Name, v, rule.ResourceNames)
					case res == "configmaps" && (v == "update" || v == "patch" || v == "*"):
						t.Errorf("Role %s grants %s on configmaps", role.Name, v)
					}
				}
			}
		}
	}
	if len(r.roles) != len(want) || len(r.roleBindings) != len(want) {
		t.Errorf("%d roles and %d bindings, want %d each", len(r.roles), len(r.roleBindings), len(want))
	}
	for _, b := range r.roleBindings {
		if want[b.Name] != b.Namespace || len(b.Subjects) != 1 || b.Subjects[0] != user {
			t.Errorf("RoleBinding %s/%s binds %v", b.Namespace, b.Name, b.Subjects)
		}
	}
	for _, b := range r.clusterRoleBindings {
		if len(b.Subjects) != 1 || b.Subjects[0] != user {
			t.Errorf("ClusterRoleBinding %s binds %v, want the User %s", b.Name, b.Subjects, ServiceUser)
		}
	}
}

// evalPolicy runs the ValidatingAdmissionPolicy of file (relative to the repository root) on one request, with
// the apiserver's own compiler and validator (what k8s.io/apiserver's validating plugin does per binding), and
// returns the denial's message, or "" when the request is admitted.
func evalPolicy(t *testing.T, file string, op admission.Operation, resource, sub, user string, obj, old runtime.Object) string {
	t.Helper()
	return evalPolicyAs(t, file, op, resource, sub, &k8suser.DefaultInfo{Name: user}, nil, obj, old)
}

// evalPolicyAs is evalPolicy for a user with groups, and the authorizer the policy's expressions ask (nil
// when they ask none).
func evalPolicyAs(t *testing.T, file string, op admission.Operation, resource, sub string, user k8suser.Info,
	authz authorizer.UnconditionalAuthorizer, obj, old runtime.Object) string {
	t.Helper()
	return evalDecodedPolicy(t, readPolicy(t, file), op, resource, sub, user, authz, obj, old)
}

// readPolicy decodes the policy of file, relative to the repository root.
func readPolicy(t *testing.T, file string) *admissionregistrationv1.ValidatingAdmissionPolicy {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", file))
	if err != nil {
		t.Fatal(err)
	}
	policy, _, err := decodeAdmissionPolicy(data)
	if err != nil {
		t.Fatal(err)
	}
	return policy
}

// evalDecodedPolicy is evalPolicyAs on a decoded policy.
func evalDecodedPolicy(t *testing.T, policy *admissionregistrationv1.ValidatingAdmissionPolicy, op admission.Operation, resource, sub string,
	user k8suser.Info, authz authorizer.UnconditionalAuthorizer, obj, old runtime.Object) string {
	t.Helper()
	vars := cel.OptionalVariableDeclarations{HasAuthorizer: true}
	compiler, err := cel.NewCompositedCompiler(environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion()))
	if err != nil {
		t.Fatal(err)
	}
	variables := make([]cel.NamedExpressionAccessor, 0, len(policy.Spec.Variables))
	for _, v := range policy.Spec.Variables {
		variables = append(variables, &validating.Variable{Name: v.Name, Expression: v.Expression})
	}
	compiler.CompileAndStoreVariables(variables, vars, environment.StoredExpressions)
	var matcher matchconditions.Matcher
	if mcs := policy.Spec.MatchConditions; len(mcs) > 0 {
		acc := make([]cel.ExpressionAccessor, len(mcs))
		for i := range mcs {
			acc[i] = (*matchconditions.MatchCondition)(&mcs[i])
		}
		matcher = matchconditions.NewMatcher(compiler.CompileCondition(acc, vars, environment.StoredExpressions), policy.Spec.FailurePolicy, "policy", "validate", policy.Name)
	}
	validations := make([]cel.ExpressionAccessor, len(policy.Spec.Validations))
	messages := make([]cel.ExpressionAccessor, len(policy.Spec.Validations))
	for i, v := range policy.Spec.Validations {
		validations[i] = &validating.ValidationCondition{Expression: v.Expression, Message: v.Message, Reason: v.Reason}
		if v.MessageExpression != "" {
			messages[i] = &validating.MessageExpressionCondition{MessageExpression: v.MessageExpression}
		}
	}
	validator := validating.NewValidator(compiler.CompileCondition(validations, vars, environment.StoredExpressions), matcher,
		compiler.CompileCondition(nil, vars, environment.StoredExpressions),
		compiler.CompileCondition(messages, cel.OptionalVariableDeclarations{}, environment.StoredExpressions), policy.Spec.FailurePolicy, nil)

	gvr := corev1.SchemeGroupVersion.WithResource(resource)
	gvk := corev1.SchemeGroupVersion.WithKind(map[string]string{"nodes": "Node", "configmaps": "ConfigMap"}[resource])
	var name, ns string
	for _, o := range []runtime.Object{obj, old} {
		if m, ok := o.(metav1.Object); ok && o != nil && !reflect.ValueOf(o).IsNil() {
			name, ns = m.GetName(), m.GetNamespace()
		}
	}
	attr := &admission.VersionedAttributes{
		Attributes:    admission.NewAttributesRecord(obj, old, gvk, ns, name, gvr, sub, op, nil, false, user),
		VersionedKind: gvk,
	}
	if obj != nil && !reflect.ValueOf(obj).IsNil() {
		attr.VersionedObject.Set(obj)
	}
	if old != nil && !reflect.ValueOf(old).IsNil() {
		attr.VersionedOldObject.Set(old)
	}
	res := validator.Validate(context.Background(), gvr, attr, nil, nil, celconfig.RuntimeCELCostBudget, authz)
	for _, d := range res.Decisions {
		if d.Evaluation == validating.EvalError {
			t.Fatalf("policy %s: expression failed: %s", policy.Name, d.Message)
		}
		if d.Action == validating.ActionDeny {
			return d.Message
		}
	}
	return ""
}

// serverUsers are dkc-server's identities: installed (its ServiceAccount, in kube-system or another namespace
// by a kustomize override) and in the process-form dev cluster.
var serverUsers = []string{"system:serviceaccount:kube-system:dkc-server", "system:serviceaccount:dkc:dkc-server", ServiceUser}

// otherUsers are not dkc-server, though their names come close: the policies do not narrow them.
var otherUsers = []string{"admin", "system:serviceaccount:kube-system:dkc-sidecar", "system:serviceaccount:kube-system:dkc-server-old", "dkc-server-old"}

// TestServerMayChangeOnlyItsNodeFields: RBAC lets dkc-server patch Nodes (pool assignments); the Node
// admission policy lets it change only the source, the assignment record and spec.configSource through the
// Node, only its status report and the status through nodes/status, and leaves everybody else alone.
func TestServerMayChangeOnlyItsNodeFields(t *testing.T) {
	base := func() *corev1.Node {
		return &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: map[string]string{"pool": "blue"},
				Annotations: map[string]string{"other": "x", "dkc.dev/config-source": `{"configMap":{"namespace":"kube-system","name":"a","kubeletConfigKey":"kubelet"}}`}},
			Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: "t", Effect: corev1.TaintEffectNoSchedule}}},
		}
	}
	edit := func(f func(n *corev1.Node)) *corev1.Node { n := base(); f(n); return n }
	assignment := edit(func(n *corev1.Node) {
		n.Annotations["dkc.dev/config-source"] = `{"configMap":{"namespace":"kube-system","name":"blue-x","kubeletConfigKey":"kubelet"}}`
		n.Annotations["dkc.dev/pool-assignment"] = `{"pool":"blue","revision":"x","time":"2026-01-01T00:00:00Z"}`
		n.Spec.ConfigSource = &corev1.NodeConfigSource{ConfigMap: &corev1.ConfigMapNodeConfigSource{Namespace: "kube-system", Name: "blue-x", KubeletConfigKey: "kubelet"}}
	})
	for _, tc := range []struct {
		name, sub string
		obj       *corev1.Node
		allowed   bool
	}{
		{"assignment", "", assignment, true},
		{"source removed", "", edit(func(n *corev1.Node) { delete(n.Annotations, "dkc.dev/config-source") }), true},
		{"label", "", edit(func(n *corev1.Node) { n.Labels["node-role.kubernetes.io/control-plane"] = "" }), false},
		{"label removed", "", edit(func(n *corev1.Node) { n.Labels = nil }), false},
		{"other annotation changed", "", edit(func(n *corev1.Node) { n.Annotations["other"] = "y" }), false},
		{"other annotation removed", "", edit(func(n *corev1.Node) { delete(n.Annotations, "other") }), false},
		{"other annotation added", "", edit(func(n *corev1.Node) { n.Annotations["new"] = "" }), false},
		{"taint", "", edit(func(n *corev1.Node) { n.Spec.Taints = nil }), false},
		// A pool's drain (spec.disruption.drain Allowed): cordon with dkc's marks, and the reverse.
		{"cordoned by a pool's drain", "", edit(func(n *corev1.Node) {
			n.Spec.Unschedulable = true
			n.Annotations["dkc.dev/cordoned"] = "pool/blue"
			n.Annotations["dkc.dev/drained"] = `{"uid":"u","resourceVersion":"1"}`
		}), true},
		{"drain marks via status", "status", edit(func(n *corev1.Node) { n.Annotations["dkc.dev/drained"] = "{}" }), false},
		{"cordoned without dkc's mark", "", edit(func(n *corev1.Node) { n.Spec.Unschedulable = true }), false},
		{"finalizer", "", edit(func(n *corev1.Node) { n.Finalizers = []string{"x"} }), false},
		{"status write", "status", edit(func(n *corev1.Node) {
			n.Annotations["dkc.dev/config-status"] = `{"active":{"configMap":{"namespace":"kube-system","name":"a","kubeletConfigKey":"kubelet"}}}`
			n.Status.Conditions = []corev1.NodeCondition{{Type: "ConfigOK", Status: corev1.ConditionTrue}}
			n.Status.Config = &corev1.NodeConfigStatus{Error: "e"}
		}), true},
		// The status strategy resets spec, not metadata: through status only dkc.dev/config-status may change.
		{"label via status", "status", edit(func(n *corev1.Node) { n.Labels["node-role.kubernetes.io/control-plane"] = "" }), false},
		{"other annotation via status", "status", edit(func(n *corev1.Node) { n.Annotations["other"] = "y" }), false},
		{"other annotation added via status", "status", edit(func(n *corev1.Node) { n.Annotations["new"] = "" }), false},
		{"assignment via status", "status", edit(func(n *corev1.Node) { n.Annotations["dkc.dev/pool-assignment"] = "{}" }), false},
		{"finalizer via status", "status", edit(func(n *corev1.Node) { n.Finalizers = []string{"x"} }), false},
		{"owner via status", "status", edit(func(n *corev1.Node) {
			n.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: "p", UID: "u"}}
		}), false},
	} {
		for _, user := range serverUsers {
			msg := evalPolicy(t, AdmissionPolicyFile, admission.Update, "nodes", tc.sub, user, tc.obj, base())
			if (msg == "") != tc.allowed {
				t.Errorf("%s by %s: refusal %q, want allowed %v", tc.name, user, msg, tc.allowed)
			}
		}
		// Someone else (an administrator, a cloud controller) is not narrowed by this rule.
		for _, user := range otherUsers {
			if msg := evalPolicy(t, AdmissionPolicyFile, admission.Update, "nodes", tc.sub, user, tc.obj, base()); msg != "" {
				t.Errorf("%s by %s refused: %s", tc.name, user, msg)
			}
		}
	}
}

// TestServerMayWriteOnlySnapshotConfigMaps: RBAC lets dkc-server create and delete ConfigMaps in its config
// namespaces; the policy confines that to revision snapshots (labelled, named for their revision, immutable),
// so coredns, kube-proxy or a user's ConfigMap labelled dkc.dev/pool stay out of its reach, and nobody else
// is narrowed.
func TestServerMayWriteOnlySnapshotConfigMaps(t *testing.T) {
	cm := func(name string, lbls map[string]string) *corev1.ConfigMap {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: name, Labels: lbls}, Data: map[string]string{"k": "v"}}
	}
	immutable := func(c *corev1.ConfigMap) *corev1.ConfigMap { yes := true; c.Immutable = &yes; return c }
	snapshot := immutable(cm("blue-x", map[string]string{"dkc.dev/pool": "blue", "dkc.dev/revision": "x"}))
	// Labelled for pool blue, but no snapshot: a user's (the pool's source, say), misnamed, mutable.
	source := immutable(cm("blue-config", map[string]string{"dkc.dev/pool": "blue"}))
	misnamed := immutable(cm("coredns", map[string]string{"dkc.dev/pool": "blue", "dkc.dev/revision": "x"}))
	mutable := cm("blue-x", map[string]string{"dkc.dev/pool": "blue", "dkc.dev/revision": "x"})
	coredns := cm("coredns", map[string]string{"k8s-app": "kube-dns"})
	changed := cm("coredns", map[string]string{"k8s-app": "kube-dns"})
	changed.Data["k"] = "evil"
	relabelled := cm("coredns", map[string]string{"dkc.dev/pool": "blue"})
	var none *corev1.ConfigMap
	for _, tc := range []struct {
		name     string
		op       admission.Operation
		obj, old *corev1.ConfigMap
		allowed  bool
	}{
		{"create a snapshot", admission.Create, snapshot, none, true},
		{"create another ConfigMap", admission.Create, coredns, none, false},
		{"delete a snapshot", admission.Delete, none, snapshot, true},
		{"delete another ConfigMap", admission.Delete, none, coredns, false},
		{"create a labelled ConfigMap without a revision", admission.Create, source, none, false},
		{"create a labelled ConfigMap under another name", admission.Create, misnamed, none, false},
		{"create a mutable snapshot", admission.Create, mutable, none, false},
		{"delete a labelled ConfigMap without a revision", admission.Delete, none, source, false},
		{"delete a labelled ConfigMap under another name", admission.Delete, none, misnamed, false},
		{"delete a mutable snapshot", admission.Delete, none, mutable, false},
		{"update another ConfigMap's data", admission.Update, changed, coredns, false},
		{"label another ConfigMap as a snapshot", admission.Update, relabelled, coredns, false},
	} {
		for _, user := range serverUsers {
			msg := evalPolicy(t, ServerConfigMapPolicyFile, tc.op, "configmaps", "", user, tc.obj, tc.old)
			if (msg == "") != tc.allowed {
				t.Errorf("%s by %s: refusal %q, want allowed %v", tc.name, user, msg, tc.allowed)
			}
		}
		for _, user := range otherUsers {
			if msg := evalPolicy(t, ServerConfigMapPolicyFile, tc.op, "configmaps", "", user, tc.obj, tc.old); msg != "" {
				t.Errorf("%s by %s refused: %s", tc.name, user, msg)
			}
		}
	}
}
