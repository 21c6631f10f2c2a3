// SPDX-License-Identifier: Apache-2.0

// Package outbox is the sidecar's side of the status report protocol (docs/design.md, "The status report
// protocol"): the reports a node has yet to deliver to the config service, and what an acknowledgement or a
// new stream changes. It does no I/O, so the protocol can be checked without a network, and it sits outside
// sidecar/ so that a test can drive it against the service's own code (services/internal/nodestatus's
// TestProtocolAgainstTheService).
package outbox

import (
	"sync"
	"time"

	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/utils/clock"

	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
)

// MaxPendingRestarts bounds the restarts kept for delivery while the service is unreachable. Restarts are
// seconds apart at the least (each waits for the kubelet's health), so this covers a long outage; beyond
// it the oldest are dropped, with a log line each: their Events are history, the status is what matters.
const MaxPendingRestarts = 32

// ParkedRestartTTL is how long, from the first time the service acknowledged it as queued, a restart is
// kept for the next streams: the apiserver's default --event-ttl, after which its Event would be gone
// anyway (with a shorter --event-ttl, a re-send inside the hour may create an expired Event again).
const ParkedRestartTTL = time.Hour

// ConfirmAfter is how long after the service acknowledged a restart as queued the outbox sends it again on
// the same stream (Confirm): by then the replica's queue has created the Event, the replica says so by
// acknowledging it as recorded, and the restart is no longer carried — not to every later stream for an
// hour, where each new replica would create the Event again, every one refused as existing. Each further
// round waits as long as the restart has been parked, at the least ConfirmAfter. Short, as a dkc-server
// replica may stop at any moment (a rolling update soon after a rollout): a round costs the replica one
// report it answers from memory, never the apiserver, and the doubling bounds the rounds of a restart
// whose Event waits long in a busy queue.
const ConfirmAfter = 5 * time.Second

// Outbox holds one node's reports: what is to be sent to the config service, and what an acknowledgement
// or a new stream changes. It reads no time but through its clock; the sidecar's client
// (sidecar/internal/client) moves its reports over gRPC. Safe for concurrent use.
//
//   - Enqueue numbers a new status (incarnation, sequence), stamps it with the Node object followed, and
//     queues its restart, if any, behind those not yet acknowledged.
//   - Next is the report to send now: the latest status, carrying the oldest unacknowledged restart.
//   - Ack says the service acknowledged a report Next returned: its restart is delivered (or, when the
//     service queued it, parked until the next stream), and once no restart waits and no newer status was
//     enqueued, nothing is pending.
//   - Confirm, when NextConfirm comes, sends the parked restarts again on the same stream: a restart the
//     service's queue has recorded meanwhile is acknowledged as such and dropped.
//   - Reconnected says a new WatchConfig stream opened: the service replica may be one that never heard of
//     this node (or dropped a held report when the node moved, or exited before its queue created a
//     parked restart's Event), so the last acknowledged report becomes pending again, with its numbers,
//     and the parked restarts ride on it again.
type Outbox struct {
	node        string
	incarnation uint64
	clock       clock.PassiveClock
	log         *zap.Logger

	mu       sync.Mutex
	sequence uint64
	nodeUID  string
	pending  *dkcv1.ReportStatusRequest // latest unacknowledged status
	// restarts not yet acknowledged, oldest first. A report carries one restart (one Event); the head rides
	// on every report until acknowledged, then the next one does, so none is lost while the service is away.
	restarts []*dkcv1.KubeletRestart
	// parked: restarts acknowledged as queued (ReportStatusResponse.restart_queued), oldest first, with when.
	// The replica that queued one may exit before creating its Event; the next stream sends them again.
	parked []parkedRestart
	// firstParked is when each restart in restarts or parked was first parked: its hour counts from then,
	// also when its re-sends are queued again and again.
	firstParked map[*dkcv1.KubeletRestart]time.Time
	last        *dkcv1.ReportStatusRequest // the last report acknowledged in full
	// out: Next handed out the pending report and no Next came since (it is in flight, or failed).
	// resend: a stream opened while it was out. Its acknowledgement may then come from the replica the
	// node left, which drops a held report once the node streams elsewhere; so the report is sent again
	// once acknowledged, as if the stream had opened after.
	out, resend bool
	// streams counts Reconnected calls; sentOn is its value when Next last handed out a report. A restart
	// acknowledged as queued after a new stream opened is not parked but sent again at once: the
	// reconnect that would send it again has already happened.
	streams, sentOn uint64
}

