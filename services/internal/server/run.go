// SPDX-License-Identifier: Apache-2.0

package server

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/go-logr/zapr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapgrpc"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/grpclog"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	coordinationv1 "k8s.io/client-go/kubernetes/typed/coordination/v1"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/dkc-dev/dkc/api/generated/clientset"
	"github.com/dkc-dev/dkc/api/v1alpha1"
	"github.com/dkc-dev/dkc/internal/configcheck"
	"github.com/dkc-dev/dkc/internal/httpserve"
	"github.com/dkc-dev/dkc/internal/metricsauth"
	"github.com/dkc-dev/dkc/internal/version"
	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
	"github.com/dkc-dev/dkc/services/internal/admission"
	"github.com/dkc-dev/dkc/services/internal/assignment"
	"github.com/dkc-dev/dkc/services/internal/auth"
	"github.com/dkc-dev/dkc/services/internal/configmaps"
	"github.com/dkc-dev/dkc/services/internal/controller"
	"github.com/dkc-dev/dkc/services/internal/nodestatus"
	"github.com/dkc-dev/dkc/services/internal/pacing"
	poolcontroller "github.com/dkc-dev/dkc/services/internal/pool/controller"
	"github.com/dkc-dev/dkc/services/internal/pool/records"
	"github.com/dkc-dev/dkc/services/internal/queuemetrics"
	"github.com/dkc-dev/dkc/services/internal/resolve"
	"github.com/dkc-dev/dkc/services/internal/rpc"
)

// server is dkc-server's parts, built by newServer in dependency order; Run runs them.
type server struct {
	cfg       Config
	log       *zap.Logger
	tlsConfig *tls.Config // nil with --insecure
	reg       *prometheus.Registry
	factory   informers.SharedInformerFactory
	// tokenKeys and tokenObjects verify sidecar tokens without TokenReviews; nil with
	// --verify-tokens-locally=false.
	tokenKeys    *auth.Keys
	tokenObjects *auth.InformerObjects
	// ready is closed once the replica serves (its caches synced): calls wait for it to authenticate.
	ready      chan struct{}
	namespaces resolve.Namespaces
	ctrl       *controller.Controller
	pacer      *pacing.Pacer
	writer     *nodestatus.Writer
	svc        *rpc.Service
	health     *health.Server
	grpc       *grpc.Server
	conns      *connLimiter
	// The client-side limits of the apiserver client and the TokenReview client, sized to the Node cache.
	apiLimiter, reviewLimiter *scaledLimiter
	nodes                     corelisters.NodeLister
	client                    kubernetes.Interface
	// newPools builds the KubeletConfigPool controller for one term as leader; events records on pools.
	newPools func() *poolcontroller.Controller
	events   record.EventBroadcaster

	// metricsGuard protects the metrics address; nil with --metrics-auth=false.
	metricsGuard *metricsauth.Guard
}

// Run runs the config service until ctx ends, then shuts down gracefully: health turns NOT_SERVING, gRPC
// stops accepting and gives in-flight calls ShutdownGrace to finish, then everything stops.
//
// Several replicas may run at once: each resolves every node independently (the result is a function of the
// cluster), serves whichever nodes connect to it, and writes only the status of nodes that reported to it,
// skipping writes the Node already shows — so no leader election is needed for any of that. The one
// exception is the KubeletConfigPool controller (runPools): it runs on the replica holding a Lease.
func Run(ctx context.Context, cfg Config, log *zap.Logger) error {
	// gRPC's and client-go's own logs go through zap too.
	grpclog.SetLoggerV2(zapgrpc.NewLogger(log.Named("grpc-go").WithOptions(zap.IncreaseLevel(zap.WarnLevel))))
	klog.SetLogger(zapr.NewLogger(log.Named("client-go")))
	s, err := newServer(cfg, log)
	if err != nil {
		return err
	}
	return s.run(ctx)
}

