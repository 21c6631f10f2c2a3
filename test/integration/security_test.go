// SPDX-License-Identifier: Apache-2.0

//go:build integration

package integration

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/dkc-dev/dkc/test/devcluster"
)

// shippedOverlay renders deploy/overlays/<name> as a user installs it (the self-signed overlay with
// certificates from its gen-certs.sh, in a copy so that nothing lands in the checkout) and returns its
// objects that client-go's scheme knows.
func shippedOverlay(t *testing.T, name string) []runtime.Object {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	root, err := devcluster.RepoRoot(wd)
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	if out, err := exec.Command("cp", "-r", filepath.Join(root, "deploy"), tmp).CombinedOutput(); err != nil {
		t.Fatalf("copy deploy/: %v\n%s", err, out)
	}
	if name == "self-signed" {
		if out, err := exec.Command(filepath.Join(tmp, "deploy/overlays/self-signed/gen-certs.sh")).CombinedOutput(); err != nil {
			t.Fatalf("gen-certs.sh: %v\n%s", err, out)
		}
	}
	rendered := kubectl(t, "", "kustomize", filepath.Join(tmp, "deploy/overlays", name))
	var objs []runtime.Object
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewBufferString(rendered)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("read rendered overlay %s: %v", name, err)
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
		if err != nil {
			continue // kinds client-go does not know (none in the self-signed overlay today)
		}
		objs = append(objs, obj)
	}
	return objs
}

// TestNodeCannotReadTheServerKey binds the sidecar's pod, exactly as deploy/ ships it, to a node and asks
// the apiserver, with that node's own kubelet credentials, for what the pod references. The Node
// authorizer lets a node read every Secret and ConfigMap a pod on it references, whatever `items` selects;
// so the pod must reference the CA through a ConfigMap that holds no key, and the node must get Forbidden
// on dkc-server's serving Secret (with tls.key it could impersonate dkc-server to every other node).
func TestNodeCannotReadTheServerKey(t *testing.T) {
	ctx := testContext(t)
	admin := adminClient(t)
	const node, ns = "authz-1", "kube-system"

	var sidecar *appsv1.DaemonSet
	for _, obj := range shippedOverlay(t, "self-signed") {
		switch o := obj.(type) {
		case *appsv1.DaemonSet:
			sidecar = o
		case *corev1.Secret:
			mustCreate(t, func() error { _, err := admin.CoreV1().Secrets(ns).Create(ctx, o, metav1.CreateOptions{}); return err })
			t.Cleanup(func() { _ = admin.CoreV1().Secrets(ns).Delete(context.Background(), o.Name, metav1.DeleteOptions{}) })
		case *corev1.ConfigMap:
			mustCreate(t, func() error {
				_, err := admin.CoreV1().ConfigMaps(ns).Create(ctx, o, metav1.CreateOptions{})
				return err
			})
			t.Cleanup(func() { _ = admin.CoreV1().ConfigMaps(ns).Delete(context.Background(), o.Name, metav1.DeleteOptions{}) })
		}
	}
	if sidecar == nil {
		t.Fatal("the self-signed overlay has no DaemonSet")
	}
	if _, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create node %s: %v", node, err)
	}
	t.Cleanup(func() { _ = admin.CoreV1().Nodes().Delete(context.Background(), node, metav1.DeleteOptions{}) })
	// The pod the DaemonSet controller would create on the node; no kubelet runs for this node, so it
	// never starts, but the Node authorizer's graph sees its references.
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "dkc-sidecar-" + node, Namespace: ns, Labels: sidecar.Spec.Template.Labels},
		Spec: *sidecar.Spec.Template.Spec.DeepCopy()}
	pod.Spec.NodeName = node
	mustCreate(t, func() error { _, err := admin.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); return err })
	t.Cleanup(func() {
		zero := int64(0)
		_ = admin.CoreV1().Pods(ns).Delete(context.Background(), pod.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	})

	cfg, err := cluster.NodeCredentials(node)
	if err != nil {
		t.Fatal(err)
	}
	nodeClient, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// The authorizer's graph follows pods through an informer: wait until the node may read what its pod
	// legitimately needs, the CA.
	var lastErr error
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, lastErr = nodeClient.CoreV1().ConfigMaps(ns).Get(ctx, "dkc-server-ca", metav1.GetOptions{})
		return lastErr == nil, nil
	}); err != nil {
		t.Fatalf("node %s cannot read the CA ConfigMap its sidecar pod references: %v", node, lastErr)
	}
	_, err = nodeClient.CoreV1().Secrets(ns).Get(ctx, "dkc-server-tls", metav1.GetOptions{})
	if !apierrors.IsForbidden(err) {
		t.Errorf("node %s reading dkc-server's serving Secret (tls.key): err %v, want Forbidden", node, err)
	}

	// Another node, with its own kubelet's credentials, reads neither.
	other, err := nodeClientFor(realNode)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.CoreV1().ConfigMaps(ns).Get(ctx, "dkc-server-ca", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("node %s reading a ConfigMap referenced only by %s's pod: err %v, want Forbidden", realNode, node, err)
	}
}

func mustCreate(t *testing.T, create func() error) {
	t.Helper()
	if err := create(); err != nil {
		t.Fatal(err)
	}
}

// nodeClientFor is a client with the real kubelet credentials of node.
func nodeClientFor(node string) (kubernetes.Interface, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", cluster.NodeKubeconfigPath(node))
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(cfg)
}
