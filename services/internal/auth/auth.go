// SPDX-License-Identifier: Apache-2.0

// Package auth establishes which node a gRPC caller is. Sidecars present a projected ServiceAccount token
// (audience "dkc") as `authorization: Bearer <token>`; the service verifies it itself with the keys the
// apiserver publishes and its caches of the objects the token names (verifyLocally), or, for what those
// cannot decide, with the apiserver's TokenReview; it requires an allowed ServiceAccount, and takes the node
// from the token's node claim
// (authentication.kubernetes.io/node-name, carried by pod-bound tokens on apiservers ≥ 1.32 and by
// node-bound tokens). Handlers then allow a caller to act only for its own node, as the Node authorizer does
// for kubelets. Verified tokens are cached briefly (never past their exp and ExpiryLeeway) so that a
// reconnect storm does not become a TokenReview storm, and what unauthenticated callers can make dkc-server
// spend is bounded: see
// Authenticator, NewReviewClient and ServerOptions. A long-lived stream is not trusted on its opening alone:
// its token is checked again whenever its verification lapses (Reauthenticate), so a revoked token loses its
// stream within the cache TTL.
package auth

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	grpcauth "github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/auth"
	"golang.org/x/sync/singleflight"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/cache"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"
)

// Audience is what sidecar tokens must be minted for.
const Audience = "dkc"

// NodeNameExtra is the TokenReview user extra that names the token's node.
const NodeNameExtra = "authentication.kubernetes.io/node-name"

// Identity is an authenticated caller.
type Identity struct {
	// Node the caller acts for.
	Node string
	// ServiceAccount as "namespace/name".
	ServiceAccount string
}

type identityKey struct{}

// credential is what the interceptor verified for a call: the token, until when its verification holds, and
// the token's exp (zero: none).
type credential struct {
	token      string
	until, exp time.Time
}

type credentialKey struct{}

// VerifiedUntil is when the verification of the call's token lapses (the end of its cache entry): a
// stream that outlives it must Reauthenticate. ok is false when the call was not authenticated by
// AuthFunc.
func VerifiedUntil(ctx context.Context) (until time.Time, ok bool) {
	c, ok := ctx.Value(credentialKey{}).(credential)
	return c.until, ok
}

// FromContext returns the caller's identity, set by the interceptor.
func FromContext(ctx context.Context) (Identity, bool) {
	id, ok := ctx.Value(identityKey{}).(Identity)
	return id, ok
}

// WithIdentity returns ctx carrying id (for tests of handlers).
func WithIdentity(ctx context.Context, id Identity) context.Context {
	return context.WithValue(ctx, identityKey{}, id)
}

// Authorize returns PermissionDenied unless the caller acts for node.
func Authorize(ctx context.Context, node string) error {
	id, ok := FromContext(ctx)
	if !ok {
		return status.Error(codes.Unauthenticated, "no caller identity")
	}
	if node == "" {
		return status.Error(codes.InvalidArgument, "node_name is required")
	}
	if id.Node != node {
		return status.Errorf(codes.PermissionDenied, "%s may act only for node %q, not %q", id.ServiceAccount, id.Node, node)
	}
	return nil
}

// Authenticator verifies bearer tokens with TokenReview.
//
// Every caller can reach it before it knows who they are, so what an unauthenticated caller can make it
// spend is bounded, cheapest check first:
//
//  1. a token over MaxTokenBytes is refused before it is even hashed;
//  2. a token seen recently is answered from a cache: verified tokens from one that only tokens passing every
//     check enter, so garbage (whose bytes the attacker picks, each token new) cannot evict them; refusals
//     from another, which garbage can churn, but only at the rate 4 allows;
//  3. a token that is not shaped like a ServiceAccount JWT is refused without a review (the apiserver's
//     ServiceAccount authenticator would refuse it unread);
//  4. a review is spent only within the caller address's token bucket (Config.PeerQPS), which counts every
//     uncached call, also one that joins a review already in flight for the same token;
//  5. reviews go through their own client and rate limiter (NewReviewClient), so the apiserver budget for
//     Node status writes is not theirs to take, and wait at most ReviewTimeout for it; calls that present a
//     token under review share that review.
type Authenticator struct {
	client  kubernetes.Interface
	allowed map[string]bool // "namespace/name"
	ttl     time.Duration
	spread  func(time.Duration) time.Duration // how much sooner than the TTL a verification lapses
	clock   clock.PassiveClock
	metrics *Metrics
	peers   *peerLimiter
	// keys and objects verify tokens without a TokenReview (verifyLocally); nil keys: every token is reviewed.
	keys    *Keys
	objects Objects
	ready   <-chan struct{}

	verified *cache.LRUExpireCache // token hash -> verification
	refused  *cache.LRUExpireCache // token hash -> refusal
	// reviewing joins the calls that present a token while its review is in flight (token hash -> outcome):
	// a sidecar's stream and its first status report arrive together, and a reconnect storm brings every
	// token at once to both, so without it each new token cost two or more reviews.
	reviewing singleflight.Group
}

