// SPDX-License-Identifier: Apache-2.0

//go:build integration

package integration

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dkc-dev/dkc/test/devcluster"
)

// TestGenCertsRotationKeepsTrust runs deploy/overlays/self-signed/gen-certs.sh as docs/security.md's rotation says
// (install, renew, rotate start, switch, finish) and checks what a rollout between two steps meets: the
// kubelets refresh the sidecars' ca.crt and dkc-server's Secret at different moments, so at every step the
// certificate served after it must verify against the CA published before it, and the one served before it
// against the CA published after it. Interrupting finish and running it again must also end installed.
func TestGenCertsRotationKeepsTrust(t *testing.T) {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	root, err := devcluster.RepoRoot(wd)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	script := filepath.Join(dir, "gen-certs.sh")
	raw, err := os.ReadFile(filepath.Join(root, "deploy/overlays/self-signed/gen-certs.sh"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(script, raw, 0o755); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(script, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("gen-certs.sh %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	type step struct {
		name       string
		ca, served []byte
	}
	snapshot := func(name string) step {
		t.Helper()
		ca, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
		if err != nil {
			t.Fatal(err)
		}
		crt, err := os.ReadFile(filepath.Join(dir, "tls.crt"))
		if err != nil {
			t.Fatal(err)
		}
		return step{name, ca, crt}
	}
	status := func(want string) {
		t.Helper()
		if got := run("status"); !strings.Contains(got, want) {
			t.Errorf("status = %q, want it to say %q", got, want)
		}
	}

	run()
	steps := []step{snapshot("install")}
	status("installed")
	run("renew")
	steps = append(steps, snapshot("renew"))
	run("rotate", "start")
	steps = append(steps, snapshot("rotate start"))
	status("rotation started")
	run("rotate", "switch")
	steps = append(steps, snapshot("rotate switch"))
	status("rotation switched")
	run("rotate", "finish")
	steps = append(steps, snapshot("rotate finish"))
	status("installed")

	for i, s := range steps {
		if err := verify(s.served, s.ca); err != nil {
			t.Errorf("after %s, the served certificate does not verify against the published CA: %v", s.name, err)
		}
		if i == 0 {
			continue
		}
		prev := steps[i-1]
		if err := verify(s.served, prev.ca); err != nil {
			t.Errorf("%s: the new certificate does not verify against the CA a sidecar still holds from %s: %v", s.name, prev.name, err)
		}
		if err := verify(prev.served, s.ca); err != nil {
			t.Errorf("%s: a sidecar with the new CA cannot verify the certificate still served from %s: %v", s.name, prev.name, err)
		}
	}
	// The rotation must have changed the CA: the first certificate no longer verifies at the end.
	if err := verify(steps[0].served, steps[len(steps)-1].ca); err == nil {
		t.Error("the certificate of the first install still verifies against the rotated CA: nothing was rotated")
	}
}

// verify checks a PEM serving certificate against a PEM CA bundle for dkc-server's Service name.
func verify(servedPEM, caPEM []byte) error {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return os.ErrInvalid
	}
	block, _ := pem.Decode(servedPEM)
	if block == nil {
		return os.ErrInvalid
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return err
	}
	_, err = cert.Verify(x509.VerifyOptions{Roots: pool, DNSName: "dkc-server.kube-system.svc", KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	return err
}
