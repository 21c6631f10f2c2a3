package kubeletconfig

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func write(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

const header = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name    string
		content string
		flags   []string
		wantErr error
		check   func(t *testing.T, r *Result)
	}{
		{name: "valid", content: header + "eventRecordQPS: 7\n", check: func(t *testing.T, r *Result) {
			if r.Config.EventRecordQPS != 7 {
				t.Errorf("eventRecordQPS = %v", r.Config.EventRecordQPS)
			}
			if r.Config.SyncFrequency.Duration == 0 || r.Config.EvictionHard == nil {
				t.Error("defaults not applied")
			}
		}},
		{name: "flag overrides file", content: header + "eventRecordQPS: 7\nport: 1234\n", flags: []string{"--port=4321", "--v=2", "--kubeconfig=/x"}, check: func(t *testing.T, r *Result) {
			if r.Config.Port != 4321 || r.Config.EventRecordQPS != 7 {
				t.Errorf("port = %d, eventRecordQPS = %v", r.Config.Port, r.Config.EventRecordQPS)
			}
		}},
		{name: "feature gates merge, flags win per gate", content: header + "featureGates:\n  MemoryQoS: false\n  CPUManagerPolicyAlphaOptions: true\n",
			flags: []string{"--feature-gates=MemoryQoS=true"}, check: func(t *testing.T, r *Result) {
				if !r.Config.FeatureGates["MemoryQoS"] || !r.Config.FeatureGates["CPUManagerPolicyAlphaOptions"] {
					t.Errorf("gates = %v", r.Config.FeatureGates)
				}
			}},
		{name: "locked feature gate makes the kubelet's decoder panic", content: header + "featureGates:\n  KubeletTracing: false\n", wantErr: ErrLoad},
		{name: "relative paths resolve against the file's dir", content: header + "staticPodPath: manifests\n", check: func(t *testing.T, r *Result) {
			if r.Config.StaticPodPath != filepath.Join(dir, "manifests") {
				t.Errorf("staticPodPath = %s", r.Config.StaticPodPath)
			}
		}},
		{name: "unknown field is a warning", content: header + "eventRecordQPS: 3\nfieldOfTheFuture: true\n", check: func(t *testing.T, r *Result) {
			if r.Config.EventRecordQPS != 3 || len(r.Warnings) == 0 {
				t.Errorf("eventRecordQPS = %v, warnings = %v", r.Config.EventRecordQPS, r.Warnings)
			}
		}},
		{name: "invalid value", content: header + "eventRecordQPS: -1\n", wantErr: ErrValidate},
		{name: "invalid by flag", content: header, flags: []string{"--kube-api-qps=-1"}, wantErr: ErrValidate},
		{name: "not yaml", content: "{{{", wantErr: ErrLoad},
		{name: "wrong kind", content: "apiVersion: v1\nkind: ConfigMap\n", wantErr: ErrLoad},
		{name: "empty", content: "", wantErr: ErrLoad},
		{name: "unknown flag", content: header, flags: []string{"--no-such-flag"}, wantErr: ErrFlags},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := write(t, dir, strings.ReplaceAll(tc.name, " ", "_"), tc.content)
			r, err := Load(context.Background(), p, tc.flags)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("err = %v, want %v", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, r)
		})
	}
	if _, err := Load(context.Background(), filepath.Join(dir, "missing"), nil); !errors.Is(err, ErrLoad) {
		t.Errorf("missing file: %v", err)
	}
}
