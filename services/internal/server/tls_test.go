// SPDX-License-Identifier: Apache-2.0

package server

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func writeSelfSigned(t *testing.T, certFile, keyFile, cn string, mod time.Time) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn}, NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalPKCS8PrivateKey(key)
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{certFile, keyFile} {
		if err := os.Chtimes(f, mod, mod); err != nil {
			t.Fatal(err)
		}
	}
}

func TestCertReloader(t *testing.T) {
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	writeSelfSigned(t, cert, key, "first", time.Now().Add(-time.Minute))
	var reloadErrs int
	r, err := newCertReloader(cert, key, func(error) { reloadErrs++ })
	if err != nil {
		t.Fatal(err)
	}
	r.interval = 0
	cn := func() string {
		c, err := r.GetCertificate(nil)
		if err != nil {
			t.Fatal(err)
		}
		parsed, _ := x509.ParseCertificate(c.Certificate[0])
		return parsed.Subject.CommonName
	}
	if got := cn(); got != "first" {
		t.Fatalf("CN = %q", got)
	}
	writeSelfSigned(t, cert, key, "rotated", time.Now())
	if got := cn(); got != "rotated" {
		t.Fatalf("after rotation CN = %q", got)
	}
	// A broken pair keeps the last good certificate.
	if err := os.WriteFile(key, []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(key, time.Now().Add(time.Minute), time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if got := cn(); got != "rotated" || reloadErrs != 1 {
		t.Fatalf("after a broken rotation CN = %q, reload errors = %d", got, reloadErrs)
	}
}

func TestConfigValidate(t *testing.T) {
	valid := DefaultConfig()
	valid.Insecure = true
	for _, tc := range []struct {
		name   string
		mutate func(*Config)
		ok     bool
	}{
		{"defaults with insecure", func(*Config) {}, true},
		{"tls files", func(c *Config) { c.Insecure, c.TLSCertFile, c.TLSKeyFile = false, "a", "b" }, true},
		{"no tls and not insecure", func(c *Config) { c.Insecure = false }, false},
		{"insecure with tls", func(c *Config) { c.TLSCertFile = "a" }, false},
		{"bad service account", func(c *Config) { c.AllowedServiceAccounts = []string{"nodash"} }, false},
		{"no service accounts", func(c *Config) { c.AllowedServiceAccounts = nil }, false},
		{"zero workers", func(c *Config) { c.Workers = 0 }, false},
		{"bad log level", func(c *Config) { c.LogLevel = "loud" }, false},
		{"tiny messages", func(c *Config) { c.MaxSendMsgSizeMiB = 1 }, false},
	} {
		c := valid
		c.AllowedServiceAccounts = append([]string(nil), valid.AllowedServiceAccounts...)
		tc.mutate(&c)
		if err := c.Validate(); (err == nil) != tc.ok {
			t.Errorf("%s: Validate() = %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
}
