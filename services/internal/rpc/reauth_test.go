// SPDX-License-Identifier: Apache-2.0

package rpc

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	grpcauth "github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/auth"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	authenticationv1 "k8s.io/api/authentication/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/dkc-dev/dkc/internal/poll"
	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
	"github.com/dkc-dev/dkc/services/internal/assignment"
	"github.com/dkc-dev/dkc/services/internal/auth"
)

// apiserver is a fake TokenReview backend: token -> node of the tokens it accepts, or down.
type apiserver struct {
	mu      sync.Mutex
	valid   map[string]string
	down    bool
	reviews int
}

func (a *apiserver) set(f func(*apiserver)) {
	a.mu.Lock()
	defer a.mu.Unlock()
	f(a)
}

func (a *apiserver) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.reviews
}

func (a *apiserver) clientset() *fake.Clientset {
	cs := fake.NewClientset()
	cs.PrependReactor("create", "tokenreviews", func(act k8stesting.Action) (bool, runtime.Object, error) {
		tr := act.(k8stesting.CreateAction).GetObject().(*authenticationv1.TokenReview).DeepCopy()
		a.mu.Lock()
		defer a.mu.Unlock()
		a.reviews++
		if a.down {
			return true, nil, errors.New("dial tcp 10.0.0.1:6443: connect: connection refused")
		}
		if node, ok := a.valid[tr.Spec.Token]; ok {
			tr.Status = authenticationv1.TokenReviewStatus{Authenticated: true, Audiences: []string{auth.Audience},
				User: authenticationv1.UserInfo{Username: "system:serviceaccount:kube-system:dkc-sidecar",
					Extra: map[string]authenticationv1.ExtraValue{auth.NodeNameExtra: {node}}}}
		} else {
			tr.Status = authenticationv1.TokenReviewStatus{Error: "pod kube-system/dkc-sidecar-x has been deleted"}
		}
		return true, tr, nil
	})
	return cs
}

// saToken is shaped like a ServiceAccount JWT (the fake apiserver decides whether it is valid).
func saToken(name string) string {
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(`{"alg":"RS256"}`)) + "." + enc([]byte(`{"iss":"k8s","sub":"`+name+`"}`)) + "." + enc([]byte("sig"))
}

// waitTimer waits until the stream's loop has scheduled its next check on the fake clock.
func waitTimer(t *testing.T, clk *clocktesting.FakeClock) {
	t.Helper()
	poll.Until(t, "the stream's next token check to be scheduled", clk.HasWaiters)
}

