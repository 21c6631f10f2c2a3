// SPDX-License-Identifier: Apache-2.0

// Package server wires the dkc config service together: its configuration (defaults, flags, validation),
// the Kubernetes clients and informers, the controller, the status writer, and the gRPC server with its
// interceptors, health, reflection and metrics. Run is the whole service; cmd/dkc-server only parses flags
// and calls it.
package server

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	flag "github.com/spf13/pflag"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	"k8s.io/client-go/tools/leaderelection"

	"github.com/dkc-dev/dkc/internal/metricsauth"
	"github.com/dkc-dev/dkc/internal/payload"
	"github.com/dkc-dev/dkc/services/internal/auth"
)

// Config is the service's configuration. Build it with DefaultConfig, override from flags (BindFlags),
// then Validate; treat it as immutable afterwards.
type Config struct {
	Kubeconfig string
	// KubeAPIQPS and KubeAPIBurst limit the requests to the apiserver; 0 sizes each to the node count
	// (kubeAPIScale).
	KubeAPIQPS    float64
	KubeAPIBurst  int
	ListenAddress string
	MetricsAddr   string
	// MetricsAuth protects the metrics address (HTTPS, delegated authentication and authorization).
	MetricsAuth    metricsauth.Options
	Profiling      bool
	WebhookAddress string

	TLSCertFile string
	TLSKeyFile  string
	Insecure    bool

	AllowedServiceAccounts []string
	TokenCacheTTL          time.Duration
	// VerifyTokensLocally verifies sidecar tokens with the apiserver's published keys and cached objects,
	// reviewing only what those cannot decide (--verify-tokens-locally).
	VerifyTokensLocally bool
	// TokenReviews have a client and rate limiter of their own (0: sized to the node count,
	// tokenReviewScale), and a per-caller-address limit for tokens not in the cache (see
	// services/internal/auth).
	TokenReviewQPS       float64
	TokenReviewBurst     int
	TokenReviewPeerQPS   float64
	TokenReviewPeerBurst int
	// ConfigNamespaces are the only namespaces whose ConfigMaps Nodes may use (and dkc-server may read).
	ConfigNamespaces []string

	Workers       int
	StatusWorkers int
	// MaxInlineStatusWrites: see nodestatus.Config.MaxInlineWrites.
	MaxInlineStatusWrites int
	// RestartingStatusDelay: see nodestatus.Config.RestartingDelay.
	RestartingStatusDelay time.Duration
	// MaxDirectConfigChanges: see pacing.Config.Limit.
	MaxDirectConfigChanges int

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

	// What a caller may hold before it authenticates (docs/security.md, "Callers and their limits"):
	// connections open at once (0: sized to the Node count, connCap), and of them not yet authenticated
	// (0: no cap of their own), the time a connection gets to finish its TLS handshake and HTTP/2 preface,
	// and to make its first authenticated call (0: no limit), how long a connection with no call open
	// lives, and the largest request message, which grpc-go reads whole before any interceptor runs.
	MaxConnections                          int
	MaxUnauthenticatedConnections           int
	MaxUnauthenticatedConnectionsPerAddress int
	HandshakeTimeout                        time.Duration
	AuthenticationTimeout                   time.Duration
	MaxConnectionIdle                       time.Duration
	MaxRecvMsgSizeKiB                       int

	// What a caller may hold or spend with a valid token (docs/security.md, "Callers and their limits"):
	// authenticated connections per node, connections per IP address authenticated or not, new
	// connections per IP address and second (refused before the TLS handshake), and status reports per node
	// and second. 0 turns each off (the per-address ones where many nodes share an address).
	MaxConnectionsPerNode         int
	MaxConnectionsPerAddress      int
	NewConnectionsPerAddressQPS   float64
	NewConnectionsPerAddressBurst int
	StatusReportsPerNodeQPS       float64
	StatusReportsPerNodeBurst     int

	// Namespace is the namespace dkc-server runs in ($POD_NAMESPACE, from the downward API); when set,
	// Validate refuses flags that name another one for the sidecars' ServiceAccount, and newServer a
	// serving certificate issued for another namespace's Service (a kustomize `namespace:` override).
	Namespace string

	// Leader election for the KubeletConfigPool controller, the one part that must run on one replica at
	// a time (two would each assign up to maxUnavailable nodes). Everything else runs on every replica.
	LeaderElect                 bool
	LeaderElectionID            string
	LeaderElectionNamespace     string // "" is Namespace, else kube-system
	LeaderElectionLeaseDuration time.Duration
	LeaderElectionRenewDeadline time.Duration
	LeaderElectionRetryPeriod   time.Duration
	// PoolWorkers are the pools synced in parallel.
	PoolWorkers int
	// KubeletConfigCheckers is the directory of the dkc-kubelet-check-<minor> helpers with which the pool
	// controller checks a pool's config before any node gets it: "" is the directory of the dkc-server
	// executable (where the image and `make build` put them), "none" checks nothing here (the nodes still do).
	KubeletConfigCheckers string
}

