// SPDX-License-Identifier: Apache-2.0

package auth

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	grpcauth "github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/auth"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	authenticationv1 "k8s.io/api/authentication/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/dkc-dev/dkc/internal/poll"
)

const sidecarSA = "kube-system/dkc-sidecar"

var epoch = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// reviewer is a fake TokenReview backend: it answers from known (token -> status) and counts the reviews it
// was asked for, which is the apiserver budget the tests care about.
type reviewer struct {
	mu      sync.Mutex
	known   map[string]authenticationv1.TokenReviewStatus
	reviews int
	down    error // when set, every review fails with it (the apiserver unreachable)
}

func newReviewer() (*reviewer, *fake.Clientset) {
	r := &reviewer{known: map[string]authenticationv1.TokenReviewStatus{}}
	cs := fake.NewClientset()
	cs.PrependReactor("create", "tokenreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		tr := a.(k8stesting.CreateAction).GetObject().(*authenticationv1.TokenReview).DeepCopy()
		r.mu.Lock()
		defer r.mu.Unlock()
		r.reviews++
		if r.down != nil {
			return true, nil, r.down
		}
		tr.Status = r.known[tr.Spec.Token] // unknown: not authenticated
		return true, tr, nil
	})
	return r, cs
}

func (r *reviewer) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reviews
}

// valid registers a token the apiserver accepts for node, with the given audiences.
func (r *reviewer) valid(token, node string, auds ...string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.known[token] = authenticationv1.TokenReviewStatus{
		Authenticated: true,
		Audiences:     auds,
		User: authenticationv1.UserInfo{Username: "system:serviceaccount:kube-system:dkc-sidecar",
			Extra: map[string]authenticationv1.ExtraValue{NodeNameExtra: {node}}},
	}
	return token
}

// sjwt builds a token shaped like a ServiceAccount JWT (unsigned: the fake reviewer decides validity).
func sjwt(claims map[string]any) string {
	p, err := json.Marshal(claims)
	if err != nil {
		panic(err)
	}
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(`{"alg":"RS256","kid":"k1"}`)) + "." + enc(p) + "." + enc([]byte("signature"))
}

func garbage(i int) string { return sjwt(map[string]any{"iss": "attacker", "n": i}) }

func fromPeer(ctx context.Context, addr string) context.Context {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		panic(err)
	}
	var p int
	if _, err := fmt.Sscan(port, &p); err != nil {
		panic(err)
	}
	return peer.NewContext(ctx, &peer.Peer{Addr: &net.TCPAddr{IP: net.ParseIP(host), Port: p}})
}

// newTestAuthenticator's verifications last the TTL exactly (no spread), so that tests can name the instant.
// newTestAuthenticator returns an Authenticator of cfg (its Client, Clock, limits and metrics) for tokens of
// sidecarSA, cached for a minute, whose verifications all lapse at the TTL (no spread).
func newTestAuthenticator(t *testing.T, cfg Config) *Authenticator {
	t.Helper()
	cfg.Allowed, cfg.TTL = []string{sidecarSA}, time.Minute
	a := New(cfg)
	a.spread = func(time.Duration) time.Duration { return 0 }
	return a
}

