// SPDX-License-Identifier: Apache-2.0

package rpc

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/dkc-dev/dkc/internal/nodeconfig"
	"github.com/dkc-dev/dkc/internal/payload"
	"github.com/dkc-dev/dkc/internal/poll"
	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
	"github.com/dkc-dev/dkc/services/internal/assignment"
)

// withFiles is assign(rv) carrying one file of size bytes (a real hash is not needed here).
func withFiles(rv string, size int) *dkcv1.Assignment {
	a := assign(rv)
	a.Files = map[string]string{"kubelet": strings.Repeat("x", size)}
	return a
}

// recvErr waits for the stream's end and returns its error; messages before it are skipped.
func recvErr(t *testing.T, stream dkcv1.ConfigService_WatchConfigClient) error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		for {
			if _, err := stream.Recv(); err != nil {
				done <- err
				return
			}
		}
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(5 * time.Second):
		t.Fatal("stream still open")
		return nil
	}
}

// TestNewStreamReplacesTheOld: a node has one WatchConfig stream per replica. Each new stream of the node
// ends the previous one with Aborted, so a token cannot hold many streams (each with its own buffers and
// goroutine); the newest one is served.
func TestNewStreamReplacesTheOld(t *testing.T) {
	table := assignment.NewTable(nil)
	table.Set("n1", assignment.State{Assignment: assign("1")})
	table.Set("n2", assignment.State{Assignment: assign("1")})
	reg := prometheus.NewRegistry()
	metrics := NewMetrics(reg)
	client := dial(t, serve(t, New(Config{Table: table, Status: &recordingWriter{}, Metrics: metrics})))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	other, err := client.WatchConfig(asNode("n2", ctx), &dkcv1.WatchConfigRequest{NodeName: "n2"})
	if err != nil {
		t.Fatal(err)
	}
	recv(t, other)
	var streams []dkcv1.ConfigService_WatchConfigClient
	for range 10 {
		s, err := client.WatchConfig(ctx, &dkcv1.WatchConfigRequest{NodeName: "n1"})
		if err != nil {
			t.Fatal(err)
		}
		if m := recv(t, s); m.GetAssignment().GetContentHash() != "h1" {
			t.Fatalf("new stream's first message = %v", m)
		}
		streams = append(streams, s)
	}
	for i, s := range streams[:len(streams)-1] {
		err := recvErr(t, s)
		if status.Code(err) != codes.Aborted || !strings.Contains(status.Convert(err).Message(), "replaced by a newer WatchConfig stream") {
			t.Fatalf("stream %d after a newer one opened: %v, want Aborted (replaced)", i, err)
		}
	}
	// The newest stream is served; another node's stream is untouched.
	table.Set("n1", assignment.State{Assignment: assign("2")})
	table.Set("n2", assignment.State{Assignment: assign("2")})
	if m := recv(t, streams[len(streams)-1]); m.GetAssignment().GetContentHash() != "h2" {
		t.Fatalf("newest stream got %v", m)
	}
	if m := recv(t, other); m.GetAssignment().GetContentHash() != "h2" {
		t.Fatalf("other node's stream got %v", m)
	}
	if n := testutil.ToFloat64(metrics.connectedNodes); n != 2 {
		t.Errorf("connected_nodes = %v, want 2", n)
	}
}

// handlers records what the server's WatchConfig handlers do, in the order their streams opened: how many
// messages each began to send, and whether it returned (WatchConfig let its stream go: endWatch ran).
type handlers struct {
	mu    sync.Mutex
	sends []int
	ended []bool
}

func (h *handlers) interceptor(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	h.mu.Lock()
	i := len(h.sends)
	h.sends, h.ended = append(h.sends, 0), append(h.ended, false)
	h.mu.Unlock()
	defer func() { h.mu.Lock(); h.ended[i] = true; h.mu.Unlock() }()
	return handler(srv, &countingStream{ServerStream: ss, sent: func() { h.mu.Lock(); h.sends[i]++; h.mu.Unlock() }})
}

// sending says whether the i-th stream's handler began its n-th send.
func (h *handlers) sending(i, n int) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return i < len(h.sends) && h.sends[i] >= n
}

// returned says whether the i-th stream's handler returned.
func (h *handlers) returned(i int) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return i < len(h.ended) && h.ended[i]
}

type countingStream struct {
	grpc.ServerStream
	sent func()
}

