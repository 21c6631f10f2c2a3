// SPDX-License-Identifier: Apache-2.0

package devcluster

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/admission"
	k8suser "k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
)

// nodePatchers is a stand-in for RBAC and the Node authorizer: the users it lets patch Node n itself. It
// fails the test when the policy asks anything else (another verb, resource or Node, or the status
// subresource), since then the rule it enforces is not the documented one.
type nodePatchers struct {
	t       *testing.T
	allowed map[string]bool
}

func (p nodePatchers) Authorize(_ context.Context, a authorizer.Attributes) (authorizer.Decision, string, error) {
	if a.GetVerb() != "patch" || a.GetAPIGroup() != "" || a.GetResource() != "nodes" || a.GetSubresource() != "" || a.GetName() != "n" {
		p.t.Errorf("policy asks %s %s/%s %q of group %q", a.GetVerb(), a.GetResource(), a.GetSubresource(), a.GetName(), a.GetAPIGroup())
		return authorizer.DecisionDeny, "", nil
	}
	if p.allowed[a.GetUser().GetName()] {
		return authorizer.DecisionAllow, "", nil
	}
	return authorizer.DecisionNoOpinion, "", nil
}

// TestOnlyDKCWritesTheNodeStatusItActsOn: the annotations dkc.dev/config-status and dkc.dev/pool-assignment
// and the ConfigOK, ConfigPreview and ConfigDrift conditions are set and changed by dkc-server alone, through the Node and nodes/status, on
// create too; removed also by whoever may patch the Node itself, never by the node; every other Node write
// (heartbeats, other conditions and annotations, registration) passes whoever makes it.
func TestOnlyDKCWritesTheNodeStatusItActsOn(t *testing.T) {
	t0 := metav1.NewTime(time.Date(2026, 11, 28, 6, 0, 0, 0, time.UTC))
	t1 := metav1.NewTime(t0.Add(40 * time.Second))
	ready := func(at metav1.Time) corev1.NodeCondition {
		return corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", LastHeartbeatTime: at, LastTransitionTime: t0}
	}
	configOK := corev1.NodeCondition{Type: "ConfigOK", Status: corev1.ConditionFalse, Reason: "ConfigFailed",
		Message: "failed to validate config, see Kubelet log for details", LastHeartbeatTime: t0, LastTransitionTime: t0}
	preview := corev1.NodeCondition{Type: "ConfigPreview", Status: corev1.ConditionFalse, Reason: "PodsAffected",
		Message:           "revision x of pool blue (requested 2026-11-28T05:00:00Z): pod default/a would be evicted",
		LastHeartbeatTime: t0, LastTransitionTime: t0}
	drift := corev1.NodeCondition{Type: "ConfigDrift", Status: corev1.ConditionTrue, Reason: "WiringRemoved",
		Message: "drop-in 90-dkc.conf is gone", LastHeartbeatTime: t0, LastTransitionTime: t0}
	const failed = `{"assigned":{"configMap":{"namespace":"kube-system","name":"blue-x","kubeletConfigKey":"kubelet"}},` +
		`"error":"failed to validate config, see Kubelet log for details"}`
	base := func() *corev1.Node {
		return &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: "n", Annotations: map[string]string{
				"other":                   "x",
				"dkc.dev/config-source":   `{"configMap":{"namespace":"kube-system","name":"blue-x","kubeletConfigKey":"kubelet"}}`,
				"dkc.dev/pool-assignment": `{"pool":"blue","revision":"x","time":"2026-11-28T05:00:00Z"}`,
				"dkc.dev/config-status":   failed,
			}},
			Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{ready(t0), configOK, preview}},
		}
	}
	edit := func(f func(n *corev1.Node)) *corev1.Node { n := base(); f(n); return n }
	// A Node as a kubelet registers it, and as it looks before dkc ever wrote to it.
	bare := func() *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: map[string]string{"kubernetes.io/os": "linux"}},
			Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{ready(t0)}}}
	}
	withBare := func(f func(n *corev1.Node)) *corev1.Node { n := bare(); f(n); return n }
	var none *corev1.Node

	const (
		everyone = iota // the write passes whoever makes it
		removers        // dkc-server, and who may patch the Node itself but the node
		dkcOnly         // dkc-server alone
	)
	const (
		statusMsg     = "only dkc-server may set or change a Node's annotation dkc.dev/config-status"
		assignmentMsg = "only dkc-server may set or change a Node's annotation dkc.dev/pool-assignment"
		configOKMsg   = "only dkc-server may set or change a Node's ConfigOK condition"
		previewMsg    = "only dkc-server may set or change a Node's ConfigPreview condition"
		driftMsg      = "only dkc-server may set or change a Node's ConfigDrift condition"
	)
	for _, tc := range []struct {
		name     string
		op       admission.Operation
		sub      string
		obj, old *corev1.Node
		who      int
		msg      string
	}{
		// The kubelet's own writes, node-problem-detector's, an operator's.
		{"heartbeat", admission.Update, "status", edit(func(n *corev1.Node) { n.Status.Conditions[0] = ready(t1) }), base(), everyone, ""},
		{"heartbeat before dkc wrote", admission.Update, "status", withBare(func(n *corev1.Node) { n.Status.Conditions[0] = ready(t1) }), bare(), everyone, ""},
		{"heartbeat with no condition yet", admission.Update, "status", bare(), withBare(func(n *corev1.Node) { n.Status.Conditions = nil }), everyone, ""},
		{"addresses and images", admission.Update, "status", edit(func(n *corev1.Node) {
			n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.0.2"}}
			n.Status.Images = []corev1.ContainerImage{{Names: []string{"pause"}}}
		}), base(), everyone, ""},
		{"another condition", admission.Update, "status", edit(func(n *corev1.Node) {
			n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: "KernelDeadlock", Status: corev1.ConditionFalse})
		}), base(), everyone, ""},
		{"conditions reordered", admission.Update, "status", edit(func(n *corev1.Node) {
			n.Status.Conditions = []corev1.NodeCondition{preview, configOK, ready(t1)}
		}), base(), everyone, ""},
		{"another annotation", admission.Update, "", edit(func(n *corev1.Node) { n.Annotations["other"] = "y" }), base(), everyone, ""},
		{"another annotation via status", admission.Update, "status", edit(func(n *corev1.Node) { delete(n.Annotations, "other") }), base(), everyone, ""},
		{"registration", admission.Create, "", bare(), none, everyone, ""},

		// Forged status.
		{"status set", admission.Update, "status", withBare(func(n *corev1.Node) { n.Annotations = map[string]string{"dkc.dev/config-status": "{}"} }), bare(), dkcOnly, statusMsg},
		{"status changed to updated", admission.Update, "status", edit(func(n *corev1.Node) {
			n.Annotations["dkc.dev/config-status"] = strings.Replace(failed, `"assigned"`, `"lastKnownGood":{"configMap":{"namespace":"kube-system","name":"blue-x","kubeletConfigKey":"kubelet"}},"active"`, 1)
		}), base(), dkcOnly, statusMsg},
		{"status changed through the Node", admission.Update, "", edit(func(n *corev1.Node) { n.Annotations["dkc.dev/config-status"] = "{}" }), base(), dkcOnly, statusMsg},
		{"status emptied", admission.Update, "status", edit(func(n *corev1.Node) { n.Annotations["dkc.dev/config-status"] = "" }), base(), dkcOnly, statusMsg},
		{"status on create", admission.Create, "", withBare(func(n *corev1.Node) { n.Annotations = map[string]string{"dkc.dev/config-status": "{}"} }), none, dkcOnly, statusMsg},
		{"status removed", admission.Update, "", edit(func(n *corev1.Node) { delete(n.Annotations, "dkc.dev/config-status") }), base(), removers, statusMsg},
		{"status removed via status", admission.Update, "status", edit(func(n *corev1.Node) { delete(n.Annotations, "dkc.dev/config-status") }), base(), removers, statusMsg},

		// Forged assignment records.
		{"assignment in the future", admission.Update, "", edit(func(n *corev1.Node) {
			n.Annotations["dkc.dev/pool-assignment"] = `{"pool":"blue","revision":"x","time":"2099-01-01T00:00:00Z"}`
		}), base(), dkcOnly, assignmentMsg},
		{"assignment via status", admission.Update, "status", edit(func(n *corev1.Node) {
			n.Annotations["dkc.dev/pool-assignment"] = `{"pool":"blue","revision":"x","time":"2099-01-01T00:00:00Z"}`
		}), base(), dkcOnly, assignmentMsg},
		{"assignment on create", admission.Create, "", withBare(func(n *corev1.Node) {
			n.Annotations = map[string]string{"dkc.dev/pool-assignment": `{"pool":"blue","revision":"x","time":"2099-01-01T00:00:00Z"}`}
		}), none, dkcOnly, assignmentMsg},
		{"assignment removed", admission.Update, "", edit(func(n *corev1.Node) { delete(n.Annotations, "dkc.dev/pool-assignment") }), base(), removers, assignmentMsg},
		{"assignment removed, status set", admission.Update, "", edit(func(n *corev1.Node) {
			delete(n.Annotations, "dkc.dev/pool-assignment")
			n.Annotations["dkc.dev/config-status"] = "{}"
		}), base(), dkcOnly, statusMsg},

		// Forged ConfigOK conditions.
		{"ConfigOK turned True", admission.Update, "status", edit(func(n *corev1.Node) {
			n.Status.Conditions[1].Status, n.Status.Conditions[1].Message = corev1.ConditionTrue, "using current (local)"
		}), base(), dkcOnly, configOKMsg},
		{"ConfigOK heartbeat", admission.Update, "status", edit(func(n *corev1.Node) { n.Status.Conditions[1].LastHeartbeatTime = t1 }), base(), dkcOnly, configOKMsg},
		{"ConfigOK added", admission.Update, "status", withBare(func(n *corev1.Node) {
			n.Status.Conditions = append(n.Status.Conditions, configOK)
		}), bare(), dkcOnly, configOKMsg},
		{"second ConfigOK", admission.Update, "status", edit(func(n *corev1.Node) {
			n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: "ConfigOK", Status: corev1.ConditionTrue})
		}), base(), dkcOnly, configOKMsg},
		{"ConfigOK on create", admission.Create, "", withBare(func(n *corev1.Node) {
			n.Status.Conditions = append(n.Status.Conditions, configOK)
		}), none, dkcOnly, configOKMsg},
		{"ConfigOK removed", admission.Update, "status", edit(func(n *corev1.Node) {
			n.Status.Conditions = []corev1.NodeCondition{n.Status.Conditions[0], n.Status.Conditions[2]}
		}), base(), removers, configOKMsg},

		// Forged ConfigPreview conditions: an answer a pool would count.
		{"ConfigPreview turned True", admission.Update, "status", edit(func(n *corev1.Node) {
			n.Status.Conditions[2].Status, n.Status.Conditions[2].Reason = corev1.ConditionTrue, "NoPodsAffected"
		}), base(), dkcOnly, previewMsg},
		{"ConfigPreview message", admission.Update, "status", edit(func(n *corev1.Node) {
			n.Status.Conditions[2].Message = "revision y of pool blue (requested 2026-11-28T05:00:00Z): "
		}), base(), dkcOnly, previewMsg},
		{"ConfigPreview heartbeat", admission.Update, "status", edit(func(n *corev1.Node) { n.Status.Conditions[2].LastHeartbeatTime = t1 }), base(), dkcOnly, previewMsg},
		{"ConfigPreview added", admission.Update, "status", withBare(func(n *corev1.Node) {
			n.Status.Conditions = append(n.Status.Conditions, preview)
		}), bare(), dkcOnly, previewMsg},
		{"ConfigPreview added through the Node", admission.Update, "", withBare(func(n *corev1.Node) {
			n.Status.Conditions = append(n.Status.Conditions, preview)
		}), bare(), dkcOnly, previewMsg},
		{"second ConfigPreview", admission.Update, "status", edit(func(n *corev1.Node) {
			n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: "ConfigPreview", Status: corev1.ConditionTrue})
		}), base(), dkcOnly, previewMsg},
		{"ConfigPreview on create", admission.Create, "", withBare(func(n *corev1.Node) {
			n.Status.Conditions = append(n.Status.Conditions, preview)
		}), none, dkcOnly, previewMsg},
		{"ConfigPreview removed", admission.Update, "status", edit(func(n *corev1.Node) { n.Status.Conditions = n.Status.Conditions[:2] }), base(), removers, previewMsg},

		// Forged ConfigDrift conditions: a drifted kubelet hidden, or one counted as drifted (and repaired).
		{"ConfigDrift added", admission.Update, "status", edit(func(n *corev1.Node) {
			n.Status.Conditions = append(n.Status.Conditions, drift)
		}), base(), dkcOnly, driftMsg},
		{"ConfigDrift cleared", admission.Update, "status", edit(func(n *corev1.Node) {
			n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: "ConfigDrift",
				Status: corev1.ConditionFalse, Reason: "NoDrift", LastHeartbeatTime: t1, LastTransitionTime: t1})
		}), edit(func(n *corev1.Node) { n.Status.Conditions = append(n.Status.Conditions, drift) }), dkcOnly, driftMsg},
		{"ConfigDrift removed", admission.Update, "status", base(),
			edit(func(n *corev1.Node) { n.Status.Conditions = append(n.Status.Conditions, drift) }), removers, driftMsg},
	} {
		users := []struct {
			name   string
			user   k8suser.Info
			remove bool // may remove: may patch the Node itself and is not a node
			dkc    bool
		}{
			{"dkc-server", &k8suser.DefaultInfo{Name: "system:serviceaccount:kube-system:dkc-server"}, true, true},
			// The name alone is nobody: a ServiceAccount dkc-server in another namespace, the dev cluster's user.
			{"dkc-server elsewhere", &k8suser.DefaultInfo{Name: "system:serviceaccount:dkc:dkc-server"}, false, false},
			{"dev dkc-server, on the installed file", &k8suser.DefaultInfo{Name: ServiceUser}, false, false},
			{"node", &k8suser.DefaultInfo{Name: "system:node:n", Groups: []string{"system:nodes", "system:authenticated"}}, false, false},
			{"node group only", &k8suser.DefaultInfo{Name: "n", Groups: []string{"system:nodes"}}, false, false},
			{"status writer", &k8suser.DefaultInfo{Name: "system:serviceaccount:kube-system:node-problem-detector"}, false, false},
			{"admin", &k8suser.DefaultInfo{Name: "admin", Groups: []string{"system:masters"}}, true, false},
			{"node patcher", &k8suser.DefaultInfo{Name: "system:serviceaccount:kube-system:cloud-node-manager"}, true, false},
			{"sidecar", &k8suser.DefaultInfo{Name: "system:serviceaccount:kube-system:dkc-sidecar"}, false, false},
			{"near name", &k8suser.DefaultInfo{Name: "system:serviceaccount:kube-system:dkc-server-old"}, false, false},
		}
		// The Node authorizer lets a kubelet patch its own Node: the policy must not rely on it saying no.
		authz := nodePatchers{t: t, allowed: map[string]bool{"admin": true, "system:serviceaccount:kube-system:cloud-node-manager": true,
			"system:node:n": true, "n": true}}
		for _, u := range users {
			allowed := tc.who == everyone || u.dkc || (tc.who == removers && u.remove)
			msg := evalPolicyAs(t, NodeStatusPolicyFile, tc.op, "nodes", tc.sub, u.user, authz, tc.obj, tc.old)
			switch {
			case allowed && msg != "":
				t.Errorf("%s by %s refused: %s", tc.name, u.name, msg)
			case !allowed && !strings.Contains(msg, tc.msg):
				t.Errorf("%s by %s: refusal %q, want one with %q", tc.name, u.name, msg, tc.msg)
			}
		}
		// The dev cluster installs the file with its user as dkc-server (asDevUser): that user is dkc there,
		// and the installed ServiceAccount is not.
		dev := readPolicy(t, NodeStatusPolicyFile)
		asDevUser(dev)
		for _, u := range []struct {
			user k8suser.Info
			dkc  bool
		}{{&k8suser.DefaultInfo{Name: ServiceUser}, true}, {&k8suser.DefaultInfo{Name: "system:serviceaccount:kube-system:dkc-server"}, false}} {
			msg := evalDecodedPolicy(t, dev, tc.op, "nodes", tc.sub, u.user, authz, tc.obj, tc.old)
			switch allowed := tc.who == everyone || u.dkc; {
			case allowed && msg != "":
				t.Errorf("dev cluster: %s by %s refused: %s", tc.name, u.user.GetName(), msg)
			case !allowed && !strings.Contains(msg, tc.msg):
				t.Errorf("dev cluster: %s by %s: refusal %q, want one with %q", tc.name, u.user.GetName(), msg, tc.msg)
			}
		}
	}
}