func TestPeerLimit(t *testing.T) {
	const burst = 5
	tests := []struct {
		name             string
		qps              float64 // per-peer; 0 disables
		warm             bool    // authenticate the valid token from 10.0.0.1 before the flood
		flood            func(i int) string
		wantFloodReviews int
		advance          time.Duration
		probeFrom        string
		probe            string // "valid" (new token), "warm", "garbage"
		wantCode         codes.Code
		wantProbeReviews int
	}{
		{name: "garbage from one address is limited before review", qps: 1, flood: func(int) string { return "10.0.0.1:40000" },
			wantFloodReviews: burst, probeFrom: "10.0.0.1:40000", probe: "garbage", wantCode: codes.ResourceExhausted},
		{name: "a new source port is the same peer", qps: 1, flood: func(i int) string { return fmt.Sprintf("10.0.0.1:%d", 40000+i) },
			wantFloodReviews: burst, probeFrom: "10.0.0.1:50000", probe: "garbage", wantCode: codes.ResourceExhausted},
		{name: "an IPv6 address is one peer", qps: 1, flood: func(i int) string { return "[2001:db8::1]:40000" },
			wantFloodReviews: burst, probeFrom: "[2001:db8::1]:1", probe: "garbage", wantCode: codes.ResourceExhausted},
		{name: "nodes of one IPv6 /64 are separate peers", qps: 1, flood: func(i int) string { return "[2001:db8::1]:40000" },
			wantFloodReviews: burst, probeFrom: "[2001:db8::2]:40000", probe: "valid", wantCode: codes.OK, wantProbeReviews: 1},
		{name: "another address is unaffected", qps: 1, flood: func(int) string { return "10.0.0.1:40000" },
			wantFloodReviews: burst, probeFrom: "10.0.0.2:40000", probe: "valid", wantCode: codes.OK, wantProbeReviews: 1},
		{name: "a cached token is never limited", qps: 1, warm: true, flood: func(int) string { return "10.0.0.1:40000" },
			wantFloodReviews: burst - 1 /* the warm token's review was the first */, probeFrom: "10.0.0.1:40001", probe: "warm", wantCode: codes.OK},
		{name: "a repeated refused token is answered from the cache", qps: 1, flood: func(int) string { return "10.0.0.1:40000" },
			wantFloodReviews: burst, probeFrom: "10.0.0.1:40000", probe: "first garbage", wantCode: codes.Unauthenticated},
		{name: "a new token from a limited address waits for the refill", qps: 1, flood: func(int) string { return "10.0.0.1:40000" },
			wantFloodReviews: burst, probeFrom: "10.0.0.1:40000", probe: "valid", wantCode: codes.ResourceExhausted},
		{name: "the bucket refills at qps", qps: 1, flood: func(int) string { return "10.0.0.1:40000" },
			wantFloodReviews: burst, advance: time.Second, probeFrom: "10.0.0.1:40000", probe: "valid", wantCode: codes.OK, wantProbeReviews: 1},
		{name: "qps 0 disables the limit", qps: 0, flood: func(int) string { return "10.0.0.1:40000" },
			wantFloodReviews: 50, probeFrom: "10.0.0.1:40000", probe: "garbage", wantCode: codes.Unauthenticated, wantProbeReviews: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			rv, cs := newReviewer()
			clk := clocktesting.NewFakeClock(epoch)
			a := newTestAuthenticator(t, Config{Client: cs, Clock: clk, PeerQPS: tt.qps, PeerBurst: burst})
			warm := rv.valid(sjwt(map[string]any{"n": "warm"}), "n1", Audience)
			if tt.warm {
				if _, err := a.Authenticate(fromPeer(ctx, "10.0.0.1:40000"), warm); err != nil {
					t.Fatal(err)
				}
			}
			before := rv.count()
			for i := range 50 {
				_, _ = a.Authenticate(fromPeer(ctx, tt.flood(i)), garbage(i))
			}
			if got := rv.count() - before; got != tt.wantFloodReviews {
				t.Fatalf("50 new garbage tokens cost %d reviews, want %d", got, tt.wantFloodReviews)
			}
			clk.Step(tt.advance)
			token := map[string]string{"valid": rv.valid(sjwt(map[string]any{"n": "new"}), "n2", Audience), "warm": warm,
				"garbage": garbage(1000), "first garbage": garbage(0)}[tt.probe]
			before = rv.count()
			_, err := a.Authenticate(fromPeer(ctx, tt.probeFrom), token)
			if status.Code(err) != tt.wantCode {
				t.Errorf("probe %s from %s: %v, want %v", tt.probe, tt.probeFrom, err, tt.wantCode)
			}
			if got := rv.count() - before; got != tt.wantProbeReviews {
				t.Errorf("probe cost %d reviews, want %d", got, tt.wantProbeReviews)
			}
		})
	}
}

