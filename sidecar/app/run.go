// SPDX-License-Identifier: Apache-2.0

package app

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"

	"github.com/dkc-dev/dkc/internal/configcheck"
	"github.com/dkc-dev/dkc/internal/durable"
	"github.com/dkc-dev/dkc/internal/httpserve"
	"github.com/dkc-dev/dkc/internal/version"
	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
	"github.com/dkc-dev/dkc/sidecar/internal/agent"
	"github.com/dkc-dev/dkc/sidecar/internal/checkpoint"
	"github.com/dkc-dev/dkc/sidecar/internal/client"
	"github.com/dkc-dev/dkc/sidecar/internal/kubeletunit"
	"github.com/dkc-dev/dkc/sidecar/internal/probe"
	"github.com/dkc-dev/dkc/sidecar/internal/systemd"
)

// Run runs the sidecar until ctx ends, in one of three modes: the DaemonSet's init container installs the
// kubelet drop-in and exits (--install-only: installOnly), the cleanup mode takes dkc off the node
// (--uninstall: uninstallNode), and the normal mode follows the config service (follow).
func (s *Sidecar) Run(ctx context.Context) error {
	log := s.log.With(zap.String("node", s.cfg.NodeName))
	switch {
	case s.cfg.InstallOnly:
		return installOnly(ctx, s.cfg, log)
	case s.cfg.Uninstall:
		return s.uninstallNode(ctx, log)
	default:
		return s.follow(ctx, log)
	}
}

// follow is the normal mode. Under the node's lock, it first brings the kubelet in line with what is on
// disk — with the service and apiserver unreachable the node keeps what it has — then follows the service.
func (s *Sidecar) follow(ctx context.Context, log *zap.Logger) error {
	cfg := s.cfg
	if !cfg.NoNodeLock {
		release, err := lockNode(ctx, cfg.DynamicConfigDir, log)
		if err != nil {
			return err
		}
		defer release()
	}
	svc, closeSvc, err := s.serviceManager(ctx, log)
	if err != nil {
		return err
	}
	defer closeSvc()
	prober, checker, err := kubeletProbes(cfg, log)
	if err != nil {
		return err
	}
	conn, streams, closeConn, err := connect(cfg, log)
	if err != nil {
		return err
	}
	defer closeConn()
	incarnation := nextIncarnation(cfg.DynamicConfigDir, log)
	// Reconnects within a few seconds of the service coming back (the goal is 5s); refused connection
	// attempts of thousands of nodes while it is away are cheap.
	cl := client.New(conn, client.Config{Node: cfg.NodeName, TokenFile: cfg.TokenFile,
		Backoff: client.Backoff{Initial: 250 * time.Millisecond, Max: 3 * time.Second}, Log: log.Named("client")},
		client.WithIncarnation(incarnation))

	reg, metrics := newRegistry(cfg)
	ag := agent.New(agent.Config{
		Log: log.Named("agent"), NodeName: cfg.NodeName, Store: checkpoint.New(cfg.DynamicConfigDir), Service: svc,
		Kubelet: prober, Reporter: cl, Metrics: metrics, LocalConfig: cfg.KubeletConfig, KubeletFlags: kubeletFlags(cfg),
		TrialDuration: cfg.TrialDuration, HealthTimeout: cfg.HealthTimeout, KeepCheckpoints: cfg.KeepCheckpoints,
		ProcDir: cfg.HostProc, KubeletVersion: cfg.KubeletVersion, KubeletVersionRequired: cfg.Checker == nil,
		TrialCheckInterval: cfg.TrialCheckInterval, Checker: checker, Trace: cfg.Trace,
		DriftInterval: cfg.DriftInterval, KubeletDropIn: driftDropIn(cfg),
	})
	var metricsServer httpserve.Listener
	if reg != nil {
		if metricsServer, err = metricsAndHealth(cfg, reg, streams, log); err != nil {
			return err
		}
	}
	log.Info("dkc-sidecar starting", zap.String("version", version.Get()), zap.String("server", cfg.Server),
		zap.String("dynamicConfigDir", cfg.DynamicConfigDir), zap.String("restartMode", cfg.RestartMode),
		zap.Duration("trialDuration", cfg.TrialDuration), zap.Uint64("incarnation", incarnation))
	if err := ag.Init(ctx); err != nil {
		return err
	}
	updates := make(chan *dkcv1.WatchConfigResponse, 1)
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return ag.Run(gctx, updates) })
	g.Go(func() error { return cl.Watch(gctx, ag.Applied, updates) })
	g.Go(func() error { return cl.RunReporter(gctx) })
	if reg != nil {
		g.Go(func() error { return httpserve.Serve(gctx, metricsServer) })
	}
	err = g.Wait()
	log.Info("dkc-sidecar stopped")
	return err
}