// newServer builds the parts, each from those before it: the apiserver client, the serving credentials,
// the parts that serve nodes (buildNodeParts), then the gRPC server in front of them.
func newServer(cfg Config, log *zap.Logger) (*server, error) {
	s := &server{cfg: cfg, log: log, reg: prometheus.NewRegistry(),
		namespaces: resolve.NewNamespaces(cfg.ConfigNamespaces...)}
	restCfg, err := restConfig(cfg)
	if err != nil {
		return nil, err
	}
	if err := s.buildMetricsGuard(restCfg); err != nil {
		return nil, err
	}
	s.apiLimiter = newScaledLimiter(kubeAPIScale.fixed(cfg.KubeAPIQPS, cfg.KubeAPIBurst))
	s.reviewLimiter = newScaledLimiter(tokenReviewScale.fixed(cfg.TokenReviewQPS, cfg.TokenReviewBurst))
	restCfg.RateLimiter = s.apiLimiter
	client, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return nil, fmt.Errorf("create kubernetes client: %w", err)
	}
	creds, err := s.buildCredentials()
	if err != nil {
		return nil, err
	}
	s.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		version.NewCollector())
	authn, err := s.buildNodeParts(client, restCfg)
	if err != nil {
		return nil, err
	}
	s.buildGRPC(creds, authn)
	return s, nil
}

// buildMetricsGuard protects the metrics address with the apiserver's authentication and authorization;
// without --metrics-auth it says loudly that anyone may read it.
func (s *server) buildMetricsGuard(restCfg *rest.Config) error {
	cfg := s.cfg
	if cfg.MetricsAddr != "" && cfg.MetricsAuth.Auth {
		var err error
		if s.metricsGuard, err = metricsauth.New(cfg.MetricsAuth, restCfg, s.log.Named("metrics")); err != nil {
			return err
		}
	} else if cfg.MetricsAddr != "" {
		s.log.Warn("SERVING METRICS OVER PLAIN HTTP TO ANYONE (--metrics-auth=false)", zap.String("address", cfg.MetricsAddr))
	}
	return nil
}

// buildCredentials loads the serving certificate, reloaded when its files change, and refuses one issued
// for another namespace's Service; nil credentials (plaintext) with --insecure.
func (s *server) buildCredentials() (credentials.TransportCredentials, error) {
	cfg, log := s.cfg, s.log
	if cfg.Insecure {
		log.Warn("SERVING PLAINTEXT gRPC (--insecure): node tokens cross the network in the clear; for tests only")
		return nil, nil
	}
	reloader, err := newCertReloader(cfg.TLSCertFile, cfg.TLSKeyFile, func(err error) {
		log.Error("reload TLS certificate failed; keeping the previous one", zap.Error(err))
	})
	if err != nil {
		return nil, err
	}
	if err := checkCertNamespace(cfg.TLSCertFile, reloader.cert, cfg.Namespace); err != nil {
		return nil, err
	}
	s.tlsConfig = serverTLSConfig(reloader.GetCertificate)
	return credentials.NewTLS(s.tlsConfig.Clone()), nil
}

