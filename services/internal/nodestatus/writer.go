// SPDX-License-Identifier: Apache-2.0

// Package nodestatus is where Node status is written (docs/design.md, "Where status is written"). For every node whose
// sidecar reported, it keeps the dkc.dev/config-status annotation, the ConfigOK condition and — where the apiserver
// keeps it — status.config equal to the node's reported NodeConfigStatus, with the sync error of the service's own
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
	"errors"
	"hash/fnv"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"

	"github.com/dkc-dev/dkc/services/internal/assignment"
)

// FieldManager owns what dkc writes on Nodes.
const FieldManager = "dkc-server"

// Writer writes node status. Create it with New and run it with Run.
type Writer struct {
	log    *zap.Logger
	client kubernetes.Interface
	nodes  corelisters.NodeLister
	table  *assignment.Table
	clock  clock.WithTicker
	// draining is set once Run's context has ended: no report is queued any more.
	draining atomic.Bool
	metrics  *Metrics
	queue    workqueue.TypedRateLimitingInterface[string]
	serving  func(node string) bool // nil: every node (a single replica)
	// restartDelay is how long a restart in progress waits for its outcome before it is written.
	restartDelay time.Duration

	// inline holds a token for each report being written inline (Config.MaxInlineWrites); nil: no bound.
	inline chan struct{}

	mu  sync.Mutex
	seq uint64
	// state is what this replica holds about each node (state.go); a node without a report nor a queued
	// Event has no entry.
	state map[string]*nodeState

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
// The queue's delays (held restarts, retries) run on clk; nil is the real clock.
func NewPending(metrics workqueue.MetricsProvider, clk clock.WithTicker) *Pending {
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &Pending{queue: workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.NewTypedItemExponentialFailureRateLimiter[string](200*time.Millisecond, 30*time.Second),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "nodestatus", MetricsProvider: metrics, Clock: clk})}
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
	// Pending is the queue the writer drains; nil: a new one on Clock (Enqueue adds to it).
	Pending *Pending
	// Clock is where every time the writer reads comes from: report and write times, the restart hold, the
	// drain at shutdown. nil: the real clock. A Pending given should run on the same clock. A fake clock
	// must be stepped for the drain to time out.
	Clock clock.WithTicker
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
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Pending == nil {
		cfg.Pending = NewPending(nil, cfg.Clock)
	}
	w := &Writer{
		log: cfg.Log, client: cfg.Client, nodes: cfg.Nodes, table: cfg.Table, clock: cfg.Clock, metrics: cfg.Metrics,
		queue: cfg.Pending.queue, serving: cfg.Serving, restartDelay: cfg.RestartingDelay,
		state: map[string]*nodeState{},
	}
	if cfg.MaxInlineWrites > 0 {
		w.inline = make(chan struct{}, cfg.MaxInlineWrites)
	}
	return w
}

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

// Receipt is what the acknowledgement of an accepted report covers beyond its status.
type Receipt struct {
	// EventQueued: the report was queued with its restart, whose Event is not created yet; the sidecar keeps
	// the restart and sends it again on its next stream (dkcv1.ReportStatusResponse.restart_queued), so that
	// the Event survives this replica exiting before its queue created it.
	EventQueued bool
}

// Enqueue asks for the node's status to be written again.
func (w *Writer) Enqueue(node string) { w.queue.Add(node) }

// Reported is the number of nodes whose latest report this replica holds.
func (w *Writer) Reported() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, s := range w.state {
		if s.report != nil {
			n++
		}
	}
	return n
}

func (w *Writer) lock(node string) *sync.Mutex {
	h := fnv.New32a()
	h.Write([]byte(node))
	return &w.locks[h.Sum32()%uint32(len(w.locks))]
}
