// Package nodestatus is where Node status is written (docs/design.md, "Where status is written"). For every node whose sidecar reported,
// it keeps the dkc.dev/config-status annotation, the ConfigOK condition and — where the apiserver keeps it —
// status.config equal to the node's reported NodeConfigStatus, with the sync error of the service's own
// resolution taking the place of the reported error while there is one (the original kubelet's "error
// override"). It also records the KubeletConfigChanged Event of each kubelet restart.
//
// Each change is one strategic-merge patch of the Node's status subresource with field manager dkc-server,
// touching only our annotation, our condition and status.config; identical content is never written again
// (so several replicas can write idempotently), and a failed write is retried with backoff — the original
// kubelet dropped failed status patches silently. A restart's Event that cannot be created is logged and
// dropped, as the original did: it never holds back the node's status.
package nodestatus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"

	"github.com/dkc-dev/dkc/internal/nodeconfig"
	"github.com/dkc-dev/dkc/internal/nodeconfig/wire"
	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
	"github.com/dkc-dev/dkc/services/internal/assignment"
)

// FieldManager owns what dkc writes on Nodes.
const FieldManager = "dkc-server"

// report is the latest status a node's sidecar reported.
type report struct {
	status  *dkcv1.NodeConfigStatus
	message string
	order   reportOrder
	// restarting is when the node's reports began to say "assigned, not yet running" (restarting); zero
	// while they do not.
	restarting time.Time
	// nodeUID is the Node object the status is about ("" if the sidecar did not say): it is written onto
	// that object only, never onto a Node registered again under the name.
	nodeUID string
	// seq numbers the reports this replica accepted, so that a write can tell whether the report it wrote
	// is still the latest.
	seq uint64
	// owed: the report was acknowledged as queued (the inline writes were all taken) and is not on the
	// Node yet. The queue writes it even if the node's stream is no longer here: it was acknowledged.
	owed bool
}

// restarting says whether a reported status is a restart in progress: a config assigned and not yet
// running, with no error. Its outcome (running, or an error and the rollback) follows within seconds.
func restarting(st *dkcv1.NodeConfigStatus) bool {
	return st.GetError() == "" && !wire.SameSource(st.GetAssigned(), st.GetActive())
}

// lastWrite is what this replica last patched onto a node's Node: the cached Node's resourceVersion the
// patch was made over, and a digest of what it wrote. While the cache still shows that resourceVersion it
// has not seen the patch, and is no judge of whether the status is on the Node: the digest is.
type lastWrite struct {
	over   string
	digest uint64
}

// reportOrder places a report among its node's reports: by the sidecar's incarnation and sequence, which
// the node's clock cannot upset; by observed time only between reports of sidecars that send no
// incarnation (older versions).
type reportOrder struct {
	incarnation, sequence uint64
	observed              time.Time
}

// before says whether o is older than p. Reports of an up- or downgraded sidecar (one numbered, one not)
// cannot be compared: the newcomer is taken as news.
func (o reportOrder) before(p reportOrder) bool {
	switch {
	case o.incarnation != 0 && p.incarnation != 0:
		return o.incarnation < p.incarnation || (o.incarnation == p.incarnation && o.sequence < p.sequence)
	case o.incarnation == 0 && p.incarnation == 0:
		return o.observed.Before(p.observed)
	default:
		return false
	}
}

// Writer writes node status. Create it with New and run it with Run.
type Writer struct {
	log    *zap.Logger
	client kubernetes.Interface
	nodes  corelisters.NodeLister
	table  *assignment.Table
	clock  clock.PassiveClock
	// draining is set once Run's context has ended: no report is queued any more.
	draining atomic.Bool
	metrics  *Metrics
	queue    workqueue.TypedRateLimitingInterface[string]
	serving  func(node string) bool // nil: every node (a single replica)
	// restartDelay is how long a restart in progress waits for its outcome before it is written.
	restartDelay time.Duration

	// inline holds a token for each report being written inline (Config.MaxInlineWrites); nil: no bound.
	inline chan struct{}

	mu      sync.Mutex
	seq     uint64
	reports map[string]report
	written map[string]lastWrite
	// events are the kubelet restarts of acknowledged reports whose Event is not created yet (the report
	// was queued): the queue creates them before it writes the node's status.
	events map[string][]*dkcv1.KubeletRestart

	// locks serialise writes per node, striped by name. Reports write inline (up to MaxInlineWrites at
	// once) beside the queue's workers, and a patch takes up to seconds on a busy apiserver: with 1,024
	// stripes two nodes rarely wait on each other.
	locks [1024]sync.Mutex
}