// buildNodeParts builds what serves nodes, around the one informer factory: the controller that resolves
// them into the assignment table, the status writer, the gRPC service and its authenticator (returned
// for the gRPC server), and the KubeletConfigPool controller. The assignment table and the status writer
// meet through a queue made first (nodestatus.Pending), the status writer and the gRPC service through
// the registry of open streams (rpc.Streams); the controller builds its own ConfigMap tracker.
func (s *server) buildNodeParts(client *kubernetes.Clientset, restCfg *rest.Config) (*auth.Authenticator, error) {
	cfg, log := s.cfg, s.log
	// One informer factory; cached Nodes are stripped of what dkc never reads, so 5,000 Nodes stay cheap.
	s.factory = informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTransform(stripNode))
	nodeInformer := s.factory.Core().V1().Nodes()
	s.nodes = nodeInformer.Lister()
	queueMetrics := queuemetrics.New(s.reg)
	pending := nodestatus.NewPending(queueMetrics, nil)
	table := assignment.NewTable(pending.Add)
	// Every replica serves pools' revision snapshots, so every replica reads what the pools record of them.
	pools, err := poolClient(restCfg)
	if err != nil {
		return nil, err
	}
	// A deleted Node leaves the table, the ConfigMap tracker and the resolved configs in the controller; its
	// status report goes through the status queue.
	// The pacer wakes waiting nodes through the controller, which asks it about each node it resolves.
	s.pacer = pacing.New(pacing.Config{Log: log.Named("pacing"), Limit: cfg.MaxDirectConfigChanges,
		Metrics: pacing.NewMetrics(s.reg), Wake: func(node string) { s.ctrl.Wake(node) }})
	s.ctrl = controller.New(controller.Config{Log: log.Named("controller"), Nodes: nodeInformer, Table: table,
		Namespaces: s.namespaces,
		ConfigMaps: func(onChange func(key string)) controller.ConfigMaps {
			return configmaps.New(configmaps.Config{Log: log.Named("configmaps"), Client: client, Namespaces: s.namespaces,
				OnChange: onChange})
		},
		Snapshots: func(onChange func(key string), onPreview func(pool string)) controller.Snapshots {
			return records.New(records.Config{Log: log.Named("records"), Pools: pools, OnChange: onChange,
				OnPreview: onPreview})
		},
		Forget: pending.Add, QueueMetrics: queueMetrics, Pacer: s.pacer})
	// The writer writes unprompted (sync errors, retries) only for nodes streaming from this replica: a
	// node that moved to another replica would otherwise get this replica's older report written back.
	streams := rpc.NewStreams()
	s.writer = nodestatus.New(nodestatus.Config{Log: log.Named("nodestatus"), Client: client,
		Nodes: nodeInformer.Lister(), Table: table, Metrics: nodestatus.NewMetrics(s.reg), Pending: pending,
		Serving: streams.Serving, RestartingDelay: cfg.RestartingStatusDelay, MaxInlineWrites: cfg.MaxInlineStatusWrites})
	reviewClient, err := reviewClient(restCfg, s.reviewLimiter)
	if err != nil {
		return nil, err
	}
	if err := s.buildTokenVerification(client, restCfg); err != nil {
		return nil, err
	}
	s.ready = make(chan struct{})
	authCfg := auth.Config{Client: reviewClient, Allowed: cfg.AllowedServiceAccounts, TTL: cfg.TokenCacheTTL,
		PeerQPS: cfg.TokenReviewPeerQPS, PeerBurst: cfg.TokenReviewPeerBurst, Metrics: auth.NewMetrics(s.reg),
		Ready: s.ready}
	if s.tokenObjects != nil {
		authCfg.Keys, authCfg.Objects = s.tokenKeys, s.tokenObjects
	}
	authn := auth.New(authCfg)
	// Each WatchConfig stream checks its token again once per --token-cache-ttl: a revoked token loses its
	// stream within the TTL instead of at the connection's max age.
	s.svc = rpc.New(rpc.Config{Log: log.Named("rpc"), Table: table, Status: s.writer, Metrics: rpc.NewMetrics(s.reg),
		Streams: streams, Reauth: authn})
	s.registerGauges(table)
	if err := s.buildPools(client, pools, nodeInformer, queueMetrics); err != nil {
		return nil, err
	}
	return authn, nil
}

// buildTokenVerification prepares what verifies sidecar tokens without a TokenReview
// (--verify-tokens-locally): the issuer's keys, fetched through the discovery client (JSON, the apiserver's
// own paths), and watches of the objects a token names, metadata only; Nodes come from the Node cache.
func (s *server) buildTokenVerification(client *kubernetes.Clientset, restCfg *rest.Config) error {
	if !s.cfg.VerifyTokensLocally {
		return nil
	}
	meta, err := metadata.NewForConfig(restCfg)
	if err != nil {
		return fmt.Errorf("create metadata client: %w", err)
	}
	s.tokenKeys = auth.NewKeys(auth.APIServerKeys{Client: client.Discovery().RESTClient()}, s.log.Named("tokenkeys"), nil)
	s.tokenObjects = auth.NewInformerObjects(meta, s.cfg.AllowedServiceAccounts, func(name string) (string, bool) {
		n, err := s.nodes.Get(name)
		if err != nil || n.DeletionTimestamp != nil {
			return "", false
		}
		return string(n.UID), true
	})
	return nil
}

// tokenVerificationWait bounds how long a starting replica waits, once its Node cache is synced, for the
// issuer's keys and its token watches before it serves: nodes that reconnect before those are ready cost a
// TokenReview each, but a cluster whose discovery is refused must not keep the replica from serving.
const tokenVerificationWait = 10 * time.Second

