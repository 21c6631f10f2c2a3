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

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"

	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
)

// awayService refuses reports while away, then acknowledges and records them.
type awayService struct {
	dkcv1.UnimplementedConfigServiceServer
	mu       sync.Mutex
	away     bool
	restarts []string // acknowledged restart ids, in order, once each
	last     *dkcv1.NodeConfigStatus
}

func (s *awayService) ReportStatus(_ context.Context, req *dkcv1.ReportStatusRequest) (*dkcv1.ReportStatusResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.away {
		return nil, status.Error(codes.Unavailable, "away")
	}
	// As the service does: an Event per restart id, however often it is re-sent.
	if id := req.GetRestart().GetId(); id != "" && (len(s.restarts) == 0 || s.restarts[len(s.restarts)-1] != id) {
		s.restarts = append(s.restarts, id)
	}
	s.last = req.GetStatus()
	return &dkcv1.ReportStatusResponse{}, nil
}

// TestRestartsAreDeliveredInOrder: restarts reported while the service is away are each delivered once
// it is back, oldest first (each is an Event), up to MaxPendingRestarts, and the latest status wins.
func TestRestartsAreDeliveredInOrder(t *testing.T) {
	for _, tc := range []struct {
		name     string
		restarts int
		want     int // delivered: the last ones
	}{
		{"to a config and back to last-known-good", 2, 2},
		{"beyond the bound", MaxPendingRestarts + 5, MaxPendingRestarts},
	} {
		t.Run(tc.name, func(t *testing.T) {
			svc := &awayService{away: true}
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
			c := New(conn, "n1", token, Backoff{Initial: 5 * time.Millisecond, Max: 20 * time.Millisecond}, zap.NewNop())
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { _ = c.RunReporter(ctx); close(done) }()
			t.Cleanup(func() { cancel(); <-done })

			var ids []string
			var final *dkcv1.NodeConfigStatus
			for i := range tc.restarts {
				id := fmt.Sprintf("r%d", i)
				ids = append(ids, id)
				final = &dkcv1.NodeConfigStatus{Error: id}
				c.Report(final, "", &dkcv1.KubeletRestart{Id: id})
			}
			time.Sleep(50 * time.Millisecond) // a few refused attempts
			svc.mu.Lock()
			svc.away = false
			svc.mu.Unlock()

			want := ids[len(ids)-tc.want:]
			deadline := time.Now().Add(5 * time.Second)
			for {
				svc.mu.Lock()
				got, last := append([]string(nil), svc.restarts...), svc.last
				svc.mu.Unlock()
				if len(got) >= len(want) && proto.Equal(last, final) {
					if fmt.Sprint(got) != fmt.Sprint(want) {
						t.Fatalf("delivered restarts %v, want %v", got, want)
					}
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("delivered restarts %v and last status %v; want %v and %v", got, last, want, final)
				}
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
}
