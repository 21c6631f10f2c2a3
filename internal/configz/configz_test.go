// SPDX-License-Identifier: Apache-2.0

package configz

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/dkc-dev/dkc/internal/kubeletcheck"
	"github.com/dkc-dev/dkc/internal/kubeletcheck/checkapi"
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
failCgroupV1: false
eventRecordQPS: 9
`), 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := kubeletcheck.Load(context.Background(), src, nil)
	if err != nil {
		t.Fatal(err)
	}
	running, err := kubeletcheck.ToV1beta1JSON(r.Config) // what /configz shows
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
	if _, err := kubeletcheck.Load(context.Background(), naiveFile, nil); err == nil {
		t.Log("note: the naive recipe happened to validate")
	}

	cfg, err := Config(kubeletcheck.Version(), running, map[string]any{"eventRecordQPS": 11})
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
	back, err := kubeletcheck.Load(context.Background(), dumped, nil)
	if err != nil {
		t.Fatalf("dumped config does not load: %v\n%s", err, out)
	}
	if back.Config.EventRecordQPS != 11 || len(back.Config.EnforceNodeAllocatable) != 0 || back.Config.CgroupsPerQOS {
		t.Errorf("round trip: eventRecordQPS %d, enforceNodeAllocatable %v, cgroupsPerQOS %v",
			back.Config.EventRecordQPS, back.Config.EnforceNodeAllocatable, back.Config.CgroupsPerQOS)
	}
}

// TestEmbeddedDefaultsAreTheKubelets: the defaults embedded for the minor this module links are what the
// kubelet's scheme defaults; after a kubelet bump, `make generate` rewrites them (the other minors' are
// checked the same way by make verify-generated, which regenerates them with each minor's helper).
func TestEmbeddedDefaultsAreTheKubelets(t *testing.T) {
	data, err := kubeletcheck.Defaults()
	if err != nil {
		t.Fatal(err)
	}
	var want map[string]any
	if err := json.Unmarshal(data, &want); err != nil {
		t.Fatal(err)
	}
	got, err := defaults(kubeletcheck.Version())
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("defaults/%s.json is not the kubelet's defaults: run make generate", checkapi.Minor(kubeletcheck.Version()))
	}
}

// TestDefaultsForEveryHelper: one defaults file per kubelet minor a helper is built for (the module files
// of internal/kubeletcheck), and a kubelet of another minor is refused, naming the range.
func TestDefaultsForEveryHelper(t *testing.T) {
	var want []string
	files, _ := filepath.Glob("../../internal/kubeletcheck/kube-*.mod")
	for _, f := range files {
		want = append(want, strings.TrimSuffix(strings.TrimPrefix(filepath.Base(f), "kube-"), ".mod"))
	}
	want = append(want, checkapi.Minor(kubeletcheck.Version())) // go.mod's: the newest
	slices.SortFunc(want, checkapi.CompareMinors)
	if got := Minors(); !slices.Equal(got, want) {
		t.Fatalf("defaults for kubelet minors %v, helpers for %v: run make generate", got, want)
	}
	for _, m := range want {
		if _, err := defaults("v" + m + ".0"); err != nil {
			t.Errorf("defaults of %s: %v", m, err)
		}
	}
	_, err := Config("v1.20.4", map[string]any{}, nil)
	if err == nil || !strings.Contains(err.Error(), `kubelet "v1.20.4" is not supported by this dkc (kubelet minors `+want[0]+"–"+want[len(want)-1]+")") {
		t.Errorf("Config for kubelet v1.20.4: %v", err)
	}
}
