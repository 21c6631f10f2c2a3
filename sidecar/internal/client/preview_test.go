// SPDX-License-Identifier: Apache-2.0

package client

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/dkc-dev/dkc/internal/nodeconfig"
	"github.com/dkc-dev/dkc/internal/poll"
	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
)

// serve serves svc in memory and returns a Client of node n1 connected to it.
func serve(t *testing.T, svc dkcv1.ConfigServiceServer) *Client {
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
	return New(conn, Config{Node: "n1", TokenFile: token, Backoff: Backoff{Initial: time.Millisecond, Max: time.Millisecond,
		Spread: time.Millisecond}})
}

// TestPreviewReachesTheAgent: the preview of the service's message reaches the agent; an update that
// replaces one the agent has not taken yet carries the newer message's preview (none, if it has none: the
// preview no longer stands), with the older one's assignment.
func TestPreviewReachesTheAgent(t *testing.T) {
	a := &dkcv1.Assignment{Source: &dkcv1.NodeConfigSource{ConfigMap: &dkcv1.ConfigMapNodeConfigSource{
		Namespace: "kube-system", Name: "c", Uid: "u", ResourceVersion: "1", KubeletConfigKey: "kubelet"}}, ContentHash: "h"}
	preview := func(rev string) *dkcv1.Preview {
		return &dkcv1.Preview{Pool: "pool-a", Revision: rev, RequestTime: timestamppb.New(time.Unix(1000, 0)), Assignment: a}
	}
	for _, tc := range []struct {
		name   string
		script []*dkcv1.WatchConfigResponse
		want   *dkcv1.Preview
	}{
		{name: "one message", script: []*dkcv1.WatchConfigResponse{{Assignment: a, Preview: preview("r1")}},
			want: preview("r1")},
		{name: "a newer preview replaces one not taken",
			script: []*dkcv1.WatchConfigResponse{{Assignment: a, Preview: preview("r1")}, {SyncError: "e", Preview: preview("r2")}},
			want:   preview("r2")},
		{name: "a message without a preview withdraws one not taken",
			script: []*dkcv1.WatchConfigResponse{{Assignment: a, Preview: preview("r1")}, {SyncError: "e"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			svc := &drainService{script: tc.script}
			c := serve(t, svc)
			updates := make(chan *dkcv1.WatchConfigResponse, 1) // not read before the stream ends: the messages coalesce
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { _ = c.Watch(ctx, func() *dkcv1.AppliedConfig { return nil }, updates); close(done) }()
			t.Cleanup(func() { cancel(); <-done })
			poll.Until(t, "the stream resumed", func() bool { svc.mu.Lock(); defer svc.mu.Unlock(); return len(svc.watches) >= 2 })
			u := <-updates
			if !proto.Equal(u.GetPreview(), tc.want) || !proto.Equal(u.GetAssignment(), a) {
				t.Errorf("update with preview %v and assignment %v; want preview %v and the first message's assignment",
					u.GetPreview(), u.GetAssignment(), tc.want)
			}
		})
	}
}

// TestPreviewAndDriftRideOnReports: the agent's answer to a preview and the drift it found are part of the
// status reported with them: every report of that status carries them, re-sent after reconnects too; a
// status without them (the preview withdrawn, the drift gone) is a new status, with a new number, and
// carries none.
func TestPreviewAndDriftRideOnReports(t *testing.T) {
	svc := &awayService{}
	c := startReporter(t, svc)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		_ = c.Watch(ctx, func() *dkcv1.AppliedConfig { return &dkcv1.AppliedConfig{} }, make(chan *dkcv1.WatchConfigResponse, 1))
		close(done)
	}()
	t.Cleanup(func() { cancel(); <-done })
	reports := func() []*dkcv1.ReportStatusRequest {
		svc.mu.Lock()
		defer svc.mu.Unlock()
		return append([]*dkcv1.ReportStatusRequest(nil), svc.reports...)
	}
	answer := &dkcv1.PreviewResult{Pool: "pool-a", Revision: "r1", RequestTime: timestamppb.New(time.Unix(1000, 0)),
		Verdict: nodeconfig.PreviewPodsAffected, Message: "web/p2: pod 3 of 2 allowed (OutOfpods)"}
	drift := &dkcv1.Drift{Cause: "FlagOverride", Fields: []string{"maxPods"}, Message: "maxPods: expected 110, running 50",
		DetectedTime: timestamppb.New(time.Unix(900, 0))}
	c.Report(&dkcv1.NodeConfigStatus{}, "", answer, drift, nil)
	poll.UntilNil(t, "the report with the answer sent again after reconnects", func() error {
		if r := reports(); len(r) < 3 {
			return fmt.Errorf("%d reports", len(r))
		}
		return nil
	})
	sent := reports()
	for _, r := range sent {
		if !proto.Equal(r.GetPreview(), answer) || !proto.Equal(r.GetDrift(), drift) ||
			r.GetSequence() != sent[0].GetSequence() {
			t.Errorf("report #%d carries preview %v and drift %v, want %v and %v with the status's number %d",
				r.GetSequence(), r.GetPreview(), r.GetDrift(), answer, drift, sent[0].GetSequence())
		}
	}
	c.Report(&dkcv1.NodeConfigStatus{}, "", nil, nil, nil)
	poll.UntilNil(t, "a report of the status without a preview", func() error {
		r := reports()
		if last := r[len(r)-1]; last.GetSequence() <= sent[0].GetSequence() {
			return fmt.Errorf("last report #%d", last.GetSequence())
		}
		return nil
	})
	for _, r := range reports() {
		if r.GetSequence() > sent[0].GetSequence() && (r.GetPreview() != nil || r.GetDrift() != nil) {
			t.Errorf("report #%d, made after the preview was withdrawn and the drift went, carries %v and %v",
				r.GetSequence(), r.GetPreview(), r.GetDrift())
		}
	}
}
