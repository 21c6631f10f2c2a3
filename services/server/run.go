package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/go-logr/zapr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapgrpc"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/grpclog"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
	"github.com/dkc-dev/dkc/services/admission"
	"github.com/dkc-dev/dkc/services/assignment"
	"github.com/dkc-dev/dkc/services/auth"
	"github.com/dkc-dev/dkc/services/configmaps"
	"github.com/dkc-dev/dkc/services/controller"
	"github.com/dkc-dev/dkc/services/nodestatus"
	"github.com/dkc-dev/dkc/services/resolve"
	"github.com/dkc-dev/dkc/services/rpc"
)

// Run runs the config service until ctx ends, then shuts down gracefully: health turns NOT_SERVING, gRPC
// stops accepting and gives in-flight calls ShutdownGrace to finish, then everything stops.
//
// Several replicas may run at once: each resolves every node independently (the result is a function of the
// cluster), serves whichever nodes connect to it, and writes only the status of nodes that reported to it,
// skipping writes the Node already shows — so no leader election is needed.
func Run(ctx context.Context, cfg Config, log *zap.Logger) error {
	// gRPC's and client-go's own logs go through zap too.
	grpclog.SetLoggerV2(zapgrpc.NewLogger(log.Named("grpc-go").WithOptions(zap.IncreaseLevel(zap.WarnLevel))))
	klog.SetLogger(zapr.NewLogger(log.Named("client-go")))

	restCfg, err := restConfig(cfg)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return fmt.Errorf("create kubernetes client: %w", err)
	}
	var creds credentials.TransportCredentials
	var tlsConfig *tls.Config
	if cfg.Insecure {
		log.Warn("SERVING PLAINTEXT gRPC (--insecure): node tokens cross the network in the clear; for tests only")
	} else {
		reloader, err := newCertReloader(cfg.TLSCertFile, cfg.TLSKeyFile, func(err error) {
			log.Error("reload TLS certificate failed; keeping the previous one", zap.Error(err))
		})
		if err != nil {
			return err
		}
		tlsConfig = serverTLSConfig(reloader.GetCertificate)
		creds = credentials.NewTLS(tlsConfig.Clone())
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	// One informer factory; cached Nodes are stripped of what dkc never reads, so 5,000 Nodes stay cheap.
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTransform(stripNode))
	nodeInformer := factory.Core().V1().Nodes()

	var writer *nodestatus.Writer
	table := assignment.NewTable(func(node string) { writer.Enqueue(node) })
	namespaces := resolve.NewNamespaces(cfg.ConfigNamespaces...)
	// A deleted Node leaves the table, the ConfigMap tracker and the resolved configs in the controller; its
	// status report goes with Forget.
	ctrl := controller.New(log.Named("controller"), nodeInformer, table, namespaces, func(node string) { writer.Forget(node) })
	tracker := configmaps.New(client, namespaces, log.Named("configmaps"), ctrl.OnConfigMapChange)
	ctrl.SetConfigMaps(tracker)
	// The writer writes unprompted (sync errors, retries) only for nodes streaming from this replica: a
	// node that moved to another replica would otherwise get this replica's older report written back.
	var svc *rpc.Service
	writer = nodestatus.New(log.Named("nodestatus"), client, nodeInformer.Lister(), table, nodestatus.NewMetrics(reg),
		nodestatus.WithServing(func(node string) bool { return svc.Serving(node) }))
	reviewClient, err := auth.NewReviewClient(restCfg, cfg.TokenReviewQPS, cfg.TokenReviewBurst)
	if err != nil {
		return err
	}
	authn := auth.New(reviewClient, cfg.AllowedServiceAccounts, cfg.TokenCacheTTL, log.Named("auth"),
		auth.WithPeerLimit(cfg.TokenReviewPeerQPS, cfg.TokenReviewPeerBurst), auth.WithMetrics(auth.NewMetrics(reg)))
	// Each WatchConfig stream checks its token again once per --token-cache-ttl: a revoked token loses its
	// stream within the TTL instead of at the connection's max age.
	svc = rpc.New(log.Named("rpc"), table, writer, rpc.NewMetrics(reg), rpc.WithReauthentication(authn))
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "dkc", Subsystem: "server", Name: "watched_configmaps",
		Help: "ConfigMap watches held because some Node references a ConfigMap: one per ConfigMap, or one per namespace past configmaps.NamespaceThreshold referenced in it."}, func() float64 { return float64(tracker.Watched()) }))
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "dkc", Subsystem: "server", Name: "resolved_nodes",
		Help: "Nodes with a resolved desired state."}, func() float64 { return float64(table.Len()) }))
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "dkc", Subsystem: "server", Name: "resolved_configs",
		Help: "ConfigMap versions held resolved, each shared by the Nodes on it."}, func() float64 { return float64(ctrl.ResolvedConfigs()) }))
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "dkc", Subsystem: "server", Name: "reported_nodes",
		Help: "Nodes whose latest status report this replica holds."}, func() float64 { return float64(writer.Reported()) }))

	healthSrv := health.NewServer()
	setServing := func(st healthpb.HealthCheckResponse_ServingStatus) {
		healthSrv.SetServingStatus("", st)
		healthSrv.SetServingStatus(dkcv1.ConfigService_ServiceDesc.ServiceName, st)
	}
	setServing(healthpb.HealthCheckResponse_NOT_SERVING)
	grpcSrv := newGRPCServer(cfg, log, creds, authn, svc, healthSrv)

	lis, err := net.Listen("tcp", cfg.ListenAddress)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.ListenAddress, err)
	}
	log.Info("config service starting", zap.String("address", lis.Addr().String()), zap.Bool("tls", !cfg.Insecure),
		zap.Strings("allowedServiceAccounts", cfg.AllowedServiceAccounts), zap.Stringer("configNamespaces", namespaces))

	g, gctx := errgroup.WithContext(ctx)
	factory.Start(gctx.Done())
	g.Go(func() error { return tracker.Run(gctx) })
	g.Go(func() error { return ctrl.Run(gctx, cfg.Workers) })
	g.Go(func() error { return writer.Run(gctx, cfg.StatusWorkers) })
	g.Go(func() error {
		// Serve only once the Node cache is synced: before that every node would look unknown.
		for !ctrl.Synced() {
			select {
			case <-gctx.Done():
				return nil
			case <-time.After(100 * time.Millisecond):
			}
		}
		setServing(healthpb.HealthCheckResponse_SERVING)
		log.Info("caches synced; serving")
		return nil
	})
	g.Go(func() error {
		if err := grpcSrv.Serve(lis); err != nil {
			return fmt.Errorf("serve gRPC: %w", err)
		}
		return nil
	})
	if cfg.MetricsAddr != "" {
		httpSrv := &http.Server{Addr: cfg.MetricsAddr, Handler: metricsMux(reg, ctrl.Synced, cfg.Profiling), ReadHeaderTimeout: 5 * time.Second}
		g.Go(func() error {
			if err := httpSrv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("serve metrics on %s: %w", cfg.MetricsAddr, err)
			}
			return nil
		})
		g.Go(func() error {
			<-gctx.Done()
			sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownGrace)
			defer cancel()
			return httpSrv.Shutdown(sctx)
		})
	}
	if cfg.WebhookAddress != "" && tlsConfig != nil {
		mux := http.NewServeMux()
		mux.Handle(admission.Path, admission.Handler(log.Named("admission"), namespaces))
		hook := &http.Server{Addr: cfg.WebhookAddress, Handler: mux, TLSConfig: tlsConfig, ReadHeaderTimeout: 5 * time.Second}
		g.Go(func() error {
			if err := hook.ListenAndServeTLS("", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("serve admission webhook on %s: %w", cfg.WebhookAddress, err)
			}
			return nil
		})
		g.Go(func() error {
			<-gctx.Done()
			sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownGrace)
			defer cancel()
			return hook.Shutdown(sctx)
		})
	}
	g.Go(func() error {
		<-gctx.Done()
		log.Info("shutting down")
		setServing(healthpb.HealthCheckResponse_NOT_SERVING)
		svc.Shutdown()
		done := make(chan struct{})
		go func() { grpcSrv.GracefulStop(); close(done) }()
		select {
		case <-done:
		case <-time.After(cfg.ShutdownGrace):
			log.Warn("graceful stop timed out; closing remaining streams", zap.Duration("grace", cfg.ShutdownGrace))
			grpcSrv.Stop()
		}
		factory.Shutdown()
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
	rc.QPS, rc.Burst = float32(cfg.KubeAPIQPS), cfg.KubeAPIBurst
	rc.UserAgent = "dkc-server"
	// As kube-controller-manager: protobuf is cheaper to encode and decode than JSON for every Node event.
	rc.ContentType = "application/vnd.kubernetes.protobuf"
	rc.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	return rc, nil
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
