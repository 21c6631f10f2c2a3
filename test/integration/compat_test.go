// SPDX-License-Identifier: Apache-2.0

//go:build integration

package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/dkc-dev/dkc/internal/nodeconfig/wire"
	"github.com/dkc-dev/dkc/internal/poll"
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

	waitForConfigSource(t, "compat-1")

	w := watch(t, token, "compat-1", nil)
	w.next("assignment from spec.configSource", hasConfigMap("compat-first", first.ResourceVersion))

	// An update of spec.configSource through the API is kept (the stored node has it) and followed.
	patch := `{"spec":{"configSource":{"configMap":{"namespace":"kube-system","name":"compat-second","kubeletConfigKey":"kubelet"}}}}`
	got, err := client.CoreV1().Nodes().Patch(ctx, "compat-1", types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{})
	if err != nil || got.Spec.ConfigSource == nil || got.Spec.ConfigSource.ConfigMap.Name != "compat-second" {
		t.Fatalf("patch spec.configSource of an upgraded node: %v, %+v", err, got.Spec.ConfigSource)
	}
	m := w.next("assignment after the spec change", hasConfigMap("compat-second", second.ResourceVersion))
	src := m.GetAssignment().GetSource()

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

	// The spec wins over an annotation, as docs/design.md, "Where a Node's config source is read" orders them.
	setSource(t, client, "compat-1", cmSource("compat-first"))
	w.quiet(2 * time.Second)
}