// Pending is the queue of nodes whose status is to be written again: the assignment table adds a node whose
// sync error changed, the Node controller a deleted Node, the writer a failed write. It is created first and
// given to all three, so that the table (which the writer reads) need not know the writer.
//
// A deleted Node's report is dropped by a queue worker once the apiserver confirms the Node is gone
// (dropIfGone), not at once: a Node deleted and created again under the same name (a kubelet registering
// again) may already have reported, and that report must still be written.
type Pending struct {
	queue workqueue.TypedRateLimitingInterface[string]
}

// NewPending returns an empty queue; metrics, if not nil, receives its metrics (queue name "nodestatus").
func NewPending(metrics workqueue.MetricsProvider) *Pending {
	return &Pending{queue: workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.NewTypedItemExponentialFailureRateLimiter[string](200*time.Millisecond, 30*time.Second),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "nodestatus", MetricsProvider: metrics})}
}

// Add queues the node.
func (p *Pending) Add(node string) { p.queue.Add(node) }

// Config of a Writer.
type Config struct {
	Log    *zap.Logger
	Client kubernetes.Interface
	Nodes  corelisters.NodeLister
	Table  *assignment.Table
	// Metrics may be nil.
	Metrics *Metrics
	// Pending is the queue the writer drains; nil: a new one (Enqueue adds to it).
	Pending *Pending
	// Serving, if not nil, says which nodes this replica serves (an open WatchConfig stream here). Writes
	// the queue makes — a sync error that changed, a retry — are made only for them; the report of a node
	// served elsewhere (it moved to another replica, by --max-connection-age or a pod deletion) is dropped
	// instead of written: it is older than what the other replica holds, and writing it would put an older
	// status back on the Node. A report that arrives is still written at once (its node is talking to this
	// replica). nil: every node (a single replica).
	Serving func(node string) bool
	// RestartingDelay is how long a node's report of a restart in progress ("assigned, not yet running")
	// waits for the restart's outcome before it is written. The sidecar reports the outcome seconds later;
	// when it arrives within the delay, only the outcome is written, and an assignment costs the Node two
	// writes (running, then last-known-good) instead of three. The original kubelet exited to restart right
	// after recording the assignment, so its Node rarely showed that step either. 0: written at once.
	RestartingDelay time.Duration
	// MaxInlineWrites bounds the reports written while their ReportStatus call waits (docs/design.md,
	// "What a status acknowledgement means"). Past it a report is acknowledged as queued: kept, with its
	// restart's Event, and written by the queue's workers, which retry. A call waiting on the apiserver
	// holds a gRPC handler goroutine and its grown stack: when 10,000 nodes report a fan-out at once,
	// unbounded, those were ~400 MiB of dkc-server's peak. 0: no bound (every report written inline).
	MaxInlineWrites int
}

// New returns a Writer.
func New(cfg Config) *Writer {
	if cfg.Pending == nil {
		cfg.Pending = NewPending(nil)
	}
	w := &Writer{
		log: cfg.Log, client: cfg.Client, nodes: cfg.Nodes, table: cfg.Table, clock: clock.RealClock{}, metrics: cfg.Metrics,
		queue: cfg.Pending.queue, serving: cfg.Serving, restartDelay: cfg.RestartingDelay, reports: map[string]report{}, written: map[string]lastWrite{},
		events: map[string][]*dkcv1.KubeletRestart{},
	}
	if cfg.MaxInlineWrites > 0 {
		w.inline = make(chan struct{}, cfg.MaxInlineWrites)
	}
	return w
}