// slowAPIServer answers TokenReviews over HTTP, each once hold is closed, accepting every token for node-1;
// a review whose request is cancelled first is answered with nothing. Over HTTP, unlike with the fake
// clientset, a review made on a caller's context ends when that context does.
type slowAPIServer struct {
	hold    chan struct{}
	reviews atomic.Int32
}

func (s *slowAPIServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.reviews.Add(1)
	var tr authenticationv1.TokenReview
	_ = json.NewDecoder(r.Body).Decode(&tr)
	select {
	case <-s.hold:
	case <-r.Context().Done():
		return
	}
	tr.Status = authenticationv1.TokenReviewStatus{Authenticated: true, Audiences: []string{Audience},
		User: authenticationv1.UserInfo{Username: "system:serviceaccount:kube-system:dkc-sidecar",
			Extra: map[string]authenticationv1.ExtraValue{NodeNameExtra: {"node-1"}}}}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(&tr)
}

// TestConcurrentCallsShareOneReview: the calls that present a token while it is being reviewed (a stream and
// its first report; a reconnect storm) wait for that review instead of each spending one, and the first
// caller going away fails none of the others.
func TestConcurrentCallsShareOneReview(t *testing.T) {
	for _, tt := range []struct {
		name         string
		cancelLeader bool
	}{
		{name: "all wait"},
		{name: "first caller gone meanwhile", cancelLeader: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			api := &slowAPIServer{hold: make(chan struct{})}
			srv := httptest.NewServer(api)
			defer srv.Close()
			client, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL, QPS: -1})
			if err != nil {
				t.Fatal(err)
			}
			a := newTestAuthenticator(t, Config{Client: client, Clock: clocktesting.NewFakeClock(epoch)})
			tok := sjwt(map[string]any{"sub": "node-1"})
			ctx := fromPeer(context.Background(), "10.0.0.1:1000")

			leaderCtx, cancelLeader := context.WithCancel(ctx)
			defer cancelLeader()
			leader := make(chan error, 1)
			go func() { _, err := a.Authenticate(leaderCtx, tok); leader <- err }()
			poll.Until(t, "the first call's review to start", func() bool { return api.reviews.Load() == 1 })
			const others = 10
			results := make(chan error, others)
			for range others {
				go func() {
					id, err := a.Authenticate(ctx, tok)
					if err == nil && id.Node != "node-1" {
						err = fmt.Errorf("identity %+v, want node-1", id)
					}
					results <- err
				}()
			}
			// A call that did not join the review would have started its own by now (one that comes later
			// than this finds the cached answer: the test cannot fail for a slow machine). Proves a negative:
			// the 200ms are waited out when all is well.
			_ = wait.PollUntilContextTimeout(ctx, time.Millisecond, 200*time.Millisecond, true, func(context.Context) (bool, error) {
				return api.reviews.Load() > 1, nil
			})
			if tt.cancelLeader {
				cancelLeader()
				select {
				case err := <-leader:
					if status.Code(err) != codes.Canceled {
						t.Errorf("the first caller, gone: %v, want Canceled", err)
					}
				case <-time.After(5 * time.Second):
					t.Errorf("the first caller still waits for the review after its context ended")
				}
			}
			close(api.hold)
			for range others {
				if err := <-results; err != nil {
					t.Errorf("a call that waited for the review: %v", err)
				}
			}
			if !tt.cancelLeader {
				if err := <-leader; err != nil {
					t.Errorf("the first call: %v", err)
				}
			}
			if got := api.reviews.Load(); got != 1 {
				t.Errorf("%d concurrent calls with one new token cost %d reviews, want 1", others+1, got)
			}
		})
	}
}

