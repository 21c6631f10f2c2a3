// SPDX-License-Identifier: Apache-2.0

package app

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/dkc-dev/dkc/internal/poll"
	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
)

// watchServer accepts WatchConfig calls whose token is "good" (headers, one message, then open until the
// caller ends it) and refuses the others before any header, as dkc-server's auth interceptor does.
type watchServer struct {
	dkcv1.UnimplementedConfigServiceServer
}

func (watchServer) WatchConfig(_ *dkcv1.WatchConfigRequest, s grpc.ServerStreamingServer[dkcv1.WatchConfigResponse]) error {
	md, _ := metadata.FromIncomingContext(s.Context())
	if got := md.Get("authorization"); len(got) != 1 || got[0] != "Bearer good" {
		return status.Error(codes.Unauthenticated, "token refused")
	}
	if err := s.SendHeader(nil); err != nil {
		return err
	}
	if err := s.Send(&dkcv1.WatchConfigResponse{}); err != nil {
		return err
	}
	<-s.Context().Done()
	return nil
}

// TestReadinessFollowsTheConfigStream: /readyz is 503 until dkc-server accepts a WatchConfig stream, 200
// while it is open, 503 again once it ends; a refused stream never makes it ready. /healthz is 200
// throughout: a sidecar waiting for dkc-server is alive.
func TestReadinessFollowsTheConfigStream(t *testing.T) {
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer()
	dkcv1.RegisterConfigServiceServer(srv, watchServer{})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	streams := &serviceStreams{}
	conn, err := grpc.NewClient("passthrough:///bufconn", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithStatsHandler(streams))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	mux := healthMux(http.NotFoundHandler(), streams)
	get := func(path string) (int, string) {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		return rec.Code, strings.TrimSpace(rec.Body.String())
	}
	want := func(step string, ready int) {
		t.Helper()
		// The stream's end is reported on the client's own goroutines: wait for it.
		poll.UntilNil(t, fmt.Sprintf("%s: /readyz %d", step, ready), func() error {
			if code, body := get("/readyz"); code != ready {
				return fmt.Errorf("/readyz %d %q", code, body)
			}
			return nil
		})
		if code, _ := get("/healthz"); code != http.StatusOK {
			t.Errorf("%s: /healthz %d, want 200", step, code)
		}
	}
	want("before any stream", http.StatusServiceUnavailable)

	watch := func(ctx context.Context, token string) (grpc.ServerStreamingClient[dkcv1.WatchConfigResponse], error) {
		s, err := dkcv1.NewConfigServiceClient(conn).WatchConfig(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token), &dkcv1.WatchConfigRequest{NodeName: "n"})
		if err != nil {
			return nil, err
		}
		if _, err = s.Recv(); err != nil {
			return nil, err
		}
		// Read on, as the sidecar's client does: a stream's end is reported to the one reading it.
		go func() {
			for {
				if _, err := s.Recv(); err != nil {
					return
				}
			}
		}()
		return s, nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := watch(ctx, "bad"); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("refused stream: %v", err)
	}
	want("after a refused stream", http.StatusServiceUnavailable)

	sctx, end := context.WithCancel(ctx)
	if _, err := watch(sctx, "good"); err != nil {
		t.Fatal(err)
	}
	want("stream open", http.StatusOK)
	end()
	want("stream ended", http.StatusServiceUnavailable)

	if _, err := watch(ctx, "good"); err != nil {
		t.Fatal(err)
	}
	want("reconnected", http.StatusOK)
	srv.Stop()
	want("dkc-server gone", http.StatusServiceUnavailable)
}

// TestReadinessWithoutTracking: an injected connection (tests, the benchmark) is not tracked: ready.
func TestReadinessWithoutTracking(t *testing.T) {
	rec := httptest.NewRecorder()
	healthMux(http.NotFoundHandler(), nil).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("/readyz %d, want 200", rec.Code)
	}
}

// TestDefaultMetricsPortIsFree: the default metrics port is none that a well-known node agent listens on
// in the host's network namespace, where the sidecar listens too (DefaultMetricsAddress says whose).
func TestDefaultMetricsPortIsFree(t *testing.T) {
	_, port, err := net.SplitHostPort(DefaultConfig().MetricsAddress)
	if err != nil {
		t.Fatal(err)
	}
	taken := map[string]string{"9091": "Calico Felix", "9099": "Calico health", "9100": "node-exporter", "10248": "kubelet healthz",
		"10249": "kube-proxy metrics", "10250": "kubelet", "10255": "kubelet read-only", "10256": "kube-proxy healthz",
		"10257": "kube-controller-manager", "10258": "cloud-controller-manager", "10259": "kube-scheduler", "9962": "Cilium agent",
		"9963": "Cilium operator", "9964": "Cilium Envoy", "9965": "Hubble", "9876": "Cilium agent API", "20256": "node-problem-detector",
		"20257": "node-problem-detector"}
	if who, ok := taken[port]; ok {
		t.Fatalf("default metrics port %s is %s's", port, who)
	}
	if host, _, _ := net.SplitHostPort(DefaultConfig().MetricsAddress); host != "" {
		t.Errorf("default metrics address binds %q only; Prometheus and the kubelet's probes reach the node's IP", host)
	}
}
