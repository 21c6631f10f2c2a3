// SPDX-License-Identifier: Apache-2.0

package server

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"
)

// serverTLSConfig is the TLS configuration of dkc-server's gRPC listener and of its admission webhook:
// TLS 1.3 only. Its callers are the sidecars and the kube-apiserver calling the webhook, Go programs that
// speak 1.3 (as do grpcurl and the tests' clients), so nothing needs the older versions and their
// renegotiation, static-RSA key exchange and CBC cipher suites, which 1.3 leaves out.
func serverTLSConfig(getCertificate func(*tls.ClientHelloInfo) (*tls.Certificate, error)) *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS13, GetCertificate: getCertificate}
}

// certReloader serves the certificate in certFile/keyFile and loads it again when either file changes, so
// that a rotated certificate (cert-manager, a mounted Secret) is picked up without a restart. It checks at
// most once per interval; a broken new pair keeps the old certificate in use.
type certReloader struct {
	certFile, keyFile string
	interval          time.Duration

	mu      sync.Mutex
	cert    *tls.Certificate
	modTime time.Time
	checked time.Time
	onError func(error)
}

func newCertReloader(certFile, keyFile string, onError func(error)) (*certReloader, error) {
	r := &certReloader{certFile: certFile, keyFile: keyFile, interval: 10 * time.Second, onError: onError}
	if err := r.load(); err != nil {
		return nil, err
	}
	return r, nil
}

func (r *certReloader) newest() (time.Time, error) {
	var newest time.Time
	for _, f := range []string{r.certFile, r.keyFile} {
		st, err := os.Stat(f)
		if err != nil {
			return time.Time{}, err
		}
		if st.ModTime().After(newest) {
			newest = st.ModTime()
		}
	}
	return newest, nil
}

func (r *certReloader) load() error {
	mod, err := r.newest()
	if err != nil {
		return fmt.Errorf("stat TLS files: %w", err)
	}
	cert, err := tls.LoadX509KeyPair(r.certFile, r.keyFile)
	if err != nil {
		return fmt.Errorf("load TLS key pair %s, %s: %w", r.certFile, r.keyFile, err)
	}
	r.cert, r.modTime = &cert, mod
	return nil
}

// GetCertificate is tls.Config.GetCertificate.
func (r *certReloader) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if time.Since(r.checked) >= r.interval {
		r.checked = time.Now()
		if mod, err := r.newest(); err == nil && !mod.Equal(r.modTime) {
			if err := r.load(); err != nil && r.onError != nil {
				r.onError(err)
			}
		}
	}
	return r.cert, nil
}

// checkCertNamespace refuses a serving certificate issued for a Service in another namespace than
// dkc-server's own (ns): sidecars reach dkc-server through its Service, <name>.<namespace>.svc, and verify
// that name against the certificate, so after a kustomize `namespace:` override a certificate still
// issued for kube-system fails every sidecar's handshake. Names that are not a Service's (no "svc" label
// third) are the operator's business; a certificate with none at all is not checked. ns "" checks nothing.
func checkCertNamespace(certFile string, cert *tls.Certificate, ns string) error {
	if ns == "" || cert == nil || len(cert.Certificate) == 0 {
		return nil
	}
	leaf := cert.Leaf
	if leaf == nil {
		var err error
		if leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return fmt.Errorf("parse serving certificate %s: %w", certFile, err)
		}
	}
	var others []string
	for _, name := range leaf.DNSNames {
		labels := strings.Split(name, ".")
		if len(labels) < 3 || labels[2] != "svc" {
			continue
		}
		if labels[1] == ns {
			return nil
		}
		others = append(others, name)
	}
	if len(others) == 0 {
		return nil
	}
	return fmt.Errorf("serving certificate %s is for %s, but dkc-server runs in namespace %q (--namespace, "+
		"$POD_NAMESPACE): sidecars verify dkc-server.%s.svc and would fail every handshake. Issue the certificate for "+
		"this namespace (deploy/overlays/self-signed: NAMESPACE=%s ./gen-certs.sh; cert-manager: the Certificate's "+
		"dnsNames; docs/install.md, \"Another namespace\"), or install into the namespace it names",
		certFile, strings.Join(others, ", "), ns, ns, ns)
}
