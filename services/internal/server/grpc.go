// SPDX-License-Identifier: Apache-2.0

package server

import (
	"context"
	"fmt"

	grpcauth "github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/auth"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/selector"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	"github.com/dkc-dev/dkc/services/internal/auth"
	"github.com/dkc-dev/dkc/services/internal/rpc"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors"

	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
)

// grpcParts are what the gRPC server serves, and with which credentials (nil: plaintext, --insecure).
type grpcParts struct {
	creds  credentials.TransportCredentials
	authn  *auth.Authenticator
	svc    dkcv1.ConfigServiceServer
	health *health.Server
	conns  *connLimiter // nil: no connection marked authenticated (tests of the server alone)
	// reports paces each node's status reports; nil: no limit.
	reports *reportLimiter
}

// newGRPCServer builds the gRPC server. Interceptors run in this order, outermost first:
//
//  1. logging  — every call is logged with its outcome, including calls refused by auth; WatchConfig,
//     whose goroutine is parked on these frames for the stream's life, logs itself instead (a refusal by
//     auth through watchRefusals);
//  2. auth     — only for dkc.v1.ConfigService: health and reflection stay open for probes and grpcurl; a
//     call it lets through marks its connection authenticated (connLimiter);
//  3. reports  — a node's ReportStatus calls past its rate are refused (reportLimiter), after auth, which
//     says which node the caller is;
//  4. recovery — a panic in a handler becomes codes.Internal for that call instead of killing the service.
func newGRPCServer(cfg Config, log *zap.Logger, p grpcParts) *grpc.Server {
	creds, svc, healthSrv := p.creds, p.svc, p.health
	authFunc := markAuthenticated(p.authn.AuthFunc, p.conns)
	logger := interceptorLogger(log.Named("grpc"))
	logOpts := []logging.Option{logging.WithLogOnEvents(logging.FinishCall), logging.WithLevels(callLevel)}
	onlyConfigService := selector.MatchFunc(func(_ context.Context, c interceptors.CallMeta) bool {
		return c.Service == dkcv1.ConfigService_ServiceDesc.ServiceName
	})
	notWatchConfig := selector.MatchFunc(func(_ context.Context, c interceptors.CallMeta) bool {
		return c.FullMethod() != dkcv1.ConfigService_WatchConfig_FullMethodName
	})
	recoveryOpts := []recovery.Option{recovery.WithRecoveryHandler(func(p any) error {
		log.Error("panic in gRPC handler", zap.Any("panic", p), zap.Stack("stack"))
		return status.Error(codes.Internal, "internal error")
	})}
	opts := []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(
			logging.UnaryServerInterceptor(logger, logOpts...),
			selector.UnaryServerInterceptor(grpcauth.UnaryServerInterceptor(authFunc), onlyConfigService),
			p.reports.interceptor(),
			recovery.UnaryServerInterceptor(recoveryOpts...),
		),
		grpc.ChainStreamInterceptor(
			// WatchConfig logs its own start and end, with the node: its goroutine is parked for the
			// stream's life on top of every interceptor's frame, and the logging interceptor's frames and
			// fields cost every connected node 8 KiB of stack more (rpc.Service.WatchConfig).
			selector.StreamServerInterceptor(logging.StreamServerInterceptor(logger, logOpts...), notWatchConfig),
			selector.StreamServerInterceptor(grpcauth.StreamServerInterceptor(watchRefusals(authFunc, log.Named("rpc"))),
				onlyConfigService),
			recovery.StreamServerInterceptor(recoveryOpts...),
		),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			Time:                  cfg.KeepaliveTime,
			Timeout:               cfg.KeepaliveTimeout,
			MaxConnectionAge:      cfg.MaxConnectionAge,
			MaxConnectionAgeGrace: cfg.MaxConnAgeGrace,
			// Counts only time with no call open: a sidecar's config stream never lets its connection
			// idle, while a caller whose every call was refused is let go instead of living to the max age.
			MaxConnectionIdle: cfg.MaxConnectionIdle,
		}),
		// A connection that has not finished its TLS handshake and HTTP/2 preface by then is closed: a
		// client that opens TCP connections and sends nothing holds each for this long, not 120 s.
		grpc.ConnectionTimeout(cfg.HandshakeTimeout),
		// Sidecars ping at most every 30s; anything faster is a misbehaving client.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 20e9, PermitWithoutStream: true}),
		// Thousands of mostly idle streams: small per-connection buffers (gRPC's shared write buffer, its
		// default, releases them between writes).
		grpc.ReadBufferSize(cfg.ReadBufferSize),
		grpc.WriteBufferSize(cfg.WriteBufferSize),
		// No HPACK dynamic table for what clients send: a sidecar's headers (its ~1 KB bearer token above
		// all) would sit in every connection's table for its life — 2 KB a connection in the 5,000-node heap
		// profile — to save re-sending them on a status report every few minutes.
		grpc.HeaderTableSize(0),
		grpc.MaxSendMsgSize(cfg.MaxSendMsgSizeMiB << 20),
		// grpc-go reads a unary request whole before any interceptor runs, auth included: the cap is what
		// each open call of an unauthenticated caller may hold (status reports are a few KiB).
		grpc.MaxRecvMsgSize(cfg.MaxRecvMsgSizeKiB << 10),
		// Calls open at once per connection: each costs a goroutine and buffers before any handler decides
		// anything. With one config stream per node (package rpc), a token is worth little more than that.
		grpc.MaxConcurrentStreams(uint32(cfg.MaxConcurrentStreams)),
	}
	opts = append(opts, auth.ServerOptions()...) // header-size cap: unauthenticated callers' metadata
	opts = append(opts, rpc.ServerOptions()...)  // the codec sending an assignment encoded once to all its nodes
	if creds != nil {
		opts = append(opts, grpc.Creds(creds))
	}
	s := grpc.NewServer(opts...)
	dkcv1.RegisterConfigServiceServer(s, svc)
	healthpb.RegisterHealthServer(s, healthSrv)
	reflection.Register(s)
	return s
}