// verification is a verified token's cache entry: who it is, until when (the entry's expiry, which the
// cache does not tell), and the token's exp.
type verification struct {
	id         Identity
	until, exp time.Time
}

const (
	// verifiedCacheSize holds every node's current and next token at 5,000 nodes with room to spare.
	verifiedCacheSize = 16384
	// refusedCacheSize only spares the apiserver a caller that repeats a refused token (a sidecar whose
	// ServiceAccount is not allowed yet, a token for the wrong audience).
	refusedCacheSize = 4096
	// ReviewTimeout bounds how long a review waits for the review rate limiter and the apiserver. client-go's
	// limiter fails at once when the wait would pass the deadline, so a backlog of reviews becomes
	// Unavailable (the sidecar backs off and retries) instead of a growing pile of blocked calls.
	ReviewTimeout = 10 * time.Second
)

// ExpiryLeeway is how long past its exp a token is still taken as valid: the kube-apiserver's own leeway
// (go-jose's jwt.DefaultLeeway, with which it validates ServiceAccount tokens), so that dkc-server's clock
// running ahead of the apiserver's, or a node's kubelet rotating its token late by its own clock, does not
// make dkc refuse a token the apiserver accepts. Past it the apiserver refuses the token too, and dkc does
// so without asking.
const ExpiryLeeway = time.Minute

// expired says whether a token whose exp claim is exp is past it and the leeway by a's clock (zero: no exp).
func (a *Authenticator) expired(exp time.Time) bool {
	return !exp.IsZero() && !a.clock.Now().Before(exp.Add(ExpiryLeeway))
}

// Config of an Authenticator.
type Config struct {
	// Client reviews tokens (TokenReview): NewReviewClient's, whose rate limit is its own. Required.
	Client kubernetes.Interface
	// Allowed are the ServiceAccounts ("namespace/name") whose tokens are accepted
	// (--allowed-service-accounts); none: every token is refused.
	Allowed []string
	// TTL is how long a verified token is cached (--token-cache-ttl), never past its exp and ExpiryLeeway,
	// and so how often an open stream's token is checked again; refusals are cached a sixth of it. 0:
	// nothing is cached, every call is reviewed.
	TTL time.Duration
	// PeerQPS and PeerBurst give each caller address a token bucket of PeerBurst reviews refilled at PeerQPS
	// per second, for tokens without a cached answer (--token-review-per-peer-qps, -burst; the defaults are
	// DefaultPeerQPS and DefaultPeerBurst). PeerQPS 0: no per-peer limit, as the flag's 0.
	PeerQPS   float64
	PeerBurst int
	// Metrics records refusals and reviews; nil: no metrics.
	Metrics *Metrics
	// Clock is where cache expiries, token exp checks and the per-peer buckets read the time; nil: the real
	// clock. Tests give a fake one.
	Clock clock.PassiveClock
	// Keys and Objects, both set, verify tokens in dkc-server (verifyLocally) and send to TokenReview only
	// what they cannot decide; nil: every token is reviewed.
	Keys    *Keys
	Objects Objects
	// Ready, when set, holds every token that is not cached until it is closed: a replica that starts
	// accepts connections at once, and a token verified before its Node cache and token watches are synced
	// would cost a TokenReview (and its first report a Node lookup) for nothing. nil: never held.
	Ready <-chan struct{}
}

