// SPDX-License-Identifier: Apache-2.0

package client

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/dkc-dev/dkc/internal/outbox"
	"github.com/dkc-dev/dkc/internal/poll"
	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
)

// awayService refuses reports while away, then acknowledges and records them.
type awayService struct {
	dkcv1.UnimplementedConfigServiceServer
	mu       sync.Mutex
	away     bool
	refused  int      // reports refused while away
	restarts []string // acknowledged restart ids, in order, once each
	last     *dkcv1.NodeConfigStatus
	numbers  [][2]uint64 // (incarnation, sequence) of each acknowledged report
	reports  []*dkcv1.ReportStatusRequest
	watches  []*dkcv1.WatchConfigRequest
	// slowFor: reports naming this Node object are answered only once release is closed (the service asks
	// the apiserver about them); slow is closed when the first one arrives. Both channels are made by
	// newSlowService.
	slowFor  string
	slow     chan struct{}
	slowOnce sync.Once
	release  chan struct{}
	// queueFirst: a restart is acknowledged as queued the first time it comes, as recorded after.
	queueFirst bool
	seen       map[string]int // restart id: times it came
}

func newSlowService(nodeUID string) *awayService {
	return &awayService{slowFor: nodeUID, slow: make(chan struct{}), release: make(chan struct{})}
}

// WatchConfig opens the stream and ends it soon after, so that the client reconnects again and again.
func (s *awayService) WatchConfig(req *dkcv1.WatchConfigRequest, stream dkcv1.ConfigService_WatchConfigServer) error {
	s.mu.Lock()
	s.watches = append(s.watches, req)
	s.mu.Unlock()
	if err := stream.SendHeader(nil); err != nil {
		return err
	}
	time.Sleep(20 * time.Millisecond) // not a wait for anything: the stream's life, a short one
	return status.Error(codes.Aborted, "ended by the test")
}

