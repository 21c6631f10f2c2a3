// SPDX-License-Identifier: Apache-2.0

package plugin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/kubernetes/fake"

	poolfake "github.com/dkc-dev/dkc/api/generated/clientset/fake"
	"github.com/dkc-dev/dkc/api/v1alpha1"
	"github.com/dkc-dev/dkc/internal/configcheck"
	"github.com/dkc-dev/dkc/internal/nodeconfig"
)

// gateChecker refuses configs that name a feature gate, as a kubelet that removed it does, and counts checks.
type gateChecker struct {
	gate     string
	versions map[string]bool
	checks   int
}

func (g *gateChecker) CheckData(_ context.Context, version string, data []byte) (*configcheck.Checked, error) {
	g.checks++
	g.versions[version] = true
	if strings.Contains(string(data), g.gate) {
		return nil, fmt.Errorf("%w: unrecognized feature gate: %s", configcheck.ErrLoad, g.gate)
	}
	if strings.Contains(string(data), "crash") {
		return nil, fmt.Errorf("run helper: signal: killed")
	}
	return &configcheck.Checked{KubeletVersion: "v1.36.3"}, nil
}

// TestCheckMinor: check names each pool's current revision and its ConfigMap's newer content, and each
// node's active config, with what the kubelet of the minor makes of it; a config several objects share is
// checked once, a missing ConfigMap or a failed check is unknown (not refused), and the command fails when
// anything is refused or unknown.
func TestCheckMinor(t *testing.T) {
	const header = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
	cm := func(name, content string) *corev1.ConfigMap {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: name, ResourceVersion: "7"},
			Data: map[string]string{"kubelet": content}}
	}
	ok, gated := header+"maxPods: 50\n", header+"featureGates:\n  MemoryManager: true\n"
	edited := cm("blue-config", gated) // the pool's ConfigMap, edited since its revision rolled out
	current := v1alpha1.RevisionName("kube-system", "kubelet", map[string]string{"kubelet": ok})
	snapshot := cm(v1alpha1.SnapshotName("blue", current), ok)
	pool := &v1alpha1.KubeletConfigPool{ObjectMeta: metav1.ObjectMeta{Name: "blue"},
		Spec: v1alpha1.KubeletConfigPoolSpec{ConfigMap: v1alpha1.ConfigMapReference{Namespace: "kube-system",
			Name: "blue-config", KubeletConfigKey: "kubelet"}},
		Status: v1alpha1.KubeletConfigPoolStatus{CurrentRevision: current}}
	settled := pool.DeepCopy()
	settled.Name, settled.Spec.ConfigMap.Name, settled.Status.CurrentRevision = "green", "green-config", ""
	active := func(name, cmName string, rv ...string) *corev1.Node {
		src := &corev1.NodeConfigSource{ConfigMap: &corev1.ConfigMapNodeConfigSource{Namespace: "kube-system",
			Name: cmName, KubeletConfigKey: "kubelet"}}
		if len(rv) > 0 {
			src.ConfigMap.ResourceVersion = rv[0]
		}
		st, _ := json.Marshal(corev1.NodeConfigStatus{Assigned: src, Active: src})
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name,
			Annotations: map[string]string{nodeconfig.StatusAnnotation: string(st)}}}
	}
	nodes := []corev1.Node{*active("a", snapshot.Name), *active("b", snapshot.Name), *active("c", "hand-gated"),
		*active("d", "gone"), *active("e", "crashing"), *active("f", "hand-gated", "3")}
	var out bytes.Buffer
	o := &Options{io: genericiooptions.IOStreams{Out: &out}, output: "table",
		client: fake.NewClientset(edited, snapshot, cm("hand-gated", gated), cm("crashing", header+"# crash\n")),
		pools:  poolfake.NewSimpleClientset(pool, settled)}
	checker := &gateChecker{gate: "MemoryManager", versions: map[string]bool{}}
	results, err := o.checkMinor(context.Background(), checker, "1.36", true, nodes)
	if err != nil {
		t.Fatal(err)
	}
	rev := v1alpha1.RevisionName("kube-system", "kubelet", edited.Data)
	want := []CheckResult{
		{Object: "pool/blue", Config: "configmap kube-system/" + snapshot.Name + " key kubelet (current revision " + current + ")", Result: CheckOK},
		{Object: "pool/blue", Config: "configmap kube-system/blue-config key kubelet (revision " + rev + ", not rolled out)", Result: CheckRefused},
		{Object: "pool/green", Config: "configmap kube-system/green-config key kubelet", Result: CheckUnknown},
		{Object: "node/a", Config: "configmap kube-system/" + snapshot.Name + " key kubelet (active)", Result: CheckOK},
		{Object: "node/b", Config: "configmap kube-system/" + snapshot.Name + " key kubelet (active)", Result: CheckOK},
		{Object: "node/c", Config: "configmap kube-system/hand-gated key kubelet (active)", Result: CheckRefused},
		{Object: "node/d", Config: "configmap kube-system/gone key kubelet (active)", Result: CheckUnknown},
		{Object: "node/e", Config: "configmap kube-system/crashing key kubelet (active)", Result: CheckUnknown},
		{Object: "node/f", Config: "configmap kube-system/hand-gated key kubelet (active at resourceVersion 3; checked as edited since, 7)",
			Result: CheckRefused},
	}
	if len(results) != len(want) {
		t.Fatalf("%d results, want %d: %+v", len(results), len(want), results)
	}
	for i, w := range want {
		if g := results[i]; g.Object != w.Object || g.Config != w.Config || g.Result != w.Result {
			t.Errorf("result %d: %s %q %s (%s), want %s %q %s", i, g.Object, g.Config, g.Result, g.Error, w.Object, w.Config, w.Result)
		}
	}
	if e := results[1].Error; !strings.Contains(e, "unrecognized feature gate: MemoryManager") {
		t.Errorf("refusal %q does not carry the kubelet's error", e)
	}
	if e := results[3].KubeletVersion; e != "v1.36.3" {
		t.Errorf("kubelet version %q, want the helper's v1.36.3", e)
	}
	// Each content once (the snapshot two nodes and the pool run; the gated content of two ConfigMaps); nothing
	// but the 1.36 code is asked.
	if checker.checks != 3 || len(checker.versions) != 1 || !checker.versions["v1.36.0"] {
		t.Errorf("%d checks with %v, want 3 with v1.36.0 only", checker.checks, checker.versions)
	}
	if err := checkVerdict(results, "1.36"); !errors.Is(err, ErrConfigsRefused) || !strings.Contains(err.Error(), "refuses 3 of 9") {
		t.Errorf("verdict %v, want %v: kubelet 1.36 refuses 3 of 9 configs", err, ErrConfigsRefused)
	}
	if err := checkVerdict(results[2:3], "1.36"); !errors.Is(err, ErrConfigsUnknown) {
		t.Errorf("verdict on an unknown row %v, want %v", err, ErrConfigsUnknown)
	}
	if err := checkVerdict(results[:1], "1.36"); err != nil {
		t.Errorf("verdict on an ok row: %v", err)
	}
	if err := o.printCheck(results, "1.36"); err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{"OBJECT", "KUBELET 1.36", "refused: ", "9 configs: 3 ok, 3 refused by kubelet 1.36, 3 unknown"} {
		if !strings.Contains(out.String(), line) {
			t.Errorf("table lacks %q:\n%s", line, out.String())
		}
	}
}