// driftDropIn is dkc's kubelet drop-in the drift check verifies: only under systemd, where it is the
// kubelet unit's (a kubelet supervised otherwise reads the env file by other means, and a drop-in found at
// the default path belongs to another kubelet).
func driftDropIn(cfg Config) string {
	switch {
	case cfg.RestartMode != "systemd" || cfg.ServiceManager != nil:
		return ""
	case cfg.InstallDropIn != "":
		return cfg.InstallDropIn
	default:
		return cfg.KubeletDropIn
	}
}

// kubeletProbes are the injected prober and checker, or the defaults: the kubelet over HTTPS, and the
// dkc-kubelet-check helpers (kubeletChecker).
func kubeletProbes(cfg Config, log *zap.Logger) (Prober, Checker, error) {
	prober, checker := cfg.Prober, cfg.Checker
	if checker == nil {
		var err error
		if checker, err = kubeletChecker(cfg, log); err != nil {
			return nil, nil, err
		}
	}
	if prober == nil {
		p, err := probe.New(probe.Config{Log: log.Named("probe"), TokenFile: cfg.KubeletTokenFile, Host: cfg.KubeletHost,
			CAFile: cfg.KubeletCAFile})
		if err != nil {
			return nil, nil, err
		}
		// The prober learns the kubelet's --cert-dir (where its serving certificate is) from the flags.
		prober, checker = p, p.ObserveFlags(checker)
	}
	return prober, checker, nil
}

// connect is the connection to the config service: the injected one (Config.Conn), which its owner closes
// and whose streams /readyz does not follow (streams nil), or one dialled to --server, with its streams
// counted for /readyz.
func connect(cfg Config, log *zap.Logger) (*grpc.ClientConn, *serviceStreams, func(), error) {
	if cfg.Conn != nil {
		return cfg.Conn, nil, func() {}, nil
	}
	streams := &serviceStreams{}
	c, err := Dial(cfg, WithDialLogger(log.Named("dial")), withStats(streams))
	if err != nil {
		return nil, nil, nil, err
	}
	return c, streams, func() { _ = c.Close() }, nil
}

// nextIncarnation numbers this start of the sidecar, which orders its reports after the last start's.
func nextIncarnation(dynamicConfigDir string, log *zap.Logger) uint64 {
	incarnation, err := agent.NextIncarnation(dynamicConfigDir, time.Now())
	if err != nil {
		// A disk that refuses the state file must not keep the sidecar from serving the node (the agent
		// reports the failed writes): order this start's reports by the clock, as the record would have.
		incarnation = uint64(max(time.Now().Unix(), 1))
		log.Warn("cannot record the sidecar's incarnation; numbering reports from the clock",
			zap.Uint64("incarnation", incarnation), zap.Error(err))
	}
	return incarnation
}

// newRegistry is the registry of --metrics-address, with the agent's metrics; nil without it.
func newRegistry(cfg Config) (*prometheus.Registry, *agent.Metrics) {
	if cfg.MetricsAddress == "" {
		return nil, nil
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		version.NewCollector())
	return reg, agent.NewMetrics(reg)
}

// metricsAndHealth is the listener of --metrics-address: reg's metrics, /healthz, and /readyz, which
// follows the service's streams when the sidecar dialled them (streams not nil).
func metricsAndHealth(cfg Config, reg *prometheus.Registry, streams *serviceStreams,
	log *zap.Logger) (httpserve.Listener, error) {
	if streams != nil {
		registerConnected(reg, streams)
	}
	h := healthMux(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), streams)
	return metricsListener("metrics", cfg, h, true, log)
}

// kubeletFlags are the kubelet's flags as given: Config.KubeletArgs (tests, the benchmark), else
// --kubelet-flags split on white space; nil when neither is (the agent reads the running kubelet's).
func kubeletFlags(cfg Config) []string {
	flags := cfg.KubeletArgs
	if flags == nil && cfg.KubeletFlags != "" {
		flags = strings.Fields(cfg.KubeletFlags)
	}
	return flags
}

