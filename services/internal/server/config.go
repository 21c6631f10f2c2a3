// Package server wires the dkc config service together: its configuration (defaults, flags, validation),
// the Kubernetes clients and informers, the controller, the status writer, and the gRPC server with its
// interceptors, health, reflection and metrics. Run is the whole service; cmd/dkc-server only parses flags
// and calls it.
package server

import (
	"errors"
	"fmt"
	"strings"
	"time"

	flag "github.com/spf13/pflag"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"

	"github.com/dkc-dev/dkc/internal/payload"
	"github.com/dkc-dev/dkc/services/internal/auth"
)

// Config is the service's configuration. Build it with DefaultConfig, override from flags (BindFlags),
// then Validate; treat it as immutable afterwards.
type Config struct {
	Kubeconfig     string
	KubeAPIQPS     float64
	KubeAPIBurst   int
	ListenAddress  string
	MetricsAddr    string
	Profiling      bool
	WebhookAddress string

	TLSCertFile string
	TLSKeyFile  string
	Insecure    bool

	AllowedServiceAccounts []string
	TokenCacheTTL          time.Duration
	// TokenReviews have a client and rate limiter of their own, and a per-caller-address limit for tokens
	// not in the cache (see services/internal/auth).
	TokenReviewQPS       float64
	TokenReviewBurst     int
	TokenReviewPeerQPS   float64
	TokenReviewPeerBurst int
	// ConfigNamespaces are the only namespaces whose ConfigMaps Nodes may use (and dkc-server may read).
	ConfigNamespaces []string

	Workers       int
	StatusWorkers int
	// RestartingStatusDelay: see nodestatus.Config.RestartingDelay.
	RestartingStatusDelay time.Duration

	KeepaliveTime     time.Duration
	KeepaliveTimeout  time.Duration
	MaxConnectionAge  time.Duration
	MaxConnAgeGrace   time.Duration
	ShutdownGrace     time.Duration
	LogLevel          string
	LogDevelopment    bool
	ReadBufferSize    int
	WriteBufferSize   int
	MaxSendMsgSizeMiB int
	// MaxConcurrentStreams caps the calls open at once on one connection (HTTP/2
	// SETTINGS_MAX_CONCURRENT_STREAMS; grpc-go's default is unlimited).
	MaxConcurrentStreams int
}

// DefaultConfig returns the defaults, chosen for a production cluster of up to 5,000 nodes.
func DefaultConfig() Config {
	return Config{
		KubeAPIQPS:             50,
		KubeAPIBurst:           100,
		ListenAddress:          ":9443",
		MetricsAddr:            ":9090",
		WebhookAddress:         ":9444",
		AllowedServiceAccounts: []string{"kube-system/dkc-sidecar"},
		TokenCacheTTL:          time.Minute,
		TokenReviewQPS:         auth.DefaultReviewQPS,
		TokenReviewBurst:       auth.DefaultReviewBurst,
		TokenReviewPeerQPS:     auth.DefaultPeerQPS,
		TokenReviewPeerBurst:   auth.DefaultPeerBurst,
		ConfigNamespaces:       []string{"kube-system"}, // where the seed workflow puts configs
		Workers:                4,
		StatusWorkers:          4,
		RestartingStatusDelay:  10 * time.Second,
		KeepaliveTime:          time.Minute,
		KeepaliveTimeout:       20 * time.Second,
		MaxConnectionAge:       30 * time.Minute,
		MaxConnAgeGrace:        time.Minute,
		ShutdownGrace:          10 * time.Second,
		LogLevel:               "info",
		ReadBufferSize:         0,
		WriteBufferSize:        8 << 10,
		MaxSendMsgSizeMiB:      4,
		// A sidecar has 2 calls open at once (its WatchConfig stream and a status report); tools and tests
		// that act for a few nodes over one connection (grpcurl, the integration tests' 10) fit too.
		MaxConcurrentStreams: 16,
	}
}

type stringList struct{ v *[]string }

func (s stringList) String() string {
	if s.v == nil {
		return ""
	}
	return strings.Join(*s.v, ",")
}

func (s stringList) Type() string { return "strings" }

func (s stringList) Set(v string) error {
	*s.v = nil
	for _, p := range strings.Split(v, ",") {
		if p = strings.TrimSpace(p); p != "" {
			*s.v = append(*s.v, p)
		}
	}
	return nil
}

