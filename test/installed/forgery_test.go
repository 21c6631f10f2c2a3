// SPDX-License-Identifier: Apache-2.0

//go:build integration

package installed

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/dkc-dev/dkc/internal/poll"
)

// The refusals of the admission policy dkc-node-status-writers (deploy/base/node-status-policy.yaml).
const (
	forgedStatusMsg     = "only dkc-server may set or change a Node's annotation dkc.dev/config-status"
	forgedAssignmentMsg = "only dkc-server may set or change a Node's annotation dkc.dev/pool-assignment"
	forgedConfigOKMsg   = "only dkc-server may set or change a Node's ConfigOK condition"
	forgedPreviewMsg    = "only dkc-server may set or change a Node's ConfigPreview condition"
)

// impersonating is the admin's client acting as user in groups, as the apiserver would authenticate them.
func impersonating(t *testing.T, user string, groups ...string) kubernetes.Interface {
	t.Helper()
	cfg, err := cluster.RESTConfig()
	if err != nil {
		t.Fatal(err)
	}
	cfg.Impersonate.UserName, cfg.Impersonate.Groups = user, slices.Concat(groups, []string{"system:authenticated"})
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestNodeStatusCannotBeForged: what the pool controller acts on — a Node's dkc.dev/config-status and
// dkc.dev/pool-assignment — and its ConfigOK and ConfigPreview conditions are written by dkc-server alone.
// node-2's own kubelet credentials, a ServiceAccount that may patch nodes/status (as node-problem-detector or
// a CNI agent does), and one that may too and is named dkc-server in another namespace, are refused a forged
// "updated" status, an assignment time in the future, a forged ConfigOK and a forged ConfigPreview answer,
// through the Node and through nodes/status, on create too, and may not remove them; an administrator may
// remove them (kubectl dkc uninstall). The kubelet's heartbeats, the writer's own condition and dkc-server's
// status reports still go through. Every forged write is a dry run: without the policy, nothing would change.
func TestNodeStatusCannotBeForged(t *testing.T) {
	resetAfter(t)
	ctx := ctxFor(t)
	const node = "node-2"
	kubelet := impersonating(t, "system:node:"+node, "system:nodes")

	// A ServiceAccount that may patch Node status and nothing else (it need not exist to be impersonated).
	const writerNS, writerName = "kube-system", "dkc-test-status-writer"
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: writerName},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes/status"}, Verbs: []string{"get", "patch", "update"}}},
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: writerName},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: writerName},
		// And a ServiceAccount named as dkc-server's, in another namespace: the name alone is nobody to dkc.
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: writerNS, Name: writerName},
			{Kind: rbacv1.ServiceAccountKind, Namespace: "default", Name: "dkc-server"}},
	}
	if _, err := admin(t).RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = admin(t).RbacV1().ClusterRoles().Delete(context.Background(), writerName, metav1.DeleteOptions{})
	})
	if _, err := admin(t).RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = admin(t).RbacV1().ClusterRoleBindings().Delete(context.Background(), writerName, metav1.DeleteOptions{})
	})
	writer := impersonating(t, "system:serviceaccount:"+writerNS+":"+writerName,
		"system:serviceaccounts", "system:serviceaccounts:"+writerNS)
	otherDKC := impersonating(t, "system:serviceaccount:default:dkc-server", "system:serviceaccounts", "system:serviceaccounts:default")

	dryRun := metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}}
	patch := func(c kubernetes.Interface, pt types.PatchType, body any, sub ...string) error {
		data, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.CoreV1().Nodes().Patch(ctx, node, pt, data, dryRun, sub...)
		return err
	}
	annotation := func(key string, value any) map[string]any {
		return map[string]any{"metadata": map[string]any{"annotations": map[string]any{key: value}}}
	}
	condition := func(c corev1.NodeCondition) map[string]any {
		return map[string]any{"status": map[string]any{"conditions": []corev1.NodeCondition{c}}}
	}
	refused := func(what string, err error, msg string, or ...string) {
		t.Helper()
		ok := apierrors.IsForbidden(err) && strings.Contains(err.Error(), msg)
		for _, m := range or {
			ok = ok || apierrors.IsForbidden(err) && strings.Contains(err.Error(), m)
		}
		if !ok {
			t.Errorf("%s: err %v, want Forbidden with %q", what, err, msg)
		}
	}

	// The writer's own work goes through (polled: RBAC takes a moment to see the new binding).
	own := condition(corev1.NodeCondition{Type: "KernelDeadlock", Status: corev1.ConditionFalse, Reason: "KernelHasNoDeadlock",
		LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()})
	for _, w := range []kubernetes.Interface{writer, otherDKC} {
		poll.ForNil(t, 30*time.Second, 200*time.Millisecond, "the status writer to write its own condition", func() error {
			return patch(w, types.StrategicMergePatchType, own, "status")
		})
	}

	// node-2 on its local config: dkc-server reported it ({} and ConfigOK True). The forgeries.
	n, err := admin(t).CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := n.Annotations["dkc.dev/config-status"]; !ok || !slices.ContainsFunc(n.Status.Conditions, func(c corev1.NodeCondition) bool {
		return c.Type == "ConfigOK"
	}) {
		t.Fatalf("%s has no dkc.dev/config-status or ConfigOK to start from: %v %+v", node, n.Annotations, n.Status.Conditions)
	}
	const cm = `{"configMap":{"namespace":"kube-system","name":"bad-x","kubeletConfigKey":"kubelet","uid":"u","resourceVersion":"1"}}`
	updated := annotation("dkc.dev/config-status", `{"assigned":`+cm+`,"active":`+cm+`,"lastKnownGood":`+cm+`}`)
	future := annotation("dkc.dev/pool-assignment", `{"pool":"blue","revision":"x","time":"2099-01-01T00:00:00Z"}`)
	okCond := condition(corev1.NodeCondition{Type: "ConfigOK", Status: corev1.ConditionTrue, Reason: "UsingCurrent",
		Message: "using current (UID: u)", LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()})
	removeOK := map[string]any{"status": map[string]any{"conditions": []any{map[string]any{"type": "ConfigOK", "$patch": "delete"}}}}
	// A node answering a pool's preview for itself: "nothing affected" would let the pool assign it.
	previewCond := condition(corev1.NodeCondition{Type: "ConfigPreview", Status: corev1.ConditionTrue,
		Reason: "NoPodsAffected", Message: "revision x of pool blue (requested 2026-01-01T00:00:00Z): nothing",
		LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()})
	for _, c := range []struct {
		who    string
		client kubernetes.Interface
		// through says whether it may patch the Node itself (RBAC refuses the writer that before the policy).
		through bool
		// or: another refusal that also answers (the policy dkc-config-source, which narrows every
		// ServiceAccount named dkc-server, refuses it an assignment through nodes/status first).
		or []string
	}{{"node-2's kubelet", kubelet, true, nil}, {"the status writer", writer, false, nil},
		{"another namespace's dkc-server", otherDKC, false, []string{"ValidatingAdmissionPolicy 'dkc-config-source'"}}} {
		// dkc-config-source lets a dkc-server write config-status and ConfigOK through nodes/status: only
		// dkc-node-status-writers, which names kube-system's alone, refuses those to otherDKC.
		refused(c.who+": updated status via nodes/status", patch(c.client, types.MergePatchType, updated, "status"), forgedStatusMsg)
		refused(c.who+": future assignment via nodes/status", patch(c.client, types.MergePatchType, future, "status"), forgedAssignmentMsg, c.or...)
		refused(c.who+": ConfigOK via nodes/status", patch(c.client, types.StrategicMergePatchType, okCond, "status"), forgedConfigOKMsg)
		refused(c.who+": status removed via nodes/status", patch(c.client, types.MergePatchType, annotation("dkc.dev/config-status", nil), "status"), forgedStatusMsg)
		refused(c.who+": ConfigOK removed", patch(c.client, types.StrategicMergePatchType, removeOK, "status"), forgedConfigOKMsg)
		refused(c.who+": ConfigPreview via nodes/status", patch(c.client, types.StrategicMergePatchType, previewCond, "status"),
			forgedPreviewMsg)
		if c.through {
			refused(c.who+": updated status via the Node", patch(c.client, types.MergePatchType, updated), forgedStatusMsg)
			refused(c.who+": future assignment via the Node", patch(c.client, types.MergePatchType, future), forgedAssignmentMsg)
			refused(c.who+": status removed via the Node", patch(c.client, types.MergePatchType, annotation("dkc.dev/config-status", nil)), forgedStatusMsg)
		}
	}
	// On create: a node may delete its own Node and register it again, and nobody but dkc-server registers
	// one with dkc's status. Admission runs before the store finds that node-2 exists.
	forged := func(name string, f func(*corev1.Node)) *corev1.Node {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{}}}
		f(n)
		return n
	}
	create := func(c kubernetes.Interface, n *corev1.Node) error {
		_, err := c.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	}
	for _, who := range []struct {
		name   string
		client kubernetes.Interface
		node   string
	}{{"node-2's kubelet", kubelet, node}, {"an administrator", admin(t), "dkc-test-forged"}} {
		refused(who.name+": create with a status", create(who.client, forged(who.node, func(n *corev1.Node) {
			n.Annotations["dkc.dev/config-status"] = `{"active":` + cm + `}`
		})), forgedStatusMsg)
		refused(who.name+": create with a future assignment", create(who.client, forged(who.node, func(n *corev1.Node) {
			n.Annotations["dkc.dev/pool-assignment"] = `{"pool":"blue","revision":"x","time":"2099-01-01T00:00:00Z"}`
		})), forgedAssignmentMsg)
		refused(who.name+": create with ConfigOK", create(who.client, forged(who.node, func(n *corev1.Node) {
			n.Status.Conditions = []corev1.NodeCondition{{Type: "ConfigOK", Status: corev1.ConditionTrue, Reason: "UsingCurrent"}}
		})), forgedConfigOKMsg)
	}
	// An administrator sets nothing either, and may remove dkc's marks (kubectl dkc uninstall's step 3).
	refused("admin: updated status via nodes/status", patch(admin(t), types.MergePatchType, updated, "status"), forgedStatusMsg)
	if err := patch(admin(t), types.MergePatchType, annotation("dkc.dev/config-status", nil)); err != nil {
		t.Errorf("admin removing dkc.dev/config-status: %v", err)
	}
	if err := patch(admin(t), types.StrategicMergePatchType, removeOK, "status"); err != nil {
		t.Errorf("admin removing ConfigOK: %v", err)
	}

	// The kubelet's status writes keep landing, and dkc-server's: an assignment goes active (dkc-server's
	// report), and the kubelet it restarted posts its status (a newer Ready heartbeat).
	heartbeat := func() (metav1.Time, bool) {
		n, err := admin(t).CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady {
				return c.LastHeartbeatTime, c.Status == corev1.ConditionTrue
			}
		}
		return metav1.Time{}, false
	}
	before, _ := heartbeat()
	cfg := createConfig(t, "forgery-qps-23", node, 23)
	assign(t, node, cfg)
	waitRunning(t, node, cfg, 2*time.Minute)
	poll.ForNil(t, 2*time.Minute, time.Second, node+": the kubelet's status to land", func() error {
		if at, ready := heartbeat(); !ready || !at.After(before.Time) {
			return fmt.Errorf("heartbeat %v (before the assignment %v), Ready %v", at, before, ready)
		}
		return nil
	})
}

// nodeCannotDropItsAssignment checks that node's own kubelet credentials may not remove the
// dkc.dev/pool-assignment its pool wrote, through the Node or nodes/status (dry runs): without the record
// the pool would never time the node out. node must carry a pool's assignment.
func nodeCannotDropItsAssignment(t *testing.T, node string) {
	t.Helper()
	ctx := ctxFor(t)
	n, err := admin(t).CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := n.Annotations["dkc.dev/pool-assignment"]; !ok {
		t.Fatalf("%s carries no dkc.dev/pool-assignment to remove", node)
	}
	kubelet := impersonating(t, "system:node:"+node, "system:nodes")
	drop := []byte(`{"metadata":{"annotations":{"dkc.dev/pool-assignment":null}}}`)
	for _, sub := range [][]string{{"status"}, nil} {
		_, err := kubelet.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, drop, metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}}, sub...)
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), forgedAssignmentMsg) {
			t.Errorf("%s's kubelet removing its pool assignment (subresource %v): err %v, want Forbidden with %q", node, sub, err, forgedAssignmentMsg)
		}
	}
}
