package app

import (
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"

	"github.com/dkc-dev/dkc/internal/configcheck"
	"github.com/dkc-dev/dkc/sidecar/internal/agent"
	"github.com/dkc-dev/dkc/sidecar/internal/kubeletunit"
)

// Sidecar is one node's dkc-sidecar. New builds it; Run runs it.
type Sidecar struct {
	cfg Config
	log *zap.Logger
	o   options
}

// ServiceManager restarts the kubelet: systemd over D-Bus by default (--restart-mode).
type ServiceManager = agent.ServiceManager

// Prober asks the running kubelet how it is (/healthz, /configz): over HTTPS by default.
type Prober = agent.Prober

// Checker loads and validates configs with the kubelet's code: the dkc-kubelet-check helper by default.
type Checker = configcheck.Checker

// Trace events (WithTrace).
const (
	TraceReceived     = agent.TraceReceived
	TraceCheckpointed = agent.TraceCheckpointed
)

// Option replaces a part of the sidecar that touches the node or the network: tests and the benchmark's
// simulated nodes use them; the daemon uses none.
type Option func(*options)

type options struct {
	log                *zap.Logger
	service            ServiceManager
	prober             Prober
	checker            Checker
	conn               *grpc.ClientConn
	trace              func(event string, src *corev1.NodeConfigSource)
	kubeletFlags       []string
	trialCheckInterval time.Duration
	noNodeLock         bool
}

// WithLogger logs to log (default: nothing).
func WithLogger(log *zap.Logger) Option { return func(o *options) { o.log = log } }

// WithServiceManager restarts the kubelet through m instead of --restart-mode: no D-Bus, no unit checks.
func WithServiceManager(m ServiceManager) Option { return func(o *options) { o.service = m } }

// WithProber asks p about the kubelet instead of its HTTPS endpoints. (The default prober also learns the
// kubelet's --cert-dir from the checker's results; an injected one is on its own.)
func WithProber(p Prober) Option { return func(o *options) { o.prober = p } }

// WithChecker checks configs with c instead of the dkc-kubelet-check helper.
func WithChecker(c Checker) Option { return func(o *options) { o.checker = c } }

// WithConn talks to the config service over conn instead of dialling --server; the caller closes it.
func WithConn(conn *grpc.ClientConn) Option { return func(o *options) { o.conn = conn } }

// WithTrace calls f when an assignment is received (TraceReceived) and when a new one is durably
// checkpointed (TraceCheckpointed): the benchmark's probes.
func WithTrace(f func(event string, src *corev1.NodeConfigSource)) Option {
	return func(o *options) { o.trace = f }
}

// WithKubeletFlags takes flags as the kubelet's command line (none: an empty, non-nil slice) instead of
// --kubelet-flags or reading the running kubelet's.
func WithKubeletFlags(flags []string) Option { return func(o *options) { o.kubeletFlags = flags } }

// WithTrialCheckInterval checks the trial every d instead of every 10s, as the original did.
func WithTrialCheckInterval(d time.Duration) Option {
	return func(o *options) { o.trialCheckInterval = d }
}

// WithoutNodeLock skips the lock that keeps a second sidecar off the node's --dynamic-config-dir. For many
// simulated nodes in one process, each on a directory of its own (the benchmark): the lock holds a file
// descriptor per node, and 10,000 nodes' locks and connections exceed a process's usual limit of 20,000.
func WithoutNodeLock() Option { return func(o *options) { o.noNodeLock = true } }

// New returns the sidecar for cfg (see Config.Validate).
func New(cfg Config, opts ...Option) *Sidecar {
	o := options{log: zap.NewNop()}
	for _, opt := range opts {
		opt(&o)
	}
	return &Sidecar{cfg: cfg, log: o.log, o: o}
}

// KubeletDropIn is the kubelet unit's drop-in that makes it run the config dkc names in
// <dynamicConfigDir>/kubelet.env (what --print-kubelet-dropin prints), for node provisioning.
func KubeletDropIn(dynamicConfigDir string) string { return kubeletunit.DropIn(dynamicConfigDir) }

// KubeletEnvFile is the file the drop-in loads, and KubeletConfigVariable the variable it sets there: the
// kubelet's --config argument.
func KubeletEnvFile(dynamicConfigDir string) string { return kubeletunit.New(dynamicConfigDir).Path }

// KubeletConfigVariable: see KubeletEnvFile.
const KubeletConfigVariable = kubeletunit.Variable

// KubeletConfigFile is the config file the kubelet runs after its next restart, as the env file in
// dynamicConfigDir names it; "" when there is none (the unit's own --config).
func KubeletConfigFile(dynamicConfigDir string) (string, error) {
	return kubeletunit.New(dynamicConfigDir).Get()
}
