// SPDX-License-Identifier: Apache-2.0

// Package rpc implements dkc.v1.ConfigService: WatchConfig streams a node's desired state from the
// assignment table; ReportStatus hands a node's status to the status writer. Every handler first checks
// that the caller acts for its own node (package auth). A node has at most one WatchConfig stream on a
// replica, and an assignment is encoded once for all the nodes it is sent to (codec.go); the gRPC server
// must be built with ServerOptions.
package rpc

import (
	"context"
	"errors"
	"maps"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/utils/clock"

	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
	"github.com/dkc-dev/dkc/services/internal/assignment"
	"github.com/dkc-dev/dkc/services/internal/auth"
	"github.com/dkc-dev/dkc/services/internal/nodestatus"
)

// Reauthenticator checks again the credential a call was authenticated with (auth.Authenticator).
type Reauthenticator interface {
	// Reauthenticate verifies the token of ctx's call again (a TokenReview once its cached verification
	// lapsed) and returns until when the answer holds. codes.Unavailable: it could not be checked now;
	// any other error: the token no longer authenticates the stream's caller.
	Reauthenticate(ctx context.Context) (time.Time, error)
}

// StatusWriter is what the service needs of the node status writer.
type StatusWriter interface {
	Report(ctx context.Context, node string, req *dkcv1.ReportStatusRequest) (nodestatus.Receipt, error)
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

	encodings encodings

	// reauth, when set, re-checks each WatchConfig stream's token whenever its verification lapses
	// (Config.Reauth).
	reauth Reauthenticator
	clock  clock.Clock

	streams *Streams
}

// Streams is each node's current WatchConfig stream on this replica. It is created before the service and
// the status writer, which asks it which nodes this replica serves (Serving).
type Streams struct {
	mu      sync.Mutex
	streams map[string]*watch
}

// NewStreams returns an empty registry.
func NewStreams() *Streams { return &Streams{streams: map[string]*watch{}} }

// Serving says whether the node has a WatchConfig stream on this replica: only then does this replica
// write the node's status unprompted (nodestatus.Config.Serving).
func (r *Streams) Serving(node string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.streams[node] != nil
}

// watch is one WatchConfig stream; replaced is closed when the node opens a newer one.
type watch struct{ replaced chan struct{} }

// Config of a Service.
type Config struct {
	// Log is where the service logs refusals and streams; nil: nowhere.
	Log *zap.Logger
	// Table is the assignment table WatchConfig streams read. Required.
	Table *assignment.Table
	// Status is the node status writer that ReportStatus hands reports to (nodestatus.Writer). Required by
	// ReportStatus.
	Status StatusWriter
	// Metrics records streams and reports; nil: no metrics.
	Metrics *Metrics
	// Streams keeps each node's WatchConfig stream; the status writer shares it (Streams.Serving). nil: a
	// registry of the service's own.
	Streams *Streams
	// Reauth, if not nil, makes every WatchConfig stream check its token again whenever its verification
	// lapses (auth.VerifiedUntil, then what each check returns): a stream is authenticated when it opens, but
	// lives for up to --max-connection-age, and a revoked token (its pod or node deleted) must stop
	// receiving configs within the token cache TTL, not half an hour later. A refusal ends the stream with
	// codes.Unauthenticated; a check that could not be made (the apiserver unreachable) keeps it and is
	// retried, so that an apiserver outage does not cut every node off from dkc. nil: streams are checked
	// only when they open.
	Reauth Reauthenticator
	// Clock times the re-checks; nil: the real clock.
	Clock clock.Clock
}