// waitTokenVerification waits, at most tokenVerificationWait, until sidecar tokens can be verified here.
func (s *server) waitTokenVerification(ctx context.Context) {
	if s.tokenObjects == nil {
		return
	}
	ready := func(context.Context) (bool, error) { return s.tokenKeys.Fetched() && s.tokenObjects.HasSynced(), nil }
	wctx, cancel := context.WithTimeout(ctx, tokenVerificationWait)
	defer cancel()
	if err := wait.PollUntilContextCancel(wctx, 50*time.Millisecond, true, ready); err != nil && ctx.Err() == nil {
		s.log.Warn("serving before sidecar tokens can be verified here; they go to TokenReview until they can",
			zap.Bool("issuerKeysFetched", s.tokenKeys.Fetched()), zap.Bool("tokenWatchesSynced", s.tokenObjects.HasSynced()),
			zap.Duration("waited", tokenVerificationWait))
	}
}

// buildGRPC builds the gRPC server, NOT_SERVING until the caches sync, behind the connection limits.
func (s *server) buildGRPC(creds credentials.TransportCredentials, authn *auth.Authenticator) {
	cfg := s.cfg
	s.health = health.NewServer()
	s.setServing(healthpb.HealthCheckResponse_NOT_SERVING)
	s.conns = newConnLimiter(connLimits{max: cfg.MaxConnections, maxUnauthenticated: cfg.MaxUnauthenticatedConnections,
		maxUnauthenticatedPerAddress: cfg.MaxUnauthenticatedConnectionsPerAddress, authTimeout: cfg.AuthenticationTimeout,
		maxPerAddress: cfg.MaxConnectionsPerAddress, maxPerNode: cfg.MaxConnectionsPerNode,
		newPerAddressQPS: cfg.NewConnectionsPerAddressQPS, newPerAddressBurst: cfg.NewConnectionsPerAddressBurst,
		tcpUserTimeout: cfg.KeepaliveTimeout}, s.reg)
	s.grpc = newGRPCServer(cfg, s.log, grpcParts{creds: creds, authn: authn, svc: s.svc, health: s.health, conns: s.conns,
		reports: newReportLimiter(cfg.StatusReportsPerNodeQPS, cfg.StatusReportsPerNodeBurst, s.reg)})
}

// buildPools prepares the KubeletConfigPool controller, which runs only while this replica leads
// (runPools): its metrics and event recorder are made once.
func (s *server) buildPools(client kubernetes.Interface, pools clientset.Interface, nodes coreinformers.NodeInformer,
	queueMetrics workqueue.MetricsProvider) error {
	s.client = client
	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return fmt.Errorf("register %s: %w", v1alpha1.GroupVersion, err)
	}
	s.events = record.NewBroadcaster()
	recorder := s.events.NewRecorder(scheme, corev1.EventSource{Component: "dkc-server"})
	metrics := poolcontroller.NewMetrics(s.reg)
	kubelets, err := s.kubeletCheckers()
	if err != nil {
		return err
	}
	s.newPools = func() *poolcontroller.Controller {
		return poolcontroller.New(poolcontroller.Config{Log: s.log.Named("pools"), Client: client, Pools: pools, Nodes: nodes,
			Namespaces: s.namespaces, Recorder: recorder, Metrics: metrics,
			Workers: s.cfg.PoolWorkers, QueueMetrics: queueMetrics,
			Kubelets: kubelets, Previews: true})
	}
	return nil
}

// kubeletCheckers finds the helpers the pool controller checks configs with (--kubelet-config-checkers).
// Missing from the default directory (a dkc-server built alone), they are logged and the nodes check
// alone; missing from a directory the operator named, dkc-server does not start.
func (s *server) kubeletCheckers() (poolcontroller.KubeletChecker, error) {
	dir, named := s.cfg.KubeletConfigCheckers, true
	switch dir {
	case "none":
		s.log.Info("pool configs are not checked with the kubelet's code before their rollout " +
			"(--kubelet-config-checkers=none); each node checks them")
		return nil, nil
	case "":
		exe, err := os.Executable()
		if err != nil {
			s.log.Warn("pool configs are not checked with the kubelet's code before their rollout; each node checks them",
				zap.Error(err))
			return nil, nil
		}
		dir, named = filepath.Dir(exe), false
	}
	h, err := configcheck.FindHelpers(dir)
	switch {
	case err != nil && !named:
		s.log.Warn("pool configs are not checked with the kubelet's code before their rollout; each node checks them",
			zap.Error(err))
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("--kubelet-config-checkers: %w", err)
	}
	s.log.Info("pool configs are checked with the kubelet's code before their rollout", zap.String("dir", dir),
		zap.String("kubeletMinors", h.Range()))
	return h, nil
}