// New returns an Authenticator.
func New(cfg Config) *Authenticator {
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	a := &Authenticator{client: cfg.Client, allowed: map[string]bool{}, ttl: cfg.TTL, spread: spreadTenth,
		clock: cfg.Clock, metrics: cfg.Metrics, peers: newPeerLimiter(cfg.PeerQPS, cfg.PeerBurst)}
	a.ready = cfg.Ready
	if cfg.Keys != nil && cfg.Objects != nil {
		a.keys, a.objects = cfg.Keys, cfg.Objects
	}
	for _, sa := range cfg.Allowed {
		a.allowed[sa] = true
	}
	if a.peers != nil {
		a.peers.clock = a.clock
	}
	a.verified = cache.NewLRUExpireCacheWithClock(verifiedCacheSize, a.clock)
	a.refused = cache.NewLRUExpireCacheWithClock(refusedCacheSize, a.clock)
	return a
}

type refusal struct {
	reason string
	err    error
}

// AuthFunc is the go-grpc-middleware auth function: it authenticates the call's bearer token and stores the
// Identity in the context.
func (a *Authenticator) AuthFunc(ctx context.Context) (context.Context, error) {
	token, err := grpcauth.AuthFromMD(ctx, "bearer")
	if err != nil {
		a.metrics.refused(reasonMissing)
		return nil, err // Unauthenticated with the middleware's message
	}
	v, reason, err := a.authenticate(ctx, token, true)
	if err != nil {
		a.metrics.refused(reason)
		return nil, err
	}
	return context.WithValue(WithIdentity(ctx, v.id), credentialKey{},
		credential{token: token, until: v.until, exp: v.exp}), nil
}

// Authenticate verifies one token presented by the caller of ctx (its gRPC peer address is what the per-peer
// limit counts); errors are gRPC status errors.
func (a *Authenticator) Authenticate(ctx context.Context, token string) (Identity, error) {
	v, reason, err := a.authenticate(ctx, token, true)
	if err != nil {
		a.metrics.refused(reason)
	}
	return v.id, err
}

// spreadTenth is a random part of the last tenth of ttl.
func spreadTenth(ttl time.Duration) time.Duration {
	if n := int64(ttl / 10); n > 0 {
		return time.Duration(rand.Int64N(n))
	}
	return 0
}

// ErrTokenExpired: the stream's token reached its exp and ExpiryLeeway. Not a refusal: the stream ends so
// that the node opens a new one with its current token.
var ErrTokenExpired = errors.New("the token the stream was opened with has expired")

// Reauthenticate checks again the token the call of ctx was authenticated with (by AuthFunc), for a stream
// that outlives VerifiedUntil: from the cache while a verification holds, else with a TokenReview. It
// returns until when the new answer holds. Errors are gRPC status errors: codes.Unavailable when the token
// could not be checked now (the apiserver is unreachable or slow: not the caller's fault, keep the stream
// and retry), anything else a refusal — the token is no longer valid (revoked: its pod or node deleted,
// expired), or now names another node or ServiceAccount than the one the stream was opened as; such a
// stream must end.
//
// The per-peer limit does not apply: the caller already holds a verified stream, of which a node has one
// per replica, so a re-check costs at most one review per stream per TTL however many nodes share an
// address.
func (a *Authenticator) Reauthenticate(ctx context.Context) (time.Time, error) {
	c, ok := ctx.Value(credentialKey{}).(credential)
	was, idOK := FromContext(ctx)
	if !ok || !idOK {
		a.metrics.reauthenticated(reauthRefused)
		return time.Time{}, status.Error(codes.Unauthenticated, "no verified credential to check again")
	}
	if a.expired(c.exp) {
		// Routine, not a revocation: the kubelet rotated the token file long before (at 80% of its life),
		// and the node reconnects with the new token at once. The verification cached for the stream lasted
		// until exp and the leeway, so this is the first check past them: no review is spent on it.
		a.metrics.reauthenticated(reauthExpired)
		return time.Time{}, ErrTokenExpired
	}
	v, _, err := a.authenticate(ctx, c.token, false)
	switch {
	case ctx.Err() != nil:
		return time.Time{}, status.FromContextError(ctx.Err()).Err() // the stream ended meanwhile: nothing to count
	case status.Code(err) == codes.Unavailable:
		a.metrics.reauthenticated(reauthUnavailable)
		return time.Time{}, err
	case err != nil:
		a.metrics.reauthenticated(reauthRefused)
		return time.Time{}, err
	case v.id != was:
		a.metrics.reauthenticated(reauthIdentityChanged)
		return time.Time{}, status.Errorf(codes.Unauthenticated,
			"token now identifies %s of node %q, not %s of node %q as when the stream opened",
			v.id.ServiceAccount, v.id.Node, was.ServiceAccount, was.Node)
	}
	a.metrics.reauthenticated(reauthOK)
	return v.until, nil
}