// New returns the service.
func New(cfg Config) *Service {
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	if cfg.Streams == nil {
		cfg.Streams = NewStreams()
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	return &Service{log: cfg.Log, table: cfg.Table, status: cfg.Status, metrics: cfg.Metrics,
		shutdown: make(chan struct{}), streams: cfg.Streams, reauth: cfg.Reauth, clock: cfg.Clock}
}

// register makes a new stream the node's only one, ending the previous one. The newest stream wins: a
// sidecar reconnects when its stream fails, so an older stream of the node is one it gave up on (its TCP
// connection perhaps half-dead, not yet found by keepalive) — or a copy of its token opening streams, each
// of which costs a goroutine and buffers here.
func (s *Service) register(node string) *watch {
	w := &watch{replaced: make(chan struct{})}
	r := s.streams
	r.mu.Lock()
	defer r.mu.Unlock()
	if old := r.streams[node]; old != nil {
		close(old.replaced)
		s.metrics.replacedStream()
	}
	r.streams[node] = w
	return w
}

// Serving says whether the node has a WatchConfig stream on this replica (Streams.Serving).
func (s *Service) Serving(node string) bool { return s.streams.Serving(node) }

// unregister forgets w unless a newer stream of the node has replaced it.
func (s *Service) unregister(node string, w *watch) {
	r := s.streams
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.streams[node] == w {
		delete(r.streams, node)
	}
}

// Shutdown ends every WatchConfig stream with codes.Unavailable so that sidecars reconnect (to another
// replica) at once: gRPC's GracefulStop waits for RPCs to end, and these streams never end by themselves.
func (s *Service) Shutdown() { s.shutdownOnce.Do(func() { close(s.shutdown) }) }

// WatchConfig streams the node's desired state. It sends a message whenever the state differs from what
// the node has: at first from what the request says it applied, later from what was sent. While a Send is
// blocked by a slow node, changes pile up as one: the next message carries only the latest state. A newer
// stream of the same node ends this one with codes.Aborted; a token that no longer passes its re-check
// (Config.Reauth) with codes.Unauthenticated.
//
// The stream's goroutine spends its life parked in the select below, on top of grpc-go's and the
// interceptors' frames. The runtime halves a goroutine's stack at a collection only while less than a
// quarter of it is in use, so the depth parked here decides the stack of every connected node: the work
// is done in helpers kept out of this frame (noinline), the stream's state lives on the heap
// (watchState), and the service's own logging replaces the logging interceptor for this method
// (server.newGRPCServer). A send's peak grows the stack; parked shallow, it shrinks back to the next size
// down at the following collection, which for thousands of streams is most of a replica's stack memory
// (docs/results.md).
func (s *Service) WatchConfig(req *dkcv1.WatchConfigRequest, stream dkcv1.ConfigService_WatchConfigServer) (err error) {
	ws, err := s.startWatch(req, stream)
	if err != nil {
		return err
	}
	defer func() { s.endWatch(ws, err) }()
	for {
		select {
		case <-ws.w.replaced: // both may be ready: never send on a replaced stream
			return ws.replaced()
		default:
		}
		changed, err := s.push(stream, ws)
		if err != nil {
			return err
		}
		select {
		case <-changed:
		case <-ws.rc.due():
			ws.rc.start()
		case res := <-ws.rc.done():
			if err := ws.rc.handle(res, ws.log()); err != nil {
				return err
			}
		case <-ws.ctx.Done():
			return nil
		case <-ws.w.replaced:
			return ws.replaced()
		case <-s.shutdown:
			return errShuttingDown
		}
	}
}

var errShuttingDown = status.Error(codes.Unavailable, "dkc-server is shutting down; reconnect")

// watchState is one WatchConfig stream's state, off the stack of its goroutine.
type watchState struct {
	ctx   context.Context
	start time.Time
	node  string
	w     *watch
	base  *zap.Logger // the service's logger: a logger made once per stream (log.With) would keep ~1.5 KiB each
	rc    *recheck
	// What the node has: its applied assignment (nil = unknown: send the first state whatever it is) and
	// the sync error it holds, told by this or another replica before the reconnect: an error that
	// cleared meanwhile must be cleared on the node too, even when the assignment is unchanged.
	has           *dkcv1.Assignment
	known         bool
	sentSyncError string
	// nodeUID is the Node object the node's state came from, as the node says or was last sent; "" when
	// the node does not know (a sidecar just started, or an older one).
	nodeUID string
	// followsNodeUID: the sidecar names the Node object in its reports (an older one does not): tell it the
	// object also when it names none.
	followsNodeUID bool
	// kubeletVersion is the node's kubelet version as the node says or was last sent: the sidecar validates
	// with that minor's code, so a change (a node upgraded in place) is sent.
	kubeletVersion string
	// drained is what the node was last told of its drain (or says it was): a change is sent.
	drained bool
	// capacity is the node's capacity as the node says or was last sent: a change is sent to a sidecar
	// that follows it (followsCapacity), which says what it has.
	capacity        map[string]string
	followsCapacity bool
	// preview is the pool preview last sent on this stream (nil: none, or nothing sent yet). The sidecar
	// does not say which it has, so a new stream sends one that stands; previews are rare.
	preview *dkcv1.Preview
	// driftRepair is the id of the drift repair request the node was last told of (or says it was): a
	// change is sent; a sidecar that does not say one gets a standing request on every new stream.
	driftRepair string
}

//go:noinline
func (s *Service) startWatch(req *dkcv1.WatchConfigRequest,
	stream dkcv1.ConfigService_WatchConfigServer) (*watchState, error) {
	ctx := stream.Context()
	node := req.GetNodeName()
	if err := auth.Authorize(ctx, node); err != nil {
		s.log.Warn("node watch refused", zap.String("node", node), zap.Stringer("grpc.code", status.Code(err)),
			zap.Error(err))
		return nil, err
	}
	ws := &watchState{ctx: ctx, start: time.Now(), node: node, w: s.register(node), base: s.log}
	// Headers now, not with the first message: the sidecar takes them as "this replica has my stream" and
	// sends its last report again (Outbox.Reconnected). A node that resumes with nothing to push would
	// otherwise get no headers, and a report this replica queued before the stream was registered —
	// dropped by the status queue as another replica's (nodestatus Config.Serving) — would never come back.
	if err := stream.SendHeader(nil); err != nil {
		s.unregister(node, ws.w)
		return nil, err
	}
	s.metrics.connected(1)
	ws.log().Info("node watching", zap.Bool("resume", req.GetLastApplied() != nil))
	ws.known = req.GetLastApplied() != nil
	if ws.known {
		ws.has = &dkcv1.Assignment{Source: req.GetLastApplied().GetSource(),
			ContentHash: req.GetLastApplied().GetContentHash()}
	}
	ws.sentSyncError = req.GetSyncError()
	ws.nodeUID, ws.followsNodeUID, ws.kubeletVersion = req.GetNodeUid(), req.GetFollowsNodeUid(), req.GetKubeletVersion()
	ws.drained, ws.capacity, ws.followsCapacity = req.GetDrained(), req.GetNodeCapacity(), req.GetFollowsNodeCapacity()
	ws.driftRepair = req.GetDriftRepairId()
	ws.rc = s.newRecheck(ctx)
	return ws, nil
}

// log is the stream's logger, made when something is logged.
func (ws *watchState) log() *zap.Logger { return ws.base.With(zap.String("node", ws.node)) }

// endWatch releases the stream and logs how it ended, with the gRPC code the node gets (the logging
// interceptor does not see this method).
//
//go:noinline
func (s *Service) endWatch(ws *watchState, err error) {
	ws.rc.stop()
	ws.log().Info("node watch ended", zap.Stringer("grpc.code", status.Code(err)),
		zap.Duration("took", time.Since(ws.start)), zap.Error(err))
	s.metrics.connected(-1)
	s.unregister(ws.node, ws.w)
}

//go:noinline
func (ws *watchState) replaced() error {
	ws.log().Info("node watch replaced by a newer stream of the node")
	return status.Errorf(codes.Aborted, "replaced by a newer WatchConfig stream of node %s on this replica", ws.node)
}

// push sends the node's state if it differs from what the node has, and returns what to wait on for the
// next change.
//
//go:noinline
func (s *Service) push(stream dkcv1.ConfigService_WatchConfigServer, ws *watchState) (<-chan struct{}, error) {
	st, ok, changed := s.table.Get(ws.node)
	if !ok {
		return changed, nil
	}
	// A node that names another Node object than the state's, or none while it could use one (its state
	// file lost, or upgraded from a version without it), is told the object, even when its config stays the
	// same: its reports name the object they are about (the Node may have been deleted and registered
	// again). A sidecar of an older version names none and would not use it: nothing more is sent to it for
	// that. A node told another kubelet version than the Node's now (upgraded in place) is sent its state
	// again; a sidecar older than kubelet_version never says one, and gets its state once per stream. A
	// sidecar that follows the node's capacity is sent another one; an older one, which never says it, is
	// not sent its state for it at each stream's start. A pool's preview is sent when it comes, changes or
	// goes, and on every new stream while it stands (the sidecar does not say which it has). So is a pool's
	// request to repair the node's drift.
	send := !ws.known || st.SyncError != ws.sentSyncError ||
		(st.Assignment != nil && !assignment.SameAssignment(st.Assignment, ws.has)) ||
		(st.NodeUID != "" && st.NodeUID != ws.nodeUID && (ws.nodeUID != "" || ws.followsNodeUID)) ||
		(st.KubeletVersion != "" && st.KubeletVersion != ws.kubeletVersion) || st.Drained != ws.drained ||
		(ws.followsCapacity && len(st.NodeCapacity) > 0 && !maps.Equal(st.NodeCapacity, ws.capacity)) ||
		!assignment.SamePreview(st.Preview, ws.preview) || st.DriftRepair.GetId() != ws.driftRepair
	if !send {
		return changed, nil
	}
	resp, err := s.encodings.response(st)
	if err != nil {
		ws.log().Error("encode config", zap.Error(err))
		return nil, status.Error(codes.Internal, "encode config")
	}
	if err := stream.SendMsg(resp); err != nil {
		return nil, err
	}
	s.metrics.pushed(st.Changed)
	// Per push and node: debug. The assignment's own line is the controller's "node assigned config".
	ws.log().Debug("pushed config", zap.String("contentHash", st.Assignment.GetContentHash()),
		zap.Bool("local", st.Assignment != nil && st.Assignment.GetSource().GetConfigMap() == nil),
		zap.String("syncError", st.SyncError), zap.String("previewPool", st.Preview.GetPool()),
		zap.String("previewRevision", st.Preview.GetRevision()))
	ws.known, ws.sentSyncError, ws.nodeUID, ws.kubeletVersion = true, st.SyncError, st.NodeUID, st.KubeletVersion
	ws.drained, ws.preview, ws.driftRepair = st.Drained, st.Preview, st.DriftRepair.GetId()
	if len(st.NodeCapacity) > 0 {
		ws.capacity = st.NodeCapacity
	}
	if st.Assignment != nil {
		ws.has = st.Assignment
	}
	return changed, nil
}

// ReportStatus hands the node's report to the status writer and acknowledges it once the status is on its
// Node or queued to be written (docs/design.md, "What a status acknowledgement means").
func (s *Service) ReportStatus(ctx context.Context,
	req *dkcv1.ReportStatusRequest) (*dkcv1.ReportStatusResponse, error) {
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
	receipt, err := s.status.Report(ctx, node, req)
	if errors.Is(err, nodestatus.ErrStale) {
		return &dkcv1.ReportStatusResponse{}, nil // a newer report is already on the Node
	}
	if errors.Is(err, nodestatus.ErrOtherNode) {
		// Acknowledged, not to be sent again (the writer logged it): the node's next report, made for the
		// Node object there is now, takes its place.
		return &dkcv1.ReportStatusResponse{}, nil
	}
	if err != nil {
		s.log.Warn("status report not written", zap.String("node", node), zap.Error(err))
		return nil, status.Errorf(codes.Unavailable, "write status of node %s: %v", node, err)
	}
	return &dkcv1.ReportStatusResponse{RestartQueued: receipt.EventQueued}, nil
}

// Metrics of the service; a nil *Metrics records nothing.
type Metrics struct {
	connectedNodes  prometheus.Gauge
	pushes          prometheus.Counter
	pushLatency     prometheus.Histogram
	replacedStreams prometheus.Counter
}

// NewMetrics registers the service's metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		connectedNodes: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "dkc", Subsystem: "server",
			Name: "connected_nodes", Help: "Open WatchConfig streams."}),
		pushes: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "dkc", Subsystem: "server", Name: "pushes_total",
			Help: "Messages sent on WatchConfig streams."}),
		pushLatency: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "dkc", Subsystem: "server",
			Name: "push_latency_seconds",
			Help: "Time from a node's state change to its push.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 16)}),
		replacedStreams: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "dkc", Subsystem: "server",
			Name: "replaced_streams_total",
			Help: "WatchConfig streams ended because their node opened a newer one: reconnects over half-dead connections; a " +
				"steady rate means two clients share a node's token."}),
	}
	reg.MustRegister(m.connectedNodes, m.pushes, m.pushLatency, m.replacedStreams)
	return m
}

func (m *Metrics) connected(d float64) {
	if m != nil {
		m.connectedNodes.Add(d)
	}
}

func (m *Metrics) replacedStream() {
	if m != nil {
		m.replacedStreams.Inc()
	}
}

func (m *Metrics) pushed(changed time.Time) {
	if m != nil {
		m.pushes.Inc()
		m.pushLatency.Observe(time.Since(changed).Seconds())
	}
}