// maxPendingEvents bounds the restarts kept per node for the queue. A sidecar sends its next restart only
// once the previous report is acknowledged, so more than a few mean a kubelet restarting in a loop while
// the apiserver refuses Events: the oldest go, as an event recorder's would.
const maxPendingEvents = 16

// ErrStale is returned for a report older than the one already accepted for the node.
var ErrStale = errors.New("report is older than the last accepted one")

// ErrNodeGone is returned for a report of a node whose Node object does not exist: there is nothing to
// write it on, so it is not acknowledged, and it is not kept.
var ErrNodeGone = errors.New("node does not exist")

// ErrOtherNode is returned for a report about a Node object that no longer exists (its node_uid is not the
// UID of the Node carrying the name, if any): it is dropped, and is to be acknowledged — the sidecar's next
// report, made for the Node there is now, takes its place. Written, it would show the deleted object's
// assignment on a Node registered again under the same name.
var ErrOtherNode = errors.New("report is about a deleted Node object of the same name")

var (
	// errNotCached: the Node exists, but this replica's Node cache has not seen it yet.
	errNotCached = errors.New("node not in the node cache yet")
	// errNoReport: the node has no report here (none received, or dropped as its Node is gone).
	errNoReport = errors.New("no status report of the node")
	// errHeld: the report is a restart in progress, queued to be written when RestartingDelay has passed
	// unless its outcome is reported first.
	errHeld = errors.New("restart in progress: status held for its outcome")
)

// Report accepts a node's status report: it records the kubelet restart's Event, if any, and writes the
// node's status before returning, so that an acknowledged report is on the Node (the sidecar retries until
// acknowledged) — except a restart in progress, which is held for RestartingDelay (Config), a report of a
// Node not in the cache yet, and a report that finds MaxInlineWrites writes in flight: these are queued
// (docs/design.md, "What a status acknowledgement means"). A report older than the last accepted one is
// ignored.
//
// A held status is written when the delay has passed only if the node still streams from this replica
// (Config.Serving); a node that moved meanwhile is served by the other replica, which its sidecar re-sends
// the report to. A replica that has not yet seen a half-dead stream end (keepalive) can still write the
// held status after the other wrote a newer one, until the node's next report corrects it.
func (w *Writer) Report(ctx context.Context, node string, req *dkcv1.ReportStatusRequest) (Receipt, error) {
	order := reportOrder{incarnation: req.GetIncarnation(), sequence: req.GetSequence(), observed: req.GetObservedTime().AsTime()}
	if req.GetObservedTime() == nil {
		order.observed = w.clock.Now()
	}
	r := report{status: req.GetStatus(), message: req.GetMessage(), order: order, nodeUID: req.GetNodeUid()}
	// Past MaxInlineWrites the report is queued instead, unless this replica's cache lacks the Node: only
	// the inline path can refuse a report of a Node that does not exist (ErrNodeGone), and such reports
	// are rare.
	acquired := w.acquireInline()
	if acquired && w.inline != nil {
		defer w.releaseInline()
	}
	// A replica shutting down writes inline: its queue may not get to a report acknowledged now.
	inline := acquired || w.draining.Load()
	if !inline {
		if _, err := w.nodes.Get(node); err != nil {
			inline = true
		}
	}
	w.mu.Lock()
	prev, had := w.reports[node]
	if had && order.before(prev.order) {
		w.mu.Unlock()
		return Receipt{}, ErrStale
	}
	w.seq++
	r.seq, r.owed = w.seq, !inline
	if restarting(r.status) {
		// Held from the first report of the restart: a node whose restarts keep being replaced by newer
		// assignments still shows one after RestartingDelay.
		r.restarting = w.clock.Now()
		if had && !prev.restarting.IsZero() {
			r.restarting = prev.restarting
		}
	}
	w.reports[node] = r
	if !inline {
		if rs := req.GetRestart(); rs != nil {
			w.addEventLocked(node, rs)
		}
		w.mu.Unlock()
		// Acknowledged as queued: the queue coalesces the node's reports into one write of the latest.
		w.queue.Add(node)
		w.metrics.write("queued")
		return Receipt{EventQueued: req.GetRestart() != nil}, nil
	}
	w.mu.Unlock()
	var eventErr error
	if r := req.GetRestart(); r != nil {
		// A refused Event (quota, admission policy) would be refused again on every retry, and the sidecar
		// retries the whole report: failing here would freeze the node's status for good. The Event is
		// news, the status is the record, so the status wins (as in the original, which logged and went on).
		// A transient failure (timeout, 429, 5xx, connection) is retried, as the original's recorder did:
		// the status is written first, then the report fails so that the sidecar sends it again (the
		// Event's name is the restart's id, so a retry creates it once).
		if err := w.recordRestart(ctx, node, r); err != nil {
			w.metrics.event("error")
			if eventRefused(err) {
				w.log.Warn("kubelet restart event refused; dropping it", zap.String("node", node),
					zap.String("restartID", r.GetId()), zap.String("reason", string(apierrors.ReasonForError(err))), zap.Error(err))
			} else {
				eventErr = err
			}
		}
	}
	if eventErr != nil {
		if err := w.write(ctx, node); err != nil && !errors.Is(err, errNotCached) && !errors.Is(err, errHeld) {
			return Receipt{}, err
		}
		return Receipt{}, fmt.Errorf("%w (status written or queued; send the report again for its event)", eventErr)
	}
	switch err := w.write(ctx, node); {
	case errors.Is(err, errNotCached):
		// Acknowledged: the report is kept and written from the queue once this replica's cache has the Node.
		w.queue.AddRateLimited(node)
		return Receipt{}, nil
	case errors.Is(err, errNoReport):
		return Receipt{}, ErrNodeGone // dropped meanwhile: the Node was found gone
	case errors.Is(err, ErrOtherNode):
		return Receipt{}, err
	case errors.Is(err, errHeld):
		return Receipt{}, nil // acknowledged: written from the queue unless the outcome comes first
	default:
		return Receipt{}, err
	}
}

