// SPDX-License-Identifier: Apache-2.0

package auth

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/dkc-dev/dkc/internal/poll"
)

const testIssuer = "https://kubernetes.default.svc.cluster.local"

// signer mints tokens as the apiserver does (k8s.io/kubernetes/pkg/serviceaccount): a key ID in the header,
// the public claims and the kubernetes.io private claims.
type signer struct {
	kid string
	key any // *rsa.PrivateKey or *ecdsa.PrivateKey
	alg jose.SignatureAlgorithm
}

func newRSASigner(t *testing.T, kid string) signer {
	t.Helper()
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	return signer{kid: kid, key: k, alg: jose.RS256}
}

func newECSigner(t *testing.T, kid string) signer {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return signer{kid: kid, key: k, alg: jose.ES256}
}

func (s signer) public() jose.JSONWebKey {
	var pub any
	switch k := s.key.(type) {
	case *rsa.PrivateKey:
		pub = &k.PublicKey
	case *ecdsa.PrivateKey:
		pub = &k.PublicKey
	}
	return jose.JSONWebKey{Key: pub, KeyID: s.kid, Algorithm: string(s.alg), Use: "sig"}
}

// claims of a pod-bound token of sidecarSA's pod "sidecar-1" on node n1, valid from epoch for an hour.
type tokenSpec struct {
	issuer   string
	audience []string
	ns, sa   string
	pod      *objectRef
	node     *objectRef
	secret   *objectRef
	nbf      time.Time
}

func podBound() tokenSpec {
	return tokenSpec{issuer: testIssuer, audience: []string{Audience}, ns: "kube-system", sa: "dkc-sidecar",
		pod: &objectRef{Name: "sidecar-1", UID: "pod-uid"}, node: &objectRef{Name: "n1", UID: "node-uid"}, nbf: epoch}
}

func (s signer) sign(t *testing.T, spec tokenSpec) string {
	t.Helper()
	sig, err := jose.NewSigner(jose.SigningKey{Algorithm: s.alg, Key: s.key},
		(&jose.SignerOptions{}).WithType("JWT").WithHeader(jose.HeaderKey("kid"), s.kid))
	if err != nil {
		t.Fatal(err)
	}
	var private privateClaims
	k := &private.Kubernetes
	k.Namespace, k.ServiceAccount = spec.ns, objectRef{Name: spec.sa, UID: "sa-uid"}
	k.Pod, k.Node, k.Secret = spec.pod, spec.node, spec.secret
	tok, err := jwt.Signed(sig).Claims(jwt.Claims{
		Issuer: spec.issuer, Subject: "system:serviceaccount:" + spec.ns + ":" + spec.sa, Audience: spec.audience,
		IssuedAt: jwt.NewNumericDate(spec.nbf), NotBefore: jwt.NewNumericDate(spec.nbf),
		Expiry: jwt.NewNumericDate(spec.nbf.Add(time.Hour)),
	}).Claims(private).Serialize()
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// keySource is a fake issuer discovery: what it publishes, how often it was asked.
type keySource struct {
	mu      sync.Mutex
	issuer  string
	keys    []jose.JSONWebKey
	err     error
	fetches int
}

func (k *keySource) FetchKeys(context.Context) (string, jose.JSONWebKeySet, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.fetches++
	return k.issuer, jose.JSONWebKeySet{Keys: k.keys}, k.err
}

func (k *keySource) publish(keys ...jose.JSONWebKey) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.keys = keys
}

func (k *keySource) count() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.fetches
}

// objects is a fake Objects: name -> UID of what the caches hold.
type objects struct{ sas, pods, nodes map[string]string }

func (o objects) ServiceAccountUID(ns, name string) (string, bool) {
	u, ok := o.sas[ns+"/"+name]
	return u, ok
}
func (o objects) PodUID(ns, name string) (string, bool) { u, ok := o.pods[ns+"/"+name]; return u, ok }
func (o objects) NodeUID(name string) (string, bool)    { u, ok := o.nodes[name]; return u, ok }

func cached() objects {
	return objects{sas: map[string]string{sidecarSA: "sa-uid"}, pods: map[string]string{"kube-system/sidecar-1": "pod-uid"},
		nodes: map[string]string{"n1": "node-uid"}}
}