// TestStreamsCheckTheirTokenAgain: with a fake clock and the real authenticator, an open WatchConfig
// stream's token is reviewed again once its cached verification lapses (once per TTL). Still valid: the
// stream is served on. The apiserver unreachable: the stream stays, served, and the check is retried. The
// token revoked, or now naming another node: the stream ends with Unauthenticated and a log line names the
// node and the reason.
func TestStreamsCheckTheirTokenAgain(t *testing.T) {
	const ttl = time.Minute
	clk := clocktesting.NewFakeClock(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
	api := &apiserver{valid: map[string]string{}}
	tokN1, tokN2 := saToken("n1"), saToken("n2")
	api.valid[tokN1], api.valid[tokN2] = "n1", "n2"
	authn := auth.New(auth.Config{Client: api.clientset(), Allowed: []string{"kube-system/dkc-sidecar"}, TTL: ttl, Clock: clk})
	core, logs := observer.New(zap.InfoLevel)
	table := assignment.NewTable(nil)
	table.Set("n1", assignment.State{Assignment: assign("1")})
	table.Set("n2", assignment.State{Assignment: assign("1")})
	svc := New(Config{Log: zap.New(core), Table: table, Status: &recordingWriter{}, Reauth: authn, Clock: clk})

	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer(append(ServerOptions(), grpc.StreamInterceptor(grpcauth.StreamServerInterceptor(authn.AuthFunc)))...)
	dkcv1.RegisterConfigServiceServer(srv, svc)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient("passthrough:///bufnet", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	client := dkcv1.NewConfigServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	open := func(node, token string) dkcv1.ConfigService_WatchConfigClient {
		t.Helper()
		s, err := client.WatchConfig(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token), &dkcv1.WatchConfigRequest{NodeName: node})
		if err != nil {
			t.Fatal(err)
		}
		recv(t, s)
		waitTimer(t, clk)
		return s
	}
	served := func(s dkcv1.ConfigService_WatchConfigClient, node, rv string) {
		t.Helper()
		table.Set(node, assignment.State{Assignment: assign(rv)})
		if m := recv(t, s); m.GetAssignment().GetContentHash() != "h"+rv {
			t.Fatalf("got %v, want assignment %s", m, rv)
		}
	}
	stepPast := func(d time.Duration, wantReviews int) {
		t.Helper()
		before := api.count()
		clk.Step(d)
		poll.UntilNil(t, fmt.Sprintf("%d token reviews after %v", wantReviews, d), func() error {
			if n := api.count() - before; n < wantReviews {
				return fmt.Errorf("%d reviews", n)
			}
			return nil
		})
	}

	s1 := open("n1", tokN1)
	// Within the TTL nothing is reviewed; past it the token is, and the stream goes on.
	clk.Step(ttl / 2)
	served(s1, "n1", "2")
	if n := api.count(); n != 1 {
		t.Fatalf("%d reviews within the TTL, want only the opening one", n)
	}
	stepPast(ttl/2+time.Second, 1)
	waitTimer(t, clk)
	served(s1, "n1", "3")

	// The apiserver unreachable: the check fails, the stream stays and is served, the check is retried.
	api.set(func(a *apiserver) { a.down = true })
	stepPast(ttl+time.Second, 1)
	waitTimer(t, clk)
	served(s1, "n1", "4")
	if logs.FilterMessage("could not check the node's token again; keeping its stream and retrying").Len() != 1 {
		t.Errorf("no log line for the failed check: %v", logs.All())
	}
	api.set(func(a *apiserver) { a.down = false })
	stepPast(reauthRetryInitial, 1) // the first retry comes within reauthRetryInitial
	waitTimer(t, clk)
	served(s1, "n1", "5")

	// Revoked: ended at the next check, with Unauthenticated.
	api.set(func(a *apiserver) { delete(a.valid, tokN1) })
	stepPast(ttl+time.Second, 1)
	err = recvErr(t, s1)
	if status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), "has been deleted") {
		t.Fatalf("revoked token's stream ended with %v, want Unauthenticated with the apiserver's reason", err)
	}
	refused := logs.FilterMessage("node's token refused when checked again; ending its stream").All()
	if len(refused) != 1 || refused[0].ContextMap()["node"] != "n1" || !strings.Contains(refused[0].ContextMap()["reason"].(string), "has been deleted") {
		t.Errorf("want one log line naming node n1 and the reason, got %v", refused)
	}

	// A token that now names another node: ended too.
	s2 := open("n2", tokN2)
	api.set(func(a *apiserver) { a.valid[tokN2] = "n3" })
	stepPast(ttl+time.Second, 1)
	if err := recvErr(t, s2); status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), `node "n3", not`) {
		t.Fatalf("stream of a token now naming another node ended with %v, want Unauthenticated", err)
	}
}

// TestExpiredTokenEndsTheStreamAsUnavailable: a token's exp ends its stream as Unavailable (reconnect, with
// the current token), logged at Info as the routine it is, not as a refusal.
func TestExpiredTokenEndsTheStreamAsUnavailable(t *testing.T) {
	r := &recheck{clock: clocktesting.NewFakeClock(time.Now())}
	core, logs := observer.New(zap.InfoLevel)
	err := r.handle(recheckResult{err: auth.ErrTokenExpired}, zap.New(core))
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("handle(ErrTokenExpired) = %v, want Unavailable", err)
	}
	if logs.FilterMessage("node's token expired; ending its stream so that it reconnects with its current token").FilterLevelExact(zap.InfoLevel).Len() != 1 {
		t.Errorf("want one Info line for the expiry, got %v", logs.All())
	}
}