// What the agent finds on systemd's Manager by type (a kubelet restarted otherwise can do neither).
var (
	_ agent.StateResetter   = (*systemd.Manager)(nil)
	_ agent.DropInInstaller = (*systemd.Manager)(nil)
)

// serviceManager is the injected one, or systemd over D-Bus after checking the kubelet unit loads dkc's env
// file, or signals by PID file.
func (s *Sidecar) serviceManager(ctx context.Context, log *zap.Logger) (agent.ServiceManager, func(), error) {
	cfg := s.cfg
	if cfg.ServiceManager != nil {
		return cfg.ServiceManager, func() {}, nil
	}
	if cfg.RestartMode == "signal" {
		return systemd.Signal{PIDFile: cfg.KubeletPIDFile, Timeout: cfg.HealthTimeout}, func() {}, nil
	}
	m, err := systemd.Dial(ctx, cfg.DBusAddress, cfg.KubeletUnit)
	if err != nil {
		return nil, nil, err
	}
	fail := func(err error) (agent.ServiceManager, func(), error) { m.Close(); return nil, nil, err }
	if err := m.CheckUnit(ctx); err != nil {
		return fail(err)
	}
	if cfg.InstallDropIn != "" {
		if err := installDropIn(ctx, m, cfg.InstallDropIn, kubeletunit.DropIn(cfg.DynamicConfigDir), log); err != nil {
			return fail(err)
		}
	}
	// Without the drop-in a restart runs the unit's own --config, whatever the env file names: every
	// config would fail its health check and be blamed for it.
	env := kubeletunit.New(cfg.DynamicConfigDir).Path
	if ok, err := m.LoadsEnvironmentFile(ctx, env); err != nil {
		return fail(err)
	} else if !ok {
		return fail(fmt.Errorf("%s does not load %s (dkc's kubelet drop-in): install it first — the DaemonSet's "+
			"init container does, or --install-kubelet-dropin, or --print-kubelet-dropin for node provisioning — "+
			"then daemon-reload", m.Unit(), env))
	}
	return m, m.Close, nil
}

// installOnly is the DaemonSet's init container: it installs the kubelet drop-in and exits, so that the
// long-running sidecar, which acts on what the network sends it, cannot write unit files.
func installOnly(ctx context.Context, cfg Config, log *zap.Logger) error {
	m, err := systemd.Dial(ctx, cfg.DBusAddress, cfg.KubeletUnit)
	if err != nil {
		return err
	}
	defer m.Close()
	// A node whose kubelet is not this unit gets nothing written: the refusal comes here, before any file.
	if err := m.CheckUnit(ctx); err != nil {
		return err
	}
	if err := installDropIn(ctx, m, cfg.InstallDropIn, kubeletunit.DropIn(cfg.DynamicConfigDir), log); err != nil {
		return err
	}
	log.Info("kubelet drop-in in place", zap.String("path", cfg.InstallDropIn), zap.String("unit", cfg.KubeletUnit))
	return nil
}

// installDropIn writes the kubelet drop-in when it differs and makes systemd read it. The kubelet itself is
// not restarted: the drop-in only matters once the env file it names exists, and the agent restarts the
// kubelet when it writes that.
func installDropIn(ctx context.Context, m *systemd.Manager, path, content string, log *zap.Logger) error {
	if old, err := os.ReadFile(path); err == nil && string(old) == content {
		return nil
	}
	if err := durable.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("install kubelet drop-in: %w", err)
	}
	if err := durable.WriteFile(path, []byte(content), 0o644); err != nil {
		return fmt.Errorf("install kubelet drop-in: %w", err)
	}
	log.Info("installed kubelet drop-in; reloading systemd", zap.String("path", path))
	return m.Reload(ctx)
}

// kubeletChecker returns the helpers that run the kubelet's config code, one per kubelet minor, failing
// early when there are none.
func kubeletChecker(cfg Config, log *zap.Logger) (configcheck.Checker, error) {
	dir := cfg.KubeletCheckDir
	if dir == "" {
		self, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("locate the dkc-kubelet-check helpers: %w", err)
		}
		dir = filepath.Dir(self)
	}
	h, err := configcheck.FindHelpers(dir)
	if err != nil {
		return nil, fmt.Errorf("%w (--kubelet-check-dir)", err)
	}
	// Sized against this container's memory limit, which the helper shares with the daemon.
	h.MemoryLimit = configcheck.SidecarMemoryLimit
	log.Info("kubelet config checkers", zap.String("dir", dir), zap.Strings("kubeletMinors", h.Minors))
	return h, nil
}
