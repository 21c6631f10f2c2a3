// SPDX-License-Identifier: Apache-2.0

package app

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t *testing.T, cn string) testCA {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// serving issues a certificate for 127.0.0.1.
func (ca testCA) serving(t *testing.T) *tls.Certificate {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: "dkc-server"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		KeyUsage: x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// configMapVolume writes files as the kubelet writes a ConfigMap volume (AtomicWriter): the content in a
// timestamped directory, ..data a symlink to it, each file name a symlink through ..data; an update writes
// a new directory and renames a new ..data symlink over the old one, then removes the old directory.
type configMapVolume struct {
	t   *testing.T
	dir string
	gen int
}

func (v *configMapVolume) write(name string, content []byte) {
	v.t.Helper()
	v.gen++
	ts := fmt.Sprintf("..2025_01_01_00_00_%02d.%d", v.gen, v.gen)
	if err := os.MkdirAll(filepath.Join(v.dir, ts), 0o755); err != nil {
		v.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(v.dir, ts, name), content, 0o644); err != nil {
		v.t.Fatal(err)
	}
	old, _ := os.Readlink(filepath.Join(v.dir, "..data"))
	if err := os.Symlink(ts, filepath.Join(v.dir, "..data_tmp")); err != nil {
		v.t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(v.dir, "..data_tmp"), filepath.Join(v.dir, "..data")); err != nil {
		v.t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(v.dir, name)); os.IsNotExist(err) {
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(v.dir, name)); err != nil {
			v.t.Fatal(err)
		}
	}
	if old != "" {
		if err := os.RemoveAll(filepath.Join(v.dir, old)); err != nil {
			v.t.Fatal(err)
		}
	}
}

// tlsServer completes TLS handshakes on 127.0.0.1 with whichever certificate is current, as dkc-server's
// reloading listener does (TLS 1.3, ALPN h2 as gRPC requires).
func tlsServer(t *testing.T, current *atomic.Pointer[tls.Certificate], maxVersion uint16) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lis.Close() })
	cfg := &tls.Config{NextProtos: []string{"h2"}, MaxVersion: maxVersion,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return current.Load(), nil }}
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				tc := tls.Server(c, cfg)
				_ = tc.Handshake()
				_, _ = tc.Read(make([]byte, 1)) // until the client closes
			}()
		}
	}()
	return lis.Addr().String()
}

// TestCARotationReachesTheRunningSidecar: the sidecar's credentials take the CA file as it is at each
// handshake, through the symlink swaps of a ConfigMap volume. Rotation as docs/security.md describes it: the
// bundle gains the new CA, the server moves to a certificate of the new CA, the bundle drops the old CA;
// each new connection is verified against the bundle of the moment. A file made unusable keeps the last
// good bundle.
func TestCARotationReachesTheRunningSidecar(t *testing.T) {
	oldCA, newCA := newTestCA(t, "dkc-ca-1"), newTestCA(t, "dkc-ca-2")
	oldCert, newCert := oldCA.serving(t), newCA.serving(t)
	vol := &configMapVolume{t: t, dir: t.TempDir()}
	vol.write("ca.crt", oldCA.pem)
	file := filepath.Join(vol.dir, "ca.crt")
	core, logs := observer.New(zap.InfoLevel)
	trust, err := newCATrust(file, zap.New(core))
	if err != nil {
		t.Fatal(err)
	}
	creds := newRotatingCreds(trust).Clone() // gRPC clones the credentials it is given
	var serving atomic.Pointer[tls.Certificate]
	addr := tlsServer(t, &serving, 0)
	handshake := func() error {
		t.Helper()
		raw, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer raw.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		conn, info, err := creds.ClientHandshake(ctx, addr, raw)
		if err != nil {
			return err
		}
		defer conn.Close()
		if v := info.(credentials.TLSInfo).State.Version; v != tls.VersionTLS13 {
			t.Errorf("negotiated TLS version %x, want 1.3", v)
		}
		return nil
	}
	step := func(what string, cert *tls.Certificate, wantOK bool) {
		t.Helper()
		serving.Store(cert)
		err := handshake()
		if wantOK && err != nil {
			t.Fatalf("%s: handshake failed: %v", what, err)
		}
		if !wantOK && (err == nil || !strings.Contains(err.Error(), "certificate signed by unknown authority")) {
			t.Fatalf("%s: handshake %v, want unknown authority", what, err)
		}
	}

	step("old CA, old certificate", oldCert, true)
	step("old CA only, new certificate", newCert, false)
	vol.write("ca.crt", append(append([]byte{}, oldCA.pem...), newCA.pem...))
	step("bundle, old certificate", oldCert, true)
	step("bundle, new certificate", newCert, true)
	vol.write("ca.crt", newCA.pem)
	step("new CA only, new certificate", newCert, true)
	step("new CA only, old certificate", oldCert, false)
	if n := logs.FilterMessage("server CA file changed; new connections trust its certificates").Len(); n != 2 {
		t.Errorf("%d log lines for the two CA changes, want 2", n)
	}

	// Unusable content, then no file at all: the last good bundle stays, and each is logged once.
	vol.write("ca.crt", []byte("not a certificate\n"))
	step("garbage file", newCert, true)
	step("garbage file, again", newCert, true)
	if n := logs.FilterMessage("server CA file unusable; trusting the CA bundle read before").Len(); n != 1 {
		t.Errorf("%d log lines for the unusable file, want 1", n)
	}
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	step("file removed", newCert, true)
	step("file removed, old certificate", oldCert, false)
}

// TestSidecarRequiresTLS13: the sidecar's connection refuses a server that offers TLS 1.2 at most, and
// says why.
func TestSidecarRequiresTLS13(t *testing.T) {
	ca := newTestCA(t, "dkc-ca")
	file := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(file, ca.pem, 0o644); err != nil {
		t.Fatal(err)
	}
	var serving atomic.Pointer[tls.Certificate]
	serving.Store(ca.serving(t))
	addr := tlsServer(t, &serving, tls.VersionTLS12)
	conn, err := Dial(Config{Server: addr, ServerCAFile: file})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err == nil || !strings.Contains(err.Error(), "protocol version") {
		t.Fatalf("call to a TLS 1.2-only server: %v, want a handshake failure naming the protocol version", err)
	}
	t.Logf("TLS 1.2-only server: %v", err)
}

// TestDialNeedsAUsableCAAtStart: without a readable CA bundle the sidecar does not start.
func TestDialNeedsAUsableCAAtStart(t *testing.T) {
	dir := t.TempDir()
	if _, err := Dial(Config{Server: "127.0.0.1:1", ServerCAFile: filepath.Join(dir, "missing")}); err == nil || !strings.Contains(err.Error(), "read server CA") {
		t.Errorf("missing CA file: %v", err)
	}
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Dial(Config{Server: "127.0.0.1:1", ServerCAFile: empty}); err == nil || !strings.Contains(err.Error(), "no PEM certificates") {
		t.Errorf("empty CA file: %v", err)
	}
}
