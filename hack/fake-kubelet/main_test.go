// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"encoding/pem"
	"os"
	"path/filepath"
	"sync"
	"testing"

	kubeletconfiginternal "k8s.io/kubernetes/pkg/kubelet/apis/config"

	"github.com/dkc-dev/dkc/internal/kubeletcheck"
)

// TestSelfSignedCertificateIsWhereTheSidecarPinsIt: the stand-in kubelet writes its self-signed certificate
// where the kubelet does and the sidecar looks (<cert-dir>/kubelet.crt), serves it, and reuses it on the next start (stand-ins starting together
// in one directory end up with one pair).
func TestSelfSignedCertificateIsWhereTheSidecarPinsIt(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pki")
	kf, err := kubeletcheck.ParseKubeletFlags([]string{"--cert-dir=" + dir})
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
	file := filepath.Join(dir, "kubelet.crt")
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
