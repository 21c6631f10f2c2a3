// SPDX-License-Identifier: Apache-2.0

package app

import (
	"context"
	"net/http"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/stats"

	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
)

// serviceStreams counts the sidecar's WatchConfig streams that dkc-server accepted (their response headers
// came: the token passed, the node is served) and that have not ended: what /readyz reports. It is the
// connection's gRPC stats handler, so it sees every stream's end however it ends.
type serviceStreams struct{ open atomic.Int64 }

var _ stats.Handler = (*serviceStreams)(nil)

type watchRPCKey struct{}

// watchRPC is one WatchConfig call; opened is set by its response headers, cleared by its end (which may be
// reported on another goroutine than the headers).
type watchRPC struct{ opened atomic.Bool }

func (s *serviceStreams) TagRPC(ctx context.Context, info *stats.RPCTagInfo) context.Context {
	if info.FullMethodName != dkcv1.ConfigService_WatchConfig_FullMethodName {
		return ctx
	}
	return context.WithValue(ctx, watchRPCKey{}, &watchRPC{})
}

func (s *serviceStreams) HandleRPC(ctx context.Context, st stats.RPCStats) {
	w, ok := ctx.Value(watchRPCKey{}).(*watchRPC)
	if !ok {
		return
	}
	switch st.(type) {
	case *stats.InHeader: // not sent for a refusal, which is trailers only
		if w.opened.CompareAndSwap(false, true) {
			s.open.Add(1)
		}
	case *stats.End:
		if w.opened.CompareAndSwap(true, false) {
			s.open.Add(-1)
		}
	}
}

func (s *serviceStreams) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return ctx
}
func (s *serviceStreams) HandleConn(context.Context, stats.ConnStats) {}

// connected says whether a config stream is open now.
func (s *serviceStreams) connected() bool { return s.open.Load() > 0 }

// healthMux serves /metrics, /healthz and /readyz on the metrics address (the DaemonSet's probes):
//   - /healthz answers while the process serves HTTP. It is deliberately nothing more: a sidecar that
//     waits for dkc-server, for the apiserver or for its kubelet to come back healthy is doing its job,
//     and a liveness probe that failed then would kill it in the middle of a health wait.
//   - /readyz is 200 while a WatchConfig stream is open (dkc-server accepted the node's token and serves
//     its config), 503 otherwise: a DaemonSet update stops at the first new pod that cannot reach or is
//     refused by dkc-server, and `kubectl get ds` counts the nodes not connected. streams nil (an injected
//     connection: tests) cannot tell and answers 200.
func healthMux(metrics http.Handler, streams *serviceStreams) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("/metrics", metrics)
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if streams != nil && !streams.connected() {
			http.Error(w, "no config stream open to dkc-server", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok"))
	})
	return mux
}

// registerConnected exports the stream state as dkc_sidecar_connected.
func registerConnected(reg prometheus.Registerer, streams *serviceStreams) {
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "dkc", Subsystem: "sidecar",
		Name: "connected",
		Help: "1 while a WatchConfig stream to dkc-server is open (what /readyz reports), 0 otherwise."}, func() float64 {
		if streams.connected() {
			return 1
		}
		return 0
	}))
}