// Receipt is what the acknowledgement of an accepted report covers beyond its status.
type Receipt struct {
	// EventQueued: the report was queued with its restart, whose Event is not created yet; the sidecar keeps
	// the restart and sends it again on its next stream (dkcv1.ReportStatusResponse.restart_queued), so that
	// the Event survives this replica exiting before its queue created it.
	EventQueued bool
}

// acquireInline takes one of the MaxInlineWrites tokens without waiting; always true without a bound.
func (w *Writer) acquireInline() bool {
	if w.inline == nil {
		return true
	}
	select {
	case w.inline <- struct{}{}:
		return true
	default:
		return false
	}
}

// releaseInline gives back a token taken by acquireInline.
func (w *Writer) releaseInline() { <-w.inline }

// addEventLocked keeps a queued report's restart for flushEvents; w.mu is held.
func (w *Writer) addEventLocked(node string, rs *dkcv1.KubeletRestart) {
	pending := w.events[node]
	for _, p := range pending {
		if p.GetId() == rs.GetId() {
			return // a re-sent report: its Event is already to be created
		}
	}
	if len(pending) == maxPendingEvents {
		w.log.Warn("too many kubelet restarts waiting for their events; dropping the oldest", zap.String("node", node),
			zap.String("restartID", pending[0].GetId()))
		w.metrics.event("error")
		pending = pending[1:]
	}
	w.events[node] = append(pending, rs)
}

