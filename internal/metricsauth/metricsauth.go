// SPDX-License-Identifier: Apache-2.0

// Package metricsauth guards the metrics listeners of dkc-server and dkc-sidecar as the Kubernetes components
// guard their secure ports (kube-scheduler, kube-controller-manager, the kubelet; controller-runtime's
// filters.WithAuthenticationAndAuthorization): HTTPS, the caller's bearer token verified by the
// kube-apiserver (TokenReview), then the caller authorized by it for the request's verb on its non-resource
// URL (SubjectAccessReview: `get` on `/metrics`), both answers cached. The kubelet's probes carry no token:
// the probe paths (AlwaysAllowPaths) are served to anyone, as the components' default
// --authorization-always-allow-paths does.
package metricsauth

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	flag "github.com/spf13/pflag"
	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/authenticatorfactory"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	authenticationv1 "k8s.io/client-go/kubernetes/typed/authentication/v1"
	authorizationv1 "k8s.io/client-go/kubernetes/typed/authorization/v1"
	"k8s.io/client-go/rest"
	certutil "k8s.io/client-go/util/cert"
)

// AlwaysAllowPaths are served without a token: what the kubelet probes (it sends none). They say whether
// the process is up and ready, nothing more, as the Kubernetes components' /healthz, /readyz and /livez.
var AlwaysAllowPaths = []string{"/healthz", "/readyz", "/livez"}

// The caches, as the kubelet's defaults for its own delegated authentication and authorization (the
// kubelet's /metrics is scraped the same way, from every node): one TokenReview per scraper token per
// TokenCacheTTL and one SubjectAccessReview per caller and path per AllowCacheTTL, on each node. With
// Prometheus scraping every 30 s, 5,000 sidecars ask the apiserver ~60 times a second in all.
const (
	TokenCacheTTL = 2 * time.Minute
	AllowCacheTTL = 5 * time.Minute
	// DenyCacheTTL is short: a binding just created lets the scraper in within it.
	DenyCacheTTL = 30 * time.Second
	// ReviewTimeout bounds one review's call to the apiserver.
	ReviewTimeout = 10 * time.Second
)

// retryBackoff is k8s.io/apiserver's DefaultAuthWebhookRetryBackoff (its options package would bring in
// the whole generic apiserver): a review that fails is retried within ~5 s, then the request is refused.
func retryBackoff() *wait.Backoff {
	return &wait.Backoff{Duration: 500 * time.Millisecond, Factor: 1.5, Jitter: 0.2, Steps: 5}
}

// Options are the flags of the metrics listener's protection, shared by dkc-server and dkc-sidecar.
type Options struct {
	// Auth: HTTPS with delegated authentication and authorization (the default). false: plain HTTP, anyone.
	Auth bool
	// CertFile and KeyFile are the serving certificate; none: a self-signed one made at start, in memory.
	CertFile string
	KeyFile  string
}

// DefaultOptions protects the listener, with a self-signed certificate.
func DefaultOptions() Options { return Options{Auth: true} }

// BindFlags registers the flags on fs with o's values as defaults.
func (o *Options) BindFlags(fs *flag.FlagSet) {
	fs.BoolVar(&o.Auth, "metrics-auth", o.Auth, "serve the metrics address over HTTPS and require, on every path but "+
		strings.Join(AlwaysAllowPaths, ", ")+" (the kubelet's probes, which send no token), a bearer token the "+
		"kube-apiserver accepts (TokenReview) whose user it authorizes for get on the path (SubjectAccessReview; the "+
		"ClusterRole dkc-metrics-reader grants get on /metrics), as the Kubernetes components serve theirs. Needs create "+
		"tokenreviews and subjectaccessreviews. false serves plain HTTP to anyone who reaches the address: INSECURE, "+
		"only for scrapers that cannot send a token, behind a network that keeps everyone else out")
	fs.StringVar(&o.CertFile, "metrics-tls-cert-file", o.CertFile,
		"with --metrics-auth: the metrics address's serving certificate "+
			"(PEM, re-read when it changes); default: a self-signed certificate made at start and kept in memory, as the "+
			"Kubernetes components make one (scrapers then skip verification: insecureSkipVerify)")
	fs.StringVar(&o.KeyFile, "metrics-tls-key-file", o.KeyFile, "with --metrics-auth: the key of --metrics-tls-cert-file")
}

