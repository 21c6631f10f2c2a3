// SPDX-License-Identifier: Apache-2.0

// Package app wires the dkc sidecar together: configuration (defaults, flags, validation), the checkpoint
// store, the service manager, the kubelet prober, the agent and the service client. Run is the whole sidecar;
// cmd/dkc-sidecar only parses flags and calls it.
package app

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	flag "github.com/spf13/pflag"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"

	"github.com/dkc-dev/dkc/internal/kubeletcheck/checkapi"
	"github.com/dkc-dev/dkc/internal/metricsauth"
	"github.com/dkc-dev/dkc/sidecar/internal/uninstall"
)

// Config is the sidecar's configuration: the parts it acts through, then its flags.
type Config struct {
	// The parts it acts through; no flag sets them. The daemon sets Log and leaves the others zero: the
	// defaults, which touch the node and the network. Tests and the benchmark's simulated nodes replace them.

	// Log is where the sidecar logs; nil: nowhere.
	Log *zap.Logger
	// ServiceManager restarts the kubelet; nil: --restart-mode's (systemd over D-Bus, after checking that
	// the kubelet unit loads dkc's env file, or signals).
	ServiceManager ServiceManager
	// Prober asks about the kubelet; nil: its HTTPS endpoints (package probe), which also learn the
	// kubelet's --cert-dir from the checker's results — a Prober given is on its own.
	Prober Prober
	// Checker checks configs; nil: the dkc-kubelet-check helpers in --kubelet-check-dir, one per kubelet
	// minor, which check nothing before the service sends the kubelet's version.
	Checker Checker
	// Conn, if not nil, talks to the config service instead of dialling --server; the caller closes it.
	Conn *grpc.ClientConn
	// Trace, if not nil, is called when an assignment is received (TraceReceived) and when a new one is
	// durably checkpointed (TraceCheckpointed): the benchmark's probes.
	Trace func(event string, src *corev1.NodeConfigSource)
	// KubeletArgs, if not nil, are the kubelet's command-line flags (none: an empty, non-nil slice), taking
	// the place of --kubelet-flags and of reading the running kubelet's.
	KubeletArgs []string
	// TrialCheckInterval is how often the trial is checked; 0: every 10s, as the original.
	TrialCheckInterval time.Duration
	// NoNodeLock skips the lock that keeps a second sidecar off the node's --dynamic-config-dir. For many
	// simulated nodes in one process, each on a directory of its own (the benchmark): the lock holds a file
	// descriptor per node, and 10,000 nodes' locks and connections exceed a process's usual limit of 20,000.
	NoNodeLock bool

	// The flags (BindFlags), from DefaultConfig's defaults.

	NodeName         string
	Server           string
	ServerCAFile     string
	Insecure         bool
	TokenFile        string
	DynamicConfigDir string
	KubeletConfig    string
	KubeletFlags     string
	RestartMode      string
	KubeletUnit      string
	DBusAddress      string
	KubeletPIDFile   string
	KubeletTokenFile string
	KubeletHost      string
	KubeletCAFile    string
	TrialDuration    time.Duration
	HealthTimeout    time.Duration
	// DriftInterval is how often the kubelet is checked for drift besides after each start the sidecar did
	// not make; 0: only after those.
	DriftInterval   time.Duration
	KeepCheckpoints int
	MetricsAddress  string
	// MetricsAuth protects the metrics address (HTTPS, delegated authentication and authorization).
	MetricsAuth    metricsauth.Options
	LogLevel       string
	LogDevelopment bool
	PrintDropIn    bool
	InstallDropIn  string
	InstallOnly    bool
	// Uninstall is the cleanup mode (--uninstall): take dkc off the node and report it, nothing else.
	Uninstall bool
	// KubeletDropIn is dkc's kubelet drop-in, which --uninstall removes.
	KubeletDropIn string
	HostProc      string
	// KubeletCheckDir holds the dkc-kubelet-check-<minor> helpers, one per kubelet minor; default: the
	// directory of this executable.
	KubeletCheckDir string
	// KubeletVersion, if set, overrides the kubelet version the service sends (the Node's
	// status.nodeInfo.kubeletVersion).
	KubeletVersion string
}