// markAuthenticated tells conns of every call authFunc lets through, and refuses the call when its node
// holds its share of connections already (connLimiter.authenticated). Like watchRefusals it returns before
// the handler runs: nothing is added to a stream's parked stack.
func markAuthenticated(authFunc grpcauth.AuthFunc, conns *connLimiter) grpcauth.AuthFunc {
	if conns == nil {
		return authFunc
	}
	return func(ctx context.Context) (context.Context, error) {
		out, err := authFunc(ctx)
		if err != nil {
			return out, err
		}
		id, _ := auth.FromContext(out)
		if err := conns.authenticated(ctx, id.Node); err != nil {
			return nil, err
		}
		return out, nil
	}
}

// watchRefusals logs the WatchConfig calls authFunc refuses, which the logging interceptor does not see
// (newGRPCServer). It runs and returns before the handler, so it adds nothing to a stream's parked stack.
func watchRefusals(authFunc grpcauth.AuthFunc, log *zap.Logger) grpcauth.AuthFunc {
	return func(ctx context.Context) (context.Context, error) {
		out, err := authFunc(ctx)
		if err != nil {
			if m, _ := grpc.Method(ctx); m == dkcv1.ConfigService_WatchConfig_FullMethodName {
				var addr string
				if p, ok := peer.FromContext(ctx); ok {
					addr = p.Addr.String()
				}
				log.Warn("node watch refused", zap.String("peer", addr), zap.Stringer("grpc.code", status.Code(err)),
					zap.Error(err))
			}
		}
		return out, err
	}
}

// callLevel is the level of a finished call's line: a call that succeeded is every node's status report
// (two or three per node per assignment, 20,000 lines at 10,000 nodes), so it is logged at debug level;
// the node's status write says what came of it (nodestatus, "node status written"). Failures keep
// go-grpc-middleware's levels (info for a refused token, warn for exhausted limits, error for the server's
// own faults).
func callLevel(code codes.Code) logging.Level {
	if code == codes.OK {
		return logging.LevelDebug
	}
	return logging.DefaultServerCodeToLevel(code)
}

// interceptorLogger adapts zap to go-grpc-middleware's logging interface. The fields are converted only
// for a line the logger keeps (its level enabled and not sampled away).
func interceptorLogger(l *zap.Logger) logging.Logger {
	return logging.LoggerFunc(func(_ context.Context, lvl logging.Level, msg string, fields ...any) {
		level := zapcore.ErrorLevel
		switch lvl {
		case logging.LevelDebug:
			level = zapcore.DebugLevel
		case logging.LevelInfo:
			level = zapcore.InfoLevel
		case logging.LevelWarn:
			level = zapcore.WarnLevel
		}
		ce := l.Check(level, msg)
		if ce == nil {
			return
		}
		f := make([]zap.Field, 0, len(fields)/2)
		for i := 0; i+1 < len(fields); i += 2 {
			f = append(f, zap.Any(fmt.Sprint(fields[i]), fields[i+1]))
		}
		ce.Write(f...)
	})
}