// runPools runs the KubeletConfigPool controller while this replica holds the Lease (or always, without
// --leader-elect), until ctx ends. A replica that loses the Lease stops its controller and competes
// again; on shutdown the leader releases the Lease (ReleaseOnCancel), so the other replica takes over
// within a retry period instead of a lease duration.
func (s *server) runPools(ctx context.Context) error {
	s.events.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: s.client.CoreV1().Events("")})
	defer s.events.Shutdown()
	cfg := s.cfg
	if !cfg.LeaderElect {
		return s.newPools().Run(ctx)
	}
	identity := hostname() + "_" + string(uuid.NewUUID())
	return elect(ctx, s.client.CoordinationV1(), cfg, identity, s.log.Named("leader-election"),
		func(ctx context.Context) error {
			return s.newPools().Run(ctx)
		})
}

// elect runs lead while identity holds the Lease cfg names, competing again after each term, until ctx
// ends; it returns once the last term's lead has returned. Terms never overlap in this process: a term's
// lead may still be stopping (its workers finishing a sync) when the next term begins, which then waits.
//
// The elector runs on a context of its own, which ends only once the lead has returned: ReleaseOnCancel
// releases the Lease as soon as the elector's context ends, and a lead still finishing a Node patch would
// then overlap the next leader's first sync. Not leading, the elector stops with ctx.
func elect(ctx context.Context, leases coordinationv1.CoordinationV1Interface, cfg Config, identity string,
	log *zap.Logger, lead func(context.Context) error) error {
	id := cfg.LeaderElectionID
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: cfg.LeaseNamespace(), Name: id},
		Client:     leases,
		LockConfig: resourcelock.ResourceLockConfig{Identity: identity},
	}
	log = log.With(zap.String("lease", cfg.LeaseNamespace()+"/"+id), zap.String("identity", identity))
	var term sync.Mutex
	for ctx.Err() == nil {
		electCtx, stopElector := context.WithCancel(context.WithoutCancel(ctx))
		var mu sync.Mutex // guards leading, against ctx's end
		leading, led := false, false
		stopWithCtx := context.AfterFunc(ctx, func() {
			mu.Lock()
			defer mu.Unlock()
			if !leading {
				stopElector()
			}
		})
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock: lock, Name: id, ReleaseOnCancel: true,
			LeaseDuration: cfg.LeaderElectionLeaseDuration, RenewDeadline: cfg.LeaderElectionRenewDeadline,
			RetryPeriod: cfg.LeaderElectionRetryPeriod,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(lctx context.Context) {
					term.Lock()
					defer term.Unlock()
					mu.Lock()
					if lctx.Err() != nil || ctx.Err() != nil {
						mu.Unlock()
						return
					}
					leading, led = true, true
					mu.Unlock()
					defer func() {
						mu.Lock()
						defer mu.Unlock()
						leading = false
						if ctx.Err() != nil {
							stopElector() // releases the Lease, now that nothing of this term writes
						}
					}()
					runCtx, cancel := context.WithCancel(lctx)
					defer cancel()
					defer context.AfterFunc(ctx, cancel)()
					log.Info("leading: running the kubeletconfigpool controller")
					if err := lead(runCtx); err != nil {
						log.Error("kubeletconfigpool controller stopped", zap.Error(err))
					}
				},
				OnStoppedLeading: func() {
					mu.Lock()
					defer mu.Unlock()
					if led {
						log.Info("not leading: kubeletconfigpool controller stopped")
					}
				},
				OnNewLeader: func(leader string) { log.Info("kubeletconfigpool leader", zap.String("leader", leader)) },
			},
		})
		if err != nil {
			stopWithCtx()
			stopElector()
			return fmt.Errorf("leader election: %w", err)
		}
		le.Run(electCtx)
		stopWithCtx()
		stopElector()
	}
	// Empty on purpose: taking the lock waits until the last term's lead has returned.
	term.Lock()
	term.Unlock() //nolint:staticcheck // SA2001: the empty critical section above
	return nil
}

