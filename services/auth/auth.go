// Package auth establishes which node a gRPC caller is. Sidecars present a projected ServiceAccount token
// (audience "dkc") as `authorization: Bearer <token>`; the service verifies it with the apiserver's
// TokenReview, requires an allowed ServiceAccount, and takes the node from the token's node claim
// (authentication.kubernetes.io/node-name, carried by pod-bound tokens on apiservers ≥ 1.32 and by
// node-bound tokens). Handlers then allow a caller to act only for its own node, as the Node authorizer does
// for kubelets. Verified tokens are cached briefly (never past their exp) so that a reconnect storm does not
// become a TokenReview storm, and what unauthenticated callers can make dkc-server spend is bounded: see
// Authenticator, NewReviewClient and ServerOptions.
package auth

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	grpcauth "github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/auth"
	"go.uber.org/zap"
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
//  4. a review is spent only within the caller address's token bucket (WithPeerLimit);
//  5. reviews go through their own client and rate limiter (NewReviewClient), so the apiserver budget for
//     Node status writes is not theirs to take, and wait at most reviewTimeout for it.
type Authenticator struct {
	client  kubernetes.Interface
	allowed map[string]bool // "namespace/name"
	log     *zap.Logger
	ttl     time.Duration
	clock   clock.PassiveClock
	metrics *Metrics
	peers   *peerLimiter

	verified *cache.LRUExpireCache // token hash -> Identity
	refused  *cache.LRUExpireCache // token hash -> refusal
}

const (
	// verifiedCacheSize holds every node's current and next token at 5,000 nodes with room to spare.
	verifiedCacheSize = 16384
	// refusedCacheSize only spares the apiserver a caller that repeats a refused token (a sidecar whose
	// ServiceAccount is not allowed yet, a token for the wrong audience).
	refusedCacheSize = 4096
	// reviewTimeout bounds how long a call waits for the review rate limiter and the apiserver. client-go's
	// limiter fails at once when the wait would pass the deadline, so a backlog of reviews becomes
	// Unavailable (the sidecar backs off and retries) instead of a growing pile of blocked calls.
	reviewTimeout = 10 * time.Second
)

// Option configures an Authenticator.
type Option func(*Authenticator)

// WithPeerLimit gives each caller address a token bucket of burst reviews refilled at qps per second, for
// tokens dkc has no cached answer for; qps 0 disables the limit. The default is DefaultPeerQPS and
// DefaultPeerBurst.
func WithPeerLimit(qps float64, burst int) Option {
	return func(a *Authenticator) { a.peers = newPeerLimiter(qps, burst) }
}

// WithMetrics records refusals and reviews in m.
func WithMetrics(m *Metrics) Option { return func(a *Authenticator) { a.metrics = m } }

// WithClock replaces the real clock (for tests).
func WithClock(c clock.PassiveClock) Option { return func(a *Authenticator) { a.clock = c } }

// New returns an Authenticator accepting tokens of the allowed ServiceAccounts ("namespace/name"), reviewed
// through client (see NewReviewClient), and caching a verified token for ttl or until its exp, whichever
// is sooner.
func New(client kubernetes.Interface, allowed []string, ttl time.Duration, log *zap.Logger, opts ...Option) *Authenticator {
	a := &Authenticator{client: client, allowed: map[string]bool{}, log: log, ttl: ttl, clock: clock.RealClock{},
		peers: newPeerLimiter(DefaultPeerQPS, DefaultPeerBurst)}
	for _, sa := range allowed {
		a.allowed[sa] = true
	}
	for _, o := range opts {
		o(a)
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
	id, err := a.Authenticate(ctx, token)
	if err != nil {
		return nil, err
	}
	return WithIdentity(ctx, id), nil
}

// Authenticate verifies one token presented by the caller of ctx (its gRPC peer address is what the per-peer
// limit counts); errors are gRPC status errors.
func (a *Authenticator) Authenticate(ctx context.Context, token string) (Identity, error) {
	if len(token) > MaxTokenBytes {
		return a.refuse(reasonTooLarge, status.Errorf(codes.Unauthenticated,
			"token is %d bytes; a ServiceAccount token is at most %d", len(token), MaxTokenBytes))
	}
	sum := sha256.Sum256([]byte(token))
	key := string(sum[:])
	if v, ok := a.verified.Get(key); ok {
		return v.(Identity), nil
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
	if addr := peerKey(ctx); !a.peers.allow(addr) {
		return a.refuse(reasonRateLimited, status.Errorf(codes.ResourceExhausted,
			"too many new tokens from %s: dkc reviews at most %g new tokens per second per address (burst %d); retry later",
			addr, float64(a.peers.qps), a.peers.burst))
	}
	id, reason, err := a.review(ctx, token)
	switch {
	case reason == reasonUnavailable:
		// Not the caller's fault and not cached: the next call retries.
	case err != nil:
		// Refusals expire sooner: the fix (an RBAC change, a new token) should apply quickly.
		a.refused.Add(key, refusal{reason, err}, a.ttl/6)
	default:
		// The exp claim, now signed as far as the apiserver is concerned, only ever shortens the cache:
		// a token is not served from it after the time it stops being valid.
		ttl := a.ttl
		if !claims.exp.IsZero() {
			ttl = min(ttl, claims.exp.Sub(a.clock.Now()))
		}
		if ttl > 0 {
			a.verified.Add(key, id, ttl)
		}
		return id, nil
	}
	return a.refuse(reason, err)
}

func (a *Authenticator) refuse(reason string, err error) (Identity, error) {
	a.metrics.refused(reason)
	return Identity{}, err
}

// review asks the apiserver about token and checks the answer; on refusal it returns the metrics reason.
func (a *Authenticator) review(ctx context.Context, token string) (Identity, string, error) {
	ctx, cancel := context.WithTimeout(ctx, reviewTimeout)
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
		return Identity{}, reasonForbidden, status.Errorf(codes.PermissionDenied, "service account %s is not allowed to call dkc", sa)
	}
	nodes := tr.Status.User.Extra[NodeNameExtra]
	if len(nodes) != 1 || nodes[0] == "" {
		return Identity{}, reasonForbidden, status.Errorf(codes.PermissionDenied,
			"token of %s carries no node claim (%s): use a pod-bound or node-bound token on an apiserver >= 1.32", sa, NodeNameExtra)
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
