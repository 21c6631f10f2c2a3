// SPDX-License-Identifier: Apache-2.0

package devcluster

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pki is the cluster's certificate authority. One CA signs every serving and client certificate; the dev
// cluster authenticates everyone by client certificate (admin, kubelets, the apiserver towards kubelets) and
// ServiceAccount tokens, as a production cluster does.
type pki struct {
	dir    string
	caCert *x509.Certificate
	caKey  crypto.Signer
}

func (p *pki) path(name string) string { return filepath.Join(p.dir, name) }

// CAFile is the CA certificate every client trusts.
func (p *pki) CAFile() string { return p.path("ca.crt") }

// loadOrCreatePKI reuses the CA in dir when present so that restarting a cluster keeps kubeconfigs valid.
func loadOrCreatePKI(dir string) (*pki, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create pki dir %s: %w", dir, err)
	}
	p := &pki{dir: dir}
	if cert, key, err := readPair(p.path("ca")); err == nil {
		p.caCert, p.caKey = cert, key
		return p, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("read CA in %s: %w", dir, err)
	}
	der, key, err := selfSignedCA("dkc-dev-ca")
	if err != nil {
		return nil, err
	}
	cert, _ := x509.ParseCertificate(der)
	p.caCert, p.caKey = cert, key
	if err := writePair(p.path("ca"), der, key); err != nil {
		return nil, err
	}
	return p, nil
}

// selfSignedCA makes a CA certificate (DER) and its key, valid 10 years.
func selfSignedCA(cn string) ([]byte, crypto.Signer, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate CA key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: cn},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().AddDate(10, 0, 0),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, nil, fmt.Errorf("self-sign CA %s: %w", cn, err)
	}
	return der, key, nil
}

// CA is a certificate authority apart from the cluster's, in memory: for tests that give dkc-server a
// serving certificate of their own and rotate the CA its sidecars trust, while the cluster's own CA (which
// every kubeconfig and the apiserver's client authentication use) stays as it is.
type CA struct {
	cert *x509.Certificate
	key  crypto.Signer
}

// NewCA makes a CA named cn.
func NewCA(cn string) (*CA, error) {
	der, key, err := selfSignedCA(cn)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{cert: cert, key: key}, nil
}

// PEM is the CA certificate, as a CA bundle file holds it.
func (ca *CA) PEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.cert.Raw})
}

// Pool is a pool of this CA alone.
func (ca *CA) Pool() *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	return pool
}

// IssueServing writes a serving certificate for ips and dns, signed by the CA, to certFile and keyFile.
// Each file is replaced by a rename, so a process that reads them never sees half of one.
func (ca *CA) IssueServing(certFile, keyFile string, ips []net.IP, dns []string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("generate serving key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "dkc-server"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().AddDate(1, 0, 0),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  ips,
		DNSNames:     dns,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		return fmt.Errorf("sign serving certificate: %w", err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	for file, data := range map[string][]byte{
		keyFile:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}),
		certFile: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
	} {
		if err := os.WriteFile(file+".tmp", data, 0o600); err != nil {
			return err
		}
		if err := os.Rename(file+".tmp", file); err != nil {
			return err
		}
	}
	return nil
}

// issue writes <name>.crt and <name>.key signed by the CA, unless they already exist.
func (p *pki) issue(name, cn string, orgs []string, usage x509.ExtKeyUsage, ips []net.IP, dns []string) error {
	base := p.path(name)
	if _, _, err := readPair(base); err == nil {
		return nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("generate key for %s: %w", name, err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().AddDate(1, 0, 0),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		IPAddresses:  ips,
		DNSNames:     dns,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.caCert, key.Public(), p.caKey)
	if err != nil {
		return fmt.Errorf("sign certificate %s: %w", name, err)
	}
	return writePair(base, der, key)
}

// remove deletes <name>.crt and <name>.key.
func (p *pki) remove(name string) error {
	for _, ext := range []string{".crt", ".key"} {
		if err := os.Remove(p.path(name) + ext); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return nil
}

// serviceAccountKey writes the RSA key the apiserver signs ServiceAccount tokens with.
func (p *pki) serviceAccountKey() (string, error) {
	path := p.path("sa.key")
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return "", fmt.Errorf("generate service account key: %w", err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return "", fmt.Errorf("encode service account key: %w", err)
	}
	return path, os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600)
}

func writePair(base string, der []byte, key crypto.Signer) error {
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return fmt.Errorf("encode key %s: %w", base, err)
	}
	if err := os.WriteFile(base+".key", pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}),
		0o600); err != nil {
		return fmt.Errorf("write key %s: %w", base, err)
	}
	if err := os.WriteFile(base+".crt", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		0o644); err != nil {
		return fmt.Errorf("write certificate %s: %w", base, err)
	}
	return nil
}

func readPair(base string) (*x509.Certificate, crypto.Signer, error) {
	certPEM, err := os.ReadFile(base + ".crt")
	if err != nil {
		return nil, nil, err
	}
	keyPEM, err := os.ReadFile(base + ".key")
	if err != nil {
		return nil, nil, err
	}
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, nil, fmt.Errorf("%s: not PEM", base)
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("parse %s.crt: %w", base, err)
	}
	k, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("parse %s.key: %w", base, err)
	}
	signer, ok := k.(crypto.Signer)
	if !ok {
		return nil, nil, fmt.Errorf("%s.key: not a signing key", base)
	}
	return cert, signer, nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	return n
}