func hostname() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "dkc-server"
	}
	return h
}

func (s *server) registerGauges(table *assignment.Table) {
	s.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "dkc", Subsystem: "server",
		Name: "watched_configmaps",
		Help: "ConfigMap watches held because some Node references a ConfigMap: one per ConfigMap, or one per namespace " +
			"past configmaps.NamespaceThreshold referenced in it."},
		func() float64 { return float64(s.ctrl.WatchedConfigMaps()) }))
	s.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "dkc", Subsystem: "server",
		Name: "resolved_nodes",
		Help: "Nodes with a resolved desired state."}, func() float64 { return float64(table.Len()) }))
	s.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "dkc", Subsystem: "server",
		Name: "resolved_configs",
		Help: "ConfigMap versions held resolved, each shared by the Nodes on it."},
		func() float64 { return float64(s.ctrl.ResolvedConfigs()) }))
	s.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "dkc", Subsystem: "server",
		Name: "reported_nodes",
		Help: "Nodes whose latest status report this replica holds."},
		func() float64 { return float64(s.writer.Reported()) }))
}

func (s *server) setServing(st healthpb.HealthCheckResponse_ServingStatus) {
	s.health.SetServingStatus("", st)
	s.health.SetServingStatus(dkcv1.ConfigService_ServiceDesc.ServiceName, st)
}

// run serves until ctx ends, then shuts down in order: NOT_SERVING, streams ended, gRPC stopped gracefully
// within ShutdownGrace, HTTP listeners shut down, informers stopped.
func (s *server) run(ctx context.Context) error {
	cfg := s.cfg
	tcp, err := net.Listen("tcp", cfg.ListenAddress)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.ListenAddress, err)
	}
	lis := s.conns.wrap(tcp)
	s.log.Info("config service starting", zap.String("version", version.Get()), zap.String("address", lis.Addr().String()),
		zap.Bool("tls", !cfg.Insecure),
		zap.Strings("allowedServiceAccounts", cfg.AllowedServiceAccounts), zap.Stringer("configNamespaces", s.namespaces))

	g, gctx := errgroup.WithContext(ctx)
	s.factory.Start(gctx.Done())
	if s.tokenObjects != nil {
		s.tokenObjects.Start(gctx.Done())
		g.Go(func() error { s.tokenKeys.Run(gctx); return nil })
	}
	g.Go(func() error { return s.ctrl.Run(gctx, cfg.Workers) })
	g.Go(func() error { return s.pacer.Run(gctx) })
	g.Go(func() error { return s.writer.Run(gctx, cfg.StatusWorkers, cfg.ShutdownGrace) })
	g.Go(func() error { return s.runPools(gctx) })
	for _, l := range []*scaledLimiter{s.apiLimiter, s.reviewLimiter} {
		g.Go(func() error { l.run(gctx, s.nodes, limitResizeInterval); return nil })
	}
	g.Go(func() error { s.conns.follow(gctx, s.nodes, limitResizeInterval); return nil })
	g.Go(func() error {
		// Serve only once the Node cache is synced: before that every node would look unknown.
		if cache.WaitForNamedCacheSync("dkc-server", gctx.Done(), s.ctrl.Synced) {
			s.waitTokenVerification(gctx)
			close(s.ready)
			s.conns.resize(s.nodes)
			s.setServing(healthpb.HealthCheckResponse_SERVING)
			s.log.Info("caches synced; serving")
			placementFromEnv().log(s.log, s.nodes)
		}
		return nil
	})
	g.Go(func() error {
		if err := s.grpc.Serve(lis); err != nil {
			return fmt.Errorf("serve gRPC: %w", err)
		}
		return nil
	})
	if cfg.MetricsAddr != "" {
		var writeTimeout time.Duration // httpserve's default
		if cfg.Profiling {
			writeTimeout = profileWriteTimeout
		}
		l := httpserve.Listener{Name: "metrics", Addr: cfg.MetricsAddr,
			Handler: metricsMux(s.reg, s.ctrl.Synced, cfg.Profiling), Grace: cfg.ShutdownGrace, WriteTimeout: writeTimeout}
		if s.metricsGuard != nil {
			l.Handler, l.TLS = s.metricsGuard.Handler(l.Handler), s.metricsGuard.TLS()
		}
		g.Go(func() error { return httpserve.Serve(gctx, l) })
	}
	if cfg.WebhookAddress != "" && s.tlsConfig != nil {
		mux := http.NewServeMux()
		mux.Handle(admission.Path, admission.Handler(s.log.Named("admission"), s.namespaces))
		g.Go(func() error {
			return httpserve.Serve(gctx, httpserve.Listener{Name: "admission webhook", Addr: cfg.WebhookAddress, Handler: mux,
				TLS: s.tlsConfig, Grace: cfg.ShutdownGrace})
		})
	}
	g.Go(func() error {
		<-gctx.Done()
		s.log.Info("shutting down")
		s.setServing(healthpb.HealthCheckResponse_NOT_SERVING)
		s.svc.Shutdown()
		done := make(chan struct{})
		go func() { s.grpc.GracefulStop(); close(done) }()
		select {
		case <-done:
		case <-time.After(cfg.ShutdownGrace):
			s.log.Warn("graceful stop timed out; closing remaining streams", zap.Duration("grace", cfg.ShutdownGrace))
			s.grpc.Stop()
		}
		s.factory.Shutdown()
		if s.tokenObjects != nil {
			s.tokenObjects.Shutdown()
		}
		return nil
	})
	return g.Wait()
}

