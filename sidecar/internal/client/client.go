// SPDX-License-Identifier: Apache-2.0

// Package client is the sidecar's side of dkc.v1.ConfigService: one WatchConfig stream, reconnected with
// exponential backoff and jitter and resumed from what the node last applied (so a reconnect re-delivers
// nothing), and status reports retried until the service acknowledges them. While the service is away the
// node simply keeps what it has.
package client

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"k8s.io/utils/clock"

	"github.com/dkc-dev/dkc/internal/outbox"
	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
)

// Backoff bounds reconnect delays.
type Backoff struct {
	Initial, Max time.Duration
	// Spread is the window over which a node reconnects after the service ended its stream or refused it
	// with Unavailable (a replica draining, --max-connection-age, a replica gone); 0 means DefaultSpread. Every node of
	// that replica sees the same end at the same instant: reconnecting within the usual 125-250ms would bring
	// them all to the other replica, and its TokenReviews, at once.
	Spread time.Duration
}

// DefaultSpread keeps a drained replica's nodes reconnected within the 5s the project promises.
const DefaultSpread = 3 * time.Second

// spread is a uniformly random delay in [Initial, Spread).
func (b Backoff) spread() time.Duration {
	s := b.Spread
	if s == 0 {
		s = DefaultSpread
	}
	if s <= b.Initial {
		return b.Initial
	}
	return b.Initial + time.Duration(rand.Int64N(int64(s-b.Initial)))
}

func (b Backoff) next(d time.Duration) time.Duration {
	if d == 0 {
		return b.Initial
	}
	d *= 2
	if d > b.Max {
		d = b.Max
	}
	return d
}

// jitter spreads reconnects of thousands of nodes: a uniformly random delay in [d/2, d).
func jitter(d time.Duration) time.Duration {
	if d <= 1 {
		return d
	}
	return d/2 + time.Duration(rand.Int64N(int64(d/2)))
}

// Client talks to the config service for one node.
type Client struct {
	node      string
	tokenFile string
	rpc       dkcv1.ConfigServiceClient
	log       *zap.Logger
	backoff   Backoff
	// outbox holds the reports to deliver, numbered with this sidecar start's incarnation (WithIncarnation);
	// RunReporter moves them, Watch tells it of each new stream.
	outbox *outbox.Outbox
	clock  clock.WithTicker // times the outbox's confirmations

	mu sync.Mutex
	// syncError is the service's sync error last received: what the node holds, sent when resuming so
	// that a replica whose state has no error (any more) says so.
	syncError string
	// kubeletVersion is the node's kubelet version the service last sent; resuming, the service sends the
	// state again when the Node says otherwise.
	kubeletVersion string
	// drained is the drained of the last response received: resuming, the service sends the state again
	// when the node's drain says otherwise.
	drained bool
	// driftRepairID is the drift_repair.id of the last response received ("": none): resuming, the service
	// sends the state again when the request standing for the node differs.
	driftRepairID string
	// nodeCapacity is the node's capacity the service last sent; resuming, the service sends the state again
	// if the Node's differs.
	nodeCapacity map[string]string
	wake         chan struct{}

	// reportMu makes enqueuing a status and setting its preview one step, and so taking the report to send
	// and adding the preview to it: the outbox always hands out the status enqueued last (a newer one
	// replaces a pending one; the last acknowledged one is sent again only while none is newer), so the
	// preview set with it is that status's — never one of another status, whose number would not change.
	reportMu sync.Mutex
	// preview is the agent's answer to the pool preview that stands, set with the status enqueued last: part
	// of that status (ReportStatusRequest.preview); nil when none stands. (The outbox, shared with the
	// service's protocol test, carries the status; the preview is added to each report it hands out.)
	preview *dkcv1.PreviewResult
	// drift is the agent's last drift finding, set with the status enqueued last as preview is
	// (ReportStatusRequest.drift); nil when the last check found none.
	drift *dkcv1.Drift
}

// Option configures a Client.
type Option func(*options)

// options are what New's options set, before the client is made of them.
type options struct {
	incarnation uint64
	clock       clock.WithTicker
}

// withClock runs the client's reports on clk (tests).
func withClock(clk clock.WithTicker) Option { return func(o *options) { o.clock = clk } }

