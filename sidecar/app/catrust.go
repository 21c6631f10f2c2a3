// SPDX-License-Identifier: Apache-2.0

package app

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"sync"

	"go.uber.org/zap"
	"google.golang.org/grpc/credentials"
)

// caTrust is the config service's CA bundle (--server-ca-file), read again at every TLS handshake, so that
// a rotated CA reaches a running sidecar without a restart. In production the file is a ConfigMap volume:
// the kubelet replaces it atomically by swapping the ..data symlink the file name points through, so a read
// sees either the old bundle or the new one, never half of either; reading the content (not a watch on the
// name, which a symlink swap does not touch) sees every swap. The bundle is a few certificates and a
// handshake happens only on (re)connect, so reading it each time costs nothing worth caching, and a change
// of content is all that counts: mtime and size cannot tell two bundles of the same length apart.
//
// A file that cannot be read or holds no certificate (deleted, emptied by hand) keeps the bundle read
// before: trust never widens to nothing, and a sidecar is not cut off from dkc by an operator's slip.
type caTrust struct {
	file string
	log  *zap.Logger

	mu      sync.Mutex
	content []byte // the file content pool was parsed from
	pool    *x509.CertPool
	bad     []byte // the last content refused (or nil): logged once, not at every handshake
	badErr  string
}

// newCATrust reads file once: a sidecar without a usable CA at start refuses to run, as before.
func newCATrust(file string, log *zap.Logger) (*caTrust, error) {
	content, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("read server CA: %w", err)
	}
	pool, err := parseBundle(content)
	if err != nil {
		return nil, fmt.Errorf("server CA %s: %w", file, err)
	}
	return &caTrust{file: file, log: log, content: content, pool: pool}, nil
}

func parseBundle(content []byte) (*x509.CertPool, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(content) {
		return nil, fmt.Errorf("no PEM certificates in it")
	}
	return pool, nil
}

// current returns the pool of the file's current content.
func (t *caTrust) current() *x509.CertPool {
	content, err := os.ReadFile(t.file)
	t.mu.Lock()
	defer t.mu.Unlock()
	if err == nil && bytes.Equal(content, t.content) {
		return t.pool
	}
	var pool *x509.CertPool
	if err == nil {
		pool, err = parseBundle(content)
	}
	if err != nil {
		if !bytes.Equal(content, t.bad) || err.Error() != t.badErr {
			t.log.Warn("server CA file unusable; trusting the CA bundle read before", zap.String("file", t.file), zap.Error(err))
			t.bad, t.badErr = content, err.Error()
		}
		return t.pool
	}
	t.log.Info("server CA file changed; new connections trust its certificates", zap.String("file", t.file))
	t.content, t.pool, t.bad, t.badErr = content, pool, nil, ""
	return pool
}

// clientTLSConfig is the sidecar's TLS configuration towards dkc-server: TLS 1.3 only (as the server,
// services/internal/server serverTLSConfig), trusting pool.
func clientTLSConfig(pool *x509.CertPool) *tls.Config {
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13}
}

// rotatingCreds are gRPC's TLS credentials with the CA bundle of caTrust as it is at each handshake. gRPC
// copies a tls.Config into its credentials once; these build them anew per handshake instead, keeping
// everything else of gRPC's (server name from the target, ALPN h2) as it is.
type rotatingCreds struct {
	credentials.TransportCredentials // Info, and ServerHandshake (never used by a client)
	trust                            *caTrust
}

var _ credentials.TransportCredentials = (*rotatingCreds)(nil)

func newRotatingCreds(trust *caTrust) *rotatingCreds {
	return &rotatingCreds{TransportCredentials: credentials.NewTLS(clientTLSConfig(trust.pool)), trust: trust}
}

// ClientHandshake is credentials.TransportCredentials.ClientHandshake, with the CA file's current bundle.
func (c *rotatingCreds) ClientHandshake(ctx context.Context, authority string,
	raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return credentials.NewTLS(clientTLSConfig(c.trust.current())).ClientHandshake(ctx, authority, raw)
}

// Clone is credentials.TransportCredentials.Clone; the clone reads the same file.
func (c *rotatingCreds) Clone() credentials.TransportCredentials {
	return &rotatingCreds{TransportCredentials: c.TransportCredentials.Clone(), trust: c.trust}
}
