package outbox_test

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/dkc-dev/dkc/internal/outbox"
	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
)

var protocolRuns = flag.Int("protocol-runs", 2000, "random histories TestProtocolInvariants plays")

// TestProtocolInvariants plays random histories of the status report protocol (docs/design.md, "The status
// report protocol"): a node's Outbox, through its exported API only, against an in-process model of the
// service — two replicas, each keeping the node's last accepted report, ordering by (incarnation,
// sequence), holding a restart in progress for a delay, writing from its queue only while the node streams
// from it, sometimes queueing a report and its restart's Event instead of writing them (past its bound on
// inline writes), which it loses if it restarts before its queue ran — and a Node that is deleted and
// registered again. The history's steps, in random order: the
// agent reports (sometimes a restart in progress, sometimes with a kubelet restart), the report in flight is
// delivered, its acknowledgement arrives or is lost, the node's stream moves to a replica, a replica
// restarts and forgets everything, the Node is registered again under a new UID, time passes.
//
// Checked after every step: the Node never shows a report older than one it showed about the same object;
// no report about a deleted Node object lands on its successor. After the history, once the node stays
// connected and acknowledgements arrive: the Node shows the last report, and every restart has its Event.
//
// A failing history prints its seed and steps; -protocol-runs sets how many are played.
func TestProtocolInvariants(t *testing.T) {
	for seed := range uint64(*protocolRuns) {
		if err := playHistory(seed, 120); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
	}
}

const holdDelay = 10 * time.Second

// replica models nodestatus.Writer for one node.
type replica struct {
	report     *dkcv1.ReportStatusRequest // last accepted; nil: none
	heldSince  time.Time                  // zero: the report is not a restart in progress
	queued     bool                       // a write waits in the queue (held, or past the inline bound)
	events     []string                   // restarts whose Events wait in the queue
	serving    bool                       // the node's stream is here
	restartLog []string
}

// nodeObject is the Node as the apiserver has it.
type nodeObject struct {
	uid     string
	written *dkcv1.ReportStatusRequest // the report whose status the Node shows
}

type world struct {
	rng      *rand.Rand
	clock    *clocktesting.FakePassiveClock
	outbox   *outbox.Outbox
	replicas [2]*replica
	at       int // the replica the node streams from; -1: disconnected
	node     nodeObject
	uids     int
	events   map[string]int // Event name → creations (AlreadyExists for the rest)
	// inFlight is the report delivered and its acknowledgement not yet arrived.
	inFlight *dkcv1.ReportStatusRequest
	acked    bool
	// restartQueued: the acknowledgement says the restart's Event was queued, not created.
	restartQueued bool
	// What the agent did.
	lastStatus *dkcv1.NodeConfigStatus
	restarts   []string
	statuses   int
	log        []string
}

func restarting(st *dkcv1.NodeConfigStatus) bool {
	return st.GetError() == "" && st.GetAssigned().GetConfigMap().GetName() != st.GetActive().GetConfigMap().GetName()
}

func before(a, b *dkcv1.ReportStatusRequest) bool {
	return a.GetIncarnation() < b.GetIncarnation() || (a.GetIncarnation() == b.GetIncarnation() && a.GetSequence() < b.GetSequence())
}

// deliver is rpc.ReportStatus and Writer.Report at replica r: it says whether the report is acknowledged,
// and whether its restart's Event was queued rather than created. busy: the replica's inline writes are all
// taken, so the report is queued.
func (w *world) deliver(r *replica, req *dkcv1.ReportStatusRequest, busy bool) (acked, restartQueued bool, err error) {
	if r.report != nil && before(req, r.report) {
		return true, false, nil // stale: acknowledged, not written
	}
	held := time.Time{}
	if restarting(req.GetStatus()) {
		held = w.clock.Now()
		if r.report != nil && !r.heldSince.IsZero() {
			held = r.heldSince
		}
	}
	r.report, r.heldSince = req, held
	if busy {
		r.queued = true
		if id := req.GetRestart().GetId(); id != "" {
			r.events = append(r.events, id)
			return true, true, nil
		}
		return true, false, nil
	}
	if id := req.GetRestart().GetId(); id != "" {
		w.events[id]++
	}
	return true, false, w.write(r)
}