// TestLocalVerification: a token the caches and published keys vouch for is decided without a TokenReview;
// one the apiserver signed but dkc must refuse is refused without one; anything else is reviewed.
func TestLocalVerification(t *testing.T) {
	rsaKey, ecKey, stranger := newRSASigner(t, "k1"), newECSigner(t, "k2"), newRSASigner(t, "k1")
	for _, tc := range []struct {
		name    string
		signer  signer
		spec    func(*tokenSpec)
		objects func(*objects)
		// result is verifyLocally's; reviewed whether a TokenReview was sent; code the call's outcome.
		result   string
		reviewed bool
		code     codes.Code
	}{
		{name: "pod-bound token", signer: rsaKey, result: localAccepted},
		{name: "node-bound token", signer: rsaKey, spec: func(s *tokenSpec) { s.pod = nil }, result: localAccepted},
		{name: "ECDSA key", signer: ecKey, result: localAccepted},
		{name: "another audience too", signer: rsaKey, spec: func(s *tokenSpec) { s.audience = []string{"vault", Audience} },
			result: localAccepted},
		{name: "a key the issuer does not publish under its ID", signer: stranger, result: localSignature, reviewed: true,
			code: codes.Unauthenticated},
		{name: "another issuer", signer: rsaKey, spec: func(s *tokenSpec) { s.issuer = "https://old.example" },
			result: localIssuer, reviewed: true},
		{name: "not valid yet", signer: rsaKey, spec: func(s *tokenSpec) { s.nbf = epoch.Add(10 * time.Minute) },
			result: localClaims, reviewed: true},
		{name: "secret-bound", signer: rsaKey, spec: func(s *tokenSpec) { s.secret = &objectRef{Name: "s", UID: "u"} },
			result: localClaims, reviewed: true},
		{name: "pod not cached yet", signer: rsaKey, objects: func(o *objects) { delete(o.pods, "kube-system/sidecar-1") },
			result: localObjects, reviewed: true},
		{name: "pod re-created under its name", signer: rsaKey,
			objects: func(o *objects) { o.pods["kube-system/sidecar-1"] = "new-pod-uid" }, result: localObjects, reviewed: true},
		{name: "node re-created under its name", signer: rsaKey, objects: func(o *objects) { o.nodes["n1"] = "new-node-uid" },
			result: localObjects, reviewed: true},
		{name: "service account re-created", signer: rsaKey, objects: func(o *objects) { o.sas[sidecarSA] = "new" },
			result: localObjects, reviewed: true},
		{name: "not for dkc", signer: rsaKey, spec: func(s *tokenSpec) { s.audience = []string{"vault"} },
			result: localRefused, code: codes.Unauthenticated},
		{name: "a service account dkc does not allow", signer: rsaKey, spec: func(s *tokenSpec) { s.sa = "default" },
			result: localRefused, code: codes.PermissionDenied},
		{name: "no node claim", signer: rsaKey, spec: func(s *tokenSpec) { s.node = nil }, result: localRefused,
			code: codes.PermissionDenied},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rv, cs := newReviewer()
			src := &keySource{issuer: testIssuer, keys: []jose.JSONWebKey{rsaKey.public(), ecKey.public()}}
			o := cached()
			if tc.objects != nil {
				tc.objects(&o)
			}
			clk := clocktesting.NewFakeClock(epoch.Add(time.Minute))
			keys := NewKeys(src, nil, clk)
			keys.refresh(context.Background())
			reg := prometheus.NewRegistry()
			a := newTestAuthenticator(t, Config{Client: cs, Clock: clk, Keys: keys, Objects: o, Metrics: NewMetrics(reg)})
			spec := podBound()
			if tc.spec != nil {
				tc.spec(&spec)
			}
			token := tc.signer.sign(t, spec)
			if tc.code == codes.OK {
				rv.valid(token, "n1", Audience)
			}

			id, err := a.Authenticate(context.Background(), token)
			if got := status.Code(err); got != tc.code {
				t.Fatalf("Authenticate: %v, want code %v", err, tc.code)
			}
			if tc.code == codes.OK && id != (Identity{Node: "n1", ServiceAccount: sidecarSA}) {
				t.Errorf("identity %+v", id)
			}
			if got := rv.count() > 0; got != tc.reviewed {
				t.Errorf("%d TokenReviews, want reviewed=%v", rv.count(), tc.reviewed)
			}
			if got := testutil.ToFloat64(a.metrics.local.WithLabelValues(tc.result)); got != 1 {
				t.Errorf("result %q counted %v times, want once", tc.result, got)
			}
			// Answered from the cache the second time, whichever way it was decided.
			reviews := rv.count()
			if _, err := a.Authenticate(context.Background(), token); status.Code(err) != tc.code || rv.count() != reviews {
				t.Errorf("again: %v and %d reviews, want code %v and %d", err, rv.count(), tc.code, reviews)
			}
		})
	}
}