func TestTokenShapeAndSize(t *testing.T) {
	pad := func(n int) string { // a JWT-shaped token of exactly n bytes
		tok := sjwt(map[string]any{"pad": ""})
		return sjwt(map[string]any{"pad": strings.Repeat("x", (n-len(tok))*3/4)})
	}
	tests := []struct {
		name        string
		token       string
		wantCode    codes.Code
		wantReviews int
	}{
		{name: "ordinary size is reviewed", token: sjwt(map[string]any{"iss": "x"}), wantCode: codes.Unauthenticated, wantReviews: 1},
		{name: "near the cap is reviewed", token: pad(MaxTokenBytes - 4), wantCode: codes.Unauthenticated, wantReviews: 1},
		{name: "over the cap is refused without review", token: pad(MaxTokenBytes + 4), wantCode: codes.Unauthenticated},
		{name: "1 MiB is refused without review", token: pad(1 << 20), wantCode: codes.Unauthenticated},
		{name: "not a JWT", token: "not-a-token", wantCode: codes.Unauthenticated},
		{name: "JSON serialization", token: `{"payload":"e30","signatures":[]}`, wantCode: codes.Unauthenticated},
		{name: "four segments", token: sjwt(nil) + ".x", wantCode: codes.Unauthenticated},
		{name: "padded base64", token: "eyJ9." + base64.URLEncoding.EncodeToString([]byte(`{"a":1}`)) + ".c2ln", wantCode: codes.Unauthenticated},
		{name: "payload not a JSON object", token: "eyJ9." + base64.RawURLEncoding.EncodeToString([]byte(`[1]`)) + ".c2ln", wantCode: codes.Unauthenticated},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rv, cs := newReviewer()
			a := newTestAuthenticator(t, Config{Client: cs, Clock: clocktesting.NewFakeClock(epoch), PeerQPS: DefaultPeerQPS, PeerBurst: DefaultPeerBurst})
			_, err := a.Authenticate(fromPeer(context.Background(), "10.0.0.1:1"), tt.token)
			if status.Code(err) != tt.wantCode {
				t.Errorf("%d-byte token: %v, want %v", len(tt.token), err, tt.wantCode)
			}
			if got := rv.count(); got != tt.wantReviews {
				t.Errorf("%d-byte token cost %d reviews, want %d", len(tt.token), got, tt.wantReviews)
			}
		})
	}
}

// An attacker controls the token bytes, so every garbage token is new: refusals must not push verified
// tokens out of the cache, or a flood of garbage would turn every sidecar's next call into a review.
func TestRefusalsDoNotEvictVerifiedTokens(t *testing.T) {
	ctx := context.Background()
	rv, cs := newReviewer()
	a := newTestAuthenticator(t, Config{Client: cs, Clock: clocktesting.NewFakeClock(epoch)})
	good := rv.valid(sjwt(map[string]any{"n": "good"}), "n1", Audience)
	if _, err := a.Authenticate(ctx, good); err != nil {
		t.Fatal(err)
	}
	for i := range 20000 { // more than any cache here holds
		_, _ = a.Authenticate(ctx, garbage(i))
	}
	before := rv.count()
	if _, err := a.Authenticate(ctx, good); err != nil {
		t.Fatal(err)
	}
	if got := rv.count() - before; got != 0 {
		t.Errorf("verified token after 20000 refusals cost %d reviews, want 0 (evicted by refusals)", got)
	}
}