// DefaultMetricsAddress is where /metrics, /healthz and /readyz are served: every address of the node (the
// pod shares the host's network, and Prometheus scrapes nodes by their IP), on a port no well-known node
// agent takes. Not 9091, the former default: Calico Felix's metrics port, where the sidecar could not
// listen and crash-looped. Taken on nodes, among others: kubelet 10248/10250/10255, kube-proxy
// 10249/10256, kube-controller-manager 10257, cloud-controller-manager 10258 and kube-scheduler 10259
// (control-plane nodes), ingress-nginx 10254 (often on the host network), OpenYurt's yurthub and
// yurt-manager (10261-10273), Antrea 10349-10351, Kube-OVN 10660-10665, node-exporter 9100, Calico
// 9091/9099, Cilium 9962-9965/9876/4240/4244, kube-router 20241/20244, node-problem-detector 20256/20257;
// Prometheus's exporter range 9100-9999 is allocated to the last port. 10395 is none of them, and below
// the NodePort (30000-32767) and ephemeral (32768-) ranges.
const DefaultMetricsAddress = ":10395"

// DefaultConfig returns the defaults for a DaemonSet pod on a kubeadm-style node.
func DefaultConfig() Config {
	return Config{
		NodeName:         os.Getenv("NODE_NAME"),
		TokenFile:        "/var/run/secrets/dkc/token",
		DynamicConfigDir: "/var/lib/kubelet/dynamic-config",
		KubeletConfig:    "/var/lib/kubelet/config.yaml",
		RestartMode:      "systemd",
		KubeletUnit:      "kubelet.service",
		KubeletTokenFile: "/var/run/secrets/kubernetes.io/serviceaccount/token",
		TrialDuration:    10 * time.Minute,
		HealthTimeout:    2 * time.Minute,
		DriftInterval:    10 * time.Minute,
		KeepCheckpoints:  3,
		MetricsAddress:   DefaultMetricsAddress,
		MetricsAuth:      metricsauth.DefaultOptions(),
		HostProc:         "/proc",
		LogLevel:         "info",
		KubeletDropIn:    uninstall.DefaultDropIn,
	}
}

