// SPDX-License-Identifier: Apache-2.0

package nodestatus_test

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/kubernetes/fake"
	corelisters "k8s.io/client-go/listers/core/v1"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/dkc-dev/dkc/internal/nodeconfig"
	"github.com/dkc-dev/dkc/internal/outbox"
	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
	"github.com/dkc-dev/dkc/services/internal/assignment"
	"github.com/dkc-dev/dkc/services/internal/auth"
	"github.com/dkc-dev/dkc/services/internal/nodestatus"
	"github.com/dkc-dev/dkc/services/internal/rpc"
)

var (
	protocolHistories = flag.Int("protocol-histories", 300, "random histories TestProtocolAgainstTheService plays")
	protocolSeed      = flag.Int64("protocol-seed", -1, "play only the history of this seed (TestProtocolAgainstTheService)")
)

// TestProtocolAgainstTheService plays random histories of the status report protocol (docs/design.md, "The
// status report protocol") through the real code of both sides: a node's outbox.Outbox, and two replicas of
// the service, each an rpc.Service (ReportStatus, and WatchConfig streams that tell its writer which nodes
// it serves) over a nodestatus.Writer with its own Node cache, sharing one apiserver (client-go's fake
// clientset, given what a real apiserver does that its tracker does not: resourceVersions, and the UID
// precondition of a status patch). Only the workqueue's timing is the test's: its delays run when the
// fake clock passes them, and its workers run when the history says, so a seed plays the same history.
//
// The history's steps, in random order: the agent reports (settled, a restart in progress, an error;
// sometimes with a kubelet restart); the outbox's next report is sent to the replica the node streams from,
// sometimes while all its inline writes are taken (the report and its Event are queued), sometimes so
// slowly that the node gives up on the call and its request reaches the replica later, after newer ones;
// its acknowledgement arrives or is lost; the node's stream moves, or ends; a replica exits — draining its
// queue, or crashing — and a new one takes its place; the Node is deleted and registered again under a new
// UID (the agent follows it and reports); the apiserver fails the next writes; each replica's cache catches
// up with the apiserver, or not; the replicas' queue workers run (at any time); time passes and they run.
//
// Checked after every step: the Node never shows a report about another Node object, and never one older
// than one it showed — except across a handover, until the resend lands: invariant 1 does not hold across
// a handover until the resend lands. A replica the node comes back to may write the older report it queued
// (while busy, or retrying a failed write) over the newer one the other replica wrote meanwhile, before the
// report the reconnect re-sends arrives (docs/design.md §10, "replica handover"); so an older report is
// allowed only once the node streamed from another replica since the Node first showed the newer one.
// After the history, once the node stays connected and acknowledgements arrive: the Node shows the last
// report, and every kubelet restart has an Event, with no extras.
//
// Time passes only while no report waits to be sent: a report reaches the service well within the restart
// hold.
//
// A failing history prints its seed and steps; -protocol-histories sets how many are played, -protocol-seed
// plays one.
func TestProtocolAgainstTheService(t *testing.T) {
	seeds := make([]uint64, 0, *protocolHistories)
	if *protocolSeed >= 0 {
		seeds = append(seeds, uint64(*protocolSeed))
	} else {
		for s := range *protocolHistories {
			seeds = append(seeds, uint64(s))
		}
	}
	for _, seed := range seeds {
		if err := playAgainstService(seed, 120); err != nil {
			t.Fatalf("seed %d (-protocol-seed=%d): %v", seed, seed, err)
		}
	}
}

const (
	nodeName  = "n1"
	holdDelay = 10 * time.Second
)

var nodesResource = corev1.SchemeGroupVersion.WithResource("nodes")

// apiserver is the fake clientset with what the writer relies on from a real apiserver: every write gives
// the Node a new resourceVersion, and a status patch naming another UID than the Node's is refused as
// Invalid (422: metadata.uid is immutable). fail makes the next writes (status patches, Event creations) fail as an overloaded apiserver's.
type apiserver struct {
	client *fake.Clientset
	rv     int
	fail   int
}

func newAPIServer() *apiserver {
	// The simple tracker: NewClientset's field-managed one builds a REST mapper on every write, 60% of
	// this test's time, for field management the writer does not read.
	a := &apiserver{client: fake.NewSimpleClientset()}
	a.client.PrependReactor("patch", "nodes", a.patch)
	a.client.PrependReactor("create", "events", func(k8stesting.Action) (bool, runtime.Object, error) {
		if a.fail > 0 {
			a.fail--
			return true, nil, apierrors.NewInternalError(errors.New("etcdserver: request timed out"))
		}
		return false, nil, nil
	})
	return a
}