// flushEvents creates the Events of the node's queued restarts, oldest first. An Event the apiserver
// refuses for good is dropped, as on the inline path; a transient failure keeps it and the rest, and is
// returned so that the node is queued again.
func (w *Writer) flushEvents(ctx context.Context, node string) error {
	w.mu.Lock()
	pending := w.events[node]
	w.mu.Unlock()
	for len(pending) > 0 {
		rs := pending[0]
		if err := w.recordRestart(ctx, node, rs); err != nil {
			w.metrics.event("error")
			if !eventRefused(err) {
				return err
			}
			w.log.Warn("kubelet restart event refused; dropping it", zap.String("node", node),
				zap.String("restartID", rs.GetId()), zap.String("reason", string(apierrors.ReasonForError(err))), zap.Error(err))
		}
		pending = pending[1:]
		w.mu.Lock()
		// Only this worker removes a node's events (the queue hands a node to one worker at a time);
		// reports may have appended more meanwhile.
		if cur := w.events[node]; len(cur) > 0 && cur[0] == rs {
			if len(cur) == 1 {
				delete(w.events, node)
			} else {
				w.events[node] = cur[1:]
			}
		}
		pending = w.events[node]
		w.mu.Unlock()
	}
	return nil
}

// owed says whether the node's latest report was acknowledged as queued and is not written yet.
func (w *Writer) owed(node string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.reports[node].owed
}

// paid records that report seq of the node is on the Node (or needs no write).
func (w *Writer) paid(node string, seq uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if r, ok := w.reports[node]; ok && r.seq == seq && r.owed {
		r.owed = false
		w.reports[node] = r
	}
}

// Enqueue asks for the node's status to be written again.
func (w *Writer) Enqueue(node string) { w.queue.Add(node) }

// release drops the node's report: another replica serves the node (see Config.Serving).
func (w *Writer) release(node string) {
	l := w.lock(node)
	l.Lock()
	defer l.Unlock()
	w.mu.Lock()
	_, held := w.reports[node]
	delete(w.reports, node)
	delete(w.written, node)
	w.mu.Unlock()
	if held {
		w.log.Debug("node served by another replica; dropped its status report", zap.String("node", node))
	}
}

// Reported is the number of nodes whose latest report this replica holds.
func (w *Writer) Reported() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.reports)
}

// Run processes enqueued nodes until ctx ends, then drains: reports that arrive while the server lets its
// calls finish are written inline (Report), and what this replica acknowledged as queued is written once
// more, for up to drain — an acknowledgement as queued must not be lost to a rolling update (review of
// issue 28). What a failed write would retry is left to the node's next stream.
func (w *Writer) Run(ctx context.Context, workers int, drain time.Duration) error {
	// The workers' writes outlive ctx by the drain.
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for w.processNext(wctx) {
			}
		}()
	}
	<-ctx.Done()
	w.draining.Store(true)
	w.queue.ShutDown() // Get returns what is queued, then quit
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(drain):
		w.log.Warn("status queue not drained in time; the nodes' next streams bring their reports again",
			zap.Duration("drain", drain), zap.Int("left", w.queue.Len()))
		cancel()
		<-done
	}
	return nil
}

func (w *Writer) processNext(ctx context.Context) bool {
	node, quit := w.queue.Get()
	if quit {
		return false
	}
	defer w.queue.Done(node)
	// Acknowledged restarts get their Events whether or not the node still streams from here. A failed
	// Event keeps the node in the queue with a growing backoff, also when its status is written: forgetting
	// the node there would retry the Event at the base delay for as long as the apiserver refuses it.
	eventErr := w.flushEvents(ctx, node)
	if eventErr != nil {
		w.log.Warn("create kubelet restart event failed; retrying", zap.String("node", node), zap.Error(eventErr))
	}
	settled := func() {
		if eventErr != nil {
			w.queue.AddRateLimited(node)
		} else {
			w.queue.Forget(node)
		}
	}
	// A node that streams from another replica now is that replica's to write, even for a report this one
	// acknowledged as queued: the sidecar sends its latest report again on every new stream, and writing the
	// queued one here could put an older status over the newer one the other replica wrote (review of
	// issue 28). Its Events are still this replica's promise.
	if w.serving != nil && !w.serving(node) {
		w.release(node)
		settled()
		return true
	}
	switch err := w.write(ctx, node); {
	case err == nil, errors.Is(err, errNoReport), errors.Is(err, ErrNodeGone), errors.Is(err, ErrOtherNode), errors.Is(err, errHeld):
		settled()
	case errors.Is(err, errNotCached):
		w.queue.AddRateLimited(node) // until the cache catches up: not worth a warning
	default:
		w.log.Warn("write node status failed; retrying", zap.String("node", node), zap.Error(err))
		w.queue.AddRateLimited(node)
	}
	return true
}