// authenticate verifies token and returns who it is and until when that holds (the cache entry's expiry;
// now when it is not cached), or the refusal with its metrics reason. limitPeer applies the per-peer review
// limit (to callers not yet authenticated).
func (a *Authenticator) authenticate(ctx context.Context, token string, limitPeer bool) (verification, string, error) {
	if len(token) > MaxTokenBytes {
		return a.refuse(reasonTooLarge, status.Errorf(codes.Unauthenticated,
			"token is %d bytes; a ServiceAccount token is at most %d", len(token), MaxTokenBytes))
	}
	sum := sha256.Sum256([]byte(token))
	key := string(sum[:])
	// The cache keeps an entry up to and including the instant it expires: the token's own expiry is
	// checked on a hit too.
	if v, ok := a.verified.Get(key); ok && !a.expired(v.(verification).exp) {
		return v.(verification), "", nil
	}
	if v, ok := a.refused.Get(key); ok {
		r := v.(refusal)
		return a.refuse(r.reason, r.err)
	}
	claims, err := parseToken(token)
	if err != nil {
		// Not cached: checking costs less than a cache entry, and each garbage token is new anyway.
		return a.refuse(reasonMalformed, status.Errorf(codes.Unauthenticated, "token is not a ServiceAccount token: %v", err))
	}
	if a.expired(claims.exp) {
		// The apiserver would refuse it as well, and a review would tell nothing more.
		return a.refuse(reasonExpired, status.Errorf(codes.Unauthenticated,
			"token expired at %s (%v of leeway passed); send the current one",
			claims.exp.UTC().Format(time.RFC3339), ExpiryLeeway))
	}
	if a.ready != nil {
		select {
		case <-a.ready:
		case <-ctx.Done():
			return a.refuse(reasonUnavailable, status.FromContextError(ctx.Err()).Err())
		}
	}
	if a.keys != nil {
		// Before the per-peer limit, which budgets TokenReviews: a token decided here costs the apiserver
		// nothing, however many nodes reconnect from one address.
		id, result, reason, err := a.verifyLocally(token)
		a.metrics.verifiedLocally(result)
		if result == localAccepted || result == localRefused {
			return a.remember(key, claims.exp, id, reason, err)
		}
	}
	if limitPeer {
		if addr := peerKey(ctx); !a.peers.allow(addr) {
			return a.refuse(reasonRateLimited, status.Errorf(codes.ResourceExhausted,
				"too many new tokens from %s: dkc reviews at most %g new tokens per second per address (burst %d); retry later",
				addr, float64(a.peers.qps), a.peers.burst))
		}
	}
	return a.verify(ctx, key, token, claims.exp)
}

// outcome is a review's result as verify shares it between the calls that waited for it.
type outcome struct {
	v      verification
	reason string
	err    error
}

// verify reviews token (whose hash is key, exp its exp claim) and caches the answer, once for all the calls
// that present it meanwhile. The review does not run on the first caller's context: that caller going away
// must not fail the others, and nothing of its call should stay referenced (ReviewTimeout bounds the
// review). A caller whose context ends stops waiting.
func (a *Authenticator) verify(ctx context.Context, key, token string, exp time.Time) (verification, string, error) {
	if err := ctx.Err(); err != nil {
		return a.refuse(reasonUnavailable, status.FromContextError(err).Err()) // nobody to review it for
	}
	ch := a.reviewing.DoChan(key, func() (any, error) {
		// The review just before may have finished between this call's cache lookup and now.
		if v, ok := a.verified.Get(key); ok {
			return outcome{v: v.(verification)}, nil
		}
		if v, ok := a.refused.Get(key); ok {
			r := v.(refusal)
			return outcome{reason: r.reason, err: r.err}, nil
		}
		v, reason, err := a.reviewAndCache(context.Background(), key, token, exp)
		return outcome{v, reason, err}, nil
	})
	select {
	case <-ctx.Done():
		return a.refuse(reasonUnavailable, status.FromContextError(ctx.Err()).Err())
	case r := <-ch:
		o := r.Val.(outcome)
		return o.v, o.reason, o.err
	}
}

func (a *Authenticator) reviewAndCache(ctx context.Context, key, token string,
	exp time.Time) (verification, string, error) {
	id, reason, err := a.review(ctx, token)
	return a.remember(key, exp, id, reason, err)
}