// WithIncarnation numbers the reports of this start of the sidecar (the agent's NextIncarnation): the service
// orders a node's reports by (incarnation, sequence), never by the node's clock. Without it reports carry
// only their observed time, as older sidecars' did.
func WithIncarnation(n uint64) Option { return func(o *options) { o.incarnation = n } }

// Config of a client.
type Config struct {
	// Node is the node's name.
	Node string
	// TokenFile holds the bearer token, read on every call so that a rotated projected token is picked up.
	TokenFile string
	// Backoff between failed attempts.
	Backoff Backoff
	Log     *zap.Logger
}

// New returns a client for cfg.Node over conn.
func New(conn grpc.ClientConnInterface, cfg Config, opts ...Option) *Client {
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	o := options{clock: clock.RealClock{}}
	for _, opt := range opts {
		opt(&o)
	}
	return &Client{node: cfg.Node, tokenFile: cfg.TokenFile, rpc: dkcv1.NewConfigServiceClient(conn), log: cfg.Log,
		backoff: cfg.Backoff, clock: o.clock,
		outbox: outbox.New(outbox.Config{Node: cfg.Node, Incarnation: o.incarnation, Log: cfg.Log, Clock: o.clock}),
		wake:   make(chan struct{}, 1)}
}

func (c *Client) authed(ctx context.Context) (context.Context, error) {
	token, err := os.ReadFile(c.tokenFile)
	if err != nil {
		return nil, fmt.Errorf("read token %s: %w", c.tokenFile, err)
	}
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+strings.TrimSpace(string(token))), nil
}

