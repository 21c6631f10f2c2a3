//go:build integration

package integration

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

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
	cfg, err := clientcmd.BuildConfigFromFlags("", cluster.NodeKubeconfigPath(realNode))
	if err != nil {
		t.Fatal(err)
	}
	nodeClient, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	err = patch(nodeClient, realNode, valid)
	if err == nil || !strings.Contains(err.Error(), `node "node-1" is not allowed to set its own config source`) {
		t.Errorf("node self-assignment: %v", err)
	}
	if err := patch(nodeClient, realNode, ""); err != nil {
		t.Errorf("a node clearing its own source must stay allowed: %v", err)
	}
}