type parkedRestart struct {
	restart *dkcv1.KubeletRestart
	since   time.Time // first parked
	confirm time.Time // when Confirm sends it again
}

// Config configures an Outbox.
type Config struct {
	// Node is the node's name, sent in every report.
	Node string
	// Incarnation of this sidecar start (agent.NextIncarnation); 0 sends reports ordered only by their
	// observed time, as older sidecars did.
	Incarnation uint64
	// Clock stamps observed times; nil is the real clock.
	Clock clock.PassiveClock
	// Log may be nil.
	Log *zap.Logger
}

// New returns an empty outbox.
func New(cfg Config) *Outbox {
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	return &Outbox{node: cfg.Node, incarnation: cfg.Incarnation, clock: cfg.Clock, log: cfg.Log,
		firstParked: map[*dkcv1.KubeletRestart]time.Time{}}
}

// Follow says that the statuses enqueued from now on are about Node object nodeUID. Reports enqueued before
// keep the object they were made for, also when sent again after a reconnect.
func (o *Outbox) Follow(nodeUID string) {
	o.mu.Lock()
	o.nodeUID = nodeUID
	o.mu.Unlock()
}

// NodeUID is the Node object followed last.
func (o *Outbox) NodeUID() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.nodeUID
}

// Enqueue records the node's latest status, replacing one not yet acknowledged, and queues restart, if not
// nil, behind the restarts not yet acknowledged.
func (o *Outbox) Enqueue(st *dkcv1.NodeConfigStatus, message string, restart *dkcv1.KubeletRestart) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if restart != nil {
		if len(o.restarts)+len(o.parked) == MaxPendingRestarts {
			var oldest *dkcv1.KubeletRestart
			if len(o.parked) > 0 { // parked ones are older, and the service may have their Events
				oldest, o.parked = o.parked[0].restart, o.parked[1:]
			} else {
				oldest, o.restarts = o.restarts[0], o.restarts[1:]
			}
			delete(o.firstParked, oldest)
			o.log.Warn("too many unacknowledged kubelet restarts; dropping the oldest, its event may be lost",
				zap.String("restartID", oldest.GetId()), zap.Int("max", MaxPendingRestarts))
		}
		o.restarts = append(o.restarts, restart)
	}
	o.sequence++
	o.pending = &dkcv1.ReportStatusRequest{NodeName: o.node, Status: st, Message: message,
		ObservedTime: timestamppb.New(o.clock.Now()), Incarnation: o.incarnation, Sequence: o.sequence, NodeUid: o.nodeUID}
}

// Next returns the report to send now, nil when nothing is pending. The caller owns the copy it gets and
// hands it back to Ack once acknowledged.
func (o *Outbox) Next() *dkcv1.ReportStatusRequest {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.pending == nil {
		return nil
	}
	// Sent now, over the stream there is now: a reconnect before this needs no resend.
	o.out, o.resend, o.sentOn = true, false, o.streams
	req := proto.Clone(o.pending).(*dkcv1.ReportStatusRequest)
	if len(o.restarts) > 0 {
		req.Restart = o.restarts[0]
	}
	return req
}