// Desired is the status the node should carry: the reported one, with the service's sync error in place of
// the reported error while there is one. ok is false when the node has not reported to this replica.
func (w *Writer) Desired(node string) (status *corev1.NodeConfigStatus, message string, ok bool) {
	status, message, _, _, _, ok = w.desired(node)
	return status, message, ok
}

// desired is Desired, how much longer the status waits for its restart's outcome (0: none), the Node
// object it is about ("": any) and the report's number.
func (w *Writer) desired(node string) (status *corev1.NodeConfigStatus, message string, hold time.Duration, nodeUID string, seq uint64, ok bool) {
	w.mu.Lock()
	r, ok := w.reports[node]
	w.mu.Unlock()
	if !ok {
		return nil, "", 0, "", 0, false
	}
	status = wire.StatusToCore(r.status)
	message = r.message
	if st, known, _ := w.table.Get(node); known && st.SyncError != "" {
		status.Error = st.SyncError
		message = ""
	}
	if !r.restarting.IsZero() && status.Error == "" && w.restartDelay > 0 {
		hold = max(0, w.restartDelay-w.clock.Since(r.restarting))
	}
	return status, message, hold, r.nodeUID, r.seq, true
}

func (w *Writer) lock(node string) *sync.Mutex {
	h := fnv.New32a()
	h.Write([]byte(node))
	return &w.locks[h.Sum32()%uint32(len(w.locks))]
}

// write patches the node's status unless the Node already shows it.
func (w *Writer) write(ctx context.Context, name string) error {
	l := w.lock(name)
	l.Lock()
	defer l.Unlock()
	status, message, hold, uid, seq, ok := w.desired(name)
	if !ok {
		return errNoReport
	}
	node, err := w.nodes.Get(name)
	if apierrors.IsNotFound(err) {
		// Before the hold: a deleted Node's report goes now, not after the delay, when a Node registered
		// again under the name could be there to take it.
		return w.dropIfGone(ctx, name, uid)
	}
	if err != nil {
		return fmt.Errorf("get node %s from cache: %w", name, err)
	}
	if uid != "" && string(node.UID) != uid {
		// The cached Node is another object than the report's: the report is about a deleted one, or the
		// cache has not seen the new one yet.
		return w.dropIfGone(ctx, name, uid)
	}
	if hold > 0 {
		w.queue.AddAfter(name, hold)
		w.metrics.write("held")
		return errHeld
	}
	annotation, err := json.Marshal(status)
	if err != nil {
		return fmt.Errorf("encode status of node %s: %w", name, err)
	}
	cond := Condition(status, message)
	digest := writeDigest(string(annotation), cond)
	w.mu.Lock()
	last, wrote := w.written[name]
	w.mu.Unlock()
	if wrote && last.over == node.ResourceVersion {
		// The cache predates this replica's last patch: a report that follows a write closely (or a queued
		// write that follows a report) would otherwise patch the same status again.
		if last.digest == digest {
			w.metrics.write("unchanged")
			w.paid(name, seq)
			return nil
		}
	} else if upToDate(node, string(annotation), status, cond) {
		w.metrics.write("unchanged")
		w.paid(name, seq)
		return nil
	}
	now := metav1.NewTime(w.clock.Now())
	cond.LastHeartbeatTime = now
	cond.LastTransitionTime = now
	for _, c := range node.Status.Conditions {
		if c.Type == nodeconfig.ConditionType && c.Status == cond.Status {
			cond.LastTransitionTime = c.LastTransitionTime
		}
	}
	meta := map[string]any{"annotations": map[string]string{nodeconfig.StatusAnnotation: string(annotation)}}
	if uid != "" {
		// A precondition: the apiserver refuses the patch if the Node under the name is another object by now
		// (this replica's cache lagging a deletion and re-registration), rather than write this object's
		// status onto it.
		meta["uid"] = uid
	}
	patch, err := json.Marshal(map[string]any{
		"metadata": meta,
		"status": map[string]any{
			// Dropped by apiservers ≥ 1.24 unless the Node already has it (docs/design.md, "The apiserver fact"); kept where allowed.
			"config":     configPatch(status),
			"conditions": []corev1.NodeCondition{cond},
		},
	})
	if err != nil {
		return err
	}
	start := w.clock.Now()
	if err := w.patchStatus(ctx, name, patch); err != nil {
		w.metrics.write("error")
		if uid != "" && (apierrors.IsConflict(err) || apierrors.IsInvalid(err)) {
			// Possibly the UID precondition: whether the report's object is still there decides.
			if derr := w.dropIfGone(ctx, name, uid); !errors.Is(derr, errNotCached) {
				return derr
			}
		}
		return fmt.Errorf("patch status of node %s: %w", name, err)
	}
	w.metrics.write("written")
	w.mu.Lock()
	w.written[name] = lastWrite{over: node.ResourceVersion, digest: digest}
	w.mu.Unlock()
	w.paid(name, seq)
	w.log.Info("node status written", zap.String("node", name), zap.String("status", string(annotation)),
		zap.String("configOK", string(cond.Status)), zap.Duration("took", w.clock.Since(start)))
	return nil
}