// Client-side limits sized to the node count (scale): the defaults of --kube-api-qps/-burst and
// --token-review-qps/-burst. A fan-out costs each node three requests (the Event of its kubelet restart,
// the status with the new config active, then last-known-good after the trial): 0.2 requests a second per
// Node, with a burst of one per Node, lets one replica take all of them in about 15 s (2,000/s at 10,000
// Nodes; the benchmark's apiserver on 2 cores answers fewer), so dkc's own limiter is never what the
// fleet waits for, and the floor keeps a small cluster at the former fixed defaults. A connected sidecar
// costs a TokenReview per --token-cache-ttl (1 minute: 167/s at 10,000) and one when it connects: 0.05 a
// second per Node (500/s at 10,000) with a burst of 0.2 per Node leaves room for a replica's nodes
// reconnecting after a drain.
var (
	kubeAPIScale     = scale{qps: 50, burst: 100, qpsPerNode: 0.2, burstPerNode: 1}
	tokenReviewScale = scale{qps: auth.DefaultReviewQPS, burst: auth.DefaultReviewBurst, qpsPerNode: 0.05,
		burstPerNode: 0.2}
)

// DefaultConfig returns the defaults, chosen for a production cluster of up to 10,000 nodes.
// It is long on purpose: one flat table, each default beside the reason for its value.
func DefaultConfig() Config {
	return Config{
		ListenAddress:          ":9443",
		MetricsAddr:            ":9090",
		MetricsAuth:            metricsauth.DefaultOptions(),
		WebhookAddress:         ":9444",
		AllowedServiceAccounts: []string{"kube-system/dkc-sidecar"},
		TokenCacheTTL:          time.Minute,
		VerifyTokensLocally:    true,
		TokenReviewPeerQPS:     auth.DefaultPeerQPS,
		TokenReviewPeerBurst:   auth.DefaultPeerBurst,
		ConfigNamespaces:       []string{"kube-system"}, // where the seed workflow puts configs
		Workers:                4,
		// A status write takes up to a second on a busy apiserver, and a worker makes a node's Event and
		// then its status write, one after the other: 256 workers beside 64 inline writes keep ~320 requests
		// in flight, more than the benchmark's bare client (make bench, fleet: with 128, a faster apiserver
		// waited on dkc-server's queue, 4,000 reports deep, ratio 2.2 to the bare client), within what
		// dkc's API Priority and Fairness level queues (server-apf.yaml: 1,024, both replicas' 640). The
		// reports past the inline writes cost a queue entry each instead of a waiting goroutine with its
		// stack; a worker costs its goroutine's stack only.
		StatusWorkers:         256,
		MaxInlineStatusWrites: 64,
		RestartingStatusDelay: 10 * time.Second,
		KeepaliveTime:         time.Minute,
		KeepaliveTimeout:      20 * time.Second,
		MaxConnectionAge:      30 * time.Minute,
		MaxConnAgeGrace:       time.Minute,
		ShutdownGrace:         10 * time.Second,
		LogLevel:              "info",
		ReadBufferSize:        0,
		WriteBufferSize:       8 << 10,
		MaxSendMsgSizeMiB:     4,
		// A sidecar has 2 calls open at once (its WatchConfig stream and a status report); 2 more leave
		// room for a report retried while another is in flight. Every open call may hold a request of
		// --max-recv-msg-size-kib read before auth: 4 x 32 KiB per connection at most.
		MaxConcurrentStreams: 4,
		// Long enough for 10,000 sidecars reconnecting at once (a replica drained: every handshake queues for
		// the same CPU, several seconds' worth on 2 cores), short against grpc-go's 120 s: what a silent
		// connection costs (~11 KB) times the cap, for at most this long.
		HandshakeTimeout: 30 * time.Second,
		// What a flood without a valid token may hold, whatever the Node count: 512 connections of at most
		// ~250 KB each before auth (TestUnauthenticatedFloodIsBounded) is 128 MB, within what the
		// Deployment's memory limit leaves above a 10,000-node peak. Sidecars reconnecting together after a
		// replica is drained wait for TokenReviews (--token-review-qps) long before they wait for this.
		MaxUnauthenticatedConnections: 512,
		// A node has one sidecar, so one connection waiting for its first authenticated call at a time; 16
		// leave room for tools and a node's reconnects. Without it one pod could keep the cap full, and every
		// node that is not connected out, by reconnecting as its connections are reaped.
		MaxUnauthenticatedConnectionsPerAddress: 16,
		// The handshake timeout, plus a TokenReview that waits its longest (10 s), plus room.
		AuthenticationTimeout: time.Minute,
		MaxConnectionIdle:     5 * time.Minute,
		MaxRecvMsgSizeKiB:     32,
		// A sidecar holds one connection; one more while a reconnect overlaps a connection not yet found
		// dead (up to --keepalive-time + --keepalive-timeout), and room for grpcurl with the node's token.
		MaxConnectionsPerNode: 4,
		// A node's address holds its sidecar's connection or two, the replica's own probes do not come here
		// (they use the metrics port), and a tool or two; --max-unauthenticated-connections-per-address and
		// the per-node cap fit beneath it.
		MaxConnectionsPerAddress: 32,
		// A sidecar opens a connection when its stream ends (--max-connection-age, a drained replica) and,
		// while refused, retries within 3 s; the burst covers grpcurl sessions and a few refused attempts in
		// a row. Past it a connect/close loop from one address costs one TLS handshake a second.
		NewConnectionsPerAddressQPS:   1,
		NewConnectionsPerAddressBurst: 16,
		// A sidecar reports when its status changes (two or three reports per assignment, a restart's
		// outcome) and re-sends its latest after a reconnect, one at a time; the burst covers a day's worth
		// of that at once.
		StatusReportsPerNodeQPS:   1,
		StatusReportsPerNodeBurst: 20,
		Namespace:                 os.Getenv("POD_NAMESPACE"),
		// kube-controller-manager's defaults: a new leader within ~15 s of a crash, at one Lease write per
		// 2 s from the leader.
		LeaderElect:                 true,
		LeaderElectionID:            "dkc-server-pools",
		LeaderElectionLeaseDuration: 15 * time.Second,
		LeaderElectionRenewDeadline: 10 * time.Second,
		LeaderElectionRetryPeriod:   2 * time.Second,
		PoolWorkers:                 2,

		// A tenth of a small cluster; a slow, steady pace for a large one (a kubelet restart proves
		// healthy in about a minute: some 600 nodes an hour).
		MaxDirectConfigChanges: 10,
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
	fs.Float64Var(&c.KubeAPIQPS, "kube-api-qps", c.KubeAPIQPS, fmt.Sprintf(
		"sustained requests per second to the apiserver; 0 sizes it to the cluster: %g per Node, at least %g "+
			"(a fan-out costs each node three requests; API Priority and Fairness, deploy/base/server-apf.yaml, "+
			"is what protects the apiserver)", kubeAPIScale.qpsPerNode, kubeAPIScale.qps))
	fs.IntVar(&c.KubeAPIBurst, "kube-api-burst", c.KubeAPIBurst, fmt.Sprintf(
		"burst of requests to the apiserver; 0 sizes it to the cluster: %g per Node, at least %g", kubeAPIScale.burstPerNode,
		kubeAPIScale.burst))
	fs.StringVar(&c.ListenAddress, "listen-address", c.ListenAddress,
		"address of the gRPC API (dkc.v1.ConfigService, health, reflection)")
	fs.StringVar(&c.MetricsAddr, "metrics-address", c.MetricsAddr,
		"address of the endpoint for /metrics (with --metrics-auth: over HTTPS, for callers allowed get on it, the "+
			"ClusterRole dkc-metrics-reader), /healthz and /readyz (to anyone: the kubelet's probes); empty disables it")
	c.MetricsAuth.BindFlags(fs)
	fs.BoolVar(&c.Profiling, "profiling", c.Profiling,
		"serve Go profiles at /debug/pprof/ on the metrics address (with --metrics-auth, for callers "+
			"allowed get on /debug/pprof/*)")
	fs.StringVar(&c.WebhookAddress, "webhook-address", c.WebhookAddress,
		"address of the HTTPS validating webhook for Node writes that change dkc.dev/config-source (path /validate-node); "+
			"empty disables it, and so does --insecure")
	fs.StringVar(&c.TLSCertFile, "tls-cert-file", c.TLSCertFile,
		"serving certificate (PEM); reloaded when the file changes")
	fs.StringVar(&c.TLSKeyFile, "tls-key-file", c.TLSKeyFile, "serving key (PEM); reloaded when the file changes")
	fs.BoolVar(&c.Insecure, "insecure", c.Insecure,
		"serve plaintext gRPC without TLS. FOR TESTS ONLY: tokens cross the network in the clear")
	fs.Var(stringList{&c.AllowedServiceAccounts}, "allowed-service-accounts",
		"comma-separated namespace/name of the service accounts sidecars run as")
	fs.Var(stringList{&c.ConfigNamespaces}, "config-namespaces",
		"comma-separated namespaces whose ConfigMaps Nodes may use as config sources; a source elsewhere is refused by the "+
			"webhook and reported as a sync error. dkc-server needs a Role to list and watch ConfigMaps in each")
	fs.DurationVar(&c.TokenCacheTTL, "token-cache-ttl", c.TokenCacheTTL,
		"how long a TokenReview result is reused (never past the token's expiry); also how often an open config stream's "+
			"token is checked again, so a revoked token loses its stream within it")
	fs.BoolVar(&c.VerifyTokensLocally, "verify-tokens-locally", c.VerifyTokensLocally,
		"verify sidecar tokens in dkc-server, as the apiserver does, with the keys it publishes for ServiceAccount tokens "+
			"(/.well-known/openid-configuration, /openid/v1/jwks, fetched every 5 minutes) and watches of the allowed service "+
			"accounts, their namespaces' pods (metadata only) and Nodes: a restart or failover then costs the apiserver no "+
			"TokenReview per reconnecting node. Whatever these cannot decide (a key not published yet, another issuer, a pod "+
			"not cached yet) is reviewed as with false")
	fs.Float64Var(&c.TokenReviewQPS, "token-review-qps", c.TokenReviewQPS, fmt.Sprintf(
		"sustained TokenReviews per second, through a client and rate limiter of their own so that callers with new or "+
			"garbage tokens cannot spend the budget of Node status writes (--kube-api-qps); a connected sidecar needs one "+
			"per new token and one per --token-cache-ttl (its stream's token is checked again that often). 0 sizes it to the "+
			"cluster: %g per Node, at least %g", tokenReviewScale.qpsPerNode, tokenReviewScale.qps))
	fs.IntVar(&c.TokenReviewBurst, "token-review-burst", c.TokenReviewBurst, fmt.Sprintf(
		"burst of TokenReviews (sidecars reconnecting after a restart); 0 sizes it to the cluster: %g per Node, at least %g",
		tokenReviewScale.burstPerNode, tokenReviewScale.burst))
	fs.Float64Var(&c.TokenReviewPeerQPS, "token-review-per-peer-qps", c.TokenReviewPeerQPS,
		"TokenReviews per second one caller IP address (IPv4 or IPv6, each address on its own, not per /64: the nodes of "+
			"one subnet share its /64) may cause for tokens not in the cache; beyond it calls get ResourceExhausted without "+
			"a review, and cached tokens are never limited. 0 disables it: only where many nodes share one address (a NAT, "+
			"the benchmark's simulated nodes)")
	fs.IntVar(&c.TokenReviewPeerBurst, "token-review-per-peer-burst", c.TokenReviewPeerBurst,
		"TokenReviews one caller address may cause at once (nodes sharing an address that reconnect together)")
	fs.IntVar(&c.Workers, "workers", c.Workers, "nodes resolved in parallel")
	fs.IntVar(&c.StatusWorkers, "status-workers", c.StatusWorkers,
		"node status writes in parallel from the status queue (sync errors, retries, held restarts and the reports "+
			"past --max-inline-status-writes)")
	fs.IntVar(&c.MaxDirectConfigChanges, "max-direct-config-changes", c.MaxDirectConfigChanges,
		"nodes at most that this replica sends a new version of a directly assigned ConfigMap (dkc.dev/config-source, not "+
			"a pool's snapshot) before they report its outcome (running it, or an error): an in-place edit of a ConfigMap "+
			"many Nodes name restarts this many kubelets at a time, and the others keep their config until a slot frees "+
			"(first come, first served; a slot without an outcome frees after 10m). Nodes not Ready are not held back, nor "+
			"pool nodes (their pool paces them), nor a return to the local config. Each replica paces alone: the bound is "+
			"this times the replicas. 0: no bound")
	fs.IntVar(&c.MaxInlineStatusWrites, "max-inline-status-writes", c.MaxInlineStatusWrites,
		"status reports written while their call waits, at most; past it a report is acknowledged as queued and written by "+
			"the status workers (docs/design.md, \"What a status acknowledgement means\"): each waiting call holds a "+
			"goroutine and its stack. 0: no bound")
	fs.DurationVar(&c.RestartingStatusDelay, "restarting-status-delay", c.RestartingStatusDelay,
		"how long a node's \"config assigned, kubelet not yet running it\" status waits for the kubelet restart's outcome "+
			"before it is written to the Node; an outcome reported in time is written instead, which saves a Node write per "+
			"assignment (the original kubelet exited to restart before writing that step, too). 0 writes it at once")
	fs.DurationVar(&c.KeepaliveTime, "keepalive-time", c.KeepaliveTime,
		"ping an idle connection after this long, to find dead nodes")
	fs.DurationVar(&c.KeepaliveTimeout, "keepalive-timeout", c.KeepaliveTimeout,
		"close a connection whose ping is unanswered this long")
	fs.DurationVar(&c.MaxConnectionAge, "max-connection-age", c.MaxConnectionAge,
		"ask clients to reconnect after this long, spreading nodes over replicas; resuming streams re-deliver nothing")
	fs.DurationVar(&c.MaxConnAgeGrace, "max-connection-age-grace", c.MaxConnAgeGrace,
		"time streams get to move after max-connection-age")
	fs.DurationVar(&c.ShutdownGrace, "shutdown-grace", c.ShutdownGrace, "time in-flight calls get to finish on shutdown")
	fs.StringVar(&c.LogLevel, "log-level", c.LogLevel, "debug, info, warn or error")
	fs.BoolVar(&c.LogDevelopment, "log-development", c.LogDevelopment, "human-readable console logs instead of JSON")
	fs.IntVar(&c.ReadBufferSize, "grpc-read-buffer-size", c.ReadBufferSize,
		"per-connection read buffer in bytes; 0 (default) reads frames straight from the TLS connection, "+
			"which costs idle streams nothing")
	fs.IntVar(&c.WriteBufferSize, "grpc-write-buffer-size", c.WriteBufferSize,
		"per-connection write buffer in bytes (shared between writes)")
	fs.IntVar(&c.MaxSendMsgSizeMiB, "max-send-msg-size-mib", c.MaxSendMsgSizeMiB, fmt.Sprintf(
		"largest message sent, in MiB; at least %d, the largest a node accepts (configs beyond %d files or %d MiB are "+
			"never sent: the node gets a sync error)",
		(payload.MaxMessageBytes+1<<20-1)>>20, payload.MaxFiles, payload.MaxBytes>>20))
	fs.IntVar(&c.MaxConcurrentStreams, "max-concurrent-streams", c.MaxConcurrentStreams,
		"calls open at once on one client connection; grpc-go clients queue further calls, a client that opens more "+
			"anyway has them refused. A sidecar needs 2 (its config stream and a status report), and a node has at most one "+
			"config stream per replica: a newer one ends the older. Each open call may hold a request of "+
			"--max-recv-msg-size-kib before it is authenticated")
	fs.IntVar(&c.MaxConnections, "max-connections", c.MaxConnections, fmt.Sprintf(
		"gRPC connections open at once, authenticated or not; a connection past it is closed as soon as it is accepted (a "+
			"sidecar retries within 3s). Each sidecar holds one, and one replica must hold every node while the other is "+
			"drained. 0 sizes it to the cluster: %g per Node, at least %d", connPerNode, connFloor))
	fs.IntVar(&c.MaxUnauthenticatedConnections, "max-unauthenticated-connections", c.MaxUnauthenticatedConnections,
		"gRPC connections open at once on which no call has been authenticated yet (a new connection until its first call "+
			"with a valid token); past it a new connection is closed as soon as it is accepted. Bounds what callers without "+
			"a token can make dkc-server hold, whatever the node count; sidecars reconnecting together wait their turn (each "+
			"retries within 3s). 0: only --max-connections")
	fs.IntVar(&c.MaxUnauthenticatedConnectionsPerAddress, "max-unauthenticated-connections-per-address",
		c.MaxUnauthenticatedConnectionsPerAddress,
		"of --max-unauthenticated-connections, how many one caller IP address may hold (IPv6 addresses one by "+
			"one); a node's sidecar needs one. 0: no limit per address, only where many nodes share one address (a "+
			"NAT, the benchmark's simulated nodes)")
	fs.DurationVar(&c.AuthenticationTimeout, "authentication-timeout", c.AuthenticationTimeout,
		"time a new connection gets to make its first call with a valid token (TLS handshake included); a connection "+
			"that has not is closed. Health checks and reflection (grpcurl) carry no token: their connections are "+
			"closed after it too. 0: no limit")
	fs.DurationVar(&c.HandshakeTimeout, "handshake-timeout", c.HandshakeTimeout,
		"time a new connection gets to complete its TLS handshake and HTTP/2 preface; a connection that has not is "+
			"closed (grpc-go's default is 120s)")
	fs.DurationVar(&c.MaxConnectionIdle, "max-connection-idle", c.MaxConnectionIdle,
		"close a connection that has had no call open this long (a caller whose calls were all refused, a tool that went "+
			"quiet). A sidecar's config stream is always open, so its connection is never idle; grpc-go's default is never")
	fs.IntVar(&c.MaxRecvMsgSizeKiB, "max-recv-msg-size-kib", c.MaxRecvMsgSizeKiB,
		"largest request message, in KiB. grpc-go reads a unary request whole before the auth interceptor runs, so this is "+
			"what each open call of an unauthenticated caller may cost. The largest request dkc's sidecars send is a status "+
			"report: three config sources (under 1 KiB each), an error and its detail (the kubelet's validation message)")
	fs.IntVar(&c.MaxConnectionsPerNode, "max-connections-per-node", c.MaxConnectionsPerNode,
		"authenticated gRPC connections one node may hold to this replica: a node's call that would take one more is "+
			"refused with ResourceExhausted, and its connection is then treated as one without a token "+
			"(--max-unauthenticated-connections-per-address, --authentication-timeout). A sidecar needs one, and two while a "+
			"reconnect overlaps a connection not yet found dead; the rest is room for grpcurl. Bounds what a copy of one "+
			"node's token can hold, so that it cannot fill --max-connections. 0: no limit")
	fs.IntVar(&c.MaxConnectionsPerAddress, "max-connections-per-address", c.MaxConnectionsPerAddress,
		"gRPC connections one caller IP address may hold, authenticated or not (IPv6 addresses one by one); a connection "+
			"past it is closed as soon as it is accepted. A node's sidecar needs one. 0: no limit, only where many nodes "+
			"share one address (a NAT, the benchmark's simulated nodes)")
	fs.Float64Var(&c.NewConnectionsPerAddressQPS, "new-connections-per-address-qps", c.NewConnectionsPerAddressQPS,
		"new gRPC connections per second one caller IP address may open; a connection past it is closed as soon as it is "+
			"accepted, before its TLS handshake, so a client that connects and closes in a loop costs dkc-server no "+
			"handshakes past it. A sidecar connects when its stream ends and retries within 3s while refused. 0: no limit, "+
			"only where many nodes share one address (a NAT, the benchmark's simulated nodes)")
	fs.IntVar(&c.NewConnectionsPerAddressBurst, "new-connections-per-address-burst", c.NewConnectionsPerAddressBurst,
		"new gRPC connections one caller IP address may open at once (grpcurl sessions, a sidecar's retries)")
	fs.Float64Var(&c.StatusReportsPerNodeQPS, "status-reports-per-node-qps", c.StatusReportsPerNodeQPS,
		"ReportStatus calls per second one node may make; past it a call gets ResourceExhausted, which a sidecar "+
			"retries after its backoff with its latest status. A report can cost a Node write, which every node's reports "+
			"share (--kube-api-qps): one node's token must not spend it. A sidecar reports when its status changes, a few "+
			"times per assignment. 0: no limit")
	fs.IntVar(&c.StatusReportsPerNodeBurst, "status-reports-per-node-burst", c.StatusReportsPerNodeBurst,
		"ReportStatus calls one node may make at once")
	fs.BoolVar(&c.LeaderElect, "leader-elect", c.LeaderElect,
		"run the KubeletConfigPool controller only on the replica holding a Lease (coordination.k8s.io); the rest of "+
			"dkc-server runs on every replica. false runs it on every replica: only with one replica")
	fs.StringVar(&c.LeaderElectionID, "leader-election-id", c.LeaderElectionID,
		"name of the Lease the replicas elect the KubeletConfigPool controller's leader with; deploy/base/server-rbac.yaml "+
			"grants get and update of this name only")
	fs.StringVar(&c.LeaderElectionNamespace, "leader-election-namespace", c.LeaderElectionNamespace,
		"namespace of the Lease; empty is --namespace, or kube-system when that is empty too")
	fs.DurationVar(&c.LeaderElectionLeaseDuration, "leader-election-lease-duration", c.LeaderElectionLeaseDuration,
		"how long the other replicas wait after the leader's last renewal before taking the Lease (a crashed "+
			"leader's pools wait this long)")
	fs.DurationVar(&c.LeaderElectionRenewDeadline, "leader-election-renew-deadline", c.LeaderElectionRenewDeadline,
		"how long the leader keeps trying to renew before it stops the controller; less than the lease duration")
	fs.DurationVar(&c.LeaderElectionRetryPeriod, "leader-election-retry-period", c.LeaderElectionRetryPeriod,
		"how often the replicas try to acquire or renew the Lease")
	fs.IntVar(&c.PoolWorkers, "pool-workers", c.PoolWorkers, "KubeletConfigPools synced in parallel (on the leader)")
	fs.StringVar(&c.KubeletConfigCheckers, "kubelet-config-checkers", c.KubeletConfigCheckers,
		"directory of the dkc-kubelet-check-<minor> helpers (one per kubelet minor, as in the sidecar's image): a pool's "+
			"config is checked with the kubelet's own loading and validation for every kubelet minor among the pool's nodes "+
			"before any node gets it, and a refusal sets the pool's ConfigInvalid. Empty: the dkc-server executable's "+
			"directory, where its image has them (without helpers there dkc-server logs a warning and leaves the check to "+
			"the nodes); a directory named here must hold helpers; \"none\": no check here")
	fs.StringVar(&c.Namespace, "namespace", c.Namespace,
		"the namespace dkc-server runs in (default $POD_NAMESPACE, which deploy/ sets from the downward API). When set, "+
			"dkc-server refuses to start if --allowed-service-accounts names no ServiceAccount in it, or if its serving "+
			"certificate names a Service of another namespace (NAME.NAMESPACE.svc) and none of this one: what a kustomize "+
			"namespace: override that missed those leaves behind. Empty skips both checks")
}

// Validate checks the configuration. It reports every problem at once, in the order of the checks below,
// so that one start shows all the flags to fix.
func (c Config) Validate() error {
	var errs []error
	errs = append(errs, c.checkServing()...)
	errs = append(errs, c.checkNames()...)
	errs = append(errs, c.checkWork()...)
	errs = append(errs, c.checkDurations()...)
	errs = append(errs, c.checkConnections()...)
	if err := c.checkNamespace(); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, c.checkPools()...)
	if c.MaxConcurrentStreams < 2 {
		errs = append(errs, errors.New("--max-concurrent-streams must be at least 2 "+
			"(a sidecar's config stream and its status report)"))
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		errs = append(errs, fmt.Errorf("--log-level %q: want debug, info, warn or error", c.LogLevel))
	}
	return errors.Join(errs...)
}