func (s *countingStream) SendMsg(m any) error { s.sent(); return s.ServerStream.SendMsg(m) }

// TestReconnectWinsOverAStuckStream: a node reconnects while its old stream is stuck in a send (a half-dead
// TCP connection: nothing is read, flow control is exhausted, keepalive has not noticed yet). The new stream
// is served at once, and the old one ending later does not unregister it.
func TestReconnectWinsOverAStuckStream(t *testing.T) {
	table := assignment.NewTable(nil)
	const big = 1 << 20 // far beyond the 64 KiB windows below: the first send fills them, the second blocks
	table.Set("n1", assignment.State{Assignment: withFiles("1", big)})
	var h handlers
	lis := serve(t, New(Config{Table: table, Status: &recordingWriter{}}), grpc.ChainStreamInterceptor(h.interceptor))
	deadCtx, killDeadConn := context.WithCancel(context.Background())
	defer killDeadConn()
	// The old connection reads nothing: fixed 64 KiB windows (no BDP growth), and no Recv.
	dead := dial(t, lis, grpc.WithInitialWindowSize(1<<16), grpc.WithInitialConnWindowSize(1<<16))
	if _, err := dead.WatchConfig(deadCtx, &dkcv1.WatchConfigRequest{NodeName: "n1"}); err != nil {
		t.Fatal(err)
	}
	// The old stream's first send takes the stream's whole write quota; its next one, of the change, blocks.
	poll.Until(t, "the old stream's handler to send the first assignment", func() bool { return h.sending(0, 1) })
	table.Set("n1", assignment.State{Assignment: withFiles("2", big)})
	poll.Until(t, "the old stream's handler to send the second assignment", func() bool { return h.sending(0, 2) })

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	fresh, err := dial(t, lis).WatchConfig(ctx, &dkcv1.WatchConfigRequest{NodeName: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	if m := recv(t, fresh); m.GetAssignment().GetContentHash() != "h2" {
		t.Fatalf("reconnected stream got %v", m)
	}
	// The stuck stream ends when its connection does; the new one stays registered and served.
	killDeadConn()
	poll.Until(t, "the stuck stream's handler to return", func() bool { return h.returned(0) })
	if h.returned(1) {
		t.Fatal("the reconnected stream ended with the stuck one")
	}
	table.Set("n1", assignment.State{Assignment: assign("3")})
	if m := recv(t, fresh); m.GetAssignment().GetContentHash() != "h3" {
		t.Fatalf("reconnected stream after the old one ended got %v", m)
	}
	// And a later reconnect replaces it as usual.
	again, err := dial(t, lis).WatchConfig(ctx, &dkcv1.WatchConfigRequest{NodeName: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	recv(t, again)
	if err := recvErr(t, fresh); status.Code(err) != codes.Aborted {
		t.Fatalf("replaced stream: %v, want Aborted", err)
	}
}

// TestAssignmentEncodedOnce: nodes on the same assignment share its encoding; each stream adds only its
// own sync error and resolved time. 2,000 nodes on a 1 MiB ConfigMap would otherwise hold 2,000 encoded
// copies while their sends are in flight.
func TestAssignmentEncodedOnce(t *testing.T) {
	const nodes = 20
	table := assignment.NewTable(nil)
	a := withFiles("1", 256<<10)
	for i := range nodes {
		table.Set(fmt.Sprintf("n%d", i), assignment.State{Assignment: a})
	}
	svc := New(Config{Table: table, Status: &recordingWriter{}})
	client := dial(t, serve(t, svc))
	// Generous: the bound only matters when a push never comes, and CI runs this under -race beside two
	// clusters (a run at 6a22c60's parent took 12.9 s to miss it, where 0.2 s is usual).
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	streams := make([]dkcv1.ConfigService_WatchConfigClient, nodes)
	var wg sync.WaitGroup
	for i := range nodes {
		node := fmt.Sprintf("n%d", i)
		s, err := client.WatchConfig(asNode(node, ctx), &dkcv1.WatchConfigRequest{NodeName: node})
		if err != nil {
			t.Fatal(err)
		}
		streams[i] = s
	}
	check := func(what string, want *dkcv1.Assignment, syncError func(i int) string) {
		t.Helper()
		for i, s := range streams {
			wg.Add(1)
			go func() {
				defer wg.Done()
				m, err := s.Recv()
				if err != nil {
					t.Errorf("%s: n%d: %v", what, i, err)
					return
				}
				st, _, _ := table.Get(fmt.Sprintf("n%d", i))
				if !proto.Equal(m.GetAssignment(), want) || m.GetSyncError() != syncError(i) ||
					!m.GetResolvedTime().AsTime().Equal(st.Changed) {
					t.Errorf("%s: n%d got assignment %q, sync error %q, resolved %v; want %q, %q, %v", what, i,
						m.GetAssignment().GetContentHash(), m.GetSyncError(), m.GetResolvedTime().AsTime(), want.GetContentHash(), syncError(i), st.Changed)
				}
			}()
		}
		wg.Wait()
	}
	check("first push", a, func(int) string { return "" })
	if n := svc.encodings.count(); n != 1 {
		t.Fatalf("%d streams on one assignment encoded it %d times, want once", nodes, n)
	}
	// Per-node fields differ, the assignment's encoding is still shared.
	for i := range nodes {
		table.SetSyncError(fmt.Sprintf("n%d", i), assignment.Facts{}, nodeconfig.StatusError(fmt.Sprintf("failed to sync: error of n%d", i)))
	}
	check("per-node sync errors", a, func(i int) string { return fmt.Sprintf("failed to sync: error of n%d", i) })
	b := withFiles("2", 256<<10)
	for i := range nodes {
		table.Set(fmt.Sprintf("n%d", i), assignment.State{Assignment: b})
	}
	check("next version", b, func(int) string { return "" })
	if n := svc.encodings.count(); n != 2 {
		t.Fatalf("two assignment versions encoded %d times, want 2", n)
	}
}

// TestOversizeAssignmentIsNotSent: an assignment larger than a node accepts is never sent (the stream would
// fail with ResourceExhausted, or the node refuse it, on every reconnect); the node gets
// nodeconfig.TooLargeError with the assignment it has, and the stream stays open.
func TestOversizeAssignmentIsNotSent(t *testing.T) {
	table := assignment.NewTable(nil)
	table.Set("n1", assignment.State{Assignment: assign("1")})
	client := start(t, table, &recordingWriter{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := client.WatchConfig(ctx, &dkcv1.WatchConfigRequest{NodeName: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	recv(t, stream)
	table.Set("n1", assignment.State{Assignment: withFiles("2", payload.MaxBytes)})
	m := recv(t, stream)
	if m.GetSyncError() != string(nodeconfig.TooLargeError(payload.MaxFiles, payload.MaxBytes>>20)) || m.GetAssignment().GetContentHash() != "h1" {
		t.Fatalf("after an oversize assignment the node got assignment %q, sync error %q; want h1, %q",
			m.GetAssignment().GetContentHash(), m.GetSyncError(), string(nodeconfig.TooLargeError(payload.MaxFiles, payload.MaxBytes>>20)))
	}
	table.Set("n1", assignment.State{Assignment: assign("3")})
	if m := recv(t, stream); m.GetSyncError() != "" || m.GetAssignment().GetContentHash() != "h3" {
		t.Fatalf("after a fitting assignment: %v", m)
	}
}

// TestCodecEncodesTheWholeMessage: the spliced encoding decodes to the message proto.Marshal would give.
func TestCodecEncodesTheWholeMessage(t *testing.T) {
	var e encodings
	at := timestamppb.New(time.Unix(1700000000, 5))
	for _, want := range []*dkcv1.WatchConfigResponse{
		{Assignment: withFiles("1", 100), SyncError: "failed to sync: x", ResolvedTime: at},
		{Assignment: withFiles("1", 100), ResolvedTime: at},
		{Assignment: &dkcv1.Assignment{}, ResolvedTime: at}, // local config: present, empty
		{SyncError: "failed to sync: y", ResolvedTime: at},  // no assignment
		{Assignment: withFiles("1", 100), ResolvedTime: at, NodeUid: "3c9f7a4e-0d1b-4f55-9a8e-1f2e3d4c5b6a"},
		// A pool's preview, its snapshot encoded once as the assignment's is.
		{Assignment: withFiles("1", 100), ResolvedTime: at, SyncError: "failed to sync: z",
			Preview: &dkcv1.Preview{Pool: "blue", Revision: "abc", RequestTime: at, Assignment: withFiles("2", 100)}},
		{ResolvedTime: at, Preview: &dkcv1.Preview{Pool: "blue", Revision: "abc", RequestTime: at, Assignment: withFiles("2", 100)}},
	} {
		r, err := e.response(assignment.State{Assignment: want.GetAssignment(), SyncError: want.GetSyncError(), Changed: want.GetResolvedTime().AsTime(), NodeUID: want.GetNodeUid(),
			Preview: want.GetPreview()})
		if err != nil {
			t.Fatal(err)
		}
		out, err := codec{}.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		got := &dkcv1.WatchConfigResponse{}
		if err := proto.Unmarshal(out.Materialize(), got); err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(got, want) {
			t.Errorf("decoded %v, want %v", got, want)
		}
	}
}

// TestPushCopiesNoPayload: once an assignment is encoded, a push of it to one more stream allocates only
// the node's own fields, not a copy of the payload.
func TestPushCopiesNoPayload(t *testing.T) {
	var e encodings
	a := withFiles("1", 1<<20)
	if _, err := e.response(assignment.State{Assignment: a, Changed: time.Now()}); err != nil {
		t.Fatal(err)
	}
	const pushes = 100
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range pushes {
		r, err := e.response(assignment.State{Assignment: a, SyncError: "failed to sync: x", Changed: time.Now()})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := (codec{}).Marshal(r); err != nil {
			t.Fatal(err)
		}
	}
	runtime.ReadMemStats(&after)
	if per := (after.TotalAlloc - before.TotalAlloc) / pushes; per > 4<<10 {
		t.Fatalf("a push of an encoded 1 MiB assignment allocates %d bytes; want its own fields only (< 4 KiB)", per)
	}
}

// BenchmarkPush is the server's cost of one push of a 1 MiB assignment to one more stream: with the
// shared encoding, and as a per-stream proto.Marshal of the whole message would cost.
func BenchmarkPush(b *testing.B) {
	a := withFiles("1", 1<<20)
	b.Run("shared", func(b *testing.B) {
		var e encodings
		if _, err := e.response(assignment.State{Assignment: a, Changed: time.Now()}); err != nil { // the one encoding, by the first stream
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			r, err := e.response(assignment.State{Assignment: a, Changed: time.Now()})
			if err != nil {
				b.Fatal(err)
			}
			if _, err := (codec{}).Marshal(r); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("marshal-per-stream", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := protoCodec.Marshal(&dkcv1.WatchConfigResponse{Assignment: a, ResolvedTime: timestamppb.Now()}); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestEncodingsFollowTheAssignments: an encoding is dropped once its assignment is garbage (no node's state
// holds it any more): the cache never keeps 1 MiB payloads of versions gone by.
func TestEncodingsFollowTheAssignments(t *testing.T) {
	var e encodings
	keep := withFiles("1", 1<<10)
	for i := range 10 {
		if _, err := e.response(assignment.State{Assignment: withFiles(fmt.Sprint(i+2), 1<<10), Changed: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.response(assignment.State{Assignment: keep, Changed: time.Now()}); err != nil {
		t.Fatal(err)
	}
	// The encodings of garbage assignments go once a collection has found them so.
	poll.Until(t, "the encodings of unreferenced assignments to go", func() bool { runtime.GC(); return e.size() <= 1 })
	if n := e.size(); n != 1 {
		t.Fatalf("%d encodings held, want 1 (the assignment still referenced)", n)
	}
	if _, err := e.response(assignment.State{Assignment: keep, Changed: time.Now()}); err != nil || e.count() != 11 {
		t.Fatalf("the live assignment was encoded again (%d encodings, %v)", e.count(), err)
	}
	runtime.KeepAlive(keep)
}

// TestServingFollowsTheNodesStream: the service serves a node exactly while the node has a stream here,
// and a replaced stream's end does not end the newer one's service.
func TestServingFollowsTheNodesStream(t *testing.T) {
	table := assignment.NewTable(nil)
	table.Set("n1", assignment.State{Assignment: assign("1")})
	svc := New(Config{Table: table, Status: &recordingWriter{}})
	if svc.Serving("n1") {
		t.Fatal("serving n1 before any stream")
	}
	first := svc.register("n1")
	second := svc.register("n1") // the node reconnected; the first stream is ended
	svc.unregister("n1", first)
	if !svc.Serving("n1") {
		t.Fatal("the replaced stream's end ended the service of the newer stream")
	}
	svc.unregister("n1", second)
	if svc.Serving("n1") {
		t.Fatal("still serving n1 after its last stream ended")
	}
}