// patchStatus applies patch to node name's status. The typed client would decode the whole Node the
// apiserver answers with, which the writer never reads: at two writes per node per assignment, that decode
// was a fifth of what each write allocated (52 of 245 MB across 10,000 writes in make bench's scale phase).
// The REST client reads the answer (in full) without decoding it; an error answer is still decoded, so
// apierrors' predicates work on it.
func (w *Writer) patchStatus(ctx context.Context, name string, patch []byte) error {
	opts := metav1.PatchOptions{FieldManager: FieldManager}
	if rc, ok := w.client.CoreV1().RESTClient().(*rest.RESTClient); ok && rc != nil {
		return rc.Patch(types.StrategicMergePatchType).Resource("nodes").Name(name).SubResource("status").
			VersionedParams(&opts, scheme.ParameterCodec).Body(patch).Do(ctx).Error()
	}
	// client-go's fake clientsets have no REST client: unit tests go through the typed one.
	_, err := w.client.CoreV1().Nodes().Patch(ctx, name, types.StrategicMergePatchType, patch, opts, "status")
	return err
}

// dropIfGone handles a node whose report is held but whose Node — the object nodeUID, if not "" — the cache
// does not hold: either the Node is new and this replica's cache has not seen it yet (keep the report,
// errNotCached), or it was deleted — by Forget, or as a late report arrived — and the report goes
// (ErrNodeGone; ErrOtherNode if the report named its object), so that reports follow the live Nodes. The
// cache cannot tell the two apart, so the apiserver is asked: a list by name, which is a quorum read and
// within the service's RBAC (nodes list/watch, no get). The node's lock is held by the caller, and only the
// report that was checked is dropped: a newer one (from a Node created again meanwhile) is kept and gets
// its own check when its Report writes.
func (w *Writer) dropIfGone(ctx context.Context, name, nodeUID string) error {
	w.mu.Lock()
	checked, ok := w.reports[name]
	w.mu.Unlock()
	if !ok {
		return errNoReport
	}
	if checked.nodeUID != nodeUID {
		return errNotCached // a newer report (about another object) came meanwhile: its own write checks it
	}
	list, err := w.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()})
	if err != nil {
		return fmt.Errorf("check whether node %s exists: %w", name, err)
	}
	for _, n := range list.Items {
		if n.Name == name && (nodeUID == "" || string(n.UID) == nodeUID) {
			return errNotCached
		}
	}
	w.mu.Lock()
	if cur, ok := w.reports[name]; ok && cur == checked {
		delete(w.reports, name)
		delete(w.written, name)
	}
	w.mu.Unlock()
	if nodeUID != "" {
		w.log.Info("node object gone; dropped its status report", zap.String("node", name), zap.String("nodeUID", nodeUID))
		return ErrOtherNode
	}
	w.log.Info("node gone; dropped its status report", zap.String("node", name))
	return ErrNodeGone
}