// Ack records that the service acknowledged req (a report Next returned): its status is on the Node or
// queued there, and its restart's Event is recorded — or, restartQueued, queued there with it: the restart
// is then parked, to ride again on the next stream's first reports. The status stays pending while
// restarts wait (the next one rides on it) and when a newer status was enqueued meanwhile — also one with
// the same content about another Node object, which req's acknowledgement says nothing about.
func (o *Outbox) Ack(req *dkcv1.ReportStatusRequest, restartQueued bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if r := req.GetRestart(); r != nil && len(o.restarts) > 0 && o.restarts[0] == r {
		switch {
		case !restartQueued:
			o.restarts = o.restarts[1:]
			delete(o.firstParked, r)
		case o.sentOn == o.streams:
			o.restarts = o.restarts[1:]
			since, ok := o.firstParked[r]
			if !ok {
				since = o.clock.Now()
				o.firstParked[r] = since
			}
			now := o.clock.Now()
			o.parked = append(o.parked,
				parkedRestart{restart: r, since: since, confirm: now.Add(max(ConfirmAfter, now.Sub(since)))})
		default:
			// Queued by the replica of a stream that has ended since: it stays first, for the new stream.
		}
	}
	if len(o.restarts) == 0 && o.pending != nil && o.pending.GetSequence() == req.GetSequence() &&
		o.pending.GetNodeUid() == req.GetNodeUid() {
		o.last, o.pending, o.out = o.pending, nil, false
		if o.resend {
			o.resend = false
			o.requeueLast()
		}
	}
}

// Reconnected records that a new stream to the service opened: the last acknowledged report is pending
// again, unless a newer one already is. A report in flight meanwhile is sent again after its
// acknowledgement. It keeps its incarnation, sequence and Node object; a fresh observed
// time keeps an older replica (which orders by it) from taking it for stale.
func (o *Outbox) Reconnected() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.streams++
	o.unparkLocked(func(parkedRestart) bool { return true })
	if o.pending != nil {
		o.resend = o.out
		return
	}
	o.requeueLast()
}

// NextConfirm is when Confirm has a parked restart to send again; false when none is parked.
func (o *Outbox) NextConfirm() (time.Time, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	var next time.Time
	for i, p := range o.parked {
		if i == 0 || p.confirm.Before(next) {
			next = p.confirm
		}
	}
	return next, len(o.parked) > 0
}

// Confirm sends the parked restarts whose confirmation is due again, on the stream there is: the replica
// that queued one acknowledges it as recorded once its Event exists, and it is dropped; one still queued
// is parked again for a longer round.
func (o *Outbox) Confirm() {
	o.mu.Lock()
	defer o.mu.Unlock()
	now := o.clock.Now()
	if !o.unparkLocked(func(p parkedRestart) bool { return !p.confirm.After(now) }) {
		return
	}
	if o.pending == nil {
		o.requeueLast()
	}
}

// unparkLocked puts the parked restarts that due selects in front of the restarts not yet acknowledged
// (they are older), in order, dropping those parked for longer than ParkedRestartTTL; it says whether any
// is to be sent. o.mu is held.
func (o *Outbox) unparkLocked(due func(parkedRestart) bool) bool {
	var again []*dkcv1.KubeletRestart
	kept := o.parked[:0]
	for _, p := range o.parked {
		switch {
		case o.clock.Since(p.since) > ParkedRestartTTL:
			o.log.Info("kubelet restart first queued by the service an hour ago; not sending it again",
				zap.String("restartID", p.restart.GetId()))
			delete(o.firstParked, p.restart)
		case due(p):
			again = append(again, p.restart)
		default:
			kept = append(kept, p)
		}
	}
	o.parked = kept
	if len(o.parked) == 0 {
		o.parked = nil
	}
	o.restarts = append(again, o.restarts...)
	return len(again) > 0
}

// requeueLast makes the last acknowledged report pending again; o.mu is held.
func (o *Outbox) requeueLast() {
	if o.last == nil {
		return
	}
	resend := proto.Clone(o.last).(*dkcv1.ReportStatusRequest)
	resend.ObservedTime = timestamppb.New(o.clock.Now())
	o.pending = resend
}

// Pending says whether a report waits to be sent or acknowledged.
func (o *Outbox) Pending() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.pending != nil
}
