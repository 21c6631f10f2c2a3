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
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
)

// Backoff bounds reconnect delays.
type Backoff struct {
	Initial, Max time.Duration
	// Spread is the window over which a node reconnects after the service ended its stream or refused it
	// with Unavailable (a replica draining, --max-connection-age, a replica gone); 0 means DefaultSpread. Every node of that
	// replica sees the same end at the same instant: reconnecting within the usual 125-250ms would bring
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
	// incarnation of this sidecar start; sequence numbers its reports (see WithIncarnation).
	incarnation uint64

	mu       sync.Mutex
	sequence uint64
	pending  *dkcv1.ReportStatusRequest // latest unacknowledged report
	// restarts not yet acknowledged, oldest first. A report carries one restart (one Event); the head rides
	// on every report until acknowledged, then the next one does, so none is lost while the service is away.
	restarts []*dkcv1.KubeletRestart
	// syncError is the service's sync error last received: what the node holds, sent when resuming so
	// that a replica whose state has no error (any more) says so.
	syncError string
	// nodeUID is the Node object the agent's state follows from (Follow): reports name it, so that the
	// service does not write them onto a Node registered again under the node's name.
	nodeUID string
	// kubeletVersion is the node's kubelet version the service last sent; resuming, the service sends the
	// state again when the Node says otherwise.
	kubeletVersion string
	wake           chan struct{}
	// connected is closed-and-replaced on each new stream, so the reporter re-sends after a reconnect (the
	// service may be a new replica that knows nothing of this node).
	connected chan struct{}
}

// Option configures a Client.
type Option func(*Client)

// WithIncarnation numbers the reports of this start of the sidecar (the agent's NextIncarnation): the service
// orders a node's reports by (incarnation, sequence), never by the node's clock. Without it reports carry
// only their observed time, as older sidecars' did.
func WithIncarnation(n uint64) Option { return func(c *Client) { c.incarnation = n } }

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
	c := &Client{node: cfg.Node, tokenFile: cfg.TokenFile, rpc: dkcv1.NewConfigServiceClient(conn), log: cfg.Log, backoff: cfg.Backoff,
		wake: make(chan struct{}, 1), connected: make(chan struct{})}
	for _, o := range opts {
		o(c)
	}
	return c
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
func (c *Client) Watch(ctx context.Context, applied func() *dkcv1.AppliedConfig, updates chan *dkcv1.WatchConfigResponse) error {
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

func (c *Client) watchOnce(ctx context.Context, applied func() *dkcv1.AppliedConfig, updates chan *dkcv1.WatchConfigResponse) (bool, error) {
	actx, err := c.authed(ctx)
	if err != nil {
		return false, err
	}
	sctx, cancel := context.WithCancel(actx)
	defer cancel()
	c.mu.Lock()
	req := &dkcv1.WatchConfigRequest{NodeName: c.node, LastApplied: applied(), SyncError: c.syncError, NodeUid: c.nodeUID, FollowsNodeUid: true,
		KubeletVersion: c.kubeletVersion}
	c.mu.Unlock()
	stream, err := c.rpc.WatchConfig(sctx, req)
	if err != nil {
		return false, err
	}
	// The stream is open once the first response or header arrives; headers come at once.
	if _, err := stream.Header(); err != nil {
		return false, err
	}
	c.log.Info("config stream open")
	c.mu.Lock()
	close(c.connected)
	c.connected = make(chan struct{})
	c.mu.Unlock()
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
		c.mu.Unlock()
		// Latest wins: an update the agent has not taken yet is replaced, so that a burst of reassignments
		// costs one kubelet restart, not one each. An update without an assignment (only a sync error: the
		// service could not resolve the new source) does not drop an assignment still waiting.
		select {
		case updates <- d:
		default:
			select {
			case old := <-updates:
				if d.GetAssignment() == nil {
					d = &dkcv1.WatchConfigResponse{Assignment: old.GetAssignment(), SyncError: d.GetSyncError(),
						ResolvedTime: d.GetResolvedTime(), NodeUid: d.GetNodeUid(), KubeletVersion: d.GetKubeletVersion()}
				}
			default:
			}
			updates <- d
		}
	}
}