func TestVerifiedCacheBoundedByExpiry(t *testing.T) {
	tests := []struct {
		name      string
		exp       any // the token's exp claim; nil: none
		cachedAt  time.Duration
		reviewAt  time.Duration // 0: the token has expired by then, and is refused without a review
		expiredAt time.Duration
		neverKept bool
	}{
		// A token stays valid for ExpiryLeeway past its exp, as the apiserver takes it (jwt.DefaultLeeway):
		// reviewed, cached until exp and the leeway, then refused without a review.
		{name: "exp within the TTL, with the leeway past it", exp: epoch.Add(10 * time.Second).Unix(), cachedAt: 59 * time.Second, reviewAt: 61 * time.Second},
		{name: "exp later than the TTL", exp: epoch.Add(2 * time.Hour).Unix(), cachedAt: 59 * time.Second, reviewAt: 61 * time.Second},
		{name: "no exp claim", exp: nil, cachedAt: 59 * time.Second, reviewAt: 61 * time.Second},
		{name: "exp not a number", exp: "soon", cachedAt: 59 * time.Second, reviewAt: 61 * time.Second},
		{name: "exp past, within the leeway", exp: epoch.Add(-30 * time.Second).Unix(), cachedAt: 30*time.Second - time.Millisecond, expiredAt: 30 * time.Second},
		{name: "exp past, a second of leeway left", exp: epoch.Add(time.Second - ExpiryLeeway).Unix(), cachedAt: time.Second - time.Millisecond, expiredAt: time.Second},
		{name: "fractional exp", exp: float64(epoch.Add(-ExpiryLeeway).Unix()) + 10.5, cachedAt: 9 * time.Second, expiredAt: 10*time.Second + time.Millisecond}, // truncated, as the apiserver does
		{name: "exp past by the leeway", exp: epoch.Add(-ExpiryLeeway).Unix(), neverKept: true},
		{name: "exp past by more than the leeway", exp: epoch.Add(-ExpiryLeeway - time.Hour).Unix(), neverKept: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			rv, cs := newReviewer()
			clk := clocktesting.NewFakeClock(epoch)
			a := newTestAuthenticator(t, Config{Client: cs, Clock: clk, PeerQPS: DefaultPeerQPS, PeerBurst: DefaultPeerBurst})
			claims := map[string]any{"iss": "k8s"}
			if tt.exp != nil {
				claims["exp"] = tt.exp
			}
			tok := rv.valid(sjwt(claims), "n1", Audience)
			at := func(d time.Duration) (int, error) {
				clk.SetTime(epoch.Add(d))
				before := rv.count()
				_, err := a.Authenticate(ctx, tok)
				return rv.count() - before, err
			}
			if tt.neverKept {
				if reviews, err := at(0); err == nil || !strings.Contains(err.Error(), "expired") || reviews != 0 {
					t.Errorf("token past its exp: %v after %d reviews; want refused as expired without a review", err, reviews)
				}
				return
			}
			if _, err := at(0); err != nil {
				t.Fatal(err)
			}
			if reviews, err := at(tt.cachedAt); err != nil || reviews != 0 {
				t.Errorf("at +%v: %d reviews, %v; want the cached result", tt.cachedAt, reviews, err)
			}
			if tt.expiredAt > 0 {
				if reviews, err := at(tt.expiredAt); err == nil || reviews != 0 {
					t.Errorf("at +%v, past exp: %d reviews, %v; want refused without a review", tt.expiredAt, reviews, err)
				}
				return
			}
			if reviews, err := at(tt.reviewAt); err != nil || reviews != 1 {
				t.Errorf("at +%v: %d reviews, %v; want 1 (cache must not outlive the TTL)", tt.reviewAt, reviews, err)
			}
		})
	}
}

// TestVerificationsSpreadOverTheLastTenth: tokens verified at one instant lapse at different instants within
// the TTL's last tenth, never past the TTL.
func TestVerificationsSpreadOverTheLastTenth(t *testing.T) {
	seen := map[time.Duration]bool{}
	for range 100 {
		d := spreadTenth(time.Minute)
		if d < 0 || d >= 6*time.Second {
			t.Fatalf("spread %v outside [0, 6s)", d)
		}
		seen[d] = true
	}
	if len(seen) < 50 {
		t.Errorf("%d distinct spreads of 100; want them random", len(seen))
	}
}

func TestAudienceRequired(t *testing.T) {
	tests := []struct {
		name     string
		auds     []string
		wantCode codes.Code
	}{
		{name: "dkc", auds: []string{Audience}, wantCode: codes.OK},
		{name: "dkc among others", auds: []string{"other", Audience}, wantCode: codes.OK},
		{name: "empty", auds: nil, wantCode: codes.Unauthenticated},
		{name: "other only", auds: []string{"https://kubernetes.default.svc"}, wantCode: codes.Unauthenticated},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rv, cs := newReviewer()
			a := newTestAuthenticator(t, Config{Client: cs, Clock: clocktesting.NewFakeClock(epoch), PeerQPS: DefaultPeerQPS, PeerBurst: DefaultPeerBurst})
			tok := rv.valid(sjwt(map[string]any{"iss": "k8s"}), "n1", tt.auds...)
			if _, err := a.Authenticate(context.Background(), tok); status.Code(err) != tt.wantCode {
				t.Errorf("status.audiences %q: %v, want %v", tt.auds, err, tt.wantCode)
			}
		})
	}
}

