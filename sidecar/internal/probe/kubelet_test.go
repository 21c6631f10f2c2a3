// SPDX-License-Identifier: Apache-2.0

package probe

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dkc-dev/dkc/internal/kubeletcheck"
)

const kubeletHeader = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nfailCgroupV1: false\n"

// TestMismatchWithDropIns: what the kubelet runs with drop-ins matches the merged config on every field
// the file or a drop-in sets, and a kubelet running the file alone does not.
func TestMismatchWithDropIns(t *testing.T) {
	dir := t.TempDir()
	content := kubeletHeader + "eventRecordQPS: 7\nauthentication:\n  webhook:\n    cacheTTL: 2m\n"
	file := filepath.Join(dir, "config.yaml")
	writeFile(t, file, []byte(content))
	confDir := filepath.Join(dir, "kubelet.conf.d")
	if err := os.Mkdir(confDir, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(confDir, "10.conf"), []byte(kubeletHeader+"authentication:\n  webhook:\n    cacheTTL: 30s\nmaxPods: 90\n"))
	flags := []string{"--config-dir=" + confDir}

	intended, err := kubeletcheck.Check(context.Background(), file, flags)
	if err != nil {
		t.Fatal(err)
	}
	withDropIns := intended.Fields // what /configz shows of a kubelet that merged them
	fileOnly, err := kubeletcheck.Check(context.Background(), file, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		running map[string]any
		want    string // the differing fields
	}{
		{name: "kubelet runs the merged config", running: withDropIns, want: ""},
		{name: "kubelet runs the file alone", running: fileOnly.Fields, want: "authentication,maxPods"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			diff, err := Mismatch(intended, []byte(content), tc.running)
			if err != nil {
				t.Fatal(err)
			}
			var fields []string
			for _, d := range diff {
				fields = append(fields, strings.SplitN(d, ":", 2)[0])
			}
			if got := strings.Join(fields, ","); got != tc.want {
				t.Errorf("Mismatch = %q, want differences in %q", diff, tc.want)
			}
		})
	}
}

// TestCertDirAsTheKubeletParsesIt: the sidecar finds the kubelet's certificate directory with a small
// parser of its own (it does not link the kubelet's code); here it must agree with the kubelet's flag parsing.
func TestCertDirAsTheKubeletParsesIt(t *testing.T) {
	for _, flags := range [][]string{
		nil,
		{"--v=1", "--root-dir=/srv/kubelet", "--address=127.0.0.1"},
		{"--cert-dir=/a"},
		{"--cert-dir", "/a", "--v=1"},
		{"--cert_dir=/a"},
		{"--cert-dir=/a", "--port", "10250", "--cert-dir=/b"},
	} {
		kf, err := kubeletcheck.ParseKubeletFlags(flags)
		if err != nil {
			t.Fatalf("kubelet flags %q: %v", flags, err)
		}
		if got := CertDir(flags); got != kf.CertDirectory {
			t.Errorf("CertDir(%q) = %q, the kubelet's --cert-dir is %q", flags, got, kf.CertDirectory)
		}
	}
}
