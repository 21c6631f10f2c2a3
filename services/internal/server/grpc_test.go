// SPDX-License-Identifier: Apache-2.0

package server

import (
	"bytes"
	"context"
	"net"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	"google.golang.org/grpc/status"

	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
	"github.com/dkc-dev/dkc/services/internal/assignment"
	"github.com/dkc-dev/dkc/services/internal/auth"
	"github.com/dkc-dev/dkc/services/internal/rpc"
)

// TestStreamsPerConnectionAreCapped: a connection gets at most --max-concurrent-streams streams at once.
// Clients are told in SETTINGS (grpc-go clients then queue further calls); one that opens more anyway, as
// an attacker's would, has them refused with REFUSED_STREAM before any handler runs. The streams here are
// grpc.health.v1.Health/Watch, which need no token and stay open while their request is not sent.
func TestStreamsPerConnectionAreCapped(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Insecure = true
	capacity := cfg.MaxConcurrentStreams
	srv := newGRPCServer(cfg, zap.NewNop(), grpcParts{authn: auth.New(auth.Config{Allowed: cfg.AllowedServiceAccounts, TTL: time.Minute}),
		svc: rpc.New(rpc.Config{Table: assignment.NewTable(nil)}), health: health.NewServer()})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)

	conn, err := net.Dial("tcp", lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(conn, conn)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	for i := range capacity + 1 {
		block.Reset()
		for _, f := range []hpack.HeaderField{{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"},
			{Name: ":path", Value: "/grpc.health.v1.Health/Watch"}, {Name: ":authority", Value: "dkc-server"},
			{Name: "content-type", Value: "application/grpc"}, {Name: "te", Value: "trailers"}} {
			if err := enc.WriteField(f); err != nil {
				t.Fatal(err)
			}
		}
		if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: uint32(2*i + 1), BlockFragment: block.Bytes(), EndHeaders: true}); err != nil {
			t.Fatal(err)
		}
	}
	last := uint32(2*capacity + 1)
	advertised, noTable := false, false
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("no REFUSED_STREAM for stream %d (the %dth on the connection): %v", last, capacity+1, err)
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if f.IsAck() {
				continue
			}
			if v, ok := f.Value(http2.SettingMaxConcurrentStreams); ok && v == uint32(capacity) {
				advertised = true
			}
			if v, ok := f.Value(http2.SettingHeaderTableSize); ok && v == 0 {
				noTable = true
			}
			if err := fr.WriteSettingsAck(); err != nil {
				t.Fatal(err)
			}
		case *http2.RSTStreamFrame:
			if f.StreamID != last || f.ErrCode != http2.ErrCodeRefusedStream {
				t.Fatalf("RST_STREAM %v on stream %d; want REFUSED_STREAM on stream %d only", f.ErrCode, f.StreamID, last)
			}
			if !advertised {
				t.Errorf("the server did not advertise SETTINGS_MAX_CONCURRENT_STREAMS=%d", capacity)
			}
			// Clients keep no headers (tokens) in the server's HPACK table: it would cost every connection.
			if !noTable {
				t.Errorf("the server did not advertise SETTINGS_HEADER_TABLE_SIZE=0")
			}
			return
		}
	}
}

// methodStream names the method of a call's context, as grpc-go's server transport does.
type methodStream struct {
	grpc.ServerTransportStream
	method string
}

func (m methodStream) Method() string { return m.method }

// TestWatchRefusalsAreLogged: a WatchConfig call that auth refuses is logged (the logging interceptor
// skips WatchConfig); other methods' refusals are left to the logging interceptor, and a call let through
// logs nothing.
func TestWatchRefusalsAreLogged(t *testing.T) {
	refuse := func(ctx context.Context) (context.Context, error) {
		return ctx, status.Error(codes.Unauthenticated, "token refused")
	}
	admit := func(ctx context.Context) (context.Context, error) { return ctx, nil }
	for _, tc := range []struct {
		name     string
		method   string
		authFunc func(context.Context) (context.Context, error)
		wantLogs int
	}{
		{"WatchConfig refused", dkcv1.ConfigService_WatchConfig_FullMethodName, refuse, 1},
		{"WatchConfig admitted", dkcv1.ConfigService_WatchConfig_FullMethodName, admit, 0},
		{"ReportStatus refused", dkcv1.ConfigService_ReportStatus_FullMethodName, refuse, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			core, logs := observer.New(zap.InfoLevel)
			ctx := grpc.NewContextWithServerTransportStream(context.Background(), methodStream{method: tc.method})
			_, err := watchRefusals(tc.authFunc, zap.New(core))(ctx)
			if _, want := tc.authFunc(ctx); (err == nil) != (want == nil) {
				t.Fatalf("error %v, want the auth func's %v", err, want)
			}
			if got := logs.FilterMessage("node watch refused").Len(); got != tc.wantLogs {
				t.Errorf("%d refusal logs, want %d", got, tc.wantLogs)
			}
		})
	}
}

// TestFinishedCallLevels: a call that succeeded (every node's status report) is not logged at info level;
// failures are, at go-grpc-middleware's levels, with their fields.
func TestFinishedCallLevels(t *testing.T) {
	for _, tc := range []struct {
		code codes.Code
		want zapcore.Level // zapcore.InvalidLevel: no line at info level
	}{
		{codes.OK, zapcore.InvalidLevel},
		{codes.Unauthenticated, zapcore.InfoLevel},
		{codes.ResourceExhausted, zapcore.WarnLevel},
		{codes.Internal, zapcore.ErrorLevel},
	} {
		t.Run(tc.code.String(), func(t *testing.T) {
			core, logs := observer.New(zap.InfoLevel)
			interceptorLogger(zap.New(core)).Log(context.Background(), callLevel(tc.code), "finished call", "grpc.code", tc.code.String())
			if tc.want == zapcore.InvalidLevel {
				if logs.Len() != 0 {
					t.Errorf("%s logged at info level: %v", tc.code, logs.All())
				}
				return
			}
			if logs.Len() != 1 || logs.All()[0].Level != tc.want || logs.All()[0].ContextMap()["grpc.code"] != tc.code.String() {
				t.Errorf("%s: got %v, want one %s line with its code", tc.code, logs.All(), tc.want)
			}
		})
	}
}