// BindFlags registers the configuration's flags on fs, with c's values as defaults.
func (c *Config) BindFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Kubeconfig, "kubeconfig", c.Kubeconfig, "kubeconfig of the apiserver; empty means in-cluster config")
	fs.Float64Var(&c.KubeAPIQPS, "kube-api-qps", c.KubeAPIQPS, "sustained requests per second to the apiserver")
	fs.IntVar(&c.KubeAPIBurst, "kube-api-burst", c.KubeAPIBurst, "burst of requests to the apiserver")
	fs.StringVar(&c.ListenAddress, "listen-address", c.ListenAddress, "address of the gRPC API (dkc.v1.ConfigService, health, reflection)")
	fs.StringVar(&c.MetricsAddr, "metrics-address", c.MetricsAddr, "address of the HTTP endpoint for /metrics, /healthz and /readyz; empty disables it")
	fs.BoolVar(&c.Profiling, "profiling", c.Profiling, "serve Go profiles at /debug/pprof/ on the metrics address")
	fs.StringVar(&c.WebhookAddress, "webhook-address", c.WebhookAddress, "address of the HTTPS validating webhook for Node writes that change dkc.dev/config-source (path /validate-node); empty disables it, and so does --insecure")
	fs.StringVar(&c.TLSCertFile, "tls-cert-file", c.TLSCertFile, "serving certificate (PEM); reloaded when the file changes")
	fs.StringVar(&c.TLSKeyFile, "tls-key-file", c.TLSKeyFile, "serving key (PEM); reloaded when the file changes")
	fs.BoolVar(&c.Insecure, "insecure", c.Insecure, "serve plaintext gRPC without TLS. FOR TESTS ONLY: tokens cross the network in the clear")
	fs.Var(stringList{&c.AllowedServiceAccounts}, "allowed-service-accounts", "comma-separated namespace/name of the service accounts sidecars run as")
	fs.Var(stringList{&c.ConfigNamespaces}, "config-namespaces", "comma-separated namespaces whose ConfigMaps Nodes may use as config sources; a source elsewhere is refused by the webhook and reported as a sync error. dkc-server needs a Role to list and watch ConfigMaps in each")
	fs.DurationVar(&c.TokenCacheTTL, "token-cache-ttl", c.TokenCacheTTL, "how long a TokenReview result is reused (never past the token's expiry); also how often an open config stream's token is checked again, so a revoked token loses its stream within it")
	fs.Float64Var(&c.TokenReviewQPS, "token-review-qps", c.TokenReviewQPS, "sustained TokenReviews per second, through a client and rate limiter of their own so that callers with new or garbage tokens cannot spend the budget of Node status writes (--kube-api-qps); a connected sidecar needs one per new token and one per --token-cache-ttl (its stream's token is checked again that often): grow it with the node count")
	fs.IntVar(&c.TokenReviewBurst, "token-review-burst", c.TokenReviewBurst, "burst of TokenReviews (sidecars reconnecting after a restart)")
	fs.Float64Var(&c.TokenReviewPeerQPS, "token-review-per-peer-qps", c.TokenReviewPeerQPS, "TokenReviews per second one caller IP address (IPv6: one /64) may cause for tokens not in the cache; beyond it calls get ResourceExhausted without a review, and cached tokens are never limited. 0 disables it: only where many nodes share one address (a NAT, the benchmark's simulated nodes)")
	fs.IntVar(&c.TokenReviewPeerBurst, "token-review-per-peer-burst", c.TokenReviewPeerBurst, "TokenReviews one caller address may cause at once (nodes sharing an address that reconnect together)")
	fs.IntVar(&c.Workers, "workers", c.Workers, "nodes resolved in parallel")
	fs.IntVar(&c.StatusWorkers, "status-workers", c.StatusWorkers, "node status writes in parallel (sync errors; reports write inline)")
	fs.DurationVar(&c.RestartingStatusDelay, "restarting-status-delay", c.RestartingStatusDelay, "how long a node's \"config assigned, kubelet not yet running it\" status waits for the kubelet restart's outcome before it is written to the Node; an outcome reported in time is written instead, which saves a Node write per assignment (the original kubelet exited to restart before writing that step, too). 0 writes it at once")
	fs.DurationVar(&c.KeepaliveTime, "keepalive-time", c.KeepaliveTime, "ping an idle connection after this long, to find dead nodes")
	fs.DurationVar(&c.KeepaliveTimeout, "keepalive-timeout", c.KeepaliveTimeout, "close a connection whose ping is unanswered this long")
	fs.DurationVar(&c.MaxConnectionAge, "max-connection-age", c.MaxConnectionAge, "ask clients to reconnect after this long, spreading nodes over replicas; resuming streams re-deliver nothing")
	fs.DurationVar(&c.MaxConnAgeGrace, "max-connection-age-grace", c.MaxConnAgeGrace, "time streams get to move after max-connection-age")
	fs.DurationVar(&c.ShutdownGrace, "shutdown-grace", c.ShutdownGrace, "time in-flight calls get to finish on shutdown")
	fs.StringVar(&c.LogLevel, "log-level", c.LogLevel, "debug, info, warn or error")
	fs.BoolVar(&c.LogDevelopment, "log-development", c.LogDevelopment, "human-readable console logs instead of JSON")
	fs.IntVar(&c.ReadBufferSize, "grpc-read-buffer-size", c.ReadBufferSize, "per-connection read buffer in bytes; 0 (default) reads frames straight from the TLS connection, which costs idle streams nothing (8 KiB each saved at 5,000 nodes)")
	fs.IntVar(&c.WriteBufferSize, "grpc-write-buffer-size", c.WriteBufferSize, "per-connection write buffer in bytes (shared between writes)")
	fs.IntVar(&c.MaxSendMsgSizeMiB, "max-send-msg-size-mib", c.MaxSendMsgSizeMiB, fmt.Sprintf("largest message sent, in MiB; at least %d, the largest a node accepts (configs beyond %d files or %d MiB are never sent: the node gets a sync error)",
		(payload.MaxMessageBytes+1<<20-1)>>20, payload.MaxFiles, payload.MaxBytes>>20))
	fs.IntVar(&c.MaxConcurrentStreams, "max-concurrent-streams", c.MaxConcurrentStreams, "calls open at once on one client connection; grpc-go clients queue further calls, a client that opens more anyway has them refused. A sidecar needs 2 (its config stream and a status report), and a node has at most one config stream per replica: a newer one ends the older")
}

