// Package auth establishes which node a gRPC caller is. Sidecars present a projected ServiceAccount token
// (audience "dkc") as `authorization: Bearer <token>`; the service verifies it with the apiserver's
// TokenReview, requires an allowed ServiceAccount, and takes the node from the token's node claim
// (authentication.kubernetes.io/node-name, carried by pod-bound tokens on apiservers ≥ 1.32 and by
// node-bound tokens). Handlers then allow a caller to act only for its own node, as the Node authorizer does
// for kubelets. Verified tokens are cached briefly so that a reconnect storm does not become a TokenReview
// storm.
package auth

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
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
type Authenticator struct {
	client  kubernetes.Interface
	allowed map[string]bool // "namespace/name"
	log     *zap.Logger
	cache   *cache.LRUExpireCache
	ttl     time.Duration
}

// New returns an Authenticator accepting tokens of the allowed ServiceAccounts ("namespace/name").
func New(client kubernetes.Interface, allowed []string, ttl time.Duration, log *zap.Logger) *Authenticator {
	a := &Authenticator{client: client, allowed: map[string]bool{}, log: log, cache: cache.NewLRUExpireCache(16384), ttl: ttl}
	for _, sa := range allowed {
		a.allowed[sa] = true
	}
	return a
}

type cached struct {
	id  Identity
	err error
}

// AuthFunc is the go-grpc-middleware auth function: it authenticates the call's bearer token and stores the
// Identity in the context.
func (a *Authenticator) AuthFunc(ctx context.Context) (context.Context, error) {
	token, err := grpcauth.AuthFromMD(ctx, "bearer")
	if err != nil {
		return nil, err // Unauthenticated with the middleware's message
	}
	id, err := a.Authenticate(ctx, token)
	if err != nil {
		return nil, err
	}
	return WithIdentity(ctx, id), nil
}

// Authenticate verifies one token; errors are gRPC status errors.
func (a *Authenticator) Authenticate(ctx context.Context, token string) (Identity, error) {
	sum := sha256.Sum256([]byte(token))
	key := string(sum[:])
	if v, ok := a.cache.Get(key); ok {
		c := v.(cached)
		return c.id, c.err
	}
	id, err, cacheable := a.review(ctx, token)
	if cacheable {
		ttl := a.ttl
		if err != nil {
			ttl = a.ttl / 6 // refusals expire sooner: the fix (an RBAC change, a new token) should apply quickly
		}
		a.cache.Add(key, cached{id, err}, ttl)
	}
	return id, err
}

func (a *Authenticator) review(ctx context.Context, token string) (Identity, error, bool) {
	tr, err := a.client.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
		Spec: authenticationv1.TokenReviewSpec{Token: token, Audiences: []string{Audience}},
	}, metav1.CreateOptions{})
	if err != nil {
		// Not the caller's fault and not cached: the next call retries.
		return Identity{}, status.Errorf(codes.Unavailable, "token review failed: %v", err), false
	}
	if !tr.Status.Authenticated {
		msg := tr.Status.Error
		if msg == "" {
			msg = "token not authenticated"
		}
		return Identity{}, status.Errorf(codes.Unauthenticated, "token rejected: %s", msg), true
	}
	if !audienceOK(tr.Status.Audiences) {
		return Identity{}, status.Errorf(codes.Unauthenticated, "token is not for audience %q", Audience), true
	}
	sa, err := serviceAccount(tr.Status.User.Username)
	if err != nil {
		return Identity{}, status.Error(codes.PermissionDenied, err.Error()), true
	}
	if !a.allowed[sa] {
		return Identity{}, status.Errorf(codes.PermissionDenied, "service account %s is not allowed to call dkc", sa), true
	}
	nodes := tr.Status.User.Extra[NodeNameExtra]
	if len(nodes) != 1 || nodes[0] == "" {
		return Identity{}, status.Errorf(codes.PermissionDenied,
			"token of %s carries no node claim (%s): use a pod-bound or node-bound token on an apiserver >= 1.32", sa, NodeNameExtra), true
	}
	return Identity{Node: nodes[0], ServiceAccount: sa}, nil, true
}

func audienceOK(auds []string) bool {
	if len(auds) == 0 {
		return true // the apiserver only sets audiences when the review asked for them and they intersect
	}
	for _, a := range auds {
		if a == Audience {
			return true
		}
	}
	return false
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