// checkServing checks where and how the API is served: an address, and TLS unless --insecure says
// plaintext on purpose (never both, so that a test flag cannot silently drop a certificate).
func (c Config) checkServing() []error {
	var errs []error
	if c.ListenAddress == "" {
		errs = append(errs, errors.New("--listen-address is required"))
	}
	if err := c.MetricsAuth.Validate(); err != nil {
		errs = append(errs, err)
	}
	if !c.Insecure && (c.TLSCertFile == "" || c.TLSKeyFile == "") {
		errs = append(errs, errors.New("--tls-cert-file and --tls-key-file are required (or --insecure, for tests only)"))
	}
	if c.Insecure && (c.TLSCertFile != "" || c.TLSKeyFile != "") {
		errs = append(errs, errors.New("--insecure conflicts with --tls-cert-file/--tls-key-file"))
	}
	return errs
}

// checkNames checks the names that decide who may connect and which ConfigMaps may be sources: a list
// that is empty or malformed would refuse every sidecar, or every source, at run time instead of at start.
func (c Config) checkNames() []error {
	var errs []error
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
			errs = append(errs, fmt.Errorf("--config-namespaces: %q is not a namespace name: %s",
				ns, strings.Join(msgs, "; ")))
		}
	}
	return errs
}

// checkWork checks the workers and the rates of the work dkc-server does for nodes. Several rates take 0
// for "sized to the node count" or "no bound", so only negatives are refused there.
func (c Config) checkWork() []error {
	var errs []error
	if c.RestartingStatusDelay < 0 {
		errs = append(errs, errors.New("--restarting-status-delay must not be negative"))
	}
	if c.Workers < 1 || c.StatusWorkers < 1 {
		errs = append(errs, errors.New("--workers and --status-workers must be at least 1"))
	}
	if c.TokenReviewQPS < 0 || c.TokenReviewBurst < 0 {
		errs = append(errs, errors.New("--token-review-qps and --token-review-burst must not be negative "+
			"(0: sized to the node count)"))
	}
	if c.TokenReviewPeerQPS < 0 || c.TokenReviewPeerBurst < 1 {
		errs = append(errs, errors.New("--token-review-per-peer-qps must not be negative and "+
			"--token-review-per-peer-burst at least 1"))
	}
	if c.KubeAPIQPS < 0 || c.KubeAPIBurst < 0 {
		errs = append(errs, errors.New("--kube-api-qps and --kube-api-burst must not be negative "+
			"(0: sized to the node count)"))
	}
	if c.MaxDirectConfigChanges < 0 {
		errs = append(errs, errors.New("--max-direct-config-changes must not be negative (0: no bound)"))
	}
	if c.MaxInlineStatusWrites < 0 {
		errs = append(errs, errors.New("--max-inline-status-writes must not be negative"))
	}
	return errs
}