// write is Writer.write: onto the Node if the report is about it and not held; a report about another
// object is dropped (acknowledged).
func (w *world) write(r *replica) error {
	if r.report == nil {
		return nil
	}
	if uid := r.report.GetNodeUid(); uid != "" && uid != w.node.uid {
		r.report, r.queued = nil, false // ErrOtherNode: dropped
		return nil
	}
	if !r.heldSince.IsZero() && w.clock.Since(r.heldSince) < holdDelay {
		r.queued = true
		return nil
	}
	r.queued = false
	if prev := w.node.written; prev != nil && prev.GetNodeUid() == r.report.GetNodeUid() && before(r.report, prev) {
		return fmt.Errorf("the Node went back from report %d/%d to %d/%d", prev.GetIncarnation(), prev.GetSequence(),
			r.report.GetIncarnation(), r.report.GetSequence())
	}
	if uid := r.report.GetNodeUid(); uid != "" && uid != w.node.uid {
		return fmt.Errorf("a report about Node object %s landed on %s", uid, w.node.uid)
	}
	w.node.written = r.report
	w.log = append(w.log, fmt.Sprintf("  written %d/%d %q", r.report.GetIncarnation(), r.report.GetSequence(), describe(r.report.GetStatus())))
	return nil
}

// drain is the replica's queue worker: queued Events are created; a queued report (held: once its delay
// passed) is written while the node streams here, dropped otherwise (another replica serves it).
func (w *world) drain(r *replica) error {
	for _, id := range r.events {
		w.events[id]++
	}
	r.events = nil
	if !r.queued || (!r.heldSince.IsZero() && w.clock.Since(r.heldSince) < holdDelay) {
		return nil
	}
	if !r.serving {
		r.report, r.queued, r.heldSince = nil, false, time.Time{}
		return nil
	}
	return w.write(r)
}

func describe(st *dkcv1.NodeConfigStatus) string {
	return st.GetAssigned().GetConfigMap().GetName() + ">" + st.GetActive().GetConfigMap().GetName() + ":" + st.GetError()
}

func source(name string) *dkcv1.NodeConfigSource {
	return &dkcv1.NodeConfigSource{ConfigMap: &dkcv1.ConfigMapNodeConfigSource{Name: name}}
}

// report is the agent reporting a status: settled, a restart in progress, or an error; sometimes with a
// kubelet restart.
func (w *world) report() {
	w.statuses++
	name := fmt.Sprintf("c%d", w.statuses)
	var st *dkcv1.NodeConfigStatus
	switch w.rng.IntN(3) {
	case 0:
		st = &dkcv1.NodeConfigStatus{Assigned: source(name), Active: source(name)}
	case 1:
		st = &dkcv1.NodeConfigStatus{Assigned: source(name), Active: source("old")}
	default:
		st = &dkcv1.NodeConfigStatus{Assigned: source(name), Active: source("old"), Error: "failed " + name}
	}
	var restart *dkcv1.KubeletRestart
	if w.rng.IntN(3) == 0 && len(w.restarts) < outbox.MaxPendingRestarts {
		restart = &dkcv1.KubeletRestart{Id: fmt.Sprintf("r%d", len(w.restarts))}
		w.restarts = append(w.restarts, restart.GetId())
	}
	w.lastStatus = st
	w.log = append(w.log, fmt.Sprintf("report %q restart %q", describe(st), restart.GetId()))
	w.outbox.Enqueue(st, "", restart)
}

// connect moves the node's stream to replica i (what client.Watch does on a new stream).
func (w *world) connect(i int) {
	for j, r := range w.replicas {
		r.serving = j == i
	}
	w.at = i
	w.log = append(w.log, fmt.Sprintf("stream to replica %d", i))
	w.outbox.Reconnected()
}

// disconnect ends the node's stream.
func (w *world) disconnect() {
	for _, r := range w.replicas {
		r.serving = false
	}
	w.at = -1
	w.log = append(w.log, "disconnected")
}

// send delivers the outbox's next report to the replica the node streams from, if any.
func (w *world) send() error {
	if w.inFlight != nil || w.at < 0 {
		return nil
	}
	req := w.outbox.Next()
	if req == nil {
		return nil
	}
	w.log = append(w.log, fmt.Sprintf("send %d/%d %q restart %q about %s to replica %d", req.GetIncarnation(), req.GetSequence(),
		describe(req.GetStatus()), req.GetRestart().GetId(), req.GetNodeUid(), w.at))
	busy := w.rng.IntN(4) == 0
	acked, restartQueued, err := w.deliver(w.replicas[w.at], req, busy)
	if busy {
		w.log = append(w.log, "  queued")
	}
	w.inFlight, w.acked, w.restartQueued = req, acked, restartQueued
	return err
}