// TestNoLocalVerificationWithoutKeys: before the keys are fetched (or when discovery is refused), every token
// is reviewed, as without local verification.
func TestNoLocalVerificationWithoutKeys(t *testing.T) {
	rv, cs := newReviewer()
	src := &keySource{err: errors.New("403 Forbidden")}
	clk := clocktesting.NewFakeClock(epoch.Add(time.Minute))
	keys := NewKeys(src, nil, clk)
	keys.refresh(context.Background())
	a := newTestAuthenticator(t, Config{Client: cs, Clock: clk, Keys: keys, Objects: cached()})
	token := rv.valid(newRSASigner(t, "k1").sign(t, podBound()), "n1", Audience)
	if _, err := a.Authenticate(context.Background(), token); err != nil || rv.count() != 1 {
		t.Fatalf("Authenticate: %v after %d reviews, want accepted after one", err, rv.count())
	}
}

// TestKeyRotation: a token signed with a key published after the last fetch is reviewed and asks for a fetch,
// at most one per keyRefetchAfter however many such tokens come; once fetched, its key verifies locally.
func TestKeyRotation(t *testing.T) {
	rv, cs := newReviewer()
	old, next := newRSASigner(t, "old"), newRSASigner(t, "next")
	src := &keySource{issuer: testIssuer, keys: []jose.JSONWebKey{old.public()}}
	clk := clocktesting.NewFakeClock(epoch.Add(time.Minute))
	keys := NewKeys(src, nil, clk)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() { keys.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	poll.Until(t, "the first fetch", func() bool { return src.count() == 1 && clk.HasWaiters() })
	a := newTestAuthenticator(t, Config{Client: cs, Clock: clk, Keys: keys, Objects: cached()})
	src.publish(old.public(), next.public())

	for i := range 3 {
		spec := podBound()
		spec.pod.Name = []string{"a", "b", "c"}[i] // three tokens: none cached
		o := cached()
		o.pods["kube-system/"+spec.pod.Name] = "pod-uid"
		a.objects = o
		token := rv.valid(next.sign(t, spec), "n1", Audience)
		if _, err := a.Authenticate(context.Background(), token); err != nil {
			t.Fatal(err)
		}
	}
	if rv.count() != 3 {
		t.Fatalf("%d reviews before the new key was fetched, want 3", rv.count())
	}
	// The fetch waits for keyRefetchAfter since the last one.
	poll.Until(t, "the refetch waiting", clk.HasWaiters)
	if src.count() != 1 {
		t.Fatalf("%d fetches before keyRefetchAfter passed, want 1", src.count())
	}
	clk.Step(keyRefetchAfter)
	poll.Until(t, "the refetch", func() bool { return src.count() == 2 })
	poll.Until(t, "the new key held", func() bool { _, _, err := keys.lookup("next"); return err == nil })
	spec := podBound()
	if _, err := a.Authenticate(context.Background(), next.sign(t, spec)); err != nil || rv.count() != 3 {
		t.Fatalf("Authenticate with the fetched key: %v, %d reviews, want accepted without one", err, rv.count())
	}
}

// TestAPIServerKeys reads the issuer and the key set from the apiserver's own discovery paths.
func TestAPIServerKeys(t *testing.T) {
	key := newRSASigner(t, "k1")
	set, err := json.Marshal(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{key.public()}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, issuer string
		status       int
		wantErr      bool
	}{
		{name: "served", issuer: testIssuer, status: http.StatusOK},
		{name: "not a URL", issuer: "kubernetes/serviceaccount", status: http.StatusOK, wantErr: true},
		{name: "forbidden", issuer: testIssuer, status: http.StatusForbidden, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if tc.status != http.StatusOK {
					http.Error(w, "forbidden", tc.status)
					return
				}
				switch r.URL.Path {
				case openIDConfigPath:
					_, _ = w.Write([]byte(`{"issuer":"` + tc.issuer + `","jwks_uri":"https://elsewhere.example/keys"}`))
				case jwksPath:
					w.Header().Set("Content-Type", "application/jwk-set+json")
					_, _ = w.Write(set)
				default:
					http.NotFound(w, r)
				}
			}))
			defer srv.Close()
			cs, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL})
			if err != nil {
				t.Fatal(err)
			}
			issuer, keys, err := APIServerKeys{Client: cs.Discovery().RESTClient()}.FetchKeys(context.Background())
			if (err != nil) != tc.wantErr {
				t.Fatalf("FetchKeys: %v, want error %v", err, tc.wantErr)
			}
			if err == nil && (issuer != tc.issuer || len(keys.Keys) != 1 || keys.Keys[0].KeyID != "k1") {
				t.Errorf("issuer %q, keys %+v", issuer, keys.Keys)
			}
		})
	}
}