// checkDurations checks the durations that have no "off" value: each of them must be positive.
func (c Config) checkDurations() []error {
	var errs []error
	for name, d := range map[string]time.Duration{
		"--keepalive-time": c.KeepaliveTime, "--keepalive-timeout": c.KeepaliveTimeout,
		"--max-connection-age": c.MaxConnectionAge, "--shutdown-grace": c.ShutdownGrace,
		"--token-cache-ttl": c.TokenCacheTTL,
	} {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("%s must be positive", name))
		}
	}
	return errs
}

// checkConnections checks the limits on connections and messages, which bound what callers (with or
// without a valid token) can make a replica hold. 0 means "no limit of their own" for most of them.
func (c Config) checkConnections() []error {
	var errs []error
	if c.MaxSendMsgSizeMiB<<20 < payload.MaxMessageBytes {
		errs = append(errs, fmt.Errorf("--max-send-msg-size-mib must be at least %d (the largest message a node accepts)",
			(payload.MaxMessageBytes+1<<20-1)>>20))
	}
	if c.MaxConnections < 0 {
		errs = append(errs, errors.New("--max-connections must not be negative (0: sized to the node count)"))
	}
	if c.MaxUnauthenticatedConnections < 0 || c.MaxUnauthenticatedConnectionsPerAddress < 0 ||
		c.AuthenticationTimeout < 0 {
		errs = append(errs, errors.New("--max-unauthenticated-connections, "+
			"--max-unauthenticated-connections-per-address and --authentication-timeout must not be negative "+
			"(0: no limit of their own)"))
	}
	if c.MaxConnectionsPerNode < 0 || c.MaxConnectionsPerAddress < 0 || c.NewConnectionsPerAddressQPS < 0 ||
		c.StatusReportsPerNodeQPS < 0 {
		errs = append(errs, errors.New("--max-connections-per-node, --max-connections-per-address, "+
			"--new-connections-per-address-qps and --status-reports-per-node-qps must not be negative (0: no limit)"))
	}
	if c.NewConnectionsPerAddressBurst < 1 || c.StatusReportsPerNodeBurst < 1 {
		errs = append(errs, errors.New("--new-connections-per-address-burst and --status-reports-per-node-burst "+
			"must be at least 1"))
	}
	if c.AuthenticationTimeout > 0 && c.AuthenticationTimeout < c.HandshakeTimeout+auth.ReviewTimeout {
		errs = append(errs, fmt.Errorf("--authentication-timeout must be 0 or at least --handshake-timeout plus %v "+
			"(a TokenReview's longest wait): sidecars reconnecting together would be closed before their first call "+
			"is answered", auth.ReviewTimeout))
	}
	if c.HandshakeTimeout <= 0 || c.MaxConnectionIdle <= 0 {
		errs = append(errs, errors.New("--handshake-timeout and --max-connection-idle must be positive"))
	}
	if c.MaxRecvMsgSizeKiB < minRecvMsgSizeKiB {
		errs = append(errs, fmt.Errorf("--max-recv-msg-size-kib must be at least %d "+
			"(a status report naming three config sources, with room for its detail)", minRecvMsgSizeKiB))
	}
	return errs
}

