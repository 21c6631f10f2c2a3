// SPDX-License-Identifier: Apache-2.0

package rpc

import (
	"context"
	"errors"
	"maps"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
	"github.com/dkc-dev/dkc/services/internal/assignment"
	"github.com/dkc-dev/dkc/services/internal/auth"
	"github.com/dkc-dev/dkc/services/internal/nodestatus"
)

type recordingWriter struct {
	mu      sync.Mutex
	reports []*dkcv1.ReportStatusRequest
	receipt nodestatus.Receipt // what Report answers
}

func (r *recordingWriter) Report(_ context.Context, _ string, req *dkcv1.ReportStatusRequest) (nodestatus.Receipt, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reports = append(r.reports, req)
	return r.receipt, nil
}

// start serves the service in memory; every call acts as node "n1".
func start(t *testing.T, table *assignment.Table, w StatusWriter) dkcv1.ConfigServiceClient {
	t.Helper()
	return dial(t, serve(t, New(Config{Table: table, Status: w})))
}

// nodeKey is test metadata naming the node a call acts for (default "n1"), in place of a token.
const nodeKey = "x-test-node"

func asNode(node string, ctx context.Context) context.Context {
	return metadata.AppendToOutgoingContext(ctx, nodeKey, node)
}

// serve serves svc in memory with the server options it needs; a call acts as the node its nodeKey
// metadata names.
func serve(t testing.TB, svc *Service, opts ...grpc.ServerOption) *bufconn.Listener {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	identity := func(ctx context.Context) context.Context {
		node := "n1"
		if v := metadata.ValueFromIncomingContext(ctx, nodeKey); len(v) > 0 {
			node = v[0]
		}
		return auth.WithIdentity(ctx, auth.Identity{Node: node, ServiceAccount: "kube-system/dkc-sidecar"})
	}
	opts = append(opts, ServerOptions()...)
	opts = append(opts,
		grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			return h(identity(ctx), req)
		}),
		grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			return h(srv, &ctxStream{ServerStream: ss, ctx: identity(ss.Context())})
		}))
	s := grpc.NewServer(opts...)
	dkcv1.RegisterConfigServiceServer(s, svc)
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)
	return lis
}

// dial opens a new connection to lis.
func dial(t testing.TB, lis *bufconn.Listener, opts ...grpc.DialOption) dkcv1.ConfigServiceClient {
	t.Helper()
	opts = append([]grpc.DialOption{grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
		return lis.DialContext(ctx)
	}), grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)
	conn, err := grpc.NewClient("passthrough:///bufnet", opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return dkcv1.NewConfigServiceClient(conn)
}

type ctxStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *ctxStream) Context() context.Context { return s.ctx }

func assign(rv string) *dkcv1.Assignment {
	return &dkcv1.Assignment{
		Source:      &dkcv1.NodeConfigSource{ConfigMap: &dkcv1.ConfigMapNodeConfigSource{Namespace: "ns", Name: "c", Uid: "u", ResourceVersion: rv, KubeletConfigKey: "kubelet"}},
		ContentHash: "h" + rv,
	}
}