func (a *apiserver) patch(action k8stesting.Action) (bool, runtime.Object, error) {
	p := action.(k8stesting.PatchAction)
	if a.fail > 0 {
		a.fail--
		return true, nil, apierrors.NewInternalError(errors.New("etcdserver: request timed out"))
	}
	obj, err := a.client.Tracker().Get(nodesResource, "", p.GetName())
	if err != nil {
		return true, nil, err
	}
	cur := obj.(*corev1.Node)
	var pre struct {
		Metadata struct {
			UID types.UID `json:"uid"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(p.GetPatch(), &pre); err != nil {
		return true, nil, apierrors.NewBadRequest(err.Error())
	}
	if pre.Metadata.UID != "" && pre.Metadata.UID != cur.UID {
		// As a real apiserver answers a patch whose metadata.uid differs from the object's.
		return true, nil, apierrors.NewInvalid(schema.GroupKind{Kind: "Node"}, cur.Name, field.ErrorList{
			field.Invalid(field.NewPath("metadata", "uid"), pre.Metadata.UID, "field is immutable")})
	}
	orig, err := json.Marshal(cur)
	if err != nil {
		return true, nil, err
	}
	merged, err := strategicpatch.StrategicMergePatch(orig, p.GetPatch(), &corev1.Node{})
	if err != nil {
		return true, nil, apierrors.NewBadRequest(err.Error())
	}
	n := &corev1.Node{}
	if err := json.Unmarshal(merged, n); err != nil {
		return true, nil, err
	}
	a.rv++
	n.ResourceVersion = strconv.Itoa(a.rv)
	return true, n, a.client.Tracker().Update(nodesResource, n, "")
}

// register creates the Node anew under uid, deleting the one there was.
func (a *apiserver) register(uid string) error {
	ctx := context.Background()
	if err := a.client.CoreV1().Nodes().Delete(ctx, nodeName, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	a.rv++
	_, err := a.client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName, UID: types.UID(uid),
		ResourceVersion: strconv.Itoa(a.rv)}}, metav1.CreateOptions{})
	return err
}

func (a *apiserver) node() (*corev1.Node, error) {
	n, err := a.client.CoreV1().Nodes().Get(context.Background(), nodeName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	return n, err
}

// stepQueue is the writer's workqueue with the test's timing: a delayed or rate-limited item becomes ready
// when the fake clock passes its time (tick), as client-go's delaying queue moves it; the rest is a
// workqueue's contract for one worker (a set of ready items; after ShutDown nothing is added).
type stepQueue struct {
	clk      *clocktesting.FakeClock
	ready    []string
	later    map[string]time.Time
	failures map[string]int
	shutdown bool
}

func newStepQueue(clk *clocktesting.FakeClock) *stepQueue {
	return &stepQueue{clk: clk, later: map[string]time.Time{}, failures: map[string]int{}}
}

func (q *stepQueue) Add(item string) {
	if !q.shutdown && !slices.Contains(q.ready, item) {
		q.ready = append(q.ready, item)
	}
}

func (q *stepQueue) Len() int { return len(q.ready) }

func (q *stepQueue) Get() (string, bool) {
	if len(q.ready) == 0 {
		return "", true
	}
	item := q.ready[0]
	q.ready = q.ready[1:]
	return item, false
}

func (q *stepQueue) Done(string)              {}
func (q *stepQueue) ShutDown()                { q.shutdown = true }
func (q *stepQueue) ShutDownWithDrain()       { q.shutdown = true }
func (q *stepQueue) ShuttingDown() bool       { return q.shutdown }
func (q *stepQueue) Forget(item string)       { delete(q.failures, item) }
func (q *stepQueue) NumRequeues(i string) int { return q.failures[i] }

func (q *stepQueue) AddAfter(item string, d time.Duration) {
	if q.shutdown {
		return
	}
	if d <= 0 {
		q.Add(item)
		return
	}
	at := q.clk.Now().Add(d)
	if t, ok := q.later[item]; !ok || at.Before(t) {
		q.later[item] = at
	}
}

// AddRateLimited delays as nodestatus.NewPending's limiter: 200ms, doubled per failure, at most 30s.
func (q *stepQueue) AddRateLimited(item string) {
	d := min(200*time.Millisecond<<min(q.failures[item], 10), 30*time.Second)
	q.failures[item]++
	q.AddAfter(item, d)
}

// tick makes the items whose delay has passed ready.
func (q *stepQueue) tick() {
	items := make([]string, 0, len(q.later))
	for item := range q.later {
		items = append(items, item)
	}
	slices.Sort(items)
	for _, item := range items {
		if !q.later[item].After(q.clk.Now()) {
			delete(q.later, item)
			q.Add(item)
		}
	}
}

// replica is one dkc-server: the service, its writer, its Node cache and its queue.
type replica struct {
	name    string
	queue   *stepQueue
	cache   cache.Indexer
	streams *rpc.Streams
	writer  *nodestatus.Writer
	svc     *rpc.Service
}

func newReplica(name string, api *apiserver, clk *clocktesting.FakeClock) *replica {
	r := &replica{name: name, queue: newStepQueue(clk), cache: cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{}),
		streams: rpc.NewStreams()}
	table := assignment.NewTable(nil)
	r.writer = nodestatus.New(nodestatus.Config{Log: zap.NewNop(), Client: api.client, Nodes: corelisters.NewNodeLister(r.cache),
		Table: table, Pending: nodestatus.NewPendingFrom(r.queue), Clock: clk, Serving: r.streams.Serving,
		RestartingDelay: holdDelay, MaxInlineWrites: 1})
	r.svc = newService(table, r.writer, r.streams)
	return r
}

// newService is the one place the test makes an rpc.Service.
func newService(table *assignment.Table, w rpc.StatusWriter, streams *rpc.Streams) *rpc.Service {
	return rpc.New(rpc.Config{Log: zap.NewNop(), Table: table, Status: w, Streams: streams})
}

// syncCache makes the replica's Node cache what the apiserver has, as its informer does sooner or later.
func (r *replica) syncCache(api *apiserver) error {
	n, err := api.node()
	if err != nil {
		return err
	}
	var items []any
	if n != nil {
		items = append(items, n)
	}
	return r.cache.Replace(items, "")
}

// work is the replica's queue workers running until nothing is ready.
func (r *replica) work() {
	r.queue.tick()
	for i := 0; i < 100 && r.queue.Len() > 0; i++ {
		r.writer.ProcessNext(context.Background())
	}
}

func asNode(ctx context.Context) context.Context {
	return auth.WithIdentity(ctx, auth.Identity{Node: nodeName, ServiceAccount: "kube-system/dkc-sidecar"})
}

// watchStream is the node's WatchConfig stream on a replica, served by the replica's own WatchConfig.
type watchStream struct {
	grpc.ServerStream // nil: WatchConfig sends nothing, as the replica's table has no state for the node
	ctx               context.Context
	cancel            context.CancelFunc
	done              chan struct{}
	// headers is closed when WatchConfig sends the stream's headers: it does once the stream is registered
	// (what the sidecar takes as "this replica has my stream").
	headers     chan struct{}
	headersOnce sync.Once
}

func (s *watchStream) Context() context.Context              { return s.ctx }
func (s *watchStream) Send(*dkcv1.WatchConfigResponse) error { return nil }
func (s *watchStream) SendMsg(any) error                     { return nil }
func (s *watchStream) SendHeader(metadata.MD) error {
	s.headersOnce.Do(func() { close(s.headers) })
	return nil
}

// openStream opens the node's stream on r and returns once r serves the node.
func openStream(r *replica) (*watchStream, error) {
	ctx, cancel := context.WithCancel(asNode(context.Background()))
	s := &watchStream{ctx: ctx, cancel: cancel, done: make(chan struct{}), headers: make(chan struct{})}
	go func() {
		defer close(s.done)
		_ = r.svc.WatchConfig(&dkcv1.WatchConfigRequest{NodeName: nodeName, FollowsNodeUid: true}, s)
	}()
	select {
	case <-s.headers:
	case <-s.done:
		return nil, errors.New("the replica ended the node's stream before registering it")
	}
	if !r.streams.Serving(nodeName) {
		s.close()
		return nil, errors.New("the replica sent the stream's headers but does not serve the node")
	}
	return s, nil
}

// close ends the stream and returns once its replica no longer serves the node on it.
func (s *watchStream) close() {
	s.cancel()
	<-s.done
}

// lateCall is a ReportStatus call whose request is delayed on its way to replica r.
type lateCall struct {
	req *dkcv1.ReportStatusRequest
	r   *replica
	// moves is h.moves when it was sent: the node's streams opened on a replica other than r since.
	moves int
}

// sentReport is what a report the node sent was about.
type sentReport struct {
	sequence uint64
	nodeUID  string
}

type serviceHistory struct {
	rng      *rand.Rand
	clk      *clocktesting.FakeClock
	api      *apiserver
	replicas [2]*replica
	started  int // replicas started, for their names
	at       int // the replica the node streams from; -1: none
	stream   *watchStream
	outbox   *outbox.Outbox
	uids     int
	nodeUID  string
	// inFlight is the report sent whose acknowledgement has not arrived; resp its acknowledgement (nil:
	// the call failed).
	inFlight *dkcv1.ReportStatusRequest
	resp     *dkcv1.ReportStatusResponse
	// late is a call the node gave up on (its deadline passed) whose request reaches the replica only now.
	late *lateCall
	// sent: every report sent, by its assigned config's name (unique per status); shown: the highest
	// sequence each Node object showed.
	sent  map[string]sentReport
	shown map[string]uint64
	// moves counts the node's streams opened on another replica than the one before (a replica replaced
	// counts as another); shownAt is moves when each Node object showed its highest report. Invariant 1
	// does not hold across a handover until the resend lands (check).
	moves   int
	shownAt map[string]int
	last    *replica // the replica the node last streamed from
	behind  bool     // the Node shows an older report than it showed, across a handover
	// What the agent did.
	lastStatus *dkcv1.NodeConfigStatus
	restarts   []string
	statuses   int
	log        []string
}

func (h *serviceHistory) logf(format string, args ...any) {
	h.log = append(h.log, fmt.Sprintf(format, args...))
}

func (h *serviceHistory) startReplica(i int) {
	h.started++
	h.replicas[i] = newReplica(fmt.Sprintf("replica-%d", h.started), h.api, h.clk)
}

func statusKey(st *dkcv1.NodeConfigStatus) string {
	return st.GetAssigned().GetConfigMap().GetName() + ">" + st.GetActive().GetConfigMap().GetName() + ":" + st.GetError()
}

func cmSource(name string) *dkcv1.NodeConfigSource {
	return &dkcv1.NodeConfigSource{ConfigMap: &dkcv1.ConfigMapNodeConfigSource{Namespace: "kube-system", Name: name,
		Uid: "uid-" + name, ResourceVersion: "1", KubeletConfigKey: "kubelet"}}
}

// report is the agent reporting a status: settled, a restart in progress, or an error; sometimes with a
// kubelet restart.
func (h *serviceHistory) report() {
	h.statuses++
	name := fmt.Sprintf("c%d", h.statuses)
	var st *dkcv1.NodeConfigStatus
	switch h.rng.IntN(3) {
	case 0:
		st = &dkcv1.NodeConfigStatus{Assigned: cmSource(name), Active: cmSource(name)}
	case 1:
		st = &dkcv1.NodeConfigStatus{Assigned: cmSource(name), Active: cmSource("old")}
	default:
		st = &dkcv1.NodeConfigStatus{Assigned: cmSource(name), Active: cmSource("old"), Error: "failed " + name}
	}
	var restart *dkcv1.KubeletRestart
	if h.rng.IntN(3) == 0 && len(h.restarts) < outbox.MaxPendingRestarts {
		restart = &dkcv1.KubeletRestart{Id: fmt.Sprintf("r%d", len(h.restarts)), Target: st.GetAssigned()}
		h.restarts = append(h.restarts, restart.GetId())
	}
	h.lastStatus = st
	h.logf("report %q restart %q", statusKey(st), restart.GetId())
	h.outbox.Enqueue(st, "", restart)
}

// connect moves the node's stream to replica i: what client.Watch does on a new stream.
func (h *serviceHistory) connect(i int) error {
	h.disconnect()
	s, err := openStream(h.replicas[i])
	if err != nil {
		return err
	}
	h.stream, h.at = s, i
	if h.last != h.replicas[i] {
		h.moves++
		h.last = h.replicas[i]
	}
	h.logf("stream to %s", h.replicas[i].name)
	h.outbox.Reconnected()
	return nil
}

func (h *serviceHistory) disconnect() {
	if h.stream != nil {
		h.stream.close()
		h.stream, h.at = nil, -1
		h.logf("disconnected")
	}
}

// send calls ReportStatus with the outbox's next report on the replica the node streams from; busy: all
// the replica's inline writes are taken meanwhile; slow: the call is given up on and its request arrives
// later, or never (deliverLate).
func (h *serviceHistory) send(busy, slow bool) {
	if h.inFlight != nil || h.at < 0 {
		return
	}
	req := h.outbox.Next()
	if req == nil {
		return
	}
	r := h.replicas[h.at]
	name := req.GetStatus().GetAssigned().GetConfigMap().GetName()
	if _, ok := h.sent[name]; !ok {
		h.sent[name] = sentReport{sequence: req.GetSequence(), nodeUID: req.GetNodeUid()}
	}
	h.logf("send %d/%d %q restart %q about %s to %s", req.GetIncarnation(), req.GetSequence(), statusKey(req.GetStatus()),
		req.GetRestart().GetId(), req.GetNodeUid(), r.name)
	if slow && h.late == nil {
		// The call is slow: the node gives up on it (no acknowledgement) and sends again or something newer;
		// the request reaches the replica later (deliverLate).
		h.late, h.inFlight, h.resp = &lateCall{req: req, r: r, moves: h.moves}, req, nil
		h.logf("  slow: given up, on its way still")
		return
	}
	if busy {
		if release, ok := r.writer.TakeInlineWrite(); ok {
			defer release()
			h.logf("  (inline writes all taken)")
		}
	}
	resp, err := r.svc.ReportStatus(asNode(context.Background()), req)
	h.inFlight, h.resp = req, resp
	switch {
	case err != nil:
		h.logf("  refused: %v", err)
	case resp.GetRestartQueued():
		h.logf("  ok, restart queued")
	default:
		h.logf("  ok")
	}
}

// deliverLate makes the late call's request reach its replica (its answer goes nowhere) unless the node
// has streamed from another replica since the call: the replica orders the node's reports, so a request
// overtaken by newer ones to the same replica is refused as stale, also across a reconnect to it. Once the
// node moved, the request is dropped: a slow call is handled within its deadline, or not at all.
// (Delivered after a move, it could put its older status over a newer one that a replica it never reached
// wrote: the Node does not carry the report's numbers, and only the node's next report corrects it, as for
// a half-dead stream.)
func (h *serviceHistory) deliverLate() {
	l := h.late
	if l == nil {
		return
	}
	h.late = nil
	if h.moves != l.moves || !slices.Contains(h.replicas[:], l.r) {
		h.logf("late %d/%d to %s dropped: the node streamed from another replica since", l.req.GetIncarnation(), l.req.GetSequence(), l.r.name)
		return
	}
	_, err := l.r.svc.ReportStatus(asNode(context.Background()), l.req)
	h.logf("late %d/%d %q restart %q reaches %s: %v", l.req.GetIncarnation(), l.req.GetSequence(), statusKey(l.req.GetStatus()),
		l.req.GetRestart().GetId(), l.r.name, err)
}

// complete delivers the acknowledgement of the report in flight to the outbox, or loses it.
func (h *serviceHistory) complete(lost bool) {
	if h.inFlight == nil {
		return
	}
	if h.resp != nil && !lost {
		h.outbox.Ack(h.inFlight, h.resp.GetRestartQueued())
		h.logf("  acknowledged")
	} else if h.resp != nil {
		h.logf("  acknowledgement lost")
	}
	h.inFlight, h.resp = nil, nil
}

// replace ends replica i — draining its queue as dkc-server does on SIGTERM, or crashing — and starts a new
// one in its place.
func (h *serviceHistory) replace(i int) error {
	r := h.replicas[i]
	graceful := h.rng.IntN(2) == 0
	if graceful {
		r.svc.Shutdown() // ends its streams with Unavailable
	}
	if h.at == i {
		h.disconnect()
	}
	if graceful {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_ = r.writer.Run(ctx, 0, time.Minute) // no workers of its own: marks it draining and shuts its queue down
		r.work()                              // the drain: what is queued is written (or released: its node left)
		h.logf("%s exited, its queue drained", r.name)
	} else {
		h.logf("%s crashed", r.name)
	}
	h.startReplica(i)
	if err := h.replicas[i].syncCache(h.api); err != nil {
		return err
	}
	h.logf("%s started", h.replicas[i].name)
	return nil
}

// reregister deletes the Node and registers it again under a new UID; the Node controller queues the
// name on every replica, and a connected node's agent follows the new object and reports.
func (h *serviceHistory) reregister() error {
	h.uids++
	h.nodeUID = fmt.Sprintf("uid-%d", h.uids)
	if err := h.api.register(h.nodeUID); err != nil {
		return err
	}
	for _, r := range h.replicas {
		r.queue.Add(nodeName)
	}
	h.logf("node registered again as %s", h.nodeUID)
	if h.at >= 0 {
		h.outbox.Follow(h.nodeUID)
		h.report()
	}
	return nil
}

// syncCaches brings each replica's cache up to date with probability p.
func (h *serviceHistory) syncCaches(p float64) error {
	for _, r := range h.replicas {
		if h.rng.Float64() < p {
			if err := r.syncCache(h.api); err != nil {
				return err
			}
		}
	}
	return nil
}

// check is the invariant after every step: the Node shows no report older than one it showed, and none
// about another Node object.
func (h *serviceHistory) check() error {
	n, err := h.api.node()
	if err != nil || n == nil {
		return err
	}
	ann, ok := n.Annotations[nodeconfig.StatusAnnotation]
	if !ok {
		return nil
	}
	var st corev1.NodeConfigStatus
	if err := json.Unmarshal([]byte(ann), &st); err != nil {
		return fmt.Errorf("status annotation %q: %w", ann, err)
	}
	name := ""
	if st.Assigned != nil && st.Assigned.ConfigMap != nil {
		name = st.Assigned.ConfigMap.Name
	}
	s, ok := h.sent[name]
	if !ok {
		return fmt.Errorf("the Node shows %s, which the node never sent", ann)
	}
	uid := string(n.UID)
	if s.nodeUID != uid {
		return fmt.Errorf("report %d about Node object %s landed on its successor %s", s.sequence, s.nodeUID, uid)
	}
	if prev := h.shown[uid]; s.sequence < prev {
		// The replica handover race (docs/design.md §10): a replica the node comes back to writes the
		// older report it queued over the newer one the other replica wrote, before the report the
		// reconnect re-sends lands. Allowed only if the node moved since the Node showed report prev.
		if h.moves == h.shownAt[uid] {
			return fmt.Errorf("Node object %s went back from report %d to report %d", uid, prev, s.sequence)
		}
		if !h.behind {
			h.logf("  the Node shows report %d after %d, across a handover", s.sequence, prev)
		}
		h.behind = true
		return nil
	}
	if s.sequence > h.shown[uid] {
		h.shownAt[uid] = h.moves
	}
	h.shown[uid], h.behind = s.sequence, false
	return nil
}

func playAgainstService(seed uint64, steps int) (err error) {
	h := &serviceHistory{rng: rand.New(rand.NewPCG(seed, 29)), clk: clocktesting.NewFakeClock(time.Unix(1_000_000, 0)),
		api: newAPIServer(), at: -1, sent: map[string]sentReport{}, shown: map[string]uint64{},
		shownAt: map[string]int{}}
	defer func() {
		h.disconnect()
		if err != nil {
			err = fmt.Errorf("%w\nhistory:\n%s", err, strings.Join(h.log, "\n"))
		}
	}()
	h.uids++
	h.nodeUID = fmt.Sprintf("uid-%d", h.uids)
	if err := h.api.register(h.nodeUID); err != nil {
		return err
	}
	h.startReplica(0)
	h.startReplica(1)
	if err := h.syncCaches(1); err != nil {
		return err
	}
	h.outbox = outbox.New(outbox.Config{Node: nodeName, Incarnation: 7, Clock: h.clk})
	h.outbox.Follow(h.nodeUID)
	if err := h.connect(0); err != nil {
		return err
	}
	for range steps {
		if err := h.syncCaches(0.7); err != nil {
			return err
		}
		switch k := h.rng.IntN(100); {
		case k < 20:
			h.report()
		case k < 45:
			h.send(h.rng.IntN(4) == 0, h.rng.IntN(8) == 0)
		case k < 65:
			h.complete(h.rng.IntN(4) == 0)
		case k < 73:
			if err := h.connect(h.rng.IntN(2)); err != nil {
				return err
			}
		case k < 76:
			if err := h.replace(h.rng.IntN(2)); err != nil {
				return err
			}
		case k < 79:
			if err := h.reregister(); err != nil {
				return err
			}
		case k < 81:
			h.disconnect()
		case k < 84:
			h.api.fail = 1 + h.rng.IntN(3)
			h.logf("the apiserver fails the next %d writes", h.api.fail)
		case k < 88:
			h.deliverLate()
		case k < 94:
			// The queue workers run whenever they like, also while a report waits to be sent.
			h.logf("queue workers run")
			for _, r := range h.replicas {
				r.work()
			}
		default:
			// Time passes only while no report waits to be sent (see the test's comment).
			if h.inFlight != nil || (h.at >= 0 && h.outbox.Pending()) {
				continue
			}
			d := time.Duration(h.rng.IntN(6)) * time.Second
			if at, ok := h.outbox.NextConfirm(); ok && h.rng.IntN(3) == 0 {
				d = max(d, at.Sub(h.clk.Now())) // to a parked restart's confirmation
			}
			h.clk.Step(d)
			h.logf("%v pass", d)
			for _, r := range h.replicas {
				r.work()
			}
			if at, ok := h.outbox.NextConfirm(); ok && !h.clk.Now().Before(at) {
				h.logf("the outbox confirms its parked restarts")
				h.outbox.Confirm()
			}
		}
		if err := h.check(); err != nil {
			return err
		}
	}
	// Quiet: the node connects again (the service tells it the Node object there is), acknowledgements arrive,
	// caches catch up, time passes.
	h.logf("-- quiet --")
	h.deliverLate()
	h.complete(false)
	h.api.fail = 0
	if h.outbox.NodeUID() != h.nodeUID {
		h.outbox.Follow(h.nodeUID)
		h.report()
	}
	// The node moves to the other replica right after its report was acknowledged as queued: the replica
	// it left drops the report, and only the reconnect's re-sent report brings it to the Node.
	next := h.rng.IntN(2)
	if h.at >= 0 {
		h.send(true, false)
		h.complete(false)
		next = 1 - h.at
	}
	if err := h.connect(next); err != nil {
		return err
	}
	for range 60 {
		if err := h.syncCaches(1); err != nil {
			return err
		}
		h.send(false, false)
		h.complete(false)
		h.clk.Step(time.Second)
		for _, r := range h.replicas {
			r.work()
		}
		if err := h.check(); err != nil {
			return err
		}
	}
	if h.lastStatus != nil {
		n, err := h.api.node()
		if err != nil {
			return err
		}
		want := statusKey(h.lastStatus)
		var st corev1.NodeConfigStatus
		_ = json.Unmarshal([]byte(n.Annotations[nodeconfig.StatusAnnotation]), &st)
		got := statusKey(&dkcv1.NodeConfigStatus{Assigned: coreSource(st.Assigned), Active: coreSource(st.Active), Error: st.Error})
		if got != want {
			return fmt.Errorf("the Node (%s) shows %q; the last report is %q", n.UID, got, want)
		}
	}
	events, err := h.api.client.CoreV1().Events(metav1.NamespaceDefault).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		return err
	}
	made := map[string]int{}
	for _, ev := range events.Items {
		if ev.Reason != nodeconfig.EventReason || ev.InvolvedObject.Name != nodeName {
			return fmt.Errorf("unexpected Event %s: %s %s", ev.Name, ev.Reason, ev.Message)
		}
		made[strings.TrimPrefix(ev.Name, nodeName+".")]++
	}
	// The tracker refuses a second Event of a name, as the apiserver does: each restart has at least one
	// Event, and there are no extras.
	for _, id := range h.restarts {
		if made[id] == 0 {
			return fmt.Errorf("kubelet restart %s has no Event", id)
		}
	}
	if len(made) != len(h.restarts) {
		return fmt.Errorf("%d Events for %d kubelet restarts", len(made), len(h.restarts))
	}
	return nil
}

func coreSource(s *corev1.NodeConfigSource) *dkcv1.NodeConfigSource {
	if s == nil || s.ConfigMap == nil {
		return nil
	}
	return &dkcv1.NodeConfigSource{ConfigMap: &dkcv1.ConfigMapNodeConfigSource{Name: s.ConfigMap.Name}}
}