// remember caches what a review or the local verification answered for the token whose hash is key (exp:
// its exp claim) and returns it.
func (a *Authenticator) remember(key string, exp time.Time, id Identity, reason string,
	err error) (verification, string, error) {
	switch {
	case reason == reasonUnavailable:
		// Not the caller's fault and not cached: the next call retries.
	case err != nil:
		// Refusals expire sooner: the fix (an RBAC change, a new token) should apply quickly.
		a.refused.Add(key, refusal{reason, err}, a.ttl/6)
	default:
		// The exp claim, now signed as far as the apiserver is concerned, only ever shortens the cache:
		// a token is not served from it after the time it stops being valid, its exp and the leeway, so
		// that a token within the leeway costs one review, not one per call.
		// Entries of tokens verified together lapse spread over the last tenth of the TTL, so that the
		// streams of a reconnect storm do not come back for their re-checks together, TTL after TTL.
		now := a.clock.Now()
		ttl := a.ttl
		ttl -= a.spread(ttl)
		if !exp.IsZero() {
			ttl = min(ttl, exp.Add(ExpiryLeeway).Sub(now))
		}
		if ttl <= 0 {
			return verification{id: id, until: now, exp: exp}, "", nil
		}
		v := verification{id: id, until: now.Add(ttl), exp: exp}
		a.verified.Add(key, v, ttl)
		return v, "", nil
	}
	return a.refuse(reason, err)
}

// refuse returns a refusal; the callers record it (a re-check counts in its own metric).
func (a *Authenticator) refuse(reason string, err error) (verification, string, error) {
	return verification{}, reason, err
}

// review asks the apiserver about token and checks the answer; on refusal it returns the metrics reason.
func (a *Authenticator) review(ctx context.Context, token string) (Identity, string, error) {
	ctx, cancel := context.WithTimeout(ctx, ReviewTimeout)
	defer cancel()
	tr, err := a.client.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
		Spec: authenticationv1.TokenReviewSpec{Token: token, Audiences: []string{Audience}},
	}, metav1.CreateOptions{})
	if err != nil {
		a.metrics.reviewed("error")
		return Identity{}, reasonUnavailable, status.Errorf(codes.Unavailable, "token review failed: %v", err)
	}
	if !tr.Status.Authenticated {
		a.metrics.reviewed("unauthenticated")
		msg := tr.Status.Error
		if msg == "" {
			msg = "token not authenticated"
		}
		return Identity{}, reasonRejected, status.Errorf(codes.Unauthenticated, "token rejected: %s", msg)
	}
	a.metrics.reviewed("authenticated")
	if !slices.Contains(tr.Status.Audiences, Audience) {
		// An apiserver that honoured spec.audiences always answers with the intersection; an empty list
		// means the token was checked without regard to audience (e.g. by an audience-agnostic
		// authenticator), which would let a token minted for anything else in.
		return Identity{}, reasonRejected, status.Errorf(codes.Unauthenticated,
			"token is not for audience %q (token review returned audiences %q)", Audience, tr.Status.Audiences)
	}
	sa, err := serviceAccount(tr.Status.User.Username)
	if err != nil {
		return Identity{}, reasonForbidden, status.Error(codes.PermissionDenied, err.Error())
	}
	if !a.allowed[sa] {
		return Identity{}, reasonForbidden, status.Errorf(codes.PermissionDenied,
			"service account %s is not allowed to call dkc", sa)
	}
	nodes := tr.Status.User.Extra[NodeNameExtra]
	if len(nodes) != 1 || nodes[0] == "" {
		return Identity{}, reasonForbidden, status.Errorf(codes.PermissionDenied,
			"token of %s carries no node claim (%s): use a pod-bound or node-bound token on an apiserver >= 1.32", sa,
			NodeNameExtra)
	}
	return Identity{Node: nodes[0], ServiceAccount: sa}, "", nil
}

// serviceAccount turns "system:serviceaccount:ns:name" into "ns/name".
func serviceAccount(username string) (string, error) {
	rest, ok := strings.CutPrefix(username, "system:serviceaccount:")
	if !ok {
		return "", fmt.Errorf("%q is not a service account", username)
	}
	ns, name, ok := strings.Cut(rest, ":")
	if !ok || ns == "" || name == "" {
		return "", errors.New("malformed service account user " + username)
	}
	return ns + "/" + name, nil
}
