// SPDX-License-Identifier: Apache-2.0

package kubeletcheck

import (
	"context"
	"errors"
	"fmt"
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

// header starts every config file; failCgroupV1 is off because kubelets from 1.35 refuse a cgroup v1 host in
// validation, and the machines these tests run on may be cgroup v1. Drop-ins start with dropInHeader.
const header = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nfailCgroupV1: false\n"

const dropInHeader = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"

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

// TestLoadDropIns merges --config-dir drop-ins as the kubelet does: over the file, in lexical order, with
// the flags over them; only *.conf files; a bad drop-in is an error naming it.
func TestLoadDropIns(t *testing.T) {
	for _, tc := range []struct {
		name    string
		file    string            // after header
		dropIns map[string]string // name (may be in a subdirectory) → content; "" content: header only
		flags   []string          // besides --config-dir
		noDir   bool              // no --config-dir flag at all
		wantErr error
		errHas  string // substring of the error: the drop-in it is about
		check   func(t *testing.T, r *Result)
	}{
		{name: "drop-in overrides file", file: "maxPods: 50\neventRecordQPS: 7\n", dropIns: map[string]string{"10-pods.conf": dropInHeader + "maxPods: 90\n"},
			check: func(t *testing.T, r *Result) {
				if r.Config.MaxPods != 90 || r.Config.EventRecordQPS != 7 {
					t.Errorf("maxPods = %d, eventRecordQPS = %v; want the drop-in's 90 and the file's 7", r.Config.MaxPods, r.Config.EventRecordQPS)
				}
				if strings.Join(r.DropInKeys, ",") != "maxPods" {
					t.Errorf("DropInKeys = %v", r.DropInKeys)
				}
				if len(r.Warnings) != 1 || !strings.Contains(r.Warnings[0], "maxPods") || !strings.Contains(r.Warnings[0], "10-pods.conf") {
					t.Errorf("warnings = %q, want one naming maxPods and 10-pods.conf", r.Warnings)
				}
			}},
		{name: "lexical order, not numeric", dropIns: map[string]string{"10-a.conf": dropInHeader + "maxPods: 10\n", "20-b.conf": dropInHeader + "maxPods: 20\n", "9-c.conf": dropInHeader + "maxPods: 9\n"},
			check: func(t *testing.T, r *Result) {
				if r.Config.MaxPods != 9 {
					t.Errorf("maxPods = %d, want 9-c.conf's 9 (it sorts after 20-b.conf)", r.Config.MaxPods)
				}
				if len(r.DropIns) != 3 || filepath.Base(r.DropIns[2]) != "9-c.conf" {
					t.Errorf("DropIns = %v", r.DropIns)
				}
			}},
		{name: "flag overrides drop-in", dropIns: map[string]string{"10-pods.conf": dropInHeader + "maxPods: 90\n"}, flags: []string{"--max-pods=7"},
			check: func(t *testing.T, r *Result) {
				if r.Config.MaxPods != 7 {
					t.Errorf("maxPods = %d, want the flag's 7", r.Config.MaxPods)
				}
			}},
		{name: "objects merge key by key, lists replace", file: "authentication:\n  webhook:\n    enabled: true\n    cacheTTL: 2m\nclusterDNS: [10.0.0.10, 10.0.0.11]\nfeatureGates:\n  MemoryQoS: true\n",
			dropIns: map[string]string{"10.conf": dropInHeader + "authentication:\n  webhook:\n    cacheTTL: 30s\nclusterDNS: [10.0.0.53]\nfeatureGates:\n  CPUManagerPolicyAlphaOptions: true\n"},
			check: func(t *testing.T, r *Result) {
				w := r.Config.Authentication.Webhook
				if !w.Enabled || w.CacheTTL.Duration.String() != "30s" {
					t.Errorf("authentication.webhook = %+v, want enabled (file) with cacheTTL 30s (drop-in)", w)
				}
				if strings.Join(r.Config.ClusterDNS, ",") != "10.0.0.53" {
					t.Errorf("clusterDNS = %v, want the drop-in's list alone", r.Config.ClusterDNS)
				}
				if !r.Config.FeatureGates["MemoryQoS"] || !r.Config.FeatureGates["CPUManagerPolicyAlphaOptions"] {
					t.Errorf("featureGates = %v, want both", r.Config.FeatureGates)
				}
				if strings.Join(r.DropInKeys, ",") != "authentication,clusterDNS,featureGates" {
					t.Errorf("DropInKeys = %v", r.DropInKeys)
				}
			}},
		{name: "only .conf files, subdirectories walked", dropIns: map[string]string{"README": "{{{", "10.conf.bak": "{{{", "10.yaml": dropInHeader + "maxPods: 1\n",
			"10.conf": dropInHeader + "maxPods: 10\n", "sub/20.conf": dropInHeader + "maxPods: 20\n"},
			check: func(t *testing.T, r *Result) {
				if r.Config.MaxPods != 20 || len(r.DropIns) != 2 {
					t.Errorf("maxPods = %d from %v, want 20 from 10.conf then sub/20.conf", r.Config.MaxPods, r.DropIns)
				}
			}},
		{name: "drop-in paths stay relative", dropIns: map[string]string{"10.conf": dropInHeader + "staticPodPath: manifests\n"},
			check: func(t *testing.T, r *Result) {
				if r.Config.StaticPodPath != "manifests" {
					t.Errorf("staticPodPath = %q: the kubelet resolves the file's relative paths, not a drop-in's", r.Config.StaticPodPath)
				}
			}},
		{name: "without --config-dir no drop-in counts", noDir: true, dropIns: map[string]string{"10.conf": dropInHeader + "maxPods: 90\n"},
			check: func(t *testing.T, r *Result) {
				if r.Config.MaxPods != 110 || len(r.DropInKeys) != 0 {
					t.Errorf("maxPods = %d, DropInKeys %v; want the default 110 and none", r.Config.MaxPods, r.DropInKeys)
				}
			}},
		{name: "empty directory", dropIns: map[string]string{}, check: func(t *testing.T, r *Result) {
			if r.Config.MaxPods != 110 || len(r.DropIns) != 0 {
				t.Errorf("maxPods = %d, DropIns %v", r.Config.MaxPods, r.DropIns)
			}
		}},
		// The kubelet merges through v1beta1 JSON, where omitempty drops the file's empty list: it is
		// defaulted again ([pods]), which cgroupsPerQOS: false makes invalid. The kubelet refuses to start so.
		{name: "file's empty list is lost", file: "cgroupsPerQOS: false\nenforceNodeAllocatable: []\n", dropIns: map[string]string{"10.conf": dropInHeader + "maxPods: 90\n"},
			wantErr: ErrValidate, errHas: "enforceNodeAllocatable"},
		{name: "drop-in's empty list survives", file: "cgroupsPerQOS: false\nenforceNodeAllocatable: []\n", dropIns: map[string]string{"00.conf": dropInHeader + "enforceNodeAllocatable: []\n"},
			check: func(t *testing.T, r *Result) {
				if len(r.Config.EnforceNodeAllocatable) != 0 {
					t.Errorf("enforceNodeAllocatable = %v", r.Config.EnforceNodeAllocatable)
				}
			}},
		{name: "drop-in makes it invalid", dropIns: map[string]string{"10.conf": dropInHeader + "eventRecordQPS: -1\n"}, wantErr: ErrValidate},
		{name: "unparsable drop-in", dropIns: map[string]string{"10.conf": dropInHeader + "maxPods: 1\n", "20-bad.conf": "{{{"}, wantErr: ErrFlags, errHas: "20-bad.conf"},
		{name: "drop-in without kind", dropIns: map[string]string{"10-nokind.conf": "maxPods: 1\n"}, wantErr: ErrFlags, errHas: "10-nokind.conf"},
		{name: "drop-in of another kind", dropIns: map[string]string{"10-cm.conf": "apiVersion: v1\nkind: ConfigMap\n"}, wantErr: ErrFlags, errHas: "10-cm.conf"},
		{name: "drop-in of another version", dropIns: map[string]string{"10-v2.conf": "apiVersion: kubelet.config.k8s.io/v1beta2\nkind: KubeletConfiguration\n"},
			wantErr: ErrFlags, errHas: "10-v2.conf"},
		{name: "empty drop-in", dropIns: map[string]string{"10-empty.conf": "-"}, wantErr: ErrFlags, errHas: "10-empty.conf"},
		{name: "missing directory", wantErr: ErrFlags, errHas: "mount that directory into the dkc-sidecar pod"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			file := write(t, dir, "config.yaml", header+tc.file)
			confDir := filepath.Join(dir, "kubelet.conf.d")
			if tc.dropIns != nil {
				if err := os.Mkdir(confDir, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			for name, content := range tc.dropIns {
				if content == "-" {
					content = ""
				}
				if err := os.MkdirAll(filepath.Dir(filepath.Join(confDir, name)), 0o755); err != nil {
					t.Fatal(err)
				}
				write(t, confDir, name, content)
			}
			flags := tc.flags
			if !tc.noDir {
				flags = append([]string{"--config-dir", confDir}, flags...)
			}
			r, err := Load(context.Background(), file, flags)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) || !strings.Contains(fmt.Sprint(err), tc.errHas) {
					t.Fatalf("err = %v, want %v containing %q", err, tc.wantErr, tc.errHas)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, r)
		})
	}
}
