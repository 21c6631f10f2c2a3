// Package rpc implements dkc.v1.ConfigService: WatchConfig streams a node's desired state from the
// assignment table; ReportStatus hands a node's status to the status writer. Every handler first checks
// that the caller acts for its own node (package auth).
package rpc

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
	"github.com/dkc-dev/dkc/services/assignment"
	"github.com/dkc-dev/dkc/services/auth"
	"github.com/dkc-dev/dkc/services/nodestatus"
)

// StatusWriter is what the service needs of the node status writer.
type StatusWriter interface {
	Report(ctx context.Context, node string, req *dkcv1.ReportStatusRequest) error
}

// Service implements dkcv1.ConfigServiceServer.
type Service struct {
	dkcv1.UnimplementedConfigServiceServer
	log     *zap.Logger
	table   *assignment.Table
	status  StatusWriter
	metrics *Metrics

	shutdownOnce sync.Once
	shutdown     chan struct{}
}

// New returns the service; m may be nil.
func New(log *zap.Logger, table *assignment.Table, status StatusWriter, m *Metrics) *Service {
	return &Service{log: log, table: table, status: status, metrics: m, shutdown: make(chan struct{})}
}

// Shutdown ends every WatchConfig stream with codes.Unavailable so that sidecars reconnect (to another
// replica) at once: gRPC's GracefulStop waits for RPCs to end, and these streams never end by themselves.
func (s *Service) Shutdown() { s.shutdownOnce.Do(func() { close(s.shutdown) }) }

// WatchConfig streams the node's desired state. It sends a message whenever the state differs from what
// the node has: at first from what the request says it applied, later from what was sent. While a Send is
// blocked by a slow node, changes pile up as one: the next message carries only the latest state.
func (s *Service) WatchConfig(req *dkcv1.WatchConfigRequest, stream dkcv1.ConfigService_WatchConfigServer) error {
	ctx := stream.Context()
	node := req.GetNodeName()
	if err := auth.Authorize(ctx, node); err != nil {
		return err
	}
	s.metrics.connected(1)
	defer s.metrics.connected(-1)
	log := s.log.With(zap.String("node", node))
	log.Info("node watching", zap.Bool("resume", req.GetLastApplied() != nil))
	defer log.Info("node watch ended")

	// What the node has: its applied assignment (nil = unknown: send the first state whatever it is) and
	// the sync error it holds, told by this or another replica before the reconnect: an error that
	// cleared meanwhile must be cleared on the node too, even when the assignment is unchanged.
	var has *dkcv1.Assignment
	known := req.GetLastApplied() != nil
	if known {
		has = &dkcv1.Assignment{Source: req.GetLastApplied().GetSource(), ContentHash: req.GetLastApplied().GetContentHash()}
	}
	sentSyncError := req.GetSyncError()
	for {
		st, ok, changed := s.table.Get(node)
		if ok {
			send := !known || st.SyncError != sentSyncError ||
				(st.Assignment != nil && !assignment.SameAssignment(st.Assignment, has))
			if send {
				resp := &dkcv1.WatchConfigResponse{
					Assignment:   st.Assignment,
					SyncError:    st.SyncError,
					ResolvedTime: timestamppb.New(st.Changed),
				}
				if err := stream.Send(resp); err != nil {
					return err
				}
				s.metrics.pushed(st.Changed)
				log.Info("pushed config", zap.String("contentHash", st.Assignment.GetContentHash()),
					zap.Bool("local", st.Assignment != nil && st.Assignment.GetSource().GetConfigMap() == nil),
					zap.String("syncError", st.SyncError))
				known, sentSyncError = true, st.SyncError
				if st.Assignment != nil {
					has = st.Assignment
				}
			}
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil
		case <-s.shutdown:
			return status.Error(codes.Unavailable, "dkc-server is shutting down; reconnect")
		}
	}
}

// ReportStatus writes the node's status onto its Node before acknowledging.
func (s *Service) ReportStatus(ctx context.Context, req *dkcv1.ReportStatusRequest) (*dkcv1.ReportStatusResponse, error) {
	node := req.GetNodeName()
	if err := auth.Authorize(ctx, node); err != nil {
		return nil, err
	}
	if req.GetStatus() == nil {
		return nil, status.Error(codes.InvalidArgument, "status is required")
	}
	if r := req.GetRestart(); r != nil && !nodestatus.ValidRestartID(r.GetId()) {
		return nil, status.Errorf(codes.InvalidArgument, "restart.id %q: want 1-64 characters of [a-z0-9]", r.GetId())
	}
	err := s.status.Report(ctx, node, req)
	if errors.Is(err, nodestatus.ErrStale) {
		return &dkcv1.ReportStatusResponse{}, nil // a newer report is already on the Node
	}
	if err != nil {
		s.log.Warn("status report not written", zap.String("node", node), zap.Error(err))
		return nil, status.Errorf(codes.Unavailable, "write status of node %s: %v", node, err)
	}
	return &dkcv1.ReportStatusResponse{}, nil
}

// Metrics of the service; a nil *Metrics records nothing.
type Metrics struct {
	connectedNodes prometheus.Gauge
	pushes         prometheus.Counter
	pushLatency    prometheus.Histogram
}

// NewMetrics registers the service's metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		connectedNodes: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "dkc", Subsystem: "server", Name: "connected_nodes",
			Help: "Open WatchConfig streams."}),
		pushes: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "dkc", Subsystem: "server", Name: "pushes_total",
			Help: "Messages sent on WatchConfig streams."}),
		pushLatency: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "dkc", Subsystem: "server", Name: "push_latency_seconds",
			Help: "Time from a node's state change to its push.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 16)}),
	}
	reg.MustRegister(m.connectedNodes, m.pushes, m.pushLatency)
	return m
}

func (m *Metrics) connected(d float64) {
	if m != nil {
		m.connectedNodes.Add(d)
	}
}

func (m *Metrics) pushed(changed time.Time) {
	if m != nil {
		m.pushes.Inc()
		m.pushLatency.Observe(time.Since(changed).Seconds())
	}
}