// Reviews go through their own client and rate limiter, so that a flood of new tokens cannot take the
// budget of the client that writes Node status. Checked at the limiter: after the review client has spent
// its burst, the status client's limiter still admits a request at once.
func TestReviewClientHasOwnLimiter(t *testing.T) {
	var mu sync.Mutex
	var ua []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		ua = append(ua, r.UserAgent())
		mu.Unlock()
		var tr authenticationv1.TokenReview
		_ = json.NewDecoder(r.Body).Decode(&tr)
		tr.Status = authenticationv1.TokenReviewStatus{Authenticated: false, Error: "invalid"}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(&tr)
	}))
	defer srv.Close()
	cfg := &rest.Config{Host: srv.URL, QPS: 1, Burst: 3, UserAgent: "dkc-server"}
	const reviewBurst = 4
	tests := []struct {
		name              string
		review            func(status kubernetes.Interface) (kubernetes.Interface, error)
		wantStatusLimited bool
	}{
		{name: "own client (NewReviewClient)", review: func(kubernetes.Interface) (kubernetes.Interface, error) {
			return NewReviewClient(cfg, 0.001, reviewBurst)
		}},
		// How services/internal/server wired it before: reviews spent the status writer's budget.
		{name: "shared client", review: func(s kubernetes.Interface) (kubernetes.Interface, error) { return s, nil }, wantStatusLimited: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			statusClient, err := kubernetes.NewForConfig(cfg)
			if err != nil {
				t.Fatal(err)
			}
			reviewClient, err := tt.review(statusClient)
			if err != nil {
				t.Fatal(err)
			}
			a := newTestAuthenticator(t, Config{Client: reviewClient, Clock: clocktesting.NewFakeClock(epoch)})
			n := reviewBurst
			if tt.wantStatusLimited {
				n = cfg.Burst
			}
			for i := range n {
				if _, err := a.Authenticate(context.Background(), garbage(i)); status.Code(err) != codes.Unauthenticated {
					t.Fatalf("review %d: %v", i, err)
				}
			}
			if got := statusClient.CoreV1().RESTClient().GetRateLimiter().TryAccept(); got == tt.wantStatusLimited {
				t.Errorf("status client admits a request after %d reviews: %v, want %v", n, got, !tt.wantStatusLimited)
			}
			if !tt.wantStatusLimited {
				if reviewClient.AuthenticationV1().RESTClient().GetRateLimiter().TryAccept() {
					t.Errorf("review client admits a request after its burst of %d", reviewBurst)
				}
				mu.Lock()
				defer mu.Unlock()
				if got := ua[len(ua)-1]; got != "dkc-server/token-review" {
					t.Errorf("review User-Agent %q, want dkc-server/token-review (tells them apart in audit logs)", got)
				}
			}
		})
	}
}

