// SPDX-License-Identifier: Apache-2.0

//go:build integration

package installed

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

const controlPlaneRole = "node-role.kubernetes.io/control-plane"

// TestNoWorkerCredentialCanAssignAConfig tries, as an attacker with root on a worker would, what that worker's
// credentials can do towards running a config no operator wrote. Root on a node holds the ServiceAccount token
// of every pod bound to it (the Node authorizer hands them out), so for each ServiceAccount of a dkc pod on a
// node without the control-plane role, impersonated with its groups, with dryRun=All: (1) create a ConfigMap
// shaped like a revision snapshot in kube-system, any content; (2) point a Node's dkc.dev/config-source at
// it. Each must be refused at least one of the two. dkc-server runs on control-plane nodes only, and a
// worker's own kubelet credentials cannot read its serving key either.
func TestNoWorkerCredentialCanAssignAConfig(t *testing.T) {
	diagnoseOnFailure(t)
	ctx := ctxFor(t)
	nodeList, err := admin(t).CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	controlPlane := map[string]bool{}
	var workers []string
	for _, n := range nodeList.Items {
		if _, ok := n.Labels[controlPlaneRole]; ok {
			controlPlane[n.Name] = true
		} else {
			workers = append(workers, n.Name)
		}
	}
	if !controlPlane[cluster.ControlPlaneNode()] {
		t.Errorf("control-plane nodes %v: want %s registered with the control-plane role", controlPlane, cluster.ControlPlaneNode())
	}
	if len(workers) == 0 {
		t.Fatalf("no node without the control-plane role: the installed form registers at least one worker")
	}

	pods, err := admin(t).CoreV1().Pods("").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/part-of=dkc"})
	if err != nil {
		t.Fatal(err)
	}
	servers := 0
	seen := map[string]bool{}         // app.kubernetes.io/name of the pods found
	accounts := map[string][]string{} // namespace/serviceaccount → the worker pods running as it
	for _, p := range pods.Items {
		seen[p.Labels["app.kubernetes.io/name"]] = true
		if p.Labels["app.kubernetes.io/name"] == "dkc-server" {
			servers++
			if !controlPlane[p.Spec.NodeName] {
				t.Errorf("dkc-server pod %s runs on %q, which is not a control-plane node", p.Name, p.Spec.NodeName)
			}
		}
		if p.Spec.NodeName != "" && !controlPlane[p.Spec.NodeName] {
			sa := p.Namespace + "/" + p.Spec.ServiceAccountName
			accounts[sa] = append(accounts[sa], p.Name+" on "+p.Spec.NodeName)
		}
	}
	// Without both, the label selector found less than dkc: the check below would prove nothing.
	if servers == 0 || !seen["dkc-sidecar"] {
		t.Fatalf("pods labelled app.kubernetes.io/part-of=dkc: %d dkc-server, dkc-sidecar found %v; want both", servers, seen["dkc-sidecar"])
	}
	if len(accounts) == 0 {
		t.Fatalf("no dkc pod on the workers %v: the sidecar runs on every node", workers)
	}

	names := make([]string, 0, len(accounts))
	for sa := range accounts {
		names = append(names, sa)
	}
	sort.Strings(names)
	for _, sa := range names {
		t.Run(sa, func(t *testing.T) {
			c := impersonateServiceAccount(t, sa)
			created, assigned := tryAssignForgedConfig(t, c, cluster.ControlPlaneNode())
			t.Logf("%s (%v): snapshot-shaped ConfigMap: %s; Node assignment: %s", sa, accounts[sa], outcome(created), outcome(assigned))
			if created == nil && assigned == nil {
				t.Errorf("ServiceAccount %s of %v, on a worker, may both create a revision snapshot of any content and "+
					"point a Node at it: root on that worker is root on every node", sa, accounts[sa])
			}
			for what, err := range map[string]error{"create": created, "assign": assigned} {
				if err != nil && !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) {
					t.Errorf("%s: %v, want Forbidden (or Invalid, from an admission policy)", what, err)
				}
			}
		})
	}

	// A worker's own kubelet credentials: no pod on it references dkc-server's serving Secret.
	worker := workers[0]
	cfg, err := cluster.NodeCredentials(worker)
	if err != nil {
		t.Fatal(err)
	}
	nodeClient, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nodeClient.CoreV1().Secrets("kube-system").Get(ctx, "dkc-server-tls", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("worker %s reading dkc-server-tls with its own credentials: err %v, want Forbidden", worker, err)
	}
}

// impersonateServiceAccount is a client acting as namespace/name, with the groups a ServiceAccount token
// authenticates with.
func impersonateServiceAccount(t *testing.T, nsName string) kubernetes.Interface {
	t.Helper()
	ns, name, _ := strings.Cut(nsName, "/")
	cfg, err := cluster.RESTConfig()
	if err != nil {
		t.Fatal(err)
	}
	cfg.Impersonate.UserName = "system:serviceaccount:" + ns + ":" + name
	cfg.Impersonate.Groups = []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// tryAssignForgedConfig makes, with dryRun=All, the two requests that together make node run a config of the
// caller's choosing: a ConfigMap shaped like a revision snapshot (dkc-server's policy checks the shape, not
// the content) and node's dkc.dev/config-source pointed at it. It returns each request's error.
func tryAssignForgedConfig(t *testing.T, c kubernetes.Interface, node string) (created, assigned error) {
	t.Helper()
	const pool, revision = "forged", "1"
	immutable := true
	_, created = c.CoreV1().ConfigMaps("kube-system").Create(ctxFor(t), &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: pool + "-" + revision,
			Labels: map[string]string{"dkc.dev/pool": pool, "dkc.dev/revision": revision}},
		Immutable: &immutable,
		Data: map[string]string{"kubelet": "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n" +
			"staticPodPath: /etc/forged\n"},
	}, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	src, _ := json.Marshal(map[string]any{"configMap": map[string]string{
		"namespace": "kube-system", "name": pool + "-" + revision, "kubeletConfigKey": "kubelet"}})
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{"dkc.dev/config-source": string(src)}}})
	_, assigned = c.CoreV1().Nodes().Patch(ctxFor(t), node, types.MergePatchType, patch,
		metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
	return created, assigned
}

func outcome(err error) string {
	if err == nil {
		return "ALLOWED"
	}
	return fmt.Sprintf("refused (%v)", err)
}