// checkPools checks the KubeletConfigPool controller's settings: its leader election and its workers.
func (c Config) checkPools() []error {
	var errs []error
	// client-go's own rules (leaderelection.NewLeaderElector), checked here so that a bad value stops
	// dkc-server at start with the flags' names.
	if c.LeaderElect && (c.LeaderElectionID == "" || c.LeaderElectionRetryPeriod <= 0 ||
		c.LeaderElectionRenewDeadline <= time.Duration(leaderelection.JitterFactor*float64(c.LeaderElectionRetryPeriod)) ||
		c.LeaderElectionLeaseDuration <= c.LeaderElectionRenewDeadline) {
		errs = append(errs, fmt.Errorf("--leader-election-id must be set, and 0 < %g x --leader-election-retry-period "+
			"< --leader-election-renew-deadline < --leader-election-lease-duration", leaderelection.JitterFactor))
	}
	if c.PoolWorkers < 1 {
		errs = append(errs, errors.New("--pool-workers must be at least 1"))
	}
	return errs
}

// LeaseNamespace is where the leader election's Lease lives.
func (c Config) LeaseNamespace() string {
	switch {
	case c.LeaderElectionNamespace != "":
		return c.LeaderElectionNamespace
	case c.Namespace != "":
		return c.Namespace
	}
	return "kube-system"
}