// Validate checks the options.
func (o Options) Validate() error {
	if (o.CertFile == "") != (o.KeyFile == "") {
		return errors.New("--metrics-tls-cert-file and --metrics-tls-key-file go together")
	}
	if !o.Auth && o.CertFile != "" {
		return errors.New("--metrics-tls-cert-file needs --metrics-auth: without it the metrics address serves plain HTTP")
	}
	return nil
}

// Guard protects one listener: its TLS configuration and the handler in front of what it serves.
type Guard struct {
	tls   *tls.Config
	authn authenticator.Request
	authz authorizer.Authorizer
	log   *zap.Logger
}

// New builds the guard of o, reviewing through the apiserver that rc reaches. rc nil: only AlwaysAllowPaths
// are served, every other path is refused (the sidecar's cleanup mode, which serves nothing else). Nothing
// is asked of the apiserver until a request comes.
func New(o Options, rc *rest.Config, log *zap.Logger) (*Guard, error) {
	if !o.Auth {
		return nil, errors.New("metrics authentication is off (--metrics-auth=false): nothing to guard")
	}
	g := &Guard{log: log}
	var err error
	if g.tls, err = servingTLS(o, log); err != nil {
		return nil, err
	}
	if rc == nil {
		return g, nil
	}
	rc = rest.CopyConfig(rc)
	rc.UserAgent = strings.TrimPrefix(rc.UserAgent+"/metrics-auth", "/")
	// A limiter of its own (client-go's default, 5/s): scrapers' reviews, cached, never spend the budget of
	// the caller's other requests, and a flood of forged tokens is bounded by it.
	rc.RateLimiter, rc.QPS, rc.Burst = nil, 5, 10
	authnClient, err := authenticationv1.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("metrics authentication: create TokenReview client: %w", err)
	}
	authzClient, err := authorizationv1.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("metrics authorization: create SubjectAccessReview client: %w", err)
	}
	// Anonymous is nil: a request without a token is refused, never passed on as system:anonymous.
	g.authn, _, err = authenticatorfactory.DelegatingAuthenticatorConfig{TokenAccessReviewClient: authnClient,
		TokenAccessReviewTimeout: ReviewTimeout, CacheTTL: TokenCacheTTL, WebhookRetryBackoff: retryBackoff()}.New()
	if err != nil {
		return nil, fmt.Errorf("metrics authentication: %w", err)
	}
	g.authz, err = authorizerfactory.DelegatingAuthorizerConfig{SubjectAccessReviewClient: authzClient,
		AllowCacheTTL: AllowCacheTTL, DenyCacheTTL: DenyCacheTTL, WebhookRetryBackoff: retryBackoff()}.New()
	if err != nil {
		return nil, fmt.Errorf("metrics authorization: %w", err)
	}
	return g, nil
}

// TLS is the listener's TLS configuration.
func (g *Guard) TLS() *tls.Config { return g.tls }

// Handler is next behind the authentication and authorization of g.
func (g *Guard) Handler(next http.Handler) http.Handler {
	return handler(g.authn, g.authz, g.log, next)
}