// configPatch is status.config as a patch that leaves exactly status behind, whatever the Node held: every
// NodeConfigStatus field is omitempty, so a patch made of status alone could set fields but never remove one
// (an error would never clear, a reset would leave the old sources). Each absent field is therefore sent as
// null. The original kubelet got the nulls from a two-way patch against a Node it had just read; naming
// every field instead does not depend on what this replica's Node cache (possibly stale, possibly behind
// another replica's write) says the Node holds.
func configPatch(status *corev1.NodeConfigStatus) map[string]any {
	patch := map[string]any{
		"assigned":      sourcePatch(status.Assigned),
		"active":        sourcePatch(status.Active),
		"lastKnownGood": sourcePatch(status.LastKnownGood),
		"error":         nil,
	}
	if status.Error != "" {
		patch["error"] = status.Error
	}
	return patch
}

// sourcePatch is a NodeConfigSource as a patch that replaces the stored one: nil (JSON null, which removes
// the field) for none, else every field of its only kind, so nothing of a previous source survives.
func sourcePatch(s *corev1.NodeConfigSource) any {
	if s == nil || s.ConfigMap == nil {
		return nil
	}
	cm := s.ConfigMap
	return map[string]any{"configMap": map[string]any{
		"namespace":        cm.Namespace,
		"name":             cm.Name,
		"uid":              cm.UID,
		"resourceVersion":  cm.ResourceVersion,
		"kubeletConfigKey": cm.KubeletConfigKey,
	}}
}

// upToDate reports whether the cached Node already carries the status. status.config is compared only
// where the apiserver keeps it, or a v1.24+ apiserver would be patched forever.
// writeDigest sums what a write puts on the Node: the annotation (the whole status) and the condition.
func writeDigest(annotation string, cond corev1.NodeCondition) uint64 {
	h := fnv.New64a()
	for _, part := range []string{annotation, string(cond.Status), cond.Reason, cond.Message} {
		h.Write([]byte(part))
		h.Write([]byte{0})
	}
	return h.Sum64()
}

func upToDate(node *corev1.Node, annotation string, status *corev1.NodeConfigStatus, cond corev1.NodeCondition) bool {
	if node.Annotations[nodeconfig.StatusAnnotation] != annotation {
		return false
	}
	if node.Status.Config != nil && !apiequality.Semantic.DeepEqual(node.Status.Config, status) {
		return false
	}
	for _, c := range node.Status.Conditions {
		if c.Type == nodeconfig.ConditionType {
			return c.Status == cond.Status && c.Reason == cond.Reason && c.Message == cond.Message
		}
	}
	return false
}

// namespaceLifecycleNotReady is how a kube-apiserver that has just started refuses a create in any
// namespace until its NamespaceLifecycle admission has synced: a 403 that is over in a second or two, not a
// refusal of the Event (k8s.io/apiserver, plugin/namespace/lifecycle). Taken for one, it dropped the Event
// of a restart made while the apiserver restarted (TestFaultsDuringRollouts, once on a new machine).
const namespaceLifecycleNotReady = "not yet ready to handle request"

// eventRefused says whether the apiserver refused an Event for good (quota, admission, validation): retrying
// the same Event cannot help. Anything else (timeouts, throttling, server errors, the connection) may.
func eventRefused(err error) bool {
	if apierrors.IsForbidden(err) && strings.Contains(err.Error(), namespaceLifecycleNotReady) {
		return false
	}
	return apierrors.IsForbidden(err) || apierrors.IsInvalid(err) || apierrors.IsBadRequest(err) ||
		apierrors.IsRequestEntityTooLargeError(err) || apierrors.IsNotFound(err) || apierrors.IsMethodNotSupported(err)
}