// MaxPendingRestarts bounds the restarts kept for delivery while the service is unreachable. Restarts are
// seconds apart at the least (each waits for the kubelet's health), so this covers a long outage; beyond
// it the oldest are dropped, with a log line each: their Events are history, the status is what matters.
const MaxPendingRestarts = 32

// Report is the agent's Reporter: it records the status to send and queues the restart; Run delivers them.
func (c *Client) Report(st *dkcv1.NodeConfigStatus, message string, restart *dkcv1.KubeletRestart) {
	c.mu.Lock()
	if restart != nil {
		if len(c.restarts) == MaxPendingRestarts {
			c.log.Warn("too many unacknowledged kubelet restarts; dropping the oldest, its event is lost",
				zap.String("restartID", c.restarts[0].GetId()), zap.Int("max", MaxPendingRestarts))
			c.restarts = c.restarts[1:]
		}
		c.restarts = append(c.restarts, restart)
	}
	c.pending = c.newRequest(st, message)
	c.mu.Unlock()
	c.poke()
}

// Follow is the agent's word that the statuses it reports from now on follow from the state the service
// resolved from Node object nodeUID (WatchConfigResponse.node_uid). Reports made before keep the object
// they were made for, also when re-sent after a reconnect: if that Node was deleted and registered again,
// the service drops them instead of showing the old object's assignment on the new one.
func (c *Client) Follow(nodeUID string) {
	c.mu.Lock()
	c.nodeUID = nodeUID
	c.mu.Unlock()
}

// newRequest numbers a new status; c.mu is held.
func (c *Client) newRequest(st *dkcv1.NodeConfigStatus, message string) *dkcv1.ReportStatusRequest {
	c.sequence++
	return &dkcv1.ReportStatusRequest{NodeName: c.node, Status: st, Message: message, ObservedTime: timestamppb.Now(),
		Incarnation: c.incarnation, Sequence: c.sequence, NodeUid: c.nodeUID}
}

// poke wakes the reporter.
func (c *Client) poke() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// RunReporter sends the latest report until acknowledged, with backoff, until ctx ends; after every
// reconnect of the stream it sends the latest status again.
func (c *Client) RunReporter(ctx context.Context) error {
	var last *dkcv1.ReportStatusRequest
	var delay time.Duration
	for {
		c.mu.Lock()
		req := c.pending
		var restart *dkcv1.KubeletRestart
		if len(c.restarts) > 0 {
			restart = c.restarts[0]
		}
		connected := c.connected
		c.mu.Unlock()
		if req != nil {
			req = proto.Clone(req).(*dkcv1.ReportStatusRequest)
			req.Restart = restart
			err := c.send(ctx, req)
			if err == nil {
				delay = 0
				c.mu.Lock()
				if restart != nil && len(c.restarts) > 0 && c.restarts[0] == restart {
					c.restarts = c.restarts[1:]
				}
				// The report stays pending while restarts wait: the next one rides on it. A newer report (another
				// sequence number: also one with the same status about another Node object) stays to be sent.
				if len(c.restarts) == 0 && c.pending != nil && c.pending.GetSequence() == req.GetSequence() && c.pending.GetNodeUid() == req.GetNodeUid() {
					last, c.pending = c.pending, nil
				}
				c.mu.Unlock()
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
			continue
		}
		select {
		case <-ctx.Done():
			return nil
		case <-c.wake:
		case <-connected:
			// A new stream: the service replica may never have heard of us.
			c.mu.Lock()
			if c.pending == nil && last != nil {
				// The same report, so the same incarnation and sequence; a fresh observed time keeps an
				// older replica (which orders by it) from taking it for stale.
				resend := proto.Clone(last).(*dkcv1.ReportStatusRequest)
				resend.ObservedTime = timestamppb.Now()
				c.pending = resend
			}
			c.mu.Unlock()
		}
	}
}

func (c *Client) send(ctx context.Context, req *dkcv1.ReportStatusRequest) error {
	actx, err := c.authed(ctx)
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(actx, 30*time.Second)
	defer cancel()
	if _, err := c.rpc.ReportStatus(cctx, req); err != nil {
		return err
	}
	c.log.Info("status reported", zap.String("error", req.GetStatus().GetError()), zap.Bool("restart", req.GetRestart() != nil))
	return nil
}