// Watch streams desired states into updates until ctx ends; applied says what the node has, for resuming.
// updates is bidirectional because an unread older update is dropped in favour of the newest.
func (c *Client) Watch(ctx context.Context, applied func() *dkcv1.AppliedConfig,
	updates chan *dkcv1.WatchConfigResponse) error {
	var delay time.Duration
	for ctx.Err() == nil {
		received, err := c.watchOnce(ctx, applied, updates)
		if ctx.Err() != nil {
			return nil
		}
		if received {
			delay = 0 // the stream worked: a quick reconnect is right
		}
		delay = c.backoff.next(delay)
		wait := jitter(delay)
		if s := c.backoff.spread(); status.Code(err) == codes.Unavailable && s > wait {
			wait = s // the service went away: its other nodes reconnect now too
		}
		c.log.Info("config stream ended; reconnecting", zap.Error(err), zap.Duration("in", wait))
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
	return nil
}

func (c *Client) watchOnce(ctx context.Context, applied func() *dkcv1.AppliedConfig,
	updates chan *dkcv1.WatchConfigResponse) (bool, error) {
	actx, err := c.authed(ctx)
	if err != nil {
		return false, err
	}
	sctx, cancel := context.WithCancel(actx)
	defer cancel()
	c.mu.Lock()
	req := &dkcv1.WatchConfigRequest{NodeName: c.node, LastApplied: applied(), SyncError: c.syncError,
		NodeUid: c.outbox.NodeUID(), FollowsNodeUid: true, KubeletVersion: c.kubeletVersion, Drained: c.drained,
		NodeCapacity: c.nodeCapacity, FollowsNodeCapacity: true, DriftRepairId: c.driftRepairID}
	c.mu.Unlock()
	stream, err := c.rpc.WatchConfig(sctx, req)
	if err != nil {
		return false, err
	}
	// The stream is open once the first response or header arrives; headers come at once.
	if _, err := stream.Header(); err != nil {
		return false, err
	}
	c.log.Debug("config stream open")
	// A new stream: the service replica may never have heard of this node.
	c.outbox.Reconnected()
	c.poke()
	received := false
	for {
		resp, err := stream.Recv()
		if err != nil {
			return received, err
		}
		received = true
		d := resp
		c.mu.Lock()
		c.syncError = d.GetSyncError()
		if v := d.GetKubeletVersion(); v != "" {
			c.kubeletVersion = v
		}
		c.drained = d.GetDrained()
		c.driftRepairID = d.GetDriftRepair().GetId()
		if m := d.GetNodeCapacity(); len(m) > 0 {
			c.nodeCapacity = m
		}
		c.mu.Unlock()
		// Latest wins: an update the agent has not taken yet is replaced, so that a burst of reassignments
		// costs one kubelet restart, not one each. An update without an assignment (only a sync error: the
		// service could not resolve the new source) does not drop an assignment still waiting; the newer drained,
		// preview and drift repair go with it, as the service's word on the node now.
		select {
		case updates <- d:
		default:
			select {
			case old := <-updates:
				if d.GetAssignment() == nil {
					d = &dkcv1.WatchConfigResponse{Assignment: old.GetAssignment(), SyncError: d.GetSyncError(),
						ResolvedTime: d.GetResolvedTime(), NodeUid: d.GetNodeUid(), KubeletVersion: d.GetKubeletVersion(),
						Drained: d.GetDrained(), NodeCapacity: d.GetNodeCapacity(), Preview: d.GetPreview(),
						DriftRepair: d.GetDriftRepair()}
				}
			default:
			}
			updates <- d
		}
	}
}

// Report is the agent's Reporter: it puts the status, and the restart, in the outbox, with the answer to
// the preview that stands (nil: none) and the drift found (nil: none) as part of that status; RunReporter
// delivers them. A changed answer or drift comes as a new status, numbered as any is.
func (c *Client) Report(st *dkcv1.NodeConfigStatus, message string, preview *dkcv1.PreviewResult,
	drift *dkcv1.Drift, restart *dkcv1.KubeletRestart) {
	c.reportMu.Lock()
	c.preview, c.drift = preview, drift
	c.outbox.Enqueue(st, message, restart)
	c.reportMu.Unlock()
	c.poke()
}

// next is the report to send now (outbox.Next) with its status's preview answer and drift; nil when none
// is pending.
func (c *Client) next() *dkcv1.ReportStatusRequest {
	c.reportMu.Lock()
	defer c.reportMu.Unlock()
	req := c.outbox.Next()
	if req != nil {
		req.Preview, req.Drift = c.preview, c.drift
	}
	return req
}

// Follow is the agent's word that the statuses it reports from now on follow from the state the service
// resolved from Node object nodeUID (WatchConfigResponse.node_uid). Reports made before keep the object
// they were made for, also when re-sent after a reconnect: if that Node was deleted and registered again,
// the service drops them instead of showing the old object's assignment on the new one. Each new stream
// names it too.
func (c *Client) Follow(nodeUID string) { c.outbox.Follow(nodeUID) }

// poke wakes the reporter.
func (c *Client) poke() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// RunReporter sends the outbox's report until acknowledged, with backoff, until ctx ends.
func (c *Client) RunReporter(ctx context.Context) error {
	var delay time.Duration
	for {
		req := c.next()
		if req == nil {
			if !c.idle(ctx) {
				return nil
			}
			continue
		}
		resp, err := c.send(ctx, req)
		if err == nil {
			delay = 0
			c.outbox.Ack(req, resp.GetRestartQueued())
			continue
		}
		if ctx.Err() != nil {
			return nil
		}
		delay = c.backoff.next(delay)
		c.log.Warn("status report failed; retrying", zap.Error(err), zap.Duration("in", delay))
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(jitter(delay)):
		}
	}
}

// idle waits until there may be a report to send: a poke, or a parked restart's confirmation coming due
// (outbox.ConfirmAfter). False once ctx ends.
func (c *Client) idle(ctx context.Context) bool {
	var due <-chan time.Time
	if at, ok := c.outbox.NextConfirm(); ok {
		t := c.clock.NewTimer(at.Sub(c.clock.Now()))
		defer t.Stop()
		due = t.C()
	}
	select {
	case <-ctx.Done():
		return false
	case <-c.wake:
	case <-due:
		c.outbox.Confirm()
	}
	return true
}

func (c *Client) send(ctx context.Context, req *dkcv1.ReportStatusRequest) (*dkcv1.ReportStatusResponse, error) {
	actx, err := c.authed(ctx)
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(actx, 30*time.Second)
	defer cancel()
	resp, err := c.rpc.ReportStatus(cctx, req)
	if err != nil {
		return nil, err
	}
	c.log.Debug("status reported", zap.String("error", req.GetStatus().GetError()),
		zap.Bool("restart", req.GetRestart() != nil), zap.Bool("restartQueued", resp.GetRestartQueued()),
		zap.Uint64("incarnation", req.GetIncarnation()), zap.Uint64("sequence", req.GetSequence()))
	return resp, nil
}