// TestTokensWaitForTheReplicaToBeReady: a replica accepts connections before its caches are synced; a token
// presented meanwhile waits for Ready instead of costing a TokenReview a moment later would not, and a
// caller that gives up first is told so without one.
func TestTokensWaitForTheReplicaToBeReady(t *testing.T) {
	rv, cs := newReviewer()
	ready := make(chan struct{})
	a := newTestAuthenticator(t, Config{Client: cs, Ready: ready})
	token := rv.valid(sjwt(map[string]any{"iss": testIssuer}), "n1", Audience)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := a.Authenticate(ctx, token); err == nil || rv.count() != 0 {
		t.Fatalf("Authenticate before ready: %v after %d reviews, want an error and none", err, rv.count())
	}
	close(ready)
	if id, err := a.Authenticate(context.Background(), token); err != nil || id.Node != "n1" || rv.count() != 1 {
		t.Fatalf("Authenticate once ready: %+v, %v after %d reviews, want n1 after one", id, err, rv.count())
	}
}

// TestStaleKeysAreNotUsed: keys whose last successful fetch is older than MaxKeyAge — the apiserver may have
// stopped publishing one while fetches fail — verify nothing: the token is reviewed.
func TestStaleKeysAreNotUsed(t *testing.T) {
	rv, cs := newReviewer()
	key := newRSASigner(t, "k1")
	src := &keySource{issuer: testIssuer, keys: []jose.JSONWebKey{key.public()}}
	clk := clocktesting.NewFakeClock(epoch.Add(time.Minute))
	keys := NewKeys(src, nil, clk)
	keys.refresh(context.Background())
	a := newTestAuthenticator(t, Config{Client: cs, Clock: clk, Keys: keys, Objects: cached()})
	fresh := key.sign(t, podBound())
	if _, err := a.Authenticate(context.Background(), fresh); err != nil || rv.count() != 0 {
		t.Fatalf("fresh keys: %v after %d reviews, want accepted without one", err, rv.count())
	}
	src.mu.Lock()
	src.err = errors.New("403 Forbidden")
	src.mu.Unlock()
	clk.Step(MaxKeyAge + time.Second)
	keys.refresh(context.Background())
	spec := podBound()
	spec.nbf = clk.Now().Add(-time.Minute) // a token minted now, valid by its time claims
	token := rv.valid(key.sign(t, spec), "n1", Audience)
	if _, err := a.Authenticate(context.Background(), token); err != nil || rv.count() != 1 || keys.Fetched() {
		t.Fatalf("stale keys: %v after %d reviews, Fetched %v; want accepted by one review, not fetched", err, rv.count(),
			keys.Fetched())
	}
}