// handler serves AlwaysAllowPaths to anyone and every other request only to a caller that authn knows and
// authz allows the request's verb (the HTTP method, lower case: get) on its path — what the Kubernetes
// components' filters check for a non-resource URL. 401 without a valid token (also when the review cannot
// be made: the components do the same), 403 when authorization does not allow, 500 when it fails. authn nil:
// every other request is refused.
func handler(authn authenticator.Request, authz authorizer.Authorizer, log *zap.Logger,
	next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if slices.Contains(AlwaysAllowPaths, r.URL.Path) {
			next.ServeHTTP(w, r)
			return
		}
		if authn == nil {
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		}
		resp, ok, err := authn.AuthenticateRequest(r)
		if err != nil || !ok {
			if err != nil {
				log.Debug("metrics request not authenticated", zap.String("path", r.URL.Path), zap.String("remote", r.RemoteAddr),
					zap.Error(err))
			}
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		}
		// The token goes no further than the check.
		r.Header.Del("Authorization")
		attrs := authorizer.AttributesRecord{User: resp.User, Verb: strings.ToLower(r.Method), Path: r.URL.Path}
		decision, reason, err := authz.Authorize(r.Context(), attrs)
		switch {
		case decision == authorizer.DecisionAllow:
			next.ServeHTTP(w, r)
		case err != nil:
			log.Warn("metrics request: authorization failed", zap.String("user", resp.User.GetName()),
				zap.String("path", r.URL.Path), zap.Error(err))
			http.Error(w, "Internal Server Error: authorization failed", http.StatusInternalServerError)
		default:
			log.Debug("metrics request forbidden", zap.String("user", resp.User.GetName()), zap.String("path", r.URL.Path),
				zap.String("reason", reason))
			msg := fmt.Sprintf("Forbidden: user %q may not %s %s", resp.User.GetName(), attrs.Verb, r.URL.Path)
			http.Error(w, msg, http.StatusForbidden)
		}
	})
}

// servingTLS is the listener's TLS: the files of o, re-read when they change, or a self-signed certificate
// for this host. TLS 1.2 and up, as the Kubernetes components' secure ports: scrapers are of every kind, and
// what crosses (a token that may only read metrics, and the metrics) needs no more.
func servingTLS(o Options, log *zap.Logger) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if o.CertFile != "" {
		f := &fileCert{certFile: o.CertFile, keyFile: o.KeyFile, log: log}
		if _, err := f.load(); err != nil {
			return nil, err
		}
		cfg.GetCertificate = func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return f.get() }
		return cfg, nil
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "localhost"
	}
	certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey(host, nil, []string{"localhost"})
	if err != nil {
		return nil, fmt.Errorf("metrics: generate a self-signed certificate: %w", err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("metrics: load the self-signed certificate: %w", err)
	}
	cfg.Certificates = []tls.Certificate{cert}
	return cfg, nil
}

// fileCert is a certificate from files, re-read at a handshake once they have changed (a Secret volume's
// update swaps them), the previous one kept while the new files do not load.
type fileCert struct {
	certFile, keyFile string
	log               *zap.Logger

	mu    sync.Mutex
	cert  *tls.Certificate
	stamp string
}

// currentStamp identifies the files' current contents cheaply: their sizes and modification times.
func (f *fileCert) currentStamp() string {
	var b strings.Builder
	for _, p := range []string{f.certFile, f.keyFile} {
		if st, err := os.Stat(p); err == nil {
			fmt.Fprintf(&b, "%d/%d;", st.Size(), st.ModTime().UnixNano())
		}
	}
	return b.String()
}

func (f *fileCert) load() (*tls.Certificate, error) {
	stamp := f.currentStamp()
	cert, err := tls.LoadX509KeyPair(f.certFile, f.keyFile)
	if err != nil {
		return nil, fmt.Errorf("metrics: load --metrics-tls-cert-file %s and --metrics-tls-key-file %s: %w", f.certFile,
			f.keyFile, err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cert, f.stamp = &cert, stamp
	return &cert, nil
}

func (f *fileCert) get() (*tls.Certificate, error) {
	f.mu.Lock()
	cert, stamp := f.cert, f.stamp
	f.mu.Unlock()
	if f.currentStamp() == stamp {
		return cert, nil
	}
	c, err := f.load()
	if err != nil {
		f.log.Error("reload the metrics serving certificate failed; keeping the previous one", zap.Error(err))
		return cert, nil
	}
	return c, nil
}