// BindFlags registers the flags on fs with c's values as defaults.
func (c *Config) BindFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.NodeName, "node-name", c.NodeName, "this node's name ($NODE_NAME, from the downward API)")
	fs.StringVar(&c.Server, "server", c.Server, "host:port of the dkc config service")
	fs.StringVar(&c.ServerCAFile, "server-ca-file", c.ServerCAFile,
		"CA certificate that signed the config service's certificate")
	fs.BoolVar(&c.Insecure, "insecure", c.Insecure, "talk plaintext gRPC to the service. FOR TESTS ONLY")
	fs.StringVar(&c.TokenFile, "token-file", c.TokenFile,
		"projected ServiceAccount token for audience \"dkc\" (re-read on every call)")
	fs.StringVar(&c.DynamicConfigDir, "dynamic-config-dir", c.DynamicConfigDir,
		"checkpoint directory (meta/assigned, meta/last-known-good, checkpoints/<uid>/<resourceVersion>/)")
	fs.StringVar(&c.KubeletConfig, "kubelet-config", c.KubeletConfig,
		"the node's local kubelet config file (never modified); used when nothing valid is assigned")
	fs.StringVar(&c.KubeletFlags, "kubelet-flags", c.KubeletFlags,
		"the kubelet's command-line flags, space-separated; default: read from the running kubelet's /proc/<pid>/cmdline")
	fs.StringVar(&c.RestartMode, "restart-mode", c.RestartMode,
		"how the kubelet is restarted: systemd (RestartUnit over D-Bus) or signal (SIGTERM; a supervisor restarts it)")
	fs.StringVar(&c.KubeletUnit, "kubelet-unit", c.KubeletUnit, "the kubelet's systemd unit")
	fs.StringVar(&c.DBusAddress, "dbus-address", c.DBusAddress,
		"system bus address; default unix:path=/run/dbus/system_bus_socket")
	fs.StringVar(&c.KubeletPIDFile, "kubelet-pid-file", c.KubeletPIDFile,
		"with --restart-mode=signal: file holding the kubelet's PID")
	fs.StringVar(&c.KubeletTokenFile, "kubelet-token-file", c.KubeletTokenFile,
		"token the kubelet accepts for GET /configz, /stats/summary and /pods (RBAC: get nodes/configz, "+
			"nodes/stats, nodes/pods)")
	fs.StringVar(&c.KubeletHost, "kubelet-host", c.KubeletHost,
		"address of the kubelet, used as given; default: from its config (127.0.0.1 when it binds all addresses), which "+
			"must be loopback or an address of this node's interfaces, or nothing is sent")
	fs.StringVar(&c.KubeletCAFile, "kubelet-ca-file", c.KubeletCAFile,
		"CA that signs the kubelet's serving certificate (read at every probe); default: the certificate the kubelet's "+
			"config makes it serve is pinned (serverTLSBootstrap: <cert-dir>/kubelet-server-current.pem; tlsCertFile; the "+
			"self-signed <cert-dir>/kubelet.crt), read at every probe at the kubelet's path")
	fs.DurationVar(&c.TrialDuration, "trial-duration", c.TrialDuration,
		"time a new config must run healthy before it becomes last-known-good")
	fs.DurationVar(&c.HealthTimeout, "health-timeout", c.HealthTimeout,
		"time the kubelet gets to come back healthy with a new config before it is rolled back")
	fs.DurationVar(&c.DriftInterval, "drift-interval", c.DriftInterval,
		"how often the sidecar checks that the kubelet runs what it should (its /configz against the active config's "+
			"fields, and dkc's drop-in and env file still as dkc wrote them), reported as drift with its cause; besides "+
			"this, every start of the kubelet the sidecar did not make is checked. 0 disables the periodic check (and the "+
			"one at the sidecar's start): only those starts are checked")
	fs.IntVar(&c.KeepCheckpoints, "keep-checkpoints", c.KeepCheckpoints,
		"unreferenced checkpoints kept besides assigned and last-known-good")
	fs.StringVar(&c.MetricsAddress, "metrics-address", c.MetricsAddress,
		"address for /metrics (with --metrics-auth: over HTTPS, for callers allowed get on it, the ClusterRole "+
			"dkc-metrics-reader), /healthz (liveness: the process serves HTTP) and /readyz (a config stream to dkc-server is "+
			"open) — these two to anyone (the kubelet's probes); empty disables. The default binds every address of the node "+
			"(the DaemonSet shares the host's network) so that Prometheus can scrape the node's IP, on 10395, a port no "+
			"well-known node agent uses (9091, the former default, is Calico Felix's metrics port; docs/dkc-sidecar.md lists "+
			"the ports checked). The probes need it reachable on the node's IP")
	c.MetricsAuth.BindFlags(fs)
	fs.StringVar(&c.LogLevel, "log-level", c.LogLevel, "debug, info, warn or error")
	fs.BoolVar(&c.LogDevelopment, "log-development", c.LogDevelopment, "human-readable console logs instead of JSON")
	fs.StringVar(&c.InstallDropIn, "install-kubelet-dropin", c.InstallDropIn,
		"with --restart-mode=systemd: write the kubelet drop-in to this path (e.g. "+
			"/etc/systemd/system/kubelet.service.d/20-dkc.conf) if it differs, and daemon-reload")
	fs.BoolVar(&c.InstallOnly, "install-only", c.InstallOnly,
		"with --install-kubelet-dropin: install the drop-in, reload systemd and exit. The DaemonSet's init container does "+
			"this, so the long-running container has no write access to unit files")
	fs.BoolVar(&c.Uninstall, "uninstall", c.Uninstall,
		"cleanup mode, for uninstalling dkc (kubectl dkc uninstall sets it on the DaemonSet): remove --kubelet-dropin, "+
			"daemon-reload, remove <dynamic-config-dir>/kubelet.env, restart the kubelet if it runs a checkpoint and wait "+
			"until it is healthy on --kubelet-config, then remove meta/, checkpoints/ and the sidecar's state; /readyz "+
			"answers 200 once that is done. Before restarting the kubelet it validates --kubelet-config with the kubelet's "+
			"code of its minor (the version recorded from dkc-server, or --kubelet-version) and refuses, leaving the node on "+
			"its dkc config, when it does not pass; a kubelet not healthy on it is put back on its dkc config. Talks to no "+
			"dkc-server. Needs the drop-in's directory mounted read-write")
	fs.StringVar(&c.KubeletDropIn, "kubelet-dropin", c.KubeletDropIn,
		"dkc's kubelet drop-in (where --install-kubelet-dropin put it): --uninstall removes it; with --restart-mode=systemd "+
			"the drift check verifies that the kubelet unit loads it and, where the sidecar sees the file, its content")
	fs.StringVar(&c.HostProc, "host-proc", c.HostProc,
		"the node's /proc, where the kubelet's command line is read (<host-proc>/<MainPID>/cmdline); the DaemonSet mounts "+
			"the host's /proc read-only at /host/proc instead of sharing the host's PID namespace")
	fs.StringVar(&c.KubeletCheckDir, "kubelet-check-dir", c.KubeletCheckDir,
		"directory of the dkc-kubelet-check-<minor> helpers that load and validate configs with the kubelet's own code, "+
			"one per supported kubelet minor (the image ships 1.34–1.37); the node kubelet's minor picks the helper, and a "+
			"kubelet of another minor is refused. Default: the directory of this executable")
	fs.StringVar(&c.KubeletVersion, "kubelet-version", c.KubeletVersion,
		"the node kubelet's version (e.g. v1.36.3), if it must override what the Node's status.nodeInfo.kubeletVersion "+
			"says (dkc-server sends that); configs are validated with the code of its minor")
	fs.BoolVar(&c.PrintDropIn, "print-kubelet-dropin", c.PrintDropIn,
		"print the kubelet systemd drop-in for --dynamic-config-dir (one-time node setup) and exit")
}

