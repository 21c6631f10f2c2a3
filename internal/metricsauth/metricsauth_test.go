// SPDX-License-Identifier: Apache-2.0

package metricsauth

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"go.uber.org/zap"
	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/client-go/rest"
	certutil "k8s.io/client-go/util/cert"
)

// fakeAuthn knows the tokens of tokens (token → user name) and fails on "broken".
func fakeAuthn(tokens map[string]string) authenticator.Request {
	return authenticator.RequestFunc(func(r *http.Request) (*authenticator.Response, bool, error) {
		h := r.Header.Get("Authorization")
		if h == "" {
			return nil, false, nil
		}
		if h == "Bearer broken" {
			return nil, false, errors.New("tokenreview unavailable")
		}
		name, ok := tokens[h[len("Bearer "):]]
		if !ok {
			return nil, false, errors.New("invalid bearer token")
		}
		return &authenticator.Response{User: &user.DefaultInfo{Name: name}}, true, nil
	})
}

// fakeAuthz allows what allowed lists (user → "verb path"), fails for the user "broken-authz".
func fakeAuthz(allowed map[string]string, seen *[]authorizer.Attributes) authorizer.Authorizer {
	return authorizer.AuthorizerFunc(func(_ context.Context, a authorizer.Attributes) (authorizer.Decision, string, error) {
		*seen = append(*seen, a)
		if a.GetUser().GetName() == "broken-authz" {
			return authorizer.DecisionNoOpinion, "", errors.New("subjectaccessreview unavailable")
		}
		if a.IsResourceRequest() {
			return authorizer.DecisionNoOpinion, "resource request", nil
		}
		if allowed[a.GetUser().GetName()] == a.GetVerb()+" "+a.GetPath() {
			return authorizer.DecisionAllow, "", nil
		}
		return authorizer.DecisionNoOpinion, "no RBAC policy matched", nil
	})
}

// TestHandler: no token 401, an unknown token 401, a known caller without the right 403, with it 200; the
// probe paths 200 without a token; the token does not reach what is served.
func TestHandler(t *testing.T) {
	var seen []authorizer.Attributes
	var gotAuthorization []string
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotAuthorization = append(gotAuthorization, r.Header.Get("Authorization"))
		_, _ = w.Write([]byte("dkc_build_info 1"))
	})
	h := handler(fakeAuthn(map[string]string{"reader": "prometheus", "nobody": "someone", "fails": "broken-authz"}),
		fakeAuthz(map[string]string{"prometheus": "get /metrics"}, &seen), zap.NewNop(), next)
	for _, tc := range []struct {
		name, method, path, token string
		want                      int
	}{
		{"no token", http.MethodGet, "/metrics", "", http.StatusUnauthorized},
		{"unknown token", http.MethodGet, "/metrics", "forged", http.StatusUnauthorized},
		{"review unavailable", http.MethodGet, "/metrics", "broken", http.StatusUnauthorized},
		{"token without the role", http.MethodGet, "/metrics", "nobody", http.StatusForbidden},
		{"reader", http.MethodGet, "/metrics", "reader", http.StatusOK},
		{"reader, another path", http.MethodGet, "/debug/pprof/", "reader", http.StatusForbidden},
		{"reader, another verb", http.MethodPost, "/metrics", "reader", http.StatusForbidden},
		{"authorization fails", http.MethodGet, "/metrics", "fails", http.StatusInternalServerError},
		{"healthz without a token", http.MethodGet, "/healthz", "", http.StatusOK},
		{"readyz without a token", http.MethodGet, "/readyz", "", http.StatusOK},
		{"livez without a token", http.MethodGet, "/livez", "", http.StatusOK},
		{"healthz subpath is not a probe path", http.MethodGet, "/healthz/../metrics", "", http.StatusUnauthorized},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(tc.method, tc.path, nil)
			if tc.token != "" {
				r.Header.Set("Authorization", "Bearer "+tc.token)
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != tc.want {
				t.Errorf("%s %s with token %q: %d %q, want %d", tc.method, tc.path, tc.token, w.Code, w.Body.String(), tc.want)
			}
		})
	}
	for _, a := range seen {
		if a.IsResourceRequest() {
			t.Errorf("authorized as a resource request: %+v", a)
		}
	}
	for _, a := range gotAuthorization {
		if a != "" {
			t.Errorf("the served handler saw Authorization %q; the token should stop at the check", a)
		}
	}
}

// TestNoReviewerServesOnlyProbes: without an apiserver to review tokens (the sidecar's cleanup mode) the
// probe paths are served and nothing else, whatever the token.
func TestNoReviewerServesOnlyProbes(t *testing.T) {
	h := handler(nil, nil, zap.NewNop(), http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) }))
	for path, want := range map[string]int{"/healthz": 200, "/readyz": 200, "/metrics": 401} {
		r := httptest.NewRequest(http.MethodGet, path, nil)
		r.Header.Set("Authorization", "Bearer anything")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != want {
			t.Errorf("GET %s: %d, want %d", path, w.Code, want)
		}
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    Options
		ok   bool
	}{
		{"default", DefaultOptions(), true},
		{"off", Options{}, true},
		{"cert and key", Options{Auth: true, CertFile: "c", KeyFile: "k"}, true},
		{"cert alone", Options{Auth: true, CertFile: "c"}, false},
		{"key alone", Options{Auth: true, KeyFile: "k"}, false},
		{"cert without auth", Options{CertFile: "c", KeyFile: "k"}, false},
	} {
		if err := tc.o.Validate(); (err == nil) != tc.ok {
			t.Errorf("%s: Validate() = %v, want ok %v", tc.name, err, tc.ok)
		}
	}
}

