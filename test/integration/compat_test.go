//go:build integration

package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/scheme"

	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
)

// upgradeNode makes a Node look like one that came through an upgrade from a cluster with
// DynamicKubeletConfig: it writes spec.configSource and status.config into the Node's etcd record, which a
// v1.24+ apiserver then keeps (it drops them only when the stored Node lacks them,
// pkg/registry/core/node/strategy.go). A v1.23 apiserver would need its generated openapi code built first;
// this is the state every upgraded cluster's Nodes are in, reached without it.
func upgradeNode(t *testing.T, node string, src *corev1.NodeConfigSource) {
	t.Helper()
	ctx := testContext(t)
	etcd, err := clientv3.New(clientv3.Config{Endpoints: []string{fmt.Sprintf("http://127.0.0.1:%d", cluster.State().EtcdPort)}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer etcd.Close()
	key := "/registry/minions/" + node
	resp, err := etcd.Get(ctx, key)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("read %s from etcd: %v (%d keys)", key, err, len(resp.Kvs))
	}
	codec := protobuf.NewSerializer(scheme.Scheme, scheme.Scheme)
	obj, _, err := codec.Decode(resp.Kvs[0].Value, nil, &corev1.Node{})
	if err != nil {
		t.Fatalf("decode stored node: %v", err)
	}
	n := obj.(*corev1.Node)
	n.Spec.ConfigSource = src
	n.Status.Config = &corev1.NodeConfigStatus{}
	n.APIVersion, n.Kind = "v1", "Node"
	var buf bytes.Buffer
	if err := codec.Encode(n, &buf); err != nil {
		t.Fatal(err)
	}
	if _, err := etcd.Put(ctx, key, buf.String()); err != nil {
		t.Fatal(err)
	}
}

// TestCompatNativeConfigSource proves the native path: a Node whose spec.configSource the apiserver keeps
// is resolved from it (no annotation), updates of the field through the API are kept and followed, and the
// node's status is written to status.config as well as to the annotation.
func TestCompatNativeConfigSource(t *testing.T) {
	ctx := testContext(t)
	client := adminClient(t)
	token := simNode(t, "compat-1")
	first := createConfigMap(t, "compat-first", map[string]string{"kubelet": "a"})
	second := createConfigMap(t, "compat-second", map[string]string{"kubelet": "b"})
	upgradeNode(t, "compat-1", &corev1.NodeConfigSource{ConfigMap: &corev1.ConfigMapNodeConfigSource{
		Namespace: "kube-system", Name: "compat-first", KubeletConfigKey: "kubelet"}})

	var stored *corev1.Node
	deadline := time.Now().Add(30 * time.Second)
	for {
		var err error
		stored, err = client.CoreV1().Nodes().Get(ctx, "compat-1", metav1.GetOptions{})
		if err == nil && stored.Spec.ConfigSource != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("apiserver does not serve the upgraded node's spec.configSource: %v %+v", err, stored)
		}
		time.Sleep(200 * time.Millisecond)
	}

	w := watch(t, token, "compat-1", nil)
	m := w.next("assignment from spec.configSource", hasConfigMap("compat-first", first.ResourceVersion))
	src := m.GetAssignment().GetSource()

	// An update of spec.configSource through the API is kept (the stored node has it) and followed.
	patch := `{"spec":{"configSource":{"configMap":{"namespace":"kube-system","name":"compat-second","kubeletConfigKey":"kubelet"}}}}`
	got, err := client.CoreV1().Nodes().Patch(ctx, "compat-1", types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{})
	if err != nil || got.Spec.ConfigSource == nil || got.Spec.ConfigSource.ConfigMap.Name != "compat-second" {
		t.Fatalf("patch spec.configSource of an upgraded node: %v, %+v", err, got.Spec.ConfigSource)
	}
	m = w.next("assignment after the spec change", hasConfigMap("compat-second", second.ResourceVersion))
	src = m.GetAssignment().GetSource()

	// Status goes to status.config too, where the apiserver keeps it.
	svc := serviceClient(t)
	if _, err := svc.ReportStatus(withToken(ctx, token), &dkcv1.ReportStatusRequest{NodeName: "compat-1",
		Status: &dkcv1.NodeConfigStatus{Assigned: src, Active: src}, ObservedTime: timestamppb.Now()}); err != nil {
		t.Fatal(err)
	}
	node, err := client.CoreV1().Nodes().Get(ctx, "compat-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if node.Status.Config == nil || node.Status.Config.Active == nil || node.Status.Config.Active.ConfigMap.UID != second.UID ||
		node.Status.Config.Active.ConfigMap.ResourceVersion != second.ResourceVersion {
		t.Errorf("status.config = %+v, want active compat-second", node.Status.Config)
	}
	var ann corev1.NodeConfigStatus
	if err := json.Unmarshal([]byte(node.Annotations["dkc.dev/config-status"]), &ann); err != nil || ann.Active == nil {
		t.Errorf("status annotation = %q", node.Annotations["dkc.dev/config-status"])
	}

	// The spec wins over an annotation, as CONTRACT §3 orders them.
	setSource(t, client, "compat-1", cmSource("compat-first"))
	w.quiet(2 * time.Second)
}