// The file the dev cluster installs is the one users install (but for the name of dkc-server: asDevUser),
// and exempts nothing.
func TestNodeStatusPolicyFile(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", NodeStatusPolicyFile))
	if err != nil {
		t.Fatal(err)
	}
	policy, binding, err := decodeAdmissionPolicy(data)
	if err != nil {
		t.Fatal(err)
	}
	if mc := policy.Spec.MatchConstraints; mc == nil || mc.ObjectSelector != nil || mc.NamespaceSelector != nil || len(mc.ExcludeResourceRules) > 0 ||
		len(mc.ResourceRules) != 1 || strings.Join(mc.ResourceRules[0].Resources, ",") != "nodes,nodes/status" {
		t.Errorf("policy match constraints exempt something or miss a path to the Node: %+v", mc)
	}
	if binding.Spec.MatchResources != nil || len(binding.Spec.ValidationActions) != 1 || binding.Spec.ValidationActions[0] != "Deny" {
		t.Errorf("binding narrows the policy or does not deny: %+v", binding.Spec)
	}
	for _, v := range policy.Spec.Validations {
		if v.Reason == nil || *v.Reason != metav1.StatusReasonForbidden {
			t.Errorf("validation %q: reason %v, want Forbidden", v.Message, v.Reason)
		}
	}
}
