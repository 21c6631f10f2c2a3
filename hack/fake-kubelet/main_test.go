package main

import (
	"bytes"
	"encoding/pem"
	"os"
	"path/filepath"
	"sync"
	"testing"

	kubeletconfiginternal "k8s.io/kubernetes/pkg/kubelet/apis/config"

	"github.com/dkc-dev/dkc/sidecar/probe"
)

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
		kf, err := kubeletFlags(flags)
		if err != nil {
			t.Fatalf("kubelet flags %q: %v", flags, err)
		}
		if got := probe.CertDir(flags); got != kf.CertDirectory {
			t.Errorf("probe.CertDir(%q) = %q, the kubelet's --cert-dir is %q", flags, got, kf.CertDirectory)
		}
	}
}

// TestSelfSignedCertificateIsWhereTheSidecarPinsIt: the stand-in kubelet writes its self-signed certificate
// where probe.ServingCertFile looks, serves it, and reuses it on the next start (stand-ins starting together
// in one directory end up with one pair).
func TestSelfSignedCertificateIsWhereTheSidecarPinsIt(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pki")
	kf, err := kubeletFlags([]string{"--cert-dir=" + dir})
	if err != nil {
		t.Fatal(err)
	}
	kc := &kubeletconfiginternal.KubeletConfiguration{}
	var wg sync.WaitGroup
	served := make([][]byte, 4)
	for i := range served {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cert, err := servingCert(kf, kc)
			if err != nil {
				t.Error(err)
				return
			}
			served[i] = cert.Certificate[0]
		}()
	}
	wg.Wait()
	file, err := probe.ServingCertFile(map[string]any{}, probe.CertDir([]string{"--cert-dir=" + dir}))
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("the stand-in kubelet wrote no certificate where the sidecar pins it: %v", err)
	}
	block, _ := pem.Decode(data)
	for i, der := range served {
		if block == nil || !bytes.Equal(block.Bytes, der) {
			t.Errorf("start %d served another certificate than %s holds", i, file)
		}
	}
}