// minRecvMsgSizeKiB is the smallest --max-recv-msg-size-kib: a status report's three sources take up to
// about 2.5 KiB (names of 253 bytes), and its detail needs room.
const minRecvMsgSizeKiB = 8

// checkNamespace refuses --allowed-service-accounts that name no ServiceAccount in dkc-server's own
// namespace. deploy/ installs the sidecars' ServiceAccount beside dkc-server, so a kustomize `namespace:`
// override moves both, while the flag keeps kube-system: every sidecar would be refused as a stranger,
// which shows only as Unauthenticated streams in the logs of every node.
func (c Config) checkNamespace() error {
	if c.Namespace == "" || len(c.AllowedServiceAccounts) == 0 { // none: reported as missing
		return nil
	}
	for _, sa := range c.AllowedServiceAccounts {
		if ns, _, _ := strings.Cut(sa, "/"); ns == c.Namespace {
			return nil
		}
	}
	return fmt.Errorf("dkc-server runs in namespace %q (--namespace, $POD_NAMESPACE) but --allowed-service-accounts=%s "+
		"names no ServiceAccount there, so every sidecar would be refused: deploy/ puts the sidecars' ServiceAccount "+
		"beside dkc-server, and a kustomize namespace: override does not move the whole install. Set "+
		"--allowed-service-accounts=%s/dkc-sidecar and replace kube-system throughout a copy of deploy/base, with a "+
		"serving certificate for dkc-server.%s.svc (docs/install.md, \"Another namespace\"); if the sidecars really run "+
		"elsewhere, set --namespace= to skip this check",
		c.Namespace, strings.Join(c.AllowedServiceAccounts, ","), c.Namespace, c.Namespace)
}