// TestCompatStatusConfigClears moves an upgraded Node (whose apiserver keeps status.config) through
// assigned → error set → error cleared → reset, as a sidecar reports them, and checks after each step that
// status.config and the annotation say exactly what was reported: a field the node no longer reports is
// gone from status.config (every NodeConfigStatus field is omitempty, so only a patch that sends null
// removes it), and a step reported again is not written again.
func TestCompatStatusConfigClears(t *testing.T) {
	ctx := testContext(t)
	client := adminClient(t)
	const name = "compat-clear"
	token := simNode(t, name)
	good := createConfigMap(t, "compat-clear-good", map[string]string{"kubelet": "a"})
	bad := createConfigMap(t, "compat-clear-bad", map[string]string{"kubelet": "b"})
	source := func(cm *corev1.ConfigMap) *corev1.NodeConfigSource {
		return &corev1.NodeConfigSource{ConfigMap: &corev1.ConfigMapNodeConfigSource{Namespace: cm.Namespace, Name: cm.Name,
			UID: cm.UID, ResourceVersion: cm.ResourceVersion, KubeletConfigKey: "kubelet"}}
	}
	upgradeNode(t, name, &corev1.NodeConfigSource{ConfigMap: &corev1.ConfigMapNodeConfigSource{
		Namespace: "kube-system", Name: good.Name, KubeletConfigKey: "kubelet"}})
	waitForConfigSource(t, name)
	setSpec := func(value string) {
		t.Helper()
		patch := fmt.Sprintf(`{"spec":{"configSource":%s}}`, value)
		if _, err := client.CoreV1().Nodes().Patch(ctx, name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatalf("patch spec.configSource of %s to %s: %v", name, value, err)
		}
	}
	svc := serviceClient(t)
	report := func(st *corev1.NodeConfigStatus) {
		t.Helper()
		if _, err := svc.ReportStatus(withToken(ctx, token), &dkcv1.ReportStatusRequest{NodeName: name,
			Status: wire.StatusFromCore(st), ObservedTime: timestamppb.Now()}); err != nil {
			t.Fatalf("ReportStatus: %v", err)
		}
	}

	const validateError = "failed to validate config, see Kubelet log for details"
	for _, step := range []struct {
		name string
		spec string // spec.configSource before the report; "" leaves it
		want corev1.NodeConfigStatus
		keys []string // the JSON keys status.config must have, no more
	}{
		{"assigned", "", corev1.NodeConfigStatus{Assigned: source(good), Active: source(good), LastKnownGood: source(good)},
			[]string{"active", "assigned", "lastKnownGood"}},
		{"error set", cmSource(bad.Name), corev1.NodeConfigStatus{Assigned: source(bad), Active: source(good), LastKnownGood: source(good), Error: validateError},
			[]string{"active", "assigned", "error", "lastKnownGood"}},
		{"error cleared", cmSource(good.Name), corev1.NodeConfigStatus{Assigned: source(good), Active: source(good), LastKnownGood: source(good)},
			[]string{"active", "assigned", "lastKnownGood"}},
		{"reset", "null", corev1.NodeConfigStatus{}, []string{}},
	} {
		if step.spec != "" {
			setSpec(step.spec)
		}
		report(&step.want)
		node, raw := getNodeRaw(t, name)
		if node.Status.Config == nil {
			t.Fatalf("%s: status.config dropped by the apiserver", step.name)
		}
		if !apiequality.Semantic.DeepEqual(*node.Status.Config, step.want) {
			t.Errorf("%s: status.config = %s\nwant %s", step.name, jsonOf(node.Status.Config), jsonOf(step.want))
		}
		var rawNode struct {
			Status struct {
				Config map[string]json.RawMessage `json:"config"`
			} `json:"status"`
		}
		if err := json.Unmarshal(raw, &rawNode); err != nil {
			t.Fatal(err)
		}
		keys := []string{}
		for k := range rawNode.Status.Config {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		if !slices.Equal(keys, step.keys) {
			t.Errorf("%s: status.config has fields %v, want exactly %v", step.name, keys, step.keys)
		}
		annotation := node.Annotations["dkc.dev/config-status"]
		var ann corev1.NodeConfigStatus
		if err := json.Unmarshal([]byte(annotation), &ann); err != nil || !apiequality.Semantic.DeepEqual(ann, step.want) {
			t.Errorf("%s: annotation = %s (%v)\nwant %s", step.name, annotation, err, jsonOf(step.want))
		}
		if step.name == "reset" && annotation != "{}" {
			t.Errorf("reset: annotation = %s, want {}", annotation)
		}
		wantOK := corev1.ConditionTrue
		if step.want.Error != "" {
			wantOK = corev1.ConditionFalse
		}
		if c := configOK(t, name); c.Status != wantOK {
			t.Errorf("%s: ConfigOK = %+v, want %s", step.name, c, wantOK)
		}

		// The same status reported again finds the Node up to date. The service compares with its Node
		// cache, which may not have seen its own write yet: one more write is allowed, an endless run is not.
		poll.For(t, 10*time.Second, 200*time.Millisecond, step.name+": a report of the same status that does not write the Node", func() bool {
			before := statusWrites(t)
			report(&step.want)
			return statusWrites(t) == before
		})
	}
}

// waitForConfigSource waits until the apiserver serves the upgraded node's spec.configSource.
func waitForConfigSource(t *testing.T, name string) {
	t.Helper()
	client := adminClient(t)
	poll.ForNil(t, 30*time.Second, 200*time.Millisecond, "the apiserver to serve the upgraded node's spec.configSource", func() error {
		stored, err := client.CoreV1().Nodes().Get(testContext(t), name, metav1.GetOptions{})
		if err == nil && stored.Spec.ConfigSource == nil {
			err = fmt.Errorf("%+v", stored)
		}
		return err
	})
}

// getNodeRaw returns the Node both decoded and as the apiserver's JSON, for checking which fields exist.
func getNodeRaw(t *testing.T, name string) (*corev1.Node, []byte) {
	t.Helper()
	raw, err := adminClient(t).CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes", name).DoRaw(testContext(t))
	if err != nil {
		t.Fatalf("get node %s: %v", name, err)
	}
	var node corev1.Node
	if err := json.Unmarshal(raw, &node); err != nil {
		t.Fatalf("decode node %s: %v", name, err)
	}
	return &node, raw
}

func jsonOf(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