// Validate checks the configuration.
func (c Config) Validate() error {
	if c.PrintDropIn {
		return nil
	}
	if c.Uninstall {
		// Cleanup mode needs the node, the bus and the paths; nothing of the service.
		var errs []error
		if c.InstallOnly {
			errs = append(errs, errors.New("--uninstall and --install-only exclude each other"))
		}
		if c.RestartMode != "systemd" {
			errs = append(errs, errors.New("--uninstall needs --restart-mode=systemd: it removes dkc's "+
				"drop-in from the kubelet's unit"))
		}
		if !strings.HasPrefix(c.DynamicConfigDir, "/") || !strings.HasPrefix(c.KubeletConfig, "/") ||
			!strings.HasPrefix(c.HostProc, "/") || !strings.HasPrefix(c.KubeletDropIn, "/") {
			errs = append(errs, errors.New("--uninstall needs absolute --dynamic-config-dir, --kubelet-config, "+
				"--host-proc and --kubelet-dropin"))
		}
		if c.HealthTimeout <= 0 {
			errs = append(errs, errors.New("--health-timeout must be positive"))
		}
		return errors.Join(errs...)
	}
	if c.InstallOnly {
		// An init container: it needs the bus and the drop-in path, nothing of the service or the node.
		if !strings.HasPrefix(c.InstallDropIn, "/") || c.RestartMode != "systemd" ||
			!strings.HasPrefix(c.DynamicConfigDir, "/") {
			return errors.New("--install-only needs an absolute --install-kubelet-dropin, --restart-mode=systemd and an " +
				"absolute --dynamic-config-dir (the drop-in names it)")
		}
		return nil
	}
	var errs []error
	if c.NodeName == "" {
		errs = append(errs, errors.New("--node-name (or $NODE_NAME) is required"))
	}
	if c.Server == "" {
		errs = append(errs, errors.New("--server is required"))
	}
	if !c.Insecure && c.ServerCAFile == "" {
		errs = append(errs, errors.New("--server-ca-file is required (or --insecure, for tests only)"))
	}
	switch c.RestartMode {
	case "systemd":
	case "signal":
		if c.KubeletPIDFile == "" {
			errs = append(errs, errors.New("--restart-mode=signal needs --kubelet-pid-file"))
		}
		// The PID file holds a PID of the host's namespace; signalled from another, it names another process.
		if c.HostProc != "/proc" {
			errs = append(errs, errors.New("--restart-mode=signal signals the kubelet by PID and needs the host's PID "+
				"namespace (hostPID, --host-proc=/proc)"))
		}
	default:
		errs = append(errs, fmt.Errorf("--restart-mode %q: want systemd or signal", c.RestartMode))
	}
	if !strings.HasPrefix(c.DynamicConfigDir, "/") || !strings.HasPrefix(c.KubeletConfig, "/") ||
		!strings.HasPrefix(c.HostProc, "/") {
		errs = append(errs, errors.New("--dynamic-config-dir, --kubelet-config and --host-proc must be absolute paths"))
	}
	// A version the helpers cannot be chosen by would only surface at the first assignment, as a status error
	// on the Node; refusing it here makes the DaemonSet's rollout stop on the first pod instead.
	if c.KubeletVersion != "" && checkapi.Minor(c.KubeletVersion) == "" {
		errs = append(errs, fmt.Errorf("--kubelet-version %q: want a kubelet version such as v1.36.3", c.KubeletVersion))
	}
	if c.TrialDuration <= 0 || c.HealthTimeout <= 0 || c.KeepCheckpoints < 0 || c.DriftInterval < 0 {
		errs = append(errs, errors.New("--trial-duration and --health-timeout must be positive, "+
			"--keep-checkpoints and --drift-interval not negative"))
	}
	if err := c.MetricsAuth.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