// TestServingTLS: a self-signed certificate when none is given; the given files otherwise, re-read once
// they change.
func TestServingTLS(t *testing.T) {
	g, err := New(DefaultOptions(), nil, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	if len(g.TLS().Certificates) != 1 || g.TLS().MinVersion != tls.VersionTLS12 {
		t.Fatalf("self-signed TLS: %d certificates, min version %x", len(g.TLS().Certificates), g.TLS().MinVersion)
	}

	dir := t.TempDir()
	write := func(host string) {
		c, k, err := certutil.GenerateSelfSignedCertKey(host, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "tls.crt"), c, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "tls.key"), k, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("first.example")
	o := Options{Auth: true, CertFile: filepath.Join(dir, "tls.crt"), KeyFile: filepath.Join(dir, "tls.key")}
	g, err = New(o, nil, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	served := func() string {
		c, err := g.TLS().GetCertificate(&tls.ClientHelloInfo{})
		if err != nil {
			t.Fatal(err)
		}
		if c.Leaf == nil {
			t.Fatal("certificate without its parsed leaf")
		}
		cn, _, _ := strings.Cut(c.Leaf.Subject.CommonName, "@") // GenerateSelfSignedCertKey's CN is host@<time>
		return cn
	}
	if got := served(); got != "first.example" {
		t.Fatalf("serves %q, want first.example", got)
	}
	write("second.example-longer-name") // another size: a change even within the clock's resolution
	if got := served(); got != "second.example-longer-name" {
		t.Errorf("after the files changed serves %q, want second.example-longer-name", got)
	}
	if err := os.WriteFile(filepath.Join(dir, "tls.key"), []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := served(); got != "second.example-longer-name" {
		t.Errorf("with a broken key serves %q, want the previous certificate", got)
	}
	if _, err := New(Options{Auth: true, CertFile: filepath.Join(dir, "missing"), KeyFile: o.KeyFile}, nil, zap.NewNop()); err == nil {
		t.Error("New with a missing certificate file succeeded")
	}
}

// TestServedOverHTTPS: the guard's TLS and handler in front of a real listener; a plain HTTP request to
// it fails.
func TestServedOverHTTPS(t *testing.T) {
	g, err := New(DefaultOptions(), nil, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(g.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })))
	srv.TLS = g.TLS()
	srv.StartTLS()
	defer srv.Close()
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	for path, want := range map[string]int{"/healthz": 200, "/metrics": 401} {
		resp, err := c.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("GET %s: %d, want %d", path, resp.StatusCode, want)
		}
	}
}

// TestDelegatesToTheAPIServer: New's reviews reach the apiserver as the Kubernetes components' do — a
// TokenReview of the bearer token, a SubjectAccessReview of get on the non-resource URL for the user it
// named — and their answers decide; each is cached.
func TestDelegatesToTheAPIServer(t *testing.T) {
	var tokenReviews, accessReviews atomic.Int32
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/apis/authentication.k8s.io/v1/tokenreviews":
			tokenReviews.Add(1)
			var tr authnv1.TokenReview
			if err := json.NewDecoder(r.Body).Decode(&tr); err != nil {
				t.Error(err)
			}
			if names := map[string]string{"reader": "system:serviceaccount:monitoring:prometheus-k8s", "nobody": "someone"}; names[tr.Spec.Token] != "" {
				tr.Status = authnv1.TokenReviewStatus{Authenticated: true, User: authnv1.UserInfo{Username: names[tr.Spec.Token]}}
			}
			_ = json.NewEncoder(w).Encode(tr)
		case "/apis/authorization.k8s.io/v1/subjectaccessreviews":
			accessReviews.Add(1)
			var sar authzv1.SubjectAccessReview
			if err := json.NewDecoder(r.Body).Decode(&sar); err != nil {
				t.Error(err)
			}
			na := sar.Spec.NonResourceAttributes
			sar.Status.Allowed = sar.Spec.ResourceAttributes == nil && na != nil && na.Verb == "get" && na.Path == "/metrics" &&
				sar.Spec.User == "system:serviceaccount:monitoring:prometheus-k8s"
			_ = json.NewEncoder(w).Encode(sar)
		default:
			http.NotFound(w, r)
		}
	}))
	defer api.Close()
	g, err := New(DefaultOptions(), &rest.Config{Host: api.URL}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	h := g.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) }))
	get := func(token string) int {
		r := httptest.NewRequest(http.MethodGet, "/metrics", nil)
		if token != "" {
			r.Header.Set("Authorization", "Bearer "+token)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	for _, tc := range []struct {
		token string
		want  int
	}{{"", 401}, {"forged", 401}, {"nobody", 403}, {"reader", 200}, {"reader", 200}, {"nobody", 403}} {
		if got := get(tc.token); got != tc.want {
			t.Errorf("GET /metrics with token %q: %d, want %d", tc.token, got, tc.want)
		}
	}
	// forged, nobody, reader reviewed once each; nobody and reader authorized once each.
	if tokenReviews.Load() != 3 || accessReviews.Load() != 2 {
		t.Errorf("%d TokenReviews and %d SubjectAccessReviews, want 3 and 2 (the answers cached)", tokenReviews.Load(), accessReviews.Load())
	}
}