// The header-list cap is advertised to clients and enforced by the server: a call with oversized metadata
// fails before the auth function runs, while a token at MaxTokenBytes still fits.
func TestServerOptionsCapHeaders(t *testing.T) {
	rv, cs := newReviewer()
	a := newTestAuthenticator(t, Config{Client: cs, Clock: clocktesting.NewFakeClock(epoch), PeerQPS: DefaultPeerQPS, PeerBurst: DefaultPeerBurst})
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer(append(ServerOptions(), grpc.UnaryInterceptor(grpcauth.UnaryServerInterceptor(a.AuthFunc)))...)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	conn, err := grpc.NewClient("passthrough:///bufnet", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)

	big := sjwt(map[string]any{"pad": strings.Repeat("x", (MaxTokenBytes-200)*3/4)})
	tests := []struct {
		name        string
		token       string
		extra       int // bytes of other metadata
		wantOK      bool
		wantReviews int
	}{
		{name: "small", token: rv.valid(sjwt(map[string]any{"n": 1}), "n1", Audience), wantOK: true, wantReviews: 1},
		{name: "token near MaxTokenBytes fits", token: rv.valid(big, "n1", Audience), wantOK: true, wantReviews: 1},
		{name: "1 MiB of other metadata", token: rv.valid(sjwt(map[string]any{"n": 2}), "n1", Audience), extra: 1 << 20},
		{name: "64 KiB of other metadata", token: rv.valid(sjwt(map[string]any{"n": 3}), "n1", Audience), extra: 64 << 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			md := metadata.Pairs("authorization", "Bearer "+tt.token)
			if tt.extra > 0 {
				md.Set("x-pad", strings.Repeat("p", tt.extra))
			}
			ctx, cancel := context.WithTimeout(metadata.NewOutgoingContext(context.Background(), md), 10*time.Second)
			defer cancel()
			before := rv.count()
			_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
			if (err == nil) != tt.wantOK {
				t.Errorf("%d-byte token, %d bytes more metadata: %v, want ok=%v", len(tt.token), tt.extra, err, tt.wantOK)
			}
			if got := rv.count() - before; got != tt.wantReviews {
				t.Errorf("cost %d reviews, want %d", got, tt.wantReviews)
			}
		})
	}
}

// A client that ignores the advertised limit gets its stream reset by the server before auth runs.
func TestServerEnforcesHeaderCap(t *testing.T) {
	tests := []struct {
		name        string
		opts        []grpc.ServerOption
		pads        []int // sizes of x-pad-<i> header fields
		wantRefused bool
	}{
		{name: "ServerOptions, one 64 KiB field", opts: ServerOptions(), pads: []int{64 << 10}, wantRefused: true},
		{name: "ServerOptions, five 8 KiB fields", opts: ServerOptions(), pads: []int{8 << 10, 8 << 10, 8 << 10, 8 << 10, 8 << 10}, wantRefused: true},
		{name: "ServerOptions, small", opts: ServerOptions(), pads: []int{1 << 10}},
		{name: "grpc-go default (16 MiB), one 64 KiB field", opts: nil, pads: []int{64 << 10}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rv, cs := newReviewer()
			a := newTestAuthenticator(t, Config{Client: cs, Clock: clocktesting.NewFakeClock(epoch), PeerQPS: DefaultPeerQPS, PeerBurst: DefaultPeerBurst})
			lis := bufconn.Listen(1 << 20)
			srv := grpc.NewServer(append(tt.opts, grpc.UnaryInterceptor(grpcauth.UnaryServerInterceptor(a.AuthFunc)))...)
			healthpb.RegisterHealthServer(srv, health.NewServer())
			go func() { _ = srv.Serve(lis) }()
			defer srv.Stop()
			conn, err := lis.Dial()
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
			if _, err := conn.Write([]byte(http2.ClientPreface)); err != nil {
				t.Fatal(err)
			}
			fr := http2.NewFramer(conn, conn)
			if err := fr.WriteSettings(); err != nil {
				t.Fatal(err)
			}
			var hb bytes.Buffer
			enc := hpack.NewEncoder(&hb)
			for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", "/grpc.health.v1.Health/Check"},
				{":authority", "x"}, {"content-type", "application/grpc"}, {"te", "trailers"},
				{"authorization", "Bearer " + rv.valid(sjwt(map[string]any{"n": 1}), "n1", Audience)}} {
				_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
			}
			for i, n := range tt.pads {
				_ = enc.WriteField(hpack.HeaderField{Name: fmt.Sprintf("x-pad-%d", i), Value: strings.Repeat("p", n)})
			}
			block := hb.Bytes()
			const chunk = 16 << 10 // the default SETTINGS_MAX_FRAME_SIZE
			send := func() error {
				first := min(chunk, len(block))
				if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block[:first], EndHeaders: first == len(block)}); err != nil {
					return err
				}
				for rest := block[first:]; len(rest) > 0; {
					n := min(chunk, len(rest))
					if err := fr.WriteContinuation(1, n == len(rest), rest[:n]); err != nil {
						return err
					}
					rest = rest[n:]
				}
				// An empty gRPC message (the request), ending the stream.
				return fr.WriteData(1, true, []byte{0, 0, 0, 0, 0})
			}
			// Refused: the stream reset (the header list is over the limit) or the connection closed (one
			// header field is over it: HPACK's string limit is a connection error) — possibly while the
			// rest of the request is still being written.
			var refused string
			if err := send(); errors.Is(err, io.ErrClosedPipe) {
				refused = "connection closed while writing"
			} else if err != nil {
				t.Fatal(err)
			}
		read:
			for refused == "" {
				f, err := fr.ReadFrame()
				if errors.Is(err, io.EOF) {
					refused = "connection closed"
					break
				}
				if err != nil {
					t.Fatalf("read frame: %v", err)
				}
				switch f := f.(type) {
				case *http2.SettingsFrame:
					if !f.IsAck() {
						_ = fr.WriteSettingsAck()
					}
				case *http2.RSTStreamFrame:
					refused = "stream reset: " + f.ErrCode.String()
					break read
				case *http2.GoAwayFrame:
					refused = "GOAWAY: " + f.ErrCode.String()
					break read
				case *http2.HeadersFrame, *http2.DataFrame:
					if f.Header().Flags.Has(http2.FlagHeadersEndStream) {
						break read // the call's trailers: the server read the headers and ran the call
					}
				}
			}
			t.Logf("refused: %q", refused)
			if (refused != "") != tt.wantRefused {
				t.Errorf("refused: %q, want refused %v", refused, tt.wantRefused)
			}
			if got, want := rv.count(), map[bool]int{true: 0, false: 1}[tt.wantRefused]; got != want {
				t.Errorf("cost %d reviews, want %d", got, want)
			}
		})
	}
}

