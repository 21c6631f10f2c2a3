package configz

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	kubeletv1beta1 "k8s.io/kubelet/config/v1beta1"
	kubeletscheme "k8s.io/kubernetes/pkg/kubelet/apis/config/scheme"

	"github.com/dkc-dev/dkc/internal/kubeletconfig"
)

// TestRoundTrip: a config with empty values, as the kubelet reports it on /configz, dumps to a file that
// loads back to the same config — where the naive recipe (configz + kind/apiVersion) does not.
func TestRoundTrip(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src.yaml")
	if err := os.WriteFile(src, []byte(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
eventRecordQPS: 9
`), 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := kubeletconfig.Load(context.Background(), src, nil)
	if err != nil {
		t.Fatal(err)
	}
	running, err := kubeletconfig.ToV1beta1JSON(r.Config) // what /configz shows
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := running["enforceNodeAllocatable"]; ok {
		t.Fatal("expected configz to omit the empty enforceNodeAllocatable (the trap this package exists for)")
	}
	naive := map[string]any{"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration"}
	for k, v := range running {
		naive[k] = v
	}
	naiveYAML, _ := YAML(naive)
	naiveFile := filepath.Join(dir, "naive.yaml")
	_ = os.WriteFile(naiveFile, naiveYAML, 0o644)
	if _, err := kubeletconfig.Load(context.Background(), naiveFile, nil); err == nil {
		t.Log("note: the naive recipe happened to validate")
	}

	cfg, err := Config(running, map[string]any{"eventRecordQPS": 11})
	if err != nil {
		t.Fatal(err)
	}
	out, err := YAML(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dumped := filepath.Join(dir, "dumped.yaml")
	if err := os.WriteFile(dumped, out, 0o644); err != nil {
		t.Fatal(err)
	}
	back, err := kubeletconfig.Load(context.Background(), dumped, nil)
	if err != nil {
		t.Fatalf("dumped config does not load: %v\n%s", err, out)
	}
	if back.Config.EventRecordQPS != 11 || len(back.Config.EnforceNodeAllocatable) != 0 || back.Config.CgroupsPerQOS {
		t.Errorf("round trip: eventRecordQPS %d, enforceNodeAllocatable %v, cgroupsPerQOS %v",
			back.Config.EventRecordQPS, back.Config.EnforceNodeAllocatable, back.Config.CgroupsPerQOS)
	}
}

// TestEmbeddedDefaultsAreTheKubelets: defaults.json is what the kubelet's scheme (at the version go.mod
// pins) defaults; after a kubelet bump, `make generate` rewrites it.
func TestEmbeddedDefaultsAreTheKubelets(t *testing.T) {
	scheme, _, err := kubeletscheme.NewSchemeAndCodecs()
	if err != nil {
		t.Fatal(err)
	}
	obj := &kubeletv1beta1.KubeletConfiguration{}
	scheme.Default(obj)
	data, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	var want map[string]any
	if err := json.Unmarshal(data, &want); err != nil {
		t.Fatal(err)
	}
	got, err := defaults()
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("defaults.json is not the kubelet's defaults: run make generate")
	}
}