func recv(t *testing.T, stream dkcv1.ConfigService_WatchConfigClient) *dkcv1.WatchConfigResponse {
	t.Helper()
	m, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestWatchConfig(t *testing.T) {
	table := assignment.NewTable(nil)
	client := start(t, table, &recordingWriter{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	table.Set("n1", assignment.State{Assignment: assign("1")})
	stream, err := client.WatchConfig(ctx, &dkcv1.WatchConfigRequest{NodeName: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	if m := recv(t, stream); m.GetAssignment().GetContentHash() != "h1" {
		t.Fatalf("first message = %v", m)
	}
	// Several changes while the node is not reading arrive as the latest one.
	table.Set("n1", assignment.State{Assignment: assign("2")})
	table.SetSyncError("n1", assignment.Facts{}, "failed to sync: x")
	if m := recv(t, stream); m.GetAssignment().GetContentHash() != "h2" {
		t.Fatalf("second message = %v", m)
	}
	// The sync error may come with it or right after; the stream ends on the latest state.
	table.SetSyncError("n1", assignment.Facts{}, "")
	table.Set("n1", assignment.State{Assignment: assign("3")})
	for {
		m := recv(t, stream)
		if m.GetAssignment().GetContentHash() == "h3" && m.GetSyncError() == "" {
			break
		}
	}

	// Resuming with what the node has: silence until something changes.
	resumed, err := client.WatchConfig(ctx, &dkcv1.WatchConfigRequest{NodeName: "n1", LastApplied: &dkcv1.AppliedConfig{
		Source: assign("3").GetSource(), ContentHash: "h3"}})
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *dkcv1.WatchConfigResponse, 1)
	go func() {
		if m, err := resumed.Recv(); err == nil {
			got <- m
		}
	}()
	select {
	case m := <-got:
		t.Fatalf("resumed stream re-delivered %v", m)
	case <-time.After(300 * time.Millisecond): // proves a negative: nothing is sent meanwhile
	}
	table.Set("n1", assignment.State{Assignment: assign("4")})
	select {
	case m := <-got:
		if m.GetAssignment().GetContentHash() != "h4" {
			t.Fatalf("resumed stream got %v", m)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("resumed stream missed a change")
	}
}

// TestResumeReconcilesTheSyncError: a node resuming its stream says which sync error it holds and which Node
// object its state came from and its kubelet version; the service tells it when its own differs (an error
// cleared or new while the node was away, the Node deleted and registered again, its kubelet upgraded),
// with the assignment unchanged.
func TestResumeReconcilesTheSyncError(t *testing.T) {
	const download = "failed to sync: failed to download config, see Kubelet log for details"
	for _, tc := range []struct {
		name          string
		nodeHolds     string // the request's sync_error
		serviceHas    string // the table's sync error
		wantSyncError string
		wantNoMessage bool
		nodeUID       string            // the request's node_uid
		serviceUID    string            // the table's NodeUID
		follows       bool              // the request's follows_node_uid
		nodeKubelet   string            // the request's kubelet_version
		kubelet       string            // the table's KubeletVersion
		nodeDrained   bool              // the request's drained
		drained       bool              // the table's Drained
		nodeCapacity  map[string]string // the request's node_capacity
		oldSidecar    bool              // the request does not set follows_node_capacity
		capacity      map[string]string // the table's NodeCapacity
		preview       bool              // the table has a pool's preview for the node
	}{
		{name: "cleared while away", nodeHolds: download, serviceHas: "", wantSyncError: ""},
		{name: "appeared while away", nodeHolds: "", serviceHas: download, wantSyncError: download},
		{name: "same error", nodeHolds: download, serviceHas: download, wantNoMessage: true},
		{name: "no error either side", wantNoMessage: true},
		{name: "node registered again while away", nodeUID: "uid-1", serviceUID: "uid-2"},
		{name: "same node object", nodeUID: "uid-1", serviceUID: "uid-1", wantNoMessage: true},
		{name: "sidecar knows no node object", serviceUID: "uid-2", follows: true},
		{name: "older sidecar, which names none", serviceUID: "uid-2", wantNoMessage: true},
		{name: "kubelet upgraded while away", nodeKubelet: "v1.36.3", kubelet: "v1.37.2"},
		{name: "sidecar knows no kubelet version", kubelet: "v1.37.2"},
		{name: "same kubelet version", nodeKubelet: "v1.37.2", kubelet: "v1.37.2", wantNoMessage: true},
		{name: "drained while away", drained: true},
		{name: "uncordoned while away", nodeDrained: true},
		{name: "still drained", nodeDrained: true, drained: true, wantNoMessage: true},
		{name: "capacity changed while away", nodeCapacity: map[string]string{"pods": "110"},
			capacity: map[string]string{"pods": "110", "cpu": "4"}},
		{name: "sidecar knows no capacity", capacity: map[string]string{"pods": "110"}},
		{name: "same capacity", nodeCapacity: map[string]string{"pods": "110"}, capacity: map[string]string{"pods": "110"},
			wantNoMessage: true},
		{name: "older sidecar, which follows no capacity", capacity: map[string]string{"pods": "110"}, oldSidecar: true,
			wantNoMessage: true},
		// The sidecar does not say which preview it has: one that stands is sent on every new stream.
		{name: "a preview stands", preview: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			table := assignment.NewTable(nil)
			client := start(t, table, &recordingWriter{})
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			var preview *dkcv1.Preview
			if tc.preview {
				preview = &dkcv1.Preview{Pool: "blue", Revision: "abc", RequestTime: timestamppb.Now(), Assignment: assign("2")}
			}
			table.Set("n1", assignment.State{Assignment: assign("1"), Drained: tc.drained, SyncError: tc.serviceHas,
				NodeUID: tc.serviceUID, KubeletVersion: tc.kubelet, NodeCapacity: tc.capacity, Preview: preview})
			stream, err := client.WatchConfig(ctx, &dkcv1.WatchConfigRequest{NodeName: "n1", SyncError: tc.nodeHolds, NodeUid: tc.nodeUID, FollowsNodeUid: tc.follows,
				KubeletVersion: tc.nodeKubelet, Drained: tc.nodeDrained, NodeCapacity: tc.nodeCapacity,
				FollowsNodeCapacity: !tc.oldSidecar,
				LastApplied:         &dkcv1.AppliedConfig{Source: assign("1").GetSource(), ContentHash: "h1"}})
			if err != nil {
				t.Fatal(err)
			}
			// Headers come at once, also when there is nothing to send: the sidecar takes them as "this
			// replica has my stream" and sends its last report again, which the replica may have dropped
			// (queued before the stream was registered) — without them a resumed node's status was lost.
			if _, err := stream.Header(); err != nil || ctx.Err() != nil {
				t.Fatalf("no headers on the resumed stream before it ended: %v", errors.Join(err, ctx.Err()))
			}
			got := make(chan *dkcv1.WatchConfigResponse, 1)
			go func() {
				if m, err := stream.Recv(); err == nil {
					got <- m
				}
			}()
			wait := 5 * time.Second
			if tc.wantNoMessage {
				wait = 500 * time.Millisecond // proves a negative: nothing is sent meanwhile
			}
			select {
			case m := <-got:
				if tc.wantNoMessage {
					t.Fatalf("resumed stream sent %v; the node already has it", m)
				}
				if m.GetSyncError() != tc.wantSyncError || m.GetAssignment().GetContentHash() != "h1" || m.GetNodeUid() != tc.serviceUID ||
					m.GetKubeletVersion() != tc.kubelet || m.GetDrained() != tc.drained ||
					!maps.Equal(m.GetNodeCapacity(), tc.capacity) || !proto.Equal(m.GetPreview(), preview) {
					t.Fatalf("resumed stream sent sync error %q, assignment %q, node %q, kubelet %q, capacity %v; want %q, h1, %q, %q, %v",
						m.GetSyncError(), m.GetAssignment().GetContentHash(), m.GetNodeUid(), m.GetKubeletVersion(),
						m.GetNodeCapacity(), tc.wantSyncError, tc.serviceUID, tc.kubelet, tc.capacity)
				}
			case <-time.After(wait):
				if !tc.wantNoMessage {
					t.Fatalf("resumed stream sent nothing; the node holds sync error %q and node %q, the service has %q and %q",
						tc.nodeHolds, tc.nodeUID, tc.serviceHas, tc.serviceUID)
				}
			}
		})
	}
}

func TestWatchConfigOtherNodeDenied(t *testing.T) {
	client := start(t, assignment.NewTable(nil), &recordingWriter{})
	// An authorised stream never ends by itself: without a deadline, a lost authorisation check would
	// hang here until the test binary's timeout instead of failing.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	stream, err := client.WatchConfig(ctx, &dkcv1.WatchConfigRequest{NodeName: "n2"})
	if err == nil {
		_, err = stream.Recv()
	}
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("watch for another node: %v", err)
	}
}

func TestReportStatus(t *testing.T) {
	w := &recordingWriter{}
	client := start(t, assignment.NewTable(nil), w)
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		req  *dkcv1.ReportStatusRequest
		code codes.Code
	}{
		{"ok", &dkcv1.ReportStatusRequest{NodeName: "n1", Status: &dkcv1.NodeConfigStatus{}}, codes.OK},
		{"other node", &dkcv1.ReportStatusRequest{NodeName: "n2", Status: &dkcv1.NodeConfigStatus{}}, codes.PermissionDenied},
		{"no node", &dkcv1.ReportStatusRequest{Status: &dkcv1.NodeConfigStatus{}}, codes.InvalidArgument},
		{"no status", &dkcv1.ReportStatusRequest{NodeName: "n1"}, codes.InvalidArgument},
		{"bad restart id", &dkcv1.ReportStatusRequest{NodeName: "n1", Status: &dkcv1.NodeConfigStatus{}, Restart: &dkcv1.KubeletRestart{Id: "../x"}}, codes.InvalidArgument},
	} {
		_, err := client.ReportStatus(ctx, tc.req)
		if status.Code(err) != tc.code {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.code)
		}
	}
	if len(w.reports) != 1 {
		t.Errorf("writer got %d reports, want 1", len(w.reports))
	}
}

// TestReportStatusRestartQueued: the acknowledgement says whether the report's restart Event was queued
// rather than created, which is what makes the sidecar keep the restart for its next stream.
func TestReportStatusRestartQueued(t *testing.T) {
	for _, queued := range []bool{false, true} {
		w := &recordingWriter{receipt: nodestatus.Receipt{EventQueued: queued}}
		client := start(t, assignment.NewTable(nil), w)
		resp, err := client.ReportStatus(context.Background(), &dkcv1.ReportStatusRequest{NodeName: "n1", Status: &dkcv1.NodeConfigStatus{},
			Restart: &dkcv1.KubeletRestart{Id: "r1"}})
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetRestartQueued() != queued {
			t.Errorf("writer's EventQueued %v: restart_queued %v", queued, resp.GetRestartQueued())
		}
	}
}

func TestShutdownEndsStreams(t *testing.T) {
	table := assignment.NewTable(nil)
	table.Set("n1", assignment.State{Assignment: assign("1")})
	w := &recordingWriter{}
	lis := bufconn.Listen(1 << 20)
	svc := New(Config{Table: table, Status: w})
	s := grpc.NewServer(append(ServerOptions(), grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		return h(srv, &ctxStream{ServerStream: ss, ctx: auth.WithIdentity(ss.Context(), auth.Identity{Node: "n1"})})
	}))...)
	dkcv1.RegisterConfigServiceServer(s, svc)
	go func() { _ = s.Serve(lis) }()
	conn, err := grpc.NewClient("passthrough:///bufnet", grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
		return lis.DialContext(ctx)
	}), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	stream, err := dkcv1.NewConfigServiceClient(conn).WatchConfig(context.Background(), &dkcv1.WatchConfigRequest{NodeName: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	recv(t, stream)
	start := time.Now()
	svc.Shutdown()
	done := make(chan struct{})
	go func() { s.GracefulStop(); close(done) }()
	if _, err := stream.Recv(); status.Code(err) != codes.Unavailable {
		t.Fatalf("stream after shutdown: %v, want Unavailable", err)
	}
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("GracefulStop still waiting for streams")
	}
	if time.Since(start) > 2*time.Second {
		t.Errorf("shutdown took %v", time.Since(start))
	}
}