// Validate checks the configuration.
func (c Config) Validate() error {
	var errs []error
	if c.ListenAddress == "" {
		errs = append(errs, errors.New("--listen-address is required"))
	}
	if !c.Insecure && (c.TLSCertFile == "" || c.TLSKeyFile == "") {
		errs = append(errs, errors.New("--tls-cert-file and --tls-key-file are required (or --insecure, for tests only)"))
	}
	if c.Insecure && (c.TLSCertFile != "" || c.TLSKeyFile != "") {
		errs = append(errs, errors.New("--insecure conflicts with --tls-cert-file/--tls-key-file"))
	}
	if len(c.AllowedServiceAccounts) == 0 {
		errs = append(errs, errors.New("--allowed-service-accounts must name at least one namespace/name"))
	}
	for _, sa := range c.AllowedServiceAccounts {
		if ns, name, ok := strings.Cut(sa, "/"); !ok || ns == "" || name == "" || strings.Contains(name, "/") {
			errs = append(errs, fmt.Errorf("--allowed-service-accounts: %q is not namespace/name", sa))
		}
	}
	if len(c.ConfigNamespaces) == 0 {
		errs = append(errs, errors.New("--config-namespaces must name at least one namespace"))
	}
	for _, ns := range c.ConfigNamespaces {
		if msgs := apivalidation.ValidateNamespaceName(ns, false); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("--config-namespaces: %q is not a namespace name: %s", ns, strings.Join(msgs, "; ")))
		}
	}
	if c.RestartingStatusDelay < 0 {
		errs = append(errs, errors.New("--restarting-status-delay must not be negative"))
	}
	if c.Workers < 1 || c.StatusWorkers < 1 {
		errs = append(errs, errors.New("--workers and --status-workers must be at least 1"))
	}
	if c.TokenReviewQPS <= 0 || c.TokenReviewBurst < 1 {
		errs = append(errs, errors.New("--token-review-qps must be positive and --token-review-burst at least 1"))
	}
	if c.TokenReviewPeerQPS < 0 || c.TokenReviewPeerBurst < 1 {
		errs = append(errs, errors.New("--token-review-per-peer-qps must not be negative and --token-review-per-peer-burst at least 1"))
	}
	if c.KubeAPIQPS <= 0 || c.KubeAPIBurst < 1 {
		errs = append(errs, errors.New("--kube-api-qps must be positive and --kube-api-burst at least 1"))
	}
	for name, d := range map[string]time.Duration{"--keepalive-time": c.KeepaliveTime, "--keepalive-timeout": c.KeepaliveTimeout,
		"--max-connection-age": c.MaxConnectionAge, "--shutdown-grace": c.ShutdownGrace, "--token-cache-ttl": c.TokenCacheTTL} {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("%s must be positive", name))
		}
	}
	if c.MaxSendMsgSizeMiB<<20 < payload.MaxMessageBytes {
		errs = append(errs, fmt.Errorf("--max-send-msg-size-mib must be at least %d (the largest message a node accepts)", (payload.MaxMessageBytes+1<<20-1)>>20))
	}
	if c.MaxConcurrentStreams < 2 {
		errs = append(errs, errors.New("--max-concurrent-streams must be at least 2 (a sidecar's config stream and its status report)"))
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		errs = append(errs, fmt.Errorf("--log-level %q: want debug, info, warn or error", c.LogLevel))
	}
	return errors.Join(errs...)
}