func TestRefusalMetrics(t *testing.T) {
	rv, cs := newReviewer()
	reg := prometheus.NewPedanticRegistry()
	m := NewMetrics(reg)
	a := newTestAuthenticator(t, Config{Client: cs, Clock: clocktesting.NewFakeClock(epoch), PeerQPS: 1, PeerBurst: 1, Metrics: m})
	ctx := fromPeer(context.Background(), "10.0.0.1:1")
	_, _ = a.AuthFunc(ctx)                                                         // missing
	_, _ = a.Authenticate(ctx, strings.Repeat("a", MaxTokenBytes+1))               // too_large
	_, _ = a.Authenticate(ctx, "not-a-token")                                      // malformed
	_, _ = a.Authenticate(ctx, garbage(1))                                         // rejected (reviewed)
	_, _ = a.Authenticate(ctx, garbage(1))                                         // rejected (cached)
	_, _ = a.Authenticate(ctx, garbage(2))                                         // rate_limited
	_, _ = a.Authenticate(fromPeer(ctx, "10.0.0.2:1"), rv.valid(garbage(3), "n1")) // rejected: no audience
	tests := []struct {
		reason string
		want   float64
	}{{"missing", 1}, {"too_large", 1}, {"malformed", 1}, {"rejected", 3}, {"rate_limited", 1}, {"forbidden", 0}, {"unavailable", 0}}
	for _, tt := range tests {
		if got := testutil.ToFloat64(m.refusals.WithLabelValues(tt.reason)); got != tt.want {
			t.Errorf("refusals{reason=%q} = %v, want %v", tt.reason, got, tt.want)
		}
	}
	if got := testutil.ToFloat64(m.reviews.WithLabelValues("unauthenticated")); got != 1 {
		t.Errorf("reviews{result=unauthenticated} = %v, want 1", got)
	}
	if got := testutil.ToFloat64(m.reviews.WithLabelValues("authenticated")); got != 1 {
		t.Errorf("reviews{result=authenticated} = %v, want 1", got)
	}
}