func restConfig(cfg Config) (*rest.Config, error) {
	var rc *rest.Config
	var err error
	if cfg.Kubeconfig != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig)
	} else {
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes client config: %w", err)
	}
	rc.UserAgent = "dkc-server"
	// As kube-controller-manager: protobuf is cheaper to encode and decode than JSON for every Node event.
	rc.ContentType = "application/vnd.kubernetes.protobuf"
	rc.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	return rc, nil
}

// profileWriteTimeout is the metrics listener's write timeout with --profiling: net/http/pprof refuses a
// CPU profile or trace longer than the write timeout, and 5 minutes covers what anyone takes.
const profileWriteTimeout = 5 * time.Minute

// limitResizeInterval is how often the client-side limits follow the Node cache.
const limitResizeInterval = 10 * time.Second

// reviewClient is the TokenReview client: auth.NewReviewClient's, with the limit sized to the Node cache.
func reviewClient(restCfg *rest.Config, limiter *scaledLimiter) (kubernetes.Interface, error) {
	c := rest.CopyConfig(restCfg)
	c.RateLimiter = limiter
	c.UserAgent += "/token-review"
	cs, err := kubernetes.NewForConfig(c)
	if err != nil {
		return nil, fmt.Errorf("create token review client: %w", err)
	}
	return cs, nil
}

// poolClient is the dkc.dev clientset: JSON whatever restCfg prefers, as CRDs speak no protobuf (its
// rate limiter is restCfg's, shared with the other clients).
func poolClient(restCfg *rest.Config) (clientset.Interface, error) {
	c := rest.CopyConfig(restCfg)
	c.ContentType = runtime.ContentTypeJSON
	c.AcceptContentTypes = runtime.ContentTypeJSON
	cs, err := clientset.NewForConfig(c)
	if err != nil {
		return nil, fmt.Errorf("create %s client: %w", v1alpha1.GroupVersion, err)
	}
	return cs, nil
}

// stripNode drops what dkc never reads from cached Nodes.
func stripNode(obj any) (any, error) {
	if n, ok := obj.(*corev1.Node); ok {
		n.ManagedFields = nil
		n.Status.Images = nil
		n.Status.VolumesAttached = nil
		n.Status.VolumesInUse = nil
	}
	return obj, nil
}

func metricsMux(reg *prometheus.Registry, synced func() bool, profiling bool) *http.ServeMux {
	mux := http.NewServeMux()
	if profiling {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !synced() {
			http.Error(w, "caches not synced", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok"))
	})
	return mux
}
