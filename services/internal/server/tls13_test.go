// SPDX-License-Identifier: Apache-2.0

package server

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/dkc-dev/dkc/services/internal/assignment"
	"github.com/dkc-dev/dkc/services/internal/auth"
	"github.com/dkc-dev/dkc/services/internal/rpc"
)

// servingPair is a CA and a certificate it signed for 127.0.0.1.
func servingPair(t *testing.T) (*x509.CertPool, tls.Certificate) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test-ca"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, caKey.Public(), caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "dkc-server"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		KeyUsage: x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, key.Public(), caKey)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return pool, tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// TestGRPCListenerRequiresTLS13: dkc-server's listener, built as Run builds it, refuses a client that
// offers TLS 1.2 at most, with the handshake's own reason, and serves a TLS 1.3 client. The admission
// webhook's listener uses the same configuration.
func TestGRPCListenerRequiresTLS13(t *testing.T) {
	pool, cert := servingPair(t)
	cfg := DefaultConfig()
	tlsConfig := serverTLSConfig(func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return &cert, nil })
	healthSrv := health.NewServer()
	srv := newGRPCServer(cfg, zap.NewNop(), grpcParts{creds: credentials.NewTLS(tlsConfig.Clone()),
		authn: auth.New(auth.Config{Allowed: cfg.AllowedServiceAccounts, TTL: time.Minute}),
		svc:   rpc.New(rpc.Config{Table: assignment.NewTable(nil)}), health: healthSrv})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)

	check := func(maxVersion uint16) error {
		conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
			RootCAs: pool, MinVersion: tls.VersionTLS12, MaxVersion: maxVersion})))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	}
	if err := check(tls.VersionTLS13); err != nil {
		t.Fatalf("TLS 1.3 client: %v", err)
	}
	err = check(tls.VersionTLS12)
	if err == nil || !strings.Contains(err.Error(), "protocol version not supported") {
		t.Fatalf("TLS 1.2-only client: %v, want a handshake failure: protocol version not supported", err)
	}
	t.Logf("TLS 1.2-only client: %v", err)

	// The raw handshake, as any TLS 1.2 client (an old grpcurl, openssl s_client -tls1_2) sees it.
	_, err = tls.Dial("tcp", lis.Addr().String(), &tls.Config{RootCAs: pool, MaxVersion: tls.VersionTLS12})
	if err == nil || !strings.Contains(err.Error(), "tls: protocol version not supported") {
		t.Fatalf("raw TLS 1.2 handshake: %v, want tls: protocol version not supported", err)
	}
}
