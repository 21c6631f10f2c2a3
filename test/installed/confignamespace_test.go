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

	"github.com/dkc-dev/dkc/api/v1alpha1"
	"github.com/dkc-dev/dkc/internal/poll"
)

// configNamespace is the dedicated config namespace of deploy/components/config-namespace, which
// deploy/overlays/dev (the installed form) includes.
const configNamespace = "dkc-configs"

// TestDedicatedConfigNamespace: the installed form serves configs from dkc-configs beside kube-system, and
// the Role dkc-config-editor is the right to change kubelets there and nothing more:
//   - dkc-server runs with --config-namespaces=kube-system,dkc-configs, and its webhook refuses a source in
//     a third namespace, naming both;
//   - a ConfigMap in dkc-configs assigned to node-1 with `kubectl dkc assign` becomes its running config;
//   - a user bound to dkc-config-editor (impersonated) updates that ConfigMap, and node-1's kubelet follows;
//     the same user is Forbidden to create or update ConfigMaps in kube-system, or to patch a Node;
//   - a pool whose ConfigMap is in dkc-configs gets its revision snapshot there (dkc-server's Role creates
//     it; the admission policy dkc-server-configmaps allows it in any namespace) and node-2 runs it.
func TestDedicatedConfigNamespace(t *testing.T) {
	const pool = "installed-confns"
	// Registered first, so it runs last, after the reset: then no node uses the pool's snapshots.
	t.Cleanup(func() {
		_ = admin(t).CoreV1().ConfigMaps(configNamespace).DeleteCollection(context.Background(), metav1.DeleteOptions{},
			metav1.ListOptions{LabelSelector: v1alpha1.LabelPool + "=" + pool})
	})
	resetAfter(t)
	deletePoolAtEnd(t, pool)
	ctx := ctxFor(t)

	// 1. What the component put into the install.
	d, err := admin(t).AppsV1().Deployments("kube-system").Get(ctx, "dkc-server", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if args := d.Spec.Template.Spec.Containers[0].Args; !slices.Contains(args, "--config-namespaces=kube-system,dkc-configs") {
		t.Fatalf("dkc-server args %v: no --config-namespaces=kube-system,dkc-configs (is the component in deploy/overlays/dev?)", args)
	}
	src := `{"configMap":{"namespace":"default","name":"installed-confns-elsewhere","kubeletConfigKey":"kubelet"}}`
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{"dkc.dev/config-source": src}}})
	_, err = admin(t).CoreV1().Nodes().Patch(ctx, "node-1", types.MergePatchType, patch, metav1.PatchOptions{})
	if err == nil || !strings.Contains(err.Error(), "kube-system") || !strings.Contains(err.Error(), configNamespace) {
		t.Fatalf("a source in namespace default: %v; want the webhook's refusal naming kube-system and %s", err, configNamespace)
	}

	// 2. A config in dkc-configs, assigned by hand.
	const node = "node-1"
	cm := createConfigIn(t, configNamespace, "installed-confns-a", nodeConfig(t, node, 33))
	before := kubeletStarts(t, node)
	if out, err := kubectlDKC(ctx, "assign", node, "--configmap", configNamespace+"/"+cm.Name); err != nil {
		t.Fatalf("kubectl dkc assign: %v\n%s", err, out)
	}
	waitRunning(t, node, cm, 2*time.Minute)
	if got := configzQPS(t, node); got != 33 {
		t.Errorf("configz eventRecordQPS = %v, want 33", got)
	}
	if n := kubeletStarts(t, node) - before; n != 1 {
		t.Errorf("kubelet of %s started %d times for one assignment, want 1", node, n)
	}

	// 3. A config editor: the ConfigMaps of dkc-configs, nothing else.
	editor := configEditor(t, "kubelet-config-editor@example.test")
	before = kubeletStarts(t, node)
	var edited *corev1.ConfigMap
	// Refused until the authorizer's cache has the RoleBinding.
	poll.ForNil(t, time.Minute, 500*time.Millisecond, fmt.Sprintf("dkc-config-editor to update %s/%s", configNamespace, cm.Name), func() error {
		cur, err := editor.CoreV1().ConfigMaps(configNamespace).Get(ctx, cm.Name, metav1.GetOptions{})
		if err == nil {
			cur.Data["kubelet"] = nodeConfig(t, node, 34)
			edited, err = editor.CoreV1().ConfigMaps(configNamespace).Update(ctx, cur, metav1.UpdateOptions{})
		}
		if err != nil && !apierrors.IsForbidden(err) {
			t.Fatalf("dkc-config-editor updating %s/%s: %v", configNamespace, cm.Name, err)
		}
		return err
	})
	waitRunning(t, node, edited, 2*time.Minute) // a Node pointed straight at a ConfigMap follows its edits
	if got := configzQPS(t, node); got != 34 {
		t.Errorf("configz eventRecordQPS = %v after the editor's update, want 34", got)
	}
	if n := kubeletStarts(t, node) - before; n != 1 {
		t.Errorf("kubelet of %s started %d times for one edit, want 1", node, n)
	}
	ks := createConfigIn(t, "kube-system", "installed-confns-ks", nodeConfig(t, node, 35))
	ks.Data["kubelet"] = nodeConfig(t, node, 36)
	if _, err := editor.CoreV1().ConfigMaps("kube-system").Update(ctx, ks, metav1.UpdateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("dkc-config-editor updating kube-system/%s: %v, want Forbidden", ks.Name, err)
	}
	if _, err := editor.CoreV1().ConfigMaps("kube-system").Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "installed-confns-forbidden"}, Data: map[string]string{"kubelet": ""},
	}, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("dkc-config-editor creating a ConfigMap in kube-system: %v, want Forbidden", err)
		_ = admin(t).CoreV1().ConfigMaps("kube-system").Delete(context.Background(), "installed-confns-forbidden", metav1.DeleteOptions{})
	}
	if _, err := editor.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, []byte(`{"metadata":{"annotations":{"dkc.dev/config-source":null}}}`),
		metav1.PatchOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("dkc-config-editor patching Node %s: %v, want Forbidden (assigning is a right of its own)", node, err)
	}

	// 4. A pool in dkc-configs: its snapshot is written there.
	createConfigIn(t, configNamespace, "installed-confns-pool", nodeConfig(t, "node-2", 37))
	out, err := kubectlDKC(ctx, "rollout", pool, "--configmap", configNamespace+"/installed-confns-pool",
		"-l", "kubernetes.io/hostname=node-2", "--max-unavailable", "1", "--timeout", "4m")
	if err != nil || !strings.Contains(out, "rollout complete") {
		t.Fatalf("kubectl dkc rollout: %v\n%s", err, out)
	}
	p, err := cluster.KubeletConfigPool(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	snap, err := admin(t).CoreV1().ConfigMaps(configNamespace).Get(ctx, v1alpha1.SnapshotName(pool, p.Status.CurrentRevision), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the pool's snapshot in %s: %v", configNamespace, err)
	}
	waitRunning(t, "node-2", snap, time.Minute)
	if got := configzQPS(t, "node-2"); got != 37 {
		t.Errorf("node-2 configz eventRecordQPS = %v, want 37", got)
	}
}