func (s *awayService) ReportStatus(ctx context.Context, req *dkcv1.ReportStatusRequest) (*dkcv1.ReportStatusResponse, error) {
	if s.slowFor != "" && req.GetNodeUid() == s.slowFor {
		s.slowOnce.Do(func() { close(s.slow) })
		select {
		case <-s.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.away {
		s.refused++
		return nil, status.Error(codes.Unavailable, "away")
	}
	// As the service does: an Event per restart id, however often it is re-sent.
	if id := req.GetRestart().GetId(); id != "" && (len(s.restarts) == 0 || s.restarts[len(s.restarts)-1] != id) {
		s.restarts = append(s.restarts, id)
	}
	s.last = req.GetStatus()
	s.reports = append(s.reports, req)
	s.numbers = append(s.numbers, [2]uint64{req.GetIncarnation(), req.GetSequence()})
	if id := req.GetRestart().GetId(); id != "" && s.queueFirst {
		if s.seen == nil {
			s.seen = map[string]int{}
		}
		s.seen[id]++
		return &dkcv1.ReportStatusResponse{RestartQueued: s.seen[id] == 1}, nil
	}
	return &dkcv1.ReportStatusResponse{}, nil
}

// TestQueuedRestartIsConfirmedOnTheSameStream: a restart the service acknowledged as queued is sent again
// ConfirmAfter later, without a reconnect; acknowledged as recorded then, it is carried no more.
func TestQueuedRestartIsConfirmedOnTheSameStream(t *testing.T) {
	svc := &awayService{queueFirst: true}
	clk := clocktesting.NewFakeClock(time.Now())
	c := startReporter(t, svc, withClock(clk))
	c.Report(&dkcv1.NodeConfigStatus{}, "", nil, nil, &dkcv1.KubeletRestart{Id: "r1"})
	seen := func() int { svc.mu.Lock(); defer svc.mu.Unlock(); return svc.seen["r1"] }
	poll.Until(t, "the restart's first report", func() bool { return seen() == 1 })
	poll.Until(t, "the restart parked", func() bool { _, ok := c.outbox.NextConfirm(); return ok })
	poll.Stepping(t, "the restart confirmed", clk, outbox.ConfirmAfter/10, func() bool { return seen() == 2 })
	poll.Until(t, "the restart no longer carried", func() bool {
		_, parked := c.outbox.NextConfirm()
		return !parked && !c.outbox.Pending()
	})
	clk.Step(outbox.ParkedRestartTTL)
	c.outbox.Reconnected()
	c.poke()
	poll.Until(t, "the report re-sent after a reconnect", func() bool { svc.mu.Lock(); defer svc.mu.Unlock(); return len(svc.reports) == 3 })
	svc.mu.Lock()
	defer svc.mu.Unlock()
	if r := svc.reports[2].GetRestart(); r != nil {
		t.Errorf("a restart acknowledged as recorded rode again after a reconnect: %v", r)
	}
}

// TestRestartsAreDeliveredInOrder: restarts reported while the service is away are each delivered once
// it is back, oldest first (each is an Event), up to outbox.MaxPendingRestarts, and the latest status wins.
func TestRestartsAreDeliveredInOrder(t *testing.T) {
	for _, tc := range []struct {
		name     string
		restarts int
		want     int // delivered: the last ones
	}{
		{"to a config and back to last-known-good", 2, 2},
		{"beyond the bound", outbox.MaxPendingRestarts + 5, outbox.MaxPendingRestarts},
	} {
		t.Run(tc.name, func(t *testing.T) {
			svc := &awayService{away: true}
			c := startReporter(t, svc)
			var ids []string
			var final *dkcv1.NodeConfigStatus
			for i := range tc.restarts {
				id := fmt.Sprintf("r%d", i)
				ids = append(ids, id)
				final = &dkcv1.NodeConfigStatus{Error: id}
				c.Report(final, "", nil, nil, &dkcv1.KubeletRestart{Id: id})
			}
			poll.Until(t, "a few refused attempts", func() bool { svc.mu.Lock(); defer svc.mu.Unlock(); return svc.refused >= 3 })
			svc.mu.Lock()
			svc.away = false
			svc.mu.Unlock()

			want := ids[len(ids)-tc.want:]
			poll.UntilNil(t, fmt.Sprintf("restarts %v delivered, and the last status %v", want, final), func() error {
				svc.mu.Lock()
				got, last := append([]string(nil), svc.restarts...), svc.last
				svc.mu.Unlock()
				if len(got) < len(want) || !proto.Equal(last, final) {
					return fmt.Errorf("delivered restarts %v and last status %v", got, last)
				}
				if fmt.Sprint(got) != fmt.Sprint(want) {
					t.Fatalf("delivered restarts %v, want %v", got, want)
				}
				return nil
			})
		})
	}
}

// startReporter serves svc in memory and runs a Client's reporter against it until the test ends.
func startReporter(t *testing.T, svc *awayService, opts ...Option) *Client {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	s := grpc.NewServer()
	dkcv1.RegisterConfigServiceServer(s, svc)
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)
	conn, err := grpc.NewClient("passthrough:///bufnet", grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
		return lis.DialContext(ctx)
	}), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	token := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(token, []byte("t"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := New(conn, Config{Node: "n1", TokenFile: token, Backoff: Backoff{Initial: 5 * time.Millisecond, Max: 20 * time.Millisecond}}, opts...)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = c.RunReporter(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return c
}

// TestReportsAreNumbered: every new status gets the next sequence number of the sidecar's incarnation,
// which the service orders reports by (not the node's clock); a status re-sent (while a second restart
// rides on it) keeps its number.
func TestReportsAreNumbered(t *testing.T) {
	svc := &awayService{}
	c := startReporter(t, svc, WithIncarnation(7))
	wait := func(n int) (got [][2]uint64) {
		t.Helper()
		poll.UntilNil(t, fmt.Sprintf("%d reports acknowledged", n), func() error {
			svc.mu.Lock()
			got = append([][2]uint64(nil), svc.numbers...)
			svc.mu.Unlock()
			if len(got) < n {
				return fmt.Errorf("%d acknowledged", len(got))
			}
			return nil
		})
		return got
	}
	c.Report(&dkcv1.NodeConfigStatus{Error: "a"}, "", nil, nil, nil)
	wait(1)
	c.Report(&dkcv1.NodeConfigStatus{Error: "b"}, "", nil, nil, nil)
	wait(2)
	// Two restarts on one status: the status is sent twice (one restart each), with one number.
	svc.mu.Lock()
	svc.away = true
	svc.mu.Unlock()
	c.Report(&dkcv1.NodeConfigStatus{Error: "c"}, "", nil, nil, &dkcv1.KubeletRestart{Id: "r1"})
	c.Report(&dkcv1.NodeConfigStatus{Error: "c"}, "", nil, nil, &dkcv1.KubeletRestart{Id: "r2"})
	svc.mu.Lock()
	svc.away = false
	svc.mu.Unlock()
	got := wait(4)
	want := [][2]uint64{{7, 1}, {7, 2}, {7, 4}, {7, 4}}
	if fmt.Sprint(got[:4]) != fmt.Sprint(want) {
		t.Errorf("(incarnation, sequence) of the acknowledged reports = %v, want %v", got[:4], want)
	}
}

// TestReconnectsAfterADrainSpread: when the service ends streams with Unavailable, the nodes of that replica
// reconnect spread over Backoff.Spread, not all within the first backoff step (a stampede on the other
// replica's TokenReviews); and never later than Spread.
func TestReconnectsAfterADrainSpread(t *testing.T) {
	b := Backoff{Initial: 250 * time.Millisecond, Max: 3 * time.Second, Spread: 3 * time.Second}
	const nodes = 2000
	buckets := make([]int, 6) // half-second buckets over [0, 3s)
	for range nodes {
		d := b.spread()
		if d < b.Initial || d >= b.Spread {
			t.Fatalf("spread delay %v outside [%v, %v)", d, b.Initial, b.Spread)
		}
		buckets[d/(500*time.Millisecond)]++
	}
	// Uniform over [0.25s, 3s): each full half-second bucket gets about 2000/5.5 ≈ 364; a stampede would put
	// them all in the first.
	for i, n := range buckets[1:] {
		if n < 250 {
			t.Errorf("bucket %d (%v–%v) got %d of %d reconnects, want about 364: %v", i+1,
				time.Duration(i+1)*500*time.Millisecond, time.Duration(i+2)*500*time.Millisecond, n, nodes, buckets)
		}
	}
	if d := (Backoff{Initial: 250 * time.Millisecond}).spread(); d >= DefaultSpread {
		t.Errorf("default spread gave %v, want below %v", d, DefaultSpread)
	}
}

// TestReportsNameTheNodeObjectTheyWereMadeFor: a report names the Node object the agent followed when it was
// made; re-sent after a reconnect it still names that one, not the object followed since (the service drops
// it if that Node was deleted and registered again, instead of showing the old object's status on the new
// one). Each watch names the object followed last.
func TestReportsNameTheNodeObjectTheyWereMadeFor(t *testing.T) {
	svc := &awayService{}
	c := startReporter(t, svc)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		_ = c.Watch(ctx, func() *dkcv1.AppliedConfig { return &dkcv1.AppliedConfig{} }, make(chan *dkcv1.WatchConfigResponse, 1))
		close(done)
	}()
	t.Cleanup(func() { cancel(); <-done })
	// waitFor waits until the service has acknowledged reports and seen watches that satisfy ok.
	waitFor := func(what string, ok func(reports []*dkcv1.ReportStatusRequest, watches []*dkcv1.WatchConfigRequest) bool) {
		t.Helper()
		poll.UntilNil(t, what, func() error {
			svc.mu.Lock()
			reports, watches := append([]*dkcv1.ReportStatusRequest(nil), svc.reports...), append([]*dkcv1.WatchConfigRequest(nil), svc.watches...)
			svc.mu.Unlock()
			if !ok(reports, watches) {
				return fmt.Errorf("reports %v, watches %v", reports, watches)
			}
			return nil
		})
	}
	count := func(reports []*dkcv1.ReportStatusRequest, errText, uid string) (n int) {
		for _, r := range reports {
			if r.GetStatus().GetError() == errText && r.GetNodeUid() == uid {
				n++
			}
		}
		return n
	}
	c.Follow("uid-a")
	c.Report(&dkcv1.NodeConfigStatus{Error: "x"}, "", nil, nil, nil)
	waitFor("report x about uid-a", func(r []*dkcv1.ReportStatusRequest, _ []*dkcv1.WatchConfigRequest) bool {
		return count(r, "x", "uid-a") > 0
	})
	c.Follow("uid-b")
	waitFor("x re-sent after reconnects, and a watch naming uid-b", func(r []*dkcv1.ReportStatusRequest, w []*dkcv1.WatchConfigRequest) bool {
		return count(r, "x", "uid-a") >= 3 && len(w) > 0 && w[len(w)-1].GetNodeUid() == "uid-b"
	})
	c.Report(&dkcv1.NodeConfigStatus{Error: "y"}, "", nil, nil, nil)
	waitFor("report y about uid-b", func(r []*dkcv1.ReportStatusRequest, _ []*dkcv1.WatchConfigRequest) bool {
		return count(r, "y", "uid-b") > 0
	})
	svc.mu.Lock()
	defer svc.mu.Unlock()
	for _, r := range svc.reports {
		if r.GetStatus().GetError() == "x" && r.GetNodeUid() != "uid-a" {
			t.Errorf("report x (made while following uid-a) sent naming %q", r.GetNodeUid())
		}
	}
}

// TestSameStatusAboutAnotherObjectIsSent: a report made while an equal status about the previous Node object
// is on its way (a Node registered again with the same config) is sent after that one's acknowledgement, not
// taken as delivered by it: the service drops the first, and the new Node would get no status.
func TestSameStatusAboutAnotherObjectIsSent(t *testing.T) {
	svc := newSlowService("uid-a")
	c := startReporter(t, svc)
	c.Follow("uid-a")
	c.Report(&dkcv1.NodeConfigStatus{Error: "x"}, "", nil, nil, nil)
	poll.Until(t, "the report about uid-a to be on its way", func() bool {
		select {
		case <-svc.slow:
			return true
		default:
			return false
		}
	})
	c.Follow("uid-b")
	c.Report(&dkcv1.NodeConfigStatus{Error: "x"}, "", nil, nil, nil)
	close(svc.release)
	poll.UntilNil(t, "reports acknowledged naming uid-a, then uid-b", func() error {
		svc.mu.Lock()
		var uids []string
		for _, r := range svc.reports {
			uids = append(uids, r.GetNodeUid())
		}
		svc.mu.Unlock()
		if len(uids) != 2 || uids[0] != "uid-a" || uids[1] != "uid-b" {
			return fmt.Errorf("acknowledged naming %v", uids)
		}
		return nil
	})
}

// drainService sends each stream's script, then ends the first stream and holds the next ones open.
type drainService struct {
	dkcv1.UnimplementedConfigServiceServer
	script  []*dkcv1.WatchConfigResponse
	mu      sync.Mutex
	watches []*dkcv1.WatchConfigRequest
}

func (s *drainService) WatchConfig(req *dkcv1.WatchConfigRequest, stream dkcv1.ConfigService_WatchConfigServer) error {
	s.mu.Lock()
	s.watches = append(s.watches, req)
	first := len(s.watches) == 1
	s.mu.Unlock()
	if err := stream.SendHeader(nil); err != nil {
		return err
	}
	if !first {
		<-stream.Context().Done()
		return nil
	}
	for _, r := range s.script {
		if err := stream.Send(r); err != nil {
			return err
		}
	}
	return status.Error(codes.Aborted, "ended by the test")
}

// TestDrainedIsKeptAndResumed: an update that replaces one the agent has not taken yet keeps that one's
// assignment and carries the newer drained, capacity and drift repair (the service's word on the node now),
// and a resumed stream tells the service the drained, capacity and drift repair id last received, so that it
// sends the node's state again if they differ.
func TestDrainedIsKeptAndResumed(t *testing.T) {
	a := &dkcv1.Assignment{Source: &dkcv1.NodeConfigSource{ConfigMap: &dkcv1.ConfigMapNodeConfigSource{
		Namespace: "kube-system", Name: "c", Uid: "u", ResourceVersion: "1", KubeletConfigKey: "kubelet"}}, ContentHash: "h"}
	svc := &drainService{script: []*dkcv1.WatchConfigResponse{
		{Assignment: a},
		{SyncError: "failed to sync: e", Drained: true, NodeCapacity: map[string]string{"pods": "110"},
			DriftRepair: &dkcv1.DriftRepair{Id: "2026-01-02T03:04:05.000000006Z", Cause: "WiringRemoved"}},
	}}
	lis := bufconn.Listen(1 << 20)
	s := grpc.NewServer()
	dkcv1.RegisterConfigServiceServer(s, svc)
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)
	conn, err := grpc.NewClient("passthrough:///bufnet", grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
		return lis.DialContext(ctx)
	}), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	token := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(token, []byte("t"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := New(conn, Config{Node: "n1", TokenFile: token, Backoff: Backoff{Initial: time.Millisecond, Max: time.Millisecond,
		Spread: time.Millisecond}})
	updates := make(chan *dkcv1.WatchConfigResponse, 1) // never read before the resume: the two coalesce
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = c.Watch(ctx, func() *dkcv1.AppliedConfig { return nil }, updates); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	var resumed *dkcv1.WatchConfigRequest
	poll.UntilNil(t, "the stream resumed", func() error {
		svc.mu.Lock()
		defer svc.mu.Unlock()
		if len(svc.watches) < 2 {
			return fmt.Errorf("%d watches", len(svc.watches))
		}
		resumed = svc.watches[1]
		return nil
	})
	if svc.watches[0].GetDrained() || svc.watches[0].GetDriftRepairId() != "" {
		t.Error("the first watch says drained or a drift repair: nothing was received yet")
	}
	if got := resumed.GetDriftRepairId(); got != "2026-01-02T03:04:05.000000006Z" {
		t.Errorf("the resumed watch says drift repair %q, not the last received", got)
	}
	if !resumed.GetDrained() {
		t.Error("the resumed watch does not say drained, the last drained received")
	}
	if got := resumed.GetNodeCapacity(); got["pods"] != "110" || len(got) != 1 || !resumed.GetFollowsNodeCapacity() {
		t.Errorf("the resumed watch says capacity %v, not the last received", got)
	}
	u := <-updates
	if !proto.Equal(u.GetAssignment(), a) || !u.GetDrained() || u.GetSyncError() != "failed to sync: e" ||
		u.GetNodeCapacity()["pods"] != "110" || u.GetDriftRepair().GetCause() != "WiringRemoved" {
		t.Errorf("coalesced update %v, want the first's assignment with the second's sync error, drained, capacity "+
			"and drift repair", u)
	}
}
