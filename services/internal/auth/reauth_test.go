// SPDX-License-Identifier: Apache-2.0

package auth

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	clocktesting "k8s.io/utils/clock/testing"
)

// authed is what AuthFunc makes of a call from addr carrying token.
func authed(t *testing.T, a *Authenticator, addr, token string) context.Context {
	t.Helper()
	ctx := metadata.NewIncomingContext(fromPeer(context.Background(), addr), metadata.Pairs("authorization", "Bearer "+token))
	ctx, err := a.AuthFunc(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return ctx
}

// TestReauthenticate: a stream's token is checked again from the cache while its verification holds, with
// a review once it lapsed; a revoked token or one now naming another node is refused, a review that fails
// is Unavailable (not a refusal), and the per-peer limit never refuses a re-check.
func TestReauthenticate(t *testing.T) {
	rv, cs := newReviewer()
	clk := clocktesting.NewFakeClock(epoch)
	m := NewMetrics(prometheus.NewPedanticRegistry())
	a := newTestAuthenticator(t, Config{Client: cs, Clock: clk, PeerQPS: 1, PeerBurst: 1, Metrics: m}) // TTL 1m
	tok := rv.valid(sjwt(map[string]any{"iss": "k8s", "exp": epoch.Add(24 * time.Hour).Unix()}), "n1", Audience)
	ctx := authed(t, a, "10.0.0.1:1", tok)
	if until, ok := VerifiedUntil(ctx); !ok || !until.Equal(epoch.Add(time.Minute)) {
		t.Fatalf("VerifiedUntil = %v, %v; want the cache entry's end %v", until, ok, epoch.Add(time.Minute))
	}
	reauth := func(at time.Duration) (time.Time, int, error) {
		t.Helper()
		clk.SetTime(epoch.Add(at))
		before := rv.count()
		until, err := a.Reauthenticate(ctx)
		return until, rv.count() - before, err
	}

	// Within the verification: the cache answers.
	if until, reviews, err := reauth(30 * time.Second); err != nil || reviews != 0 || !until.Equal(epoch.Add(time.Minute)) {
		t.Fatalf("within the TTL: until %v, err %v, %d reviews; want the cached answer", until, err, reviews)
	}
	// Past it: a review, and a new verification. The per-peer bucket (burst 1) was spent by AuthFunc:
	// re-checks are not limited by it.
	if until, reviews, err := reauth(time.Minute + time.Millisecond); err != nil || reviews != 1 || !until.Equal(epoch.Add(2*time.Minute+time.Millisecond)) {
		t.Fatalf("past the TTL: until %v, err %v, %d reviews; want one review and a new minute", until, err, reviews)
	}
	// The apiserver unreachable: Unavailable, nothing cached, not a refusal.
	rv.mu.Lock()
	rv.down = errors.New("connection refused")
	rv.mu.Unlock()
	if _, reviews, err := reauth(2*time.Minute + 2*time.Millisecond); status.Code(err) != codes.Unavailable || reviews != 1 {
		t.Fatalf("apiserver down: err %v, %d reviews; want Unavailable after one review", err, reviews)
	}
	rv.mu.Lock()
	rv.down = nil
	rv.mu.Unlock()
	if _, reviews, err := reauth(2*time.Minute + 3*time.Millisecond); err != nil || reviews != 1 {
		t.Fatalf("apiserver back: err %v, %d reviews; want a verification", err, reviews)
	}
	// The token revoked (its pod deleted): refused at the first check past the verification.
	rv.mu.Lock()
	delete(rv.known, tok)
	rv.mu.Unlock()
	if _, _, err := reauth(3*time.Minute + 2*time.Millisecond); err != nil {
		t.Fatalf("revoked, still within the verification: %v; want the cached answer", err)
	}
	if _, reviews, err := reauth(3*time.Minute + 4*time.Millisecond); status.Code(err) != codes.Unauthenticated || reviews != 1 {
		t.Fatalf("revoked: err %v, %d reviews; want Unauthenticated after one review", err, reviews)
	}

	// A token that now names another node ends the stream opened as n1.
	tok2 := rv.valid(sjwt(map[string]any{"iss": "k8s", "n": 2}), "n1", Audience)
	ctx = authed(t, a, "10.0.0.2:1", tok2)
	rv.valid(tok2, "n2", Audience)
	_, _, err := reauth(5 * time.Minute)
	if status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), `node "n2", not kube-system/dkc-sidecar of node "n1"`) {
		t.Fatalf("identity changed: %v; want Unauthenticated naming both nodes", err)
	}
	// A context AuthFunc did not make has nothing to check: refused.
	if _, err := a.Reauthenticate(WithIdentity(context.Background(), Identity{Node: "n1"})); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("no credential: %v", err)
	}

	for result, want := range map[string]float64{reauthOK: 4, reauthUnavailable: 1, reauthRefused: 2, reauthIdentityChanged: 1} {
		if got := testutil.ToFloat64(m.reauths.WithLabelValues(result)); got != want {
			t.Errorf("stream_reauth_total{result=%q} = %v, want %v", result, got, want)
		}
	}
	// Re-checks are not calls: they count in their own metric, not as refusals of calls.
	if got := testutil.ToFloat64(m.refusals.WithLabelValues(reasonRejected)); got != 0 {
		t.Errorf("token_refusals_total{reason=rejected} = %v, want 0", got)
	}
}