// createConfigIn creates ns/name with data as its kubelet key, deleted when t ends.
func createConfigIn(t *testing.T, ns, name, data string) *corev1.ConfigMap {
	t.Helper()
	cm, err := admin(t).CoreV1().ConfigMaps(ns).Create(ctxFor(t), &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Data:       map[string]string{"kubelet": data},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create configmap %s/%s: %v", ns, name, err)
	}
	t.Cleanup(func() {
		_ = admin(t).CoreV1().ConfigMaps(ns).Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	return cm
}

// configEditor binds user to the Role dkc-config-editor in dkc-configs, as docs/install.md tells a platform
// team to, and returns a client acting as user (the admin impersonating it). The binding goes when t ends.
func configEditor(t *testing.T, user string) kubernetes.Interface {
	t.Helper()
	b := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "installed-confns-editor", Namespace: configNamespace},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "dkc-config-editor"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
	}
	if _, err := admin(t).RbacV1().RoleBindings(configNamespace).Create(ctxFor(t), b, metav1.CreateOptions{}); err != nil {
		t.Fatalf("bind %s to dkc-config-editor: %v", user, err)
	}
	t.Cleanup(func() {
		_ = admin(t).RbacV1().RoleBindings(configNamespace).Delete(context.Background(), b.Name, metav1.DeleteOptions{})
	})
	cfg, err := cluster.RESTConfig()
	if err != nil {
		t.Fatal(err)
	}
	cfg.Impersonate.UserName = user
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
