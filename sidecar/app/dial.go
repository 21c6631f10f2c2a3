// SPDX-License-Identifier: Apache-2.0

package app

import (
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/stats"
)

// DialOption configures Dial.
type DialOption func(*dialOptions)

type dialOptions struct {
	log   *zap.Logger
	stats stats.Handler
}

// WithDialLogger logs what happens to the server CA file (a new bundle taken, an unusable one skipped).
func WithDialLogger(log *zap.Logger) DialOption { return func(o *dialOptions) { o.log = log } }

// withStats has h see every call on the connection (the sidecar's /readyz: serviceStreams).
func withStats(h stats.Handler) DialOption { return func(o *dialOptions) { o.stats = h } }

// Dial opens the sidecar's connection to the config service (also used by the benchmark's simulated nodes):
// TLS 1.3, trusting the CA bundle in cfg.ServerCAFile as the file is at each handshake, so that a CA
// rotation reaches the sidecar without a restart (see caTrust).
func Dial(cfg Config, opts ...DialOption) (*grpc.ClientConn, error) {
	o := dialOptions{log: zap.NewNop()}
	for _, opt := range opts {
		opt(&o)
	}
	creds := insecure.NewCredentials()
	if !cfg.Insecure {
		trust, err := newCATrust(cfg.ServerCAFile, o.log)
		if err != nil {
			return nil, err
		}
		creds = newRotatingCreds(trust)
	}
	var extra []grpc.DialOption
	if o.stats != nil {
		extra = append(extra, grpc.WithStatsHandler(o.stats))
	}
	return grpc.NewClient(cfg.Server, append(extra,
		grpc.WithTransportCredentials(creds),
		// Find a dead service (or path) within a minute; the service permits pings every 20s.
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 30 * time.Second, Timeout: 20 * time.Second,
			PermitWithoutStream: true}),
		// gRPC's own reconnect backoff defaults to a 120s cap; keep it as short as the stream's.
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 250 * time.Millisecond, Multiplier: 1.6,
			Jitter: 0.2, MaxDelay: 3 * time.Second}, MinConnectTimeout: 5 * time.Second}),
		grpc.WithReadBufferSize(8<<10), grpc.WithWriteBufferSize(8<<10),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(8<<20)),
	)...)
}
