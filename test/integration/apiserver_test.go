// SPDX-License-Identifier: Apache-2.0

//go:build integration

// Package integration holds tests against the real local cluster (real etcd, kube-apiserver, containerd and
// kubelet). Run with `make test` (or `go test -tags integration ./test/integration/`) as root.
package integration

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/dkc-dev/dkc/internal/poll"
	"github.com/dkc-dev/dkc/test/devcluster"
	"github.com/dkc-dev/dkc/test/devcluster/devclustertest"
)

var cluster *devcluster.Cluster

func TestMain(m *testing.M) { os.Exit(devclustertest.Main(m, "integration", bySlowest, &cluster)) }

func adminClient(t *testing.T) kubernetes.Interface {
	t.Helper()
	c, err := cluster.Client()
	if err != nil {
		t.Fatalf("admin client: %v", err)
	}
	return c
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

var configSource = &corev1.NodeConfigSource{ConfigMap: &corev1.ConfigMapNodeConfigSource{
	Namespace: "kube-system", Name: "my-node-config", KubeletConfigKey: "kubelet",
}}

// TestAPIServerDropsDynamicConfigFields guards dkc's design (docs/design.md, "The apiserver fact"): a v1.34 apiserver accepts writes
// of spec.configSource and status.config and silently drops them, while annotations and custom Node
// conditions survive. If this test ever fails, the annotation fallback may no longer be needed, or status
// writes must change.
func TestAPIServerDropsDynamicConfigFields(t *testing.T) {
	ctx := testContext(t)
	client := adminClient(t)
	nodes := client.CoreV1().Nodes()

	t.Run("create", func(t *testing.T) {
		created, err := nodes.Create(ctx, &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: "contract-create"},
			Spec:       corev1.NodeSpec{ConfigSource: configSource},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create node with spec.configSource: %v", err)
		}
		t.Cleanup(func() { _ = nodes.Delete(context.Background(), created.Name, metav1.DeleteOptions{}) })
		if created.Spec.ConfigSource != nil {
			t.Errorf("spec.configSource kept on create: %+v", created.Spec.ConfigSource)
		}
	})

	// A Node no dkc sidecar serves: on node-1 dkc itself owns the ConfigOK condition.
	node := "contract-guard"
	if _, err := nodes.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nodes.Delete(context.Background(), node, metav1.DeleteOptions{}) })
	t.Run("spec patch", func(t *testing.T) {
		patch := `{"spec":{"configSource":{"configMap":{"namespace":"kube-system","name":"my-node-config","kubeletConfigKey":"kubelet"}}}}`
		got, err := nodes.Patch(ctx, node, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{})
		if err != nil {
			t.Fatalf("patch spec.configSource: %v (the apiserver is expected to accept it)", err)
		}
		if got.Spec.ConfigSource != nil {
			t.Errorf("patch response kept spec.configSource: %+v", got.Spec.ConfigSource)
		}
		stored, err := nodes.Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if stored.Spec.ConfigSource != nil {
			t.Errorf("stored node kept spec.configSource: %+v", stored.Spec.ConfigSource)
		}
	})

	t.Run("spec update", func(t *testing.T) {
		stored, err := nodes.Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		stored.Spec.ConfigSource = configSource
		got, err := nodes.Update(ctx, stored, metav1.UpdateOptions{})
		if err != nil {
			t.Fatalf("update with spec.configSource: %v", err)
		}
		if got.Spec.ConfigSource != nil {
			t.Errorf("update kept spec.configSource: %+v", got.Spec.ConfigSource)
		}
	})

	t.Run("status and annotation", func(t *testing.T) {
		status := corev1.NodeConfigStatus{Assigned: &corev1.NodeConfigSource{ConfigMap: &corev1.ConfigMapNodeConfigSource{
			Namespace: "kube-system", Name: "my-node-config", KubeletConfigKey: "kubelet", UID: "1234", ResourceVersion: "5",
		}}}
		patch, _ := json.Marshal(map[string]any{"status": map[string]any{
			"config": status,
			"conditions": []corev1.NodeCondition{{
				Type: "ConfigOK", Status: corev1.ConditionTrue, Reason: "Contract", Message: "using current (local)",
				LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now(),
			}},
		}})
		// As dkc-server: the admission policy dkc-node-status-writers lets nobody else write ConfigOK.
		cfg, err := cluster.RESTConfig()
		if err != nil {
			t.Fatal(err)
		}
		cfg.Impersonate.UserName = devcluster.ServiceUser
		server, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := server.CoreV1().Nodes().PatchStatus(ctx, node, patch); err != nil {
			t.Fatalf("patch status: %v", err)
		}
		annotation := `{"configMap":{"namespace":"kube-system","name":"my-node-config","kubeletConfigKey":"kubelet"}}` // valid: the webhook admits it
		ap, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{"dkc.dev/config-source": annotation}}})
		if _, err := nodes.Patch(ctx, node, types.StrategicMergePatchType, ap, metav1.PatchOptions{}); err != nil {
			t.Fatalf("patch annotation: %v", err)
		}
		t.Cleanup(func() {
			_, _ = nodes.Patch(context.Background(), node, types.StrategicMergePatchType,
				[]byte(`{"metadata":{"annotations":{"dkc.dev/config-source":null}}}`), metav1.PatchOptions{})
		})
		// Read after the service had time to react to the annotation: it writes status only for nodes whose
		// sidecar reported, so the condition must be ours, untouched.
		time.Sleep(2 * time.Second) // proves a negative: the service writes no status meanwhile
		stored, err := nodes.Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if stored.Status.Config != nil {
			t.Errorf("status.config kept: %+v", stored.Status.Config)
		}
		var found bool
		for _, c := range stored.Status.Conditions {
			if c.Type == "ConfigOK" && c.Status == corev1.ConditionTrue && c.Message == "using current (local)" {
				found = true
			}
		}
		if !found {
			t.Errorf("custom condition ConfigOK not kept; conditions: %+v", stored.Status.Conditions)
		}
		if got := stored.Annotations["dkc.dev/config-source"]; got != annotation {
			t.Errorf("annotation dkc.dev/config-source = %q, want %q", got, annotation)
		}
	})
}

// TestConfigzThroughNodeProxy is the seed doc's recipe: the running kubelet's configuration through the
// apiserver's node proxy.
func TestConfigzThroughNodeProxy(t *testing.T) {
	ctx := testContext(t)
	client := adminClient(t)
	var raw []byte
	// The kubelet may still be waiting for its addresses right after start.
	poll.ForNil(t, time.Minute, time.Second, "GET configz through the node proxy", func() error {
		var err error
		raw, err = client.CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes/node-1/proxy/configz").DoRaw(ctx)
		return err
	})
	var configz struct {
		KubeletConfig map[string]any `json:"kubeletconfig"`
	}
	if err := json.Unmarshal(raw, &configz); err != nil {
		t.Fatalf("decode configz %q: %v", raw, err)
	}
	if got := configz.KubeletConfig["healthzPort"]; got != float64(cluster.State().Nodes[0].HealthzPort) {
		t.Errorf("configz healthzPort = %v, want %d (the node's local config)", got, cluster.State().Nodes[0].HealthzPort)
	}
	if !strings.Contains(string(raw), `"eventRecordQPS"`) {
		t.Errorf("configz lacks eventRecordQPS: %s", raw)
	}
}
