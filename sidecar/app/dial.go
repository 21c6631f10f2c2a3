package app

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
)

// Dial opens the sidecar's connection to the config service (also used by the benchmark's simulated nodes).
func Dial(cfg Config) (*grpc.ClientConn, error) {
	creds := insecure.NewCredentials()
	if !cfg.Insecure {
		pem, err := os.ReadFile(cfg.ServerCAFile)
		if err != nil {
			return nil, fmt.Errorf("read server CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("no certificates in %s", cfg.ServerCAFile)
		}
		creds = credentials.NewTLS(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12})
	}
	return grpc.NewClient(cfg.Server,
		grpc.WithTransportCredentials(creds),
		// Find a dead service (or path) within a minute; the service permits pings every 20s.
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 30 * time.Second, Timeout: 20 * time.Second, PermitWithoutStream: true}),
		// gRPC's own reconnect backoff defaults to a 120s cap; keep it as short as the stream's.
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 250 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 3 * time.Second},
			MinConnectTimeout: 5 * time.Second}),
		grpc.WithReadBufferSize(8<<10), grpc.WithWriteBufferSize(8<<10),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(8<<20)),
	)
}