// complete makes the acknowledgement of the report in flight arrive (or be lost).
func (w *world) complete(lost bool) {
	if w.inFlight == nil {
		return
	}
	if w.acked && !lost {
		w.outbox.Ack(w.inFlight, w.restartQueued)
		w.log = append(w.log, fmt.Sprintf("  acknowledged (restart queued: %v)", w.restartQueued))
	} else {
		w.log = append(w.log, "  acknowledgement lost")
	}
	w.inFlight = nil
}

func playHistory(seed uint64, steps int) (err error) {
	w := &world{rng: rand.New(rand.NewPCG(seed, 29)), clock: clocktesting.NewFakePassiveClock(time.Unix(1_000_000, 0)),
		replicas: [2]*replica{{}, {}}, at: -1, events: map[string]int{}}
	w.uids++
	w.node.uid = fmt.Sprintf("uid-%d", w.uids)
	w.outbox = outbox.New(outbox.Config{Node: "n1", Incarnation: 7, Clock: w.clock})
	w.outbox.Follow(w.node.uid)
	defer func() {
		if err != nil {
			err = fmt.Errorf("%w\nhistory:\n%s", err, strings.Join(w.log, "\n"))
		}
	}()
	w.connect(0)
	for range steps {
		var err error
		switch k := w.rng.IntN(100); {
		case k < 20:
			w.report()
		case k < 45:
			err = w.send()
		case k < 65:
			w.complete(w.rng.IntN(4) == 0)
		case k < 73:
			w.connect(w.rng.IntN(2))
		case k < 76:
			// A replica restarts (a rollout or a crash): it forgets everything, its queue included; its
			// streams end.
			i := w.rng.IntN(2)
			w.replicas[i] = &replica{}
			w.log = append(w.log, fmt.Sprintf("replica %d restarted", i))
			if w.at == i {
				w.disconnect()
			}
		case k < 79:
			// The Node is deleted and registered again: the service tells the node the new object, and the
			// agent's reconcile reports about it.
			w.uids++
			w.node = nodeObject{uid: fmt.Sprintf("uid-%d", w.uids)}
			w.log = append(w.log, "node registered again as "+w.node.uid)
			if w.at >= 0 {
				w.outbox.Follow(w.node.uid)
				w.report()
			}
		case k < 81:
			w.disconnect()
		default:
			// Time passes only while no report waits to be sent: a report reaches the service within far
			// less than the hold delay (the reporter sends as soon as it is woken). Without this the model
			// finds a race of the service's alone — a replica holding an older report when the node comes
			// back to it writes it before the node's re-sent report arrives.
			if w.inFlight != nil || (w.at >= 0 && w.outbox.Pending()) {
				continue
			}
			w.clock.SetTime(w.clock.Now().Add(time.Duration(w.rng.IntN(6)) * time.Second))
			for _, r := range w.replicas {
				if err := w.drain(r); err != nil {
					return err
				}
			}
		}
		if err != nil {
			return err
		}
	}
	// Quiet: the node connects (the service tells it the Node object there is), acknowledgements arrive,
	// time passes.
	w.log = append(w.log, "-- quiet --")
	w.complete(false)
	if w.outbox.NodeUID() != w.node.uid {
		w.outbox.Follow(w.node.uid)
		w.report()
	}
	if w.at < 0 {
		w.connect(w.rng.IntN(2))
	}
	for range 50 {
		if err := w.send(); err != nil {
			return err
		}
		w.complete(false)
		w.clock.SetTime(w.clock.Now().Add(time.Second))
		for _, r := range w.replicas {
			if err := w.drain(r); err != nil {
				return err
			}
		}
	}
	if w.lastStatus != nil {
		got := w.node.written
		if got == nil || describe(got.GetStatus()) != describe(w.lastStatus) || got.GetNodeUid() != w.node.uid {
			return fmt.Errorf("the Node shows %q about %s; the last report is %q about %s", describe(got.GetStatus()), got.GetNodeUid(),
				describe(w.lastStatus), w.node.uid)
		}
	}
	for _, id := range w.restarts {
		if w.events[id] == 0 {
			return fmt.Errorf("restart %s has no Event", id)
		}
	}
	return nil
}