// TestExpiredTokenEndsItsStreamWithoutReviews: a stream outlives its token's exp as a matter of course (the
// kubelet rotates the file at 80% of its life; streams live up to --max-connection-age). Its verification is
// cached until exp and ExpiryLeeway, the apiserver's own leeway; the re-check then says ErrTokenExpired
// without a review, counted as expired, not refused. Within the leeway the stream is kept.
func TestExpiredTokenEndsItsStreamWithoutReviews(t *testing.T) {
	rv, cs := newReviewer()
	clk := clocktesting.NewFakeClock(epoch)
	m := NewMetrics(prometheus.NewPedanticRegistry())
	a := newTestAuthenticator(t, Config{Client: cs, Clock: clk, PeerQPS: DefaultPeerQPS, PeerBurst: DefaultPeerBurst, Metrics: m})
	exp := epoch.Add(-30 * time.Second) // past already, by a clock ahead of the apiserver's
	tok := rv.valid(sjwt(map[string]any{"iss": "k8s", "exp": exp.Unix()}), "n1", Audience)
	ctx := authed(t, a, "10.0.0.1:1", tok)
	if until, _ := VerifiedUntil(ctx); !until.Equal(exp.Add(ExpiryLeeway)) {
		t.Fatalf("VerifiedUntil = %v, want the token's exp and the leeway %v", until, exp.Add(ExpiryLeeway))
	}
	clk.SetTime(exp.Add(ExpiryLeeway - time.Millisecond))
	if _, err := a.Reauthenticate(ctx); err != nil {
		t.Fatalf("within the leeway: %v; want the stream kept", err)
	}
	before := rv.count()
	for _, at := range []time.Duration{0, time.Millisecond, time.Hour} {
		clk.SetTime(exp.Add(ExpiryLeeway + at))
		if _, err := a.Reauthenticate(ctx); !errors.Is(err, ErrTokenExpired) {
			t.Fatalf("at +%v: %v; want ErrTokenExpired", at, err)
		}
	}
	if got := rv.count() - before; got != 0 {
		t.Errorf("%d TokenReviews for an expired token, want none", got)
	}
	if got := testutil.ToFloat64(m.reauths.WithLabelValues(reauthExpired)); got != 3 {
		t.Errorf("stream_reauth_total{result=expired} = %v, want 3", got)
	}
	if got := testutil.ToFloat64(m.reauths.WithLabelValues(reauthRefused)); got != 0 {
		t.Errorf("stream_reauth_total{result=refused} = %v, want 0: expiry is not a revocation", got)
	}
}
