// Package agent is the node's state machine: it checkpoints what the config service assigns, decides which
// config the kubelet should run (assigned if it loads, validates and runs; else last-known-good; else the
// local config), makes the kubelet use it and restarts it through the service manager only when that changes,
// checks that the kubelet came back healthy with the intended config, rolls back when it did not, promotes a
// config that ran healthy for the trial duration to last-known-good, and reports the node's status.
//
// Everything it decides from survives a restart of the sidecar: the checkpoint store, the kubelet env file
// and a small state file (trial start, configs that failed to run, the kubelet's flags). A sidecar restart
// alone therefore never restarts the kubelet.
package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/clock"

	"github.com/dkc-dev/dkc/internal/configcheck"
	"github.com/dkc-dev/dkc/internal/nodeconfig"
	"github.com/dkc-dev/dkc/internal/nodeconfig/wire"
	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
	"github.com/dkc-dev/dkc/sidecar/internal/checkpoint"
	"github.com/dkc-dev/dkc/sidecar/internal/kubeletunit"
	"github.com/dkc-dev/dkc/sidecar/internal/probe"
)

// errConfigFault marks what run returns when the config itself is to blame: the kubelet, running it, did not
// become healthy. Only such a failure marks a config failed (and rolls back); anything else — the service
// manager, the env file, the sidecar being stopped in the middle of a health wait — says nothing about the
// config and is retried.
var errConfigFault = errors.New("kubelet not healthy with config")

// Events of Config.Trace.
const (
	TraceReceived     = "received"
	TraceCheckpointed = "checkpointed"
)

// ServiceManager restarts the kubelet; implemented by systemd.Manager (D-Bus) and systemd.Signal.
type ServiceManager interface {
	// Restart is `systemctl restart kubelet`: it returns when the restart job finished. When the job failed
	// because the kubelet's own process failed starting, the error has a method KubeletFailed() bool that
	// returns true (systemd.StartFailedError); any other failure says nothing about the config.
	Restart(ctx context.Context) error
	// MainPID is `systemctl show --property MainPID kubelet`: 0 when not running.
	MainPID(ctx context.Context) (int, error)
}

// Prober asks the running kubelet how it is; implemented by probe.Kubelet.
type Prober interface {
	Healthz(ctx context.Context, kc *configcheck.Checked) error
	Configz(ctx context.Context, kc *configcheck.Checked) (map[string]any, error)
}

// Reporter delivers status to the config service, retrying until acknowledged; implemented by the client.
type Reporter interface {
	// Report records the node's latest status and, if restart is not nil, queues that restart behind the
	// ones not yet acknowledged: each restart is delivered (and becomes its Event) once, in order.
	Report(status *dkcv1.NodeConfigStatus, message string, restart *dkcv1.KubeletRestart)
	// Follow says that the reports from now on are about Node object nodeUID: the state the agent applies
	// next was resolved from it (WatchConfigResponse.node_uid).
	Follow(nodeUID string)
}

// Desired is what the config service wants for the node.
type Desired struct {
	// Assignment to apply; nil keeps the current one (the service could not resolve a new one).
	Assignment *dkcv1.Assignment
	// SyncError is the service's error for the node's source, "" when it syncs.
	SyncError string
}

// Config of the agent.
type Config struct {
	// LocalConfig is the node's own kubelet config file, used when nothing (valid) is assigned.
	LocalConfig string
	// KubeletFlags, if not nil, are the kubelet's command-line flags; otherwise they are read from the
	// running kubelet's <ProcDir>/<pid>/cmdline (and remembered for when it is not running).
	KubeletFlags []string
	// ProcDir is the node's /proc (default); in a pod, the host's /proc mounted read-only, which shows the
	// kubelet's command line without sharing the host's PID namespace (and so without being able to signal
	// the node's processes).
	ProcDir string
	// TrialDuration a config must run healthy before it becomes last-known-good.
	TrialDuration time.Duration
	// HealthTimeout bounds the wait for the kubelet to come back healthy with a new config.
	HealthTimeout time.Duration
	// KeepCheckpoints is how many unreferenced checkpoints are kept besides assigned and last-known-good.
	KeepCheckpoints int
	// TrialCheckInterval is how often the trial is checked; default 10s, as the original.
	TrialCheckInterval time.Duration
	// Checker loads and validates configs with the kubelet's code, of the node kubelet's minor
	// (configcheck.Helpers in the daemon).
	Checker configcheck.Checker
	// KubeletVersion, if set, is the node kubelet's version the operator states (--kubelet-version); it
	// overrides the one the service sends (the Node's status.nodeInfo.kubeletVersion).
	KubeletVersion string
	// KubeletVersionRequired: the Checker checks nothing without the kubelet's version (the helpers, one per
	// minor). Init then leaves the kubelet alone and reports nothing until the service sends the version:
	// a version remembered from an earlier start may be stale (the node upgraded while the sidecar was
	// down), and a check with another minor's code could restart or roll back a kubelet for nothing.
	KubeletVersionRequired bool
	// Trace, if set, is called when an assignment is received (TraceReceived) and when a new one is durably
	// checkpointed (TraceCheckpointed): the benchmark's probes.
	Trace func(event string, src *corev1.NodeConfigSource)
}

// Agent runs the state machine for one node.
type Agent struct {
	cfg      Config
	log      *zap.Logger
	store    *checkpoint.Store
	env      kubeletunit.EnvFile
	svc      ServiceManager
	kubelet  Prober
	reporter Reporter
	metrics  *Metrics
	clock    clock.WithTicker
	state    *stateFile

	// What the node knows now.
	syncError      nodeconfig.StatusError   // from the service
	nodeUID        string                   // the Node object the service's last update was resolved from
	kubeletVersion string                   // the node kubelet's version, as the service last sent it
	localSyncError nodeconfig.StatusError   // checkpointing failed here
	localSyncWhy   string                   // why, for humans
	configError    nodeconfig.StatusError   // assigned could not be used
	detail         string                   // why, for humans
	active         *corev1.NodeConfigSource // config the kubelet runs, nil = local
	activeKnown    bool                     // active proven by this process; else active is the last proven one
	activeRecorded bool                     // active was ever proven on this node (state file or this process)
	clearPending   bool                     // the assignment's clearAssigned failed: retried with it
	retry          bool                     // the last reconcile could not decide (e.g. kubelet flags unknown yet): try again
	// unsynced is the last assignment from the service that could not be checkpointed (a failed disk write,
	// not a refused payload). The service sends an assignment once per change, so without this the node
	// would drop it until its next reconnect; it is retried at every tick instead, as the original re-synced
	// every 10s, until written or replaced by a newer one.
	unsynced *dkcv1.Assignment
	// Restarts since the last report, in order. One reconcile can restart the kubelet more than once (into
	// the assigned config, then back to last-known-good when it does not run), and each restart is an Event.
	pendingRestarts []*dkcv1.KubeletRestart
}

// Deps are what the agent acts through.
type Deps struct {
	Log      *zap.Logger
	Store    *checkpoint.Store
	Service  ServiceManager
	Kubelet  Prober
	Reporter Reporter
	// Metrics may be nil (no metrics); Clock nil is the real clock.
	Metrics *Metrics
	Clock   clock.WithTicker
}

// New returns an agent.
func New(cfg Config, d Deps) *Agent {
	if cfg.TrialCheckInterval == 0 {
		cfg.TrialCheckInterval = 10 * time.Second
	}
	if d.Clock == nil {
		d.Clock = clock.RealClock{}
	}
	if d.Log == nil {
		d.Log = zap.NewNop()
	}
	return &Agent{
		cfg: cfg, log: d.Log, store: d.Store, env: kubeletunit.New(d.Store.Dir()), svc: d.Service, kubelet: d.Kubelet,
		reporter: d.Reporter, metrics: d.Metrics, clock: d.Clock, state: &stateFile{path: filepath.Join(d.Store.Dir(), StateFileName)},
	}
}

// Init prepares the store and brings the kubelet in line with what is on disk — without restarting it if it
// already runs the right config. Call it before Run and before connecting to the service: a node with the
// service and apiserver down keeps what it has.
func (a *Agent) Init(ctx context.Context) error {
	// Every path the env file will name starts with one of these; refusing them here says at start what a
	// failed env-file write would otherwise only say on the first restart.
	for _, p := range []string{a.cfg.LocalConfig, a.store.Dir()} {
		if err := kubeletunit.ValidatePath(p); err != nil {
			return fmt.Errorf("kubelet env file cannot name this node's configs: %w", err)
		}
	}
	removed, err := a.store.Initialize()
	if err != nil {
		return fmt.Errorf("initialize checkpoint store %s: %w", a.store.Dir(), err)
	}
	if len(removed) > 0 {
		a.log.Info("removed leftovers of interrupted writes", zap.Strings("paths", removed))
	}
	if err := a.state.load(); err != nil {
		// A corrupt state file must not strand the node: start from an empty one.
		a.log.Warn("sidecar state unreadable; starting fresh", zap.Error(err))
		a.state.s = persisted{}
	}
	// Until this process proves what the kubelet runs (it may be stopped, its flags never seen), report what
	// was last proven: the service has no "unknown" for active and writes an absent one as local, which
	// would claim the node's local config while it runs an assigned one.
	if r := a.state.s.Active; r != nil {
		a.active, a.activeRecorded = r.Source, true
	}
	a.follow(a.state.s.NodeUID)
	// A kubelet started with another config than --kubelet-config would silently switch to that file at the
	// first restart dkc makes: refuse to start rather than change the node behind its operator's back.
	if a.cfg.KubeletFlags == nil {
		if _, err := a.kubeletFlags(ctx); errors.Is(err, errForeignConfig) {
			return err
		}
		// While the kubelet runs a checkpoint its command line cannot tell the local config; the unit can.
		if u, ok := a.svc.(unitConfig); ok {
			config, err := u.UnitConfigFlag(ctx)
			if err != nil {
				a.log.Warn("cannot read the kubelet unit's own --config; not checked against --kubelet-config", zap.Error(err))
			} else if config != "" && filepath.Clean(config) != filepath.Clean(a.cfg.LocalConfig) {
				return fmt.Errorf("%w: the kubelet unit gives the kubelet --config=%s ($%s), but --kubelet-config is %s; "+
					"fix --kubelet-config (resetting the node would switch the kubelet to that file)", errForeignConfig, config, kubeletunit.Variable, a.cfg.LocalConfig)
			}
		}
	}
	if a.cfg.KubeletVersionRequired && a.cfg.KubeletVersion == "" && a.kubeletVersion == "" {
		a.log.Info("kubelet version not known yet: configs are checked, and the kubelet touched, once the service sends it")
		return nil
	}
	a.reconcile(ctx)
	return nil
}

// unitConfig is implemented by service managers that can tell the --config the kubelet's unit sets by
// itself (systemd.Manager).
type unitConfig interface {
	UnitConfigFlag(ctx context.Context) (string, error)
}

// Applied is what the node has checkpointed as assigned, for resuming the service stream.
func (a *Agent) Applied() *dkcv1.AppliedConfig {
	assigned, err := a.store.Assigned()
	if err != nil {
		return nil // unknown: the service sends the current assignment
	}
	hash, err := a.store.ContentHash(assigned)
	if err != nil {
		return nil
	}
	return &dkcv1.AppliedConfig{Source: wire.SourceFromCore(assigned), ContentHash: hash}
}

// Run applies the service's updates and checks the trial until ctx ends. An update without an assignment
// carries only a sync error (the service could not resolve the node's new source): the node keeps what it
// has.
func (a *Agent) Run(ctx context.Context, updates <-chan *dkcv1.WatchConfigResponse) error {
	tick := a.clock.NewTicker(a.cfg.TrialCheckInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case u := <-updates:
			if uid := u.GetNodeUid(); uid != "" && uid != a.nodeUID {
				// Another Node object than before (the Node was registered again, or this sidecar never knew):
				// Apply's reconcile reports the node's status about it, even when nothing changes on the node.
				a.follow(uid)
				a.state.s.NodeUID = uid
				if err := a.state.save(); err != nil {
					a.log.Warn("cannot record the Node object followed; a restarted sidecar's first reports will not name it",
						zap.String("nodeUID", uid), zap.Error(err))
				}
			}
			if v := u.GetKubeletVersion(); v != "" && v != a.kubeletVersion {
				// Configs are checked with the code of this kubelet's minor from now on.
				a.log.Info("kubelet version", zap.String("kubeletVersion", v), zap.String("was", a.kubeletVersion))
				a.kubeletVersion = v
			}
			a.Apply(ctx, Desired{Assignment: u.GetAssignment(), SyncError: u.GetSyncError()})
		case <-tick.C():
			if a.unsynced != nil {
				a.log.Info("retrying checkpoint of the last assignment", sourceFields(checkpoint.SourceOf(a.unsynced))...)
				a.Apply(ctx, Desired{Assignment: a.unsynced, SyncError: string(a.syncError)})
			} else if a.retry {
				a.reconcile(ctx)
			}
			a.CheckTrial(ctx)
		}
	}
}

// follow makes the reports from now on name Node object uid ("": none).
func (a *Agent) follow(uid string) {
	a.nodeUID = uid
	if a.reporter != nil && uid != "" {
		a.reporter.Follow(uid)
	}
}

// Apply takes a desired state from the service.
func (a *Agent) Apply(ctx context.Context, d Desired) {
	a.syncError = nodeconfig.StatusError(d.SyncError)
	if d.Assignment != nil {
		a.unsynced = nil // a newer assignment replaces one not yet written
		before, _ := a.store.Assigned()
		a.assign(ctx, d.Assignment)
		if after, err := a.store.Assigned(); err == nil && !nodeconfig.SameSource(before, after) {
			// Say what is assigned before restarting into it, as the original's status did: a restart and
			// its health wait take seconds, and until now the Node would show the previous assignment as
			// assigned and active while the kubelet already restarts into another. The new assignment is not
			// judged yet, so the old one's error does not carry over to it. (Reported at once: holding it
			// back until the restart is done left a re-registered Node showing its deleted object's
			// assignment for the whole restart — TestNodeDeletedAndRejoined.)
			a.configError, a.detail = "", ""
			a.report()
		}
	}
	a.reconcile(ctx)
}

func (a *Agent) assign(ctx context.Context, as *dkcv1.Assignment) {
	assigned, err := a.store.Assigned()
	if err != nil {
		a.log.Error("read assigned record", zap.Error(err))
		assigned = nil
	}
	src := checkpoint.SourceOf(as)
	if a.cfg.Trace != nil {
		a.cfg.Trace(TraceReceived, src)
	}
	if src == nil {
		// Reset: the local config is always assumed good, so last-known-good is forgotten at once (as the
		// original's store.Reset).
		lkg, _ := a.store.LastKnownGood()
		if assigned != nil || lkg != nil {
			a.log.Info("assigned local config (reset)")
		}
		if err := a.store.SetLastKnownGood(nil); err != nil {
			a.failWrite(as, err)
			return
		}
		if err := a.store.SetAssigned(nil); err != nil {
			a.failWrite(as, err)
			return
		}
		if err := a.state.clearAssigned(nil, nil); err != nil {
			a.failWrite(as, fmt.Errorf("forget the trial and failures of the previous assignment: %w", err))
			return
		}
		a.localSyncError = ""
		return
	}
	if err := a.store.Save(as); err != nil {
		if errors.Is(err, checkpoint.ErrRefused) {
			a.fail(nodeconfig.PayloadError, err)
		} else {
			a.failWrite(as, err)
		}
		return
	}
	a.localSyncError = ""
	if nodeconfig.SameSource(src, assigned) && !a.clearPending {
		return
	}
	if err := a.store.SetAssigned(src); err != nil {
		a.failWrite(as, err)
		return
	}
	lkg, err := a.store.LastKnownGood()
	if err != nil {
		// reconcile treats an unreadable last-known-good as local, so it is no fallback whose failures matter.
		a.log.Error("read meta/last-known-good; treating it as local", zap.Error(err))
		lkg = nil
	}
	// A new assignment gets a fresh trial and a fresh chance. If that cannot be recorded, the old
	// failures stay in force (nothing that failed before is restarted into), the node says so, and the
	// retry tick tries again (clearPending: meta/assigned already names it, which alone would end the retry).
	if err := a.state.clearAssigned(src, lkg); err != nil {
		a.clearPending = true
		a.failWrite(as, fmt.Errorf("forget the trial and failures of the previous assignment: %w", err))
		return
	}
	a.clearPending = false
	a.log.Info("checkpointed new assignment", sourceFields(src)...)
	if a.cfg.Trace != nil {
		a.cfg.Trace(TraceCheckpointed, src)
	}
}

// failWrite records that as could not be written to disk and keeps it for the retry tick.
func (a *Agent) failWrite(as *dkcv1.Assignment, err error) {
	a.unsynced = as
	a.fail(nodeconfig.SyncInternalError, err)
}

func (a *Agent) fail(status nodeconfig.StatusError, err error) {
	a.localSyncError, a.localSyncWhy = status, err.Error()
	a.log.Error("sync failed", zap.Stringer("status", status), zap.Error(err))
}

// candidate is a config the kubelet could run.
type candidate struct {
	src    *corev1.NodeConfigSource // nil: local
	file   string
	config *configcheck.Checked
	flags  []string // the kubelet's flags it was checked with
}

func (a *Agent) load(ctx context.Context, src *corev1.NodeConfigSource, flags []string) (candidate, error) {
	c := candidate{src: src, file: a.cfg.LocalConfig, flags: flags}
	if src != nil {
		c.file = a.store.ConfigFile(src.ConfigMap)
	}
	version := a.kubeletVersion
	if a.cfg.KubeletVersion != "" {
		version = a.cfg.KubeletVersion
	}
	r, err := a.cfg.Checker.Check(ctx, configcheck.Request{File: c.file, Flags: flags, KubeletVersion: version})
	if err != nil {
		return c, err
	}
	for _, w := range r.Warnings {
		a.log.Warn("kubelet config warning", zap.String("file", c.file), zap.String("warning", w))
	}
	c.config = r
	return c, nil
}

func statusFor(err error) nodeconfig.StatusError {
	switch {
	case errors.Is(err, configcheck.ErrLoad):
		return nodeconfig.LoadError
	case errors.Is(err, configcheck.ErrValidate):
		return nodeconfig.ValidateError
	case errors.Is(err, configcheck.ErrUnsupportedKubelet):
		return nodeconfig.UnsupportedKubeletError
	default:
		return nodeconfig.InternalError
	}
}

// reconcile decides the target config and brings the kubelet to it, then reports.
func (a *Agent) reconcile(ctx context.Context) {
	defer a.report()
	a.retry = false
	for attempt := 0; attempt < 3; attempt++ { // assigned, then last-known-good, then local: never a loop
		if done := a.reconcileOnce(ctx); done {
			return
		}
	}
}

// reconcileOnce returns false when a failed restart changed what should run, so another round is needed.
func (a *Agent) reconcileOnce(ctx context.Context) bool {
	assigned, err := a.store.Assigned()
	if err != nil {
		a.configError, a.detail = nodeconfig.InternalError, err.Error()
		a.log.Error("read meta/assigned", zap.Error(err))
		a.retry = true
		return true
	}
	lkg, err := a.store.LastKnownGood()
	if err != nil {
		a.log.Error("read meta/last-known-good; treating it as local", zap.Error(err))
		lkg = nil
	}
	flags, err := a.kubeletFlags(ctx)
	if err != nil {
		a.configError, a.detail = nodeconfig.InternalError, err.Error()
		a.log.Error("kubelet command line unknown or not dkc's to manage; not changing the kubelet, will retry", zap.Error(err))
		a.retry = true
		return true
	}

	a.configError, a.detail = "", ""
	var target candidate
	usable := false
	if assigned != nil {
		if f := a.state.failure(assigned); f != "" {
			a.configError, a.detail = nodeconfig.HealthError, f
		} else if c, err := a.load(ctx, assigned, flags); err != nil {
			a.configError, a.detail = statusFor(err), err.Error()
			// The check itself failed (the helper could not run): not the config's fault, so try again.
			a.retry = a.retry || a.configError == nodeconfig.InternalError
			a.log.Warn("assigned config unusable; falling back", append(sourceFields(assigned), zap.Stringer("status", a.configError), zap.Error(err))...)
		} else {
			target, usable = c, true
		}
	}
	if !usable && lkg != nil && a.state.failure(lkg) == "" {
		if c, err := a.load(ctx, lkg, flags); err != nil {
			a.log.Error("last-known-good config unusable; falling back to local", append(sourceFields(lkg), zap.Error(err))...)
		} else {
			target, usable = c, true
		}
	}
	if !usable {
		c, err := a.load(ctx, nil, flags)
		if err != nil {
			// The node's own config does not validate: nothing dkc can pick is safe, so touch nothing.
			switch {
			case errors.Is(err, configcheck.ErrUnsupportedKubelet):
				// Not the local config's fault: dkc has no code for this kubelet and checks nothing; that
				// says more than whatever the assigned config's own error was.
				a.configError, a.detail = nodeconfig.UnsupportedKubeletError, err.Error()
			case a.configError == "":
				a.configError, a.detail = nodeconfig.InternalError, "local config: "+err.Error()
			}
			a.log.Error("local kubelet config unusable; leaving the kubelet alone", zap.String("file", a.cfg.LocalConfig), zap.Error(err))
			return true
		}
		target = c
	}

	if err := a.run(ctx, target); err != nil {
		if probe.Unverifiable(err) && !errors.Is(err, errConfigFault) {
			a.activeKnown = false
			if ctx.Err() != nil {
				return true
			}
			a.configError, a.detail = nodeconfig.VerifyError, err.Error()
			if errors.Is(err, probe.ErrNoAnswer) {
				a.configError = nodeconfig.VerifyTimeoutError
			}
			a.retry = true
			a.log.Warn("kubelet healthy but /configz refused or unanswered; the config is not blamed, verifying again", append(sourceFields(target.src), zap.Error(err))...)
			return true
		}
		if !errors.Is(err, errConfigFault) {
			// What runs now is unknown until the next reconcile proves it through /configz.
			a.activeKnown = false
			if ctx.Err() != nil {
				return true // stopping: the next start picks up from what is on disk
			}
			a.configError, a.detail = nodeconfig.RestartError, err.Error()
			a.retry = true
			a.log.Error("could not make the kubelet run the target config; retrying, the config is not blamed", append(sourceFields(target.src), zap.Error(err))...)
			return true
		}
		a.log.Error("kubelet did not come back healthy with the target config", append(sourceFields(target.src), zap.Error(err))...)
		if target.src == nil {
			a.configError, a.detail = nodeconfig.HealthError, "local config: "+err.Error()
			return true // nothing left to roll back to; no more restarts
		}
		a.state.markFailed(target.src, err.Error())
		if err := a.state.save(); err != nil {
			a.log.Error("persist failed config", zap.Error(err))
		}
		return false
	}
	if target.src != nil && nodeconfig.SameSource(target.src, assigned) {
		if a.state.startTrial(assigned, a.clock.Now()) {
			if err := a.state.save(); err != nil {
				a.log.Error("persist trial start", zap.Error(err))
			}
			a.log.Info("assigned config active; trial started", append(sourceFields(assigned), zap.Duration("trialDuration", a.cfg.TrialDuration))...)
		}
	}
	a.gc(assigned, lkg)
	return true
}

// run makes the kubelet run target: it restarts the kubelet only when the env file must change, or when the
// kubelet demonstrably does not run what the env file says (a crash between writing the file and restarting).
func (a *Agent) run(ctx context.Context, target candidate) error {
	current, err := a.env.Get()
	if err != nil {
		a.log.Warn("kubelet env file unreadable; rewriting it", zap.Error(err))
	}
	if current == "" && err == nil {
		// No env file yet (first start on this node): the drop-in ignores a missing file, so the kubelet
		// runs its local config.
		current = a.cfg.LocalConfig
		if target.src == nil {
			if err := a.env.Set(target.file); err != nil {
				return fmt.Errorf("write kubelet env file: %w", err)
			}
		}
	}
	if current == target.file && a.activeKnown && nodeconfig.SameSource(a.active, target.src) {
		return nil
	}
	if current == target.file {
		if pid, err := a.svc.MainPID(ctx); err == nil && pid == 0 {
			// Not running at all (stopped, or its unit failed, e.g. on its start limit): waiting for it to
			// become healthy would only blame the config for what the service manager did.
			a.log.Info("kubelet is not running; starting it", sourceFields(target.src)...)
		} else if err := a.verify(ctx, target, a.cfg.HealthTimeout, true); err == nil {
			a.setActive(target.src)
			return nil
		} else if !errors.Is(err, errMismatch) {
			if ctx.Err() != nil || (probe.Unverifiable(err) && a.authLikeLocal(ctx, target)) {
				return err
			}
			return fmt.Errorf("%w: %v", errConfigFault, err)
		} else {
			a.log.Info("kubelet runs another config than its env file names; restarting it", sourceFields(target.src)...)
		}
	}
	if err := a.env.Set(target.file); err != nil {
		return fmt.Errorf("write kubelet env file: %w", err)
	}
	restart := &dkcv1.KubeletRestart{Id: newRestartID(), Target: wire.SourceFromCore(target.src), Time: nil}
	a.log.Info("restarting kubelet to use config", append(sourceFields(target.src), zap.String("file", target.file))...)
	if err := a.svc.Restart(ctx); err != nil {
		if kubeletFailed(err) {
			// The kubelet was stopped and started, and failed running this config: a restart that happened
			// (its Event), and the config's fault as a kubelet that does not become healthy is.
			restart.Time = timestamp(a.clock.Now())
			a.pendingRestarts = append(a.pendingRestarts, restart)
			a.metrics.restarted()
			return fmt.Errorf("%w: restart kubelet: %v", errConfigFault, err)
		}
		return fmt.Errorf("restart kubelet: %w", err)
	}
	// Stamped when the restart job is done, not when it was asked for: the service manager may first wait
	// for room in the unit's start limit, and the Event must say when the kubelet really restarted.
	start := a.clock.Now()
	restart.Time = timestamp(start)
	a.pendingRestarts = append(a.pendingRestarts, restart)
	a.metrics.restarted()
	if err := a.verify(ctx, target, a.cfg.HealthTimeout, false); err != nil {
		if ctx.Err() != nil {
			return err // stopped in the middle of the health wait: that is not the config's fault
		}
		if probe.Unverifiable(err) && a.authLikeLocal(ctx, target) {
			return err // healthy, but what it runs cannot be read, and not for its auth settings
		}
		return fmt.Errorf("%w: %v", errConfigFault, err)
	}
	a.setActive(target.src)
	a.log.Info("kubelet healthy with config", append(sourceFields(target.src), zap.Duration("took", a.clock.Since(start)))...)
	return nil
}

// kubeletFailed says whether a Restart error says the kubelet's own process failed starting (see
// ServiceManager).
func kubeletFailed(err error) bool {
	var f interface{ KubeletFailed() bool }
	return errors.As(err, &f) && f.KubeletFailed()
}

// authLikeLocal says whether target authenticates and authorizes requests as the node's local config does
// (effective values). Only then does a kubelet refusing the sidecar's /configz say nothing about the config; a
// config that changes authentication (webhook off, another client CA) may itself be why the kubelet refuses.
// Asked only after a refusal, so the local config is checked again only then.
func (a *Agent) authLikeLocal(ctx context.Context, target candidate) bool {
	if target.src == nil {
		return true
	}
	local, err := a.load(ctx, nil, target.flags)
	if err != nil {
		return false // unknown: a refusal may be the config's doing
	}
	for _, f := range []string{"authentication", "authorization"} {
		if !reflect.DeepEqual(target.config.Fields[f], local.config.Fields[f]) {
			return false
		}
	}
	return true
}

// setActive records that the kubelet was proven to run src, on disk too for the next sidecar's first status.
func (a *Agent) setActive(src *corev1.NodeConfigSource) {
	a.active, a.activeKnown, a.activeRecorded = src, true, true
	if a.state.setActive(src) {
		if err := a.state.save(); err != nil {
			// Only a restarted sidecar's first status depends on it, until it proves the active config again.
			a.log.Warn("persist active config", zap.Error(err))
		}
	}
}

var errMismatch = errors.New("kubelet runs another config")

// verify waits until the kubelet is healthy and its configz shows the target's fields. With
// mismatchIsFinal, a healthy kubelet reporting another config returns errMismatch at once.
func (a *Agent) verify(ctx context.Context, target candidate, timeout time.Duration, mismatchIsFinal bool) error {
	content, err := os.ReadFile(target.file)
	if err != nil {
		return fmt.Errorf("read %s: %w", target.file, err)
	}
	deadline := a.clock.Now().Add(timeout)
	var last error
	for {
		last = a.check(ctx, target, content)
		if last == nil {
			return nil
		}
		if mismatchIsFinal && errors.Is(last, errMismatch) {
			return last
		}
		if a.clock.Now().After(deadline) {
			return fmt.Errorf("not healthy with %s after %v: %w", target.file, timeout, last)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-a.clock.After(500 * time.Millisecond):
		}
	}
}

func (a *Agent) check(ctx context.Context, target candidate, content []byte) error {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := a.kubelet.Healthz(cctx, target.config); err != nil {
		return fmt.Errorf("healthz: %w", err)
	}
	running, err := a.kubelet.Configz(cctx, target.config)
	if err != nil {
		return fmt.Errorf("configz: %w", err)
	}
	diff, err := probe.Mismatch(target.config, content, running)
	if err != nil {
		return err
	}
	if len(diff) > 0 {
		return fmt.Errorf("%w: %s", errMismatch, strings.Join(diff, "; "))
	}
	return nil
}

// CheckTrial promotes the assigned config to last-known-good once it has run healthy for the trial
// duration. No restart is needed: the kubelet already runs it.
func (a *Agent) CheckTrial(ctx context.Context) {
	assigned, err := a.store.Assigned()
	if err != nil || assigned == nil || !a.activeKnown || !nodeconfig.SameSource(a.active, assigned) {
		return
	}
	lkg, err := a.store.LastKnownGood()
	if err != nil || nodeconfig.SameSource(assigned, lkg) {
		return
	}
	start := a.state.trialStart(assigned)
	if start.IsZero() || a.clock.Since(start) < a.cfg.TrialDuration {
		return
	}
	flags, err := a.kubeletFlags(ctx)
	if err != nil {
		return
	}
	c, err := a.load(ctx, assigned, flags)
	if err != nil {
		return
	}
	if err := a.kubelet.Healthz(ctx, c.config); err != nil {
		a.log.Info("trial over but kubelet not healthy now; not promoting yet", zap.Error(err))
		return
	}
	if err := a.store.SetLastKnownGood(assigned); err != nil {
		a.log.Error("write last-known-good", zap.Error(err))
		return
	}
	a.log.Info("updated last-known-good config", sourceFields(assigned)...)
	a.gc(assigned, assigned)
	a.report()
}

func (a *Agent) gc(assigned, lkg *corev1.NodeConfigSource) {
	removed, err := a.store.GC([]*corev1.NodeConfigSource{assigned, lkg, a.active}, a.cfg.KeepCheckpoints)
	if err != nil {
		a.log.Warn("checkpoint garbage collection failed", zap.Error(err))
	}
	if len(removed) > 0 {
		a.log.Info("removed unreferenced checkpoints", zap.Strings("checkpoints", removed))
	}
}

// Status is the node's current config status.
func (a *Agent) Status() (*dkcv1.NodeConfigStatus, string) {
	assigned, _ := a.store.Assigned()
	lkg, _ := a.store.LastKnownGood()
	errText, detail := a.configError, a.detail
	if a.localSyncError != "" {
		errText, detail = a.localSyncError, a.localSyncWhy
	}
	if a.syncError != "" {
		errText = a.syncError
	}
	// Not proven yet by this process, a.active is the last proven config (Init), never a default of local.
	active := a.active
	return &dkcv1.NodeConfigStatus{
		Assigned:      wire.SourceFromCore(assigned),
		Active:        wire.SourceFromCore(active),
		LastKnownGood: wire.SourceFromCore(lkg),
		Error:         string(errText),
	}, detail
}

func (a *Agent) report() {
	st, detail := a.Status()
	a.metrics.set(st)
	if !a.activeRecorded && len(a.pendingRestarts) == 0 && st.GetError() == "" {
		// Nothing ever proved what the kubelet runs (a sidecar upgraded from a version that kept no record,
		// with the kubelet stopped or its flags unknown): the service writes an absent active as local, which
		// may be false. Report nothing until it is known; the Node keeps what it showed. An error is reported
		// all the same (active then shows local): the operator must see why the node is stuck.
		a.log.Info("not reporting status until the kubelet's active config is known")
		return
	}
	if a.reporter != nil {
		if len(a.pendingRestarts) == 0 {
			a.reporter.Report(st, detail, nil)
		}
		for _, r := range a.pendingRestarts {
			a.reporter.Report(st, detail, r)
		}
	}
	a.pendingRestarts = nil // the reporter owns them now, until acknowledged
}

// kubeletFlags returns the kubelet's command-line flags without --config.
func (a *Agent) kubeletFlags(ctx context.Context) ([]string, error) {
	if a.cfg.KubeletFlags != nil {
		return a.cfg.KubeletFlags, nil
	}
	pid, err := a.svc.MainPID(ctx)
	if err == nil && pid > 0 {
		path := filepath.Join(a.procDir(), strconv.Itoa(pid), "cmdline")
		raw, err := os.ReadFile(path)
		if err != nil {
			// E.g. a host /proc mounted with hidepid, which hides the kubelet (it holds capabilities this
			// process lacks): say so; --kubelet-flags is the way out.
			a.log.Warn("cannot read the kubelet's command line; using the flags seen last (--kubelet-flags gives them)", zap.String("path", path), zap.Error(err))
		} else {
			args := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
			if len(args) > 0 {
				config, rest := configcheck.ConfigFlag(args[1:])
				if err := checkConfigFlag(config, a.cfg.LocalConfig, a.store.Dir()); err != nil {
					return nil, err
				}
				if rest == nil {
					rest = []string{}
				}
				if a.state.setFlags(rest) {
					if err := a.state.save(); err != nil {
						a.log.Warn("persist kubelet flags", zap.Error(err))
					}
				}
				return rest, nil
			}
		}
	}
	if f := a.state.s.KubeletFlags; f != nil {
		return f, nil
	}
	return nil, errors.New("the kubelet is not running and its flags were never seen")
}

// procDir is where the node's processes are seen: /proc, or the host's /proc mounted into the pod.
func (a *Agent) procDir() string {
	if a.cfg.ProcDir != "" {
		return a.cfg.ProcDir
	}
	return "/proc"
}

// errForeignConfig marks a kubelet running with a --config dkc did not give it.
var errForeignConfig = errors.New("kubelet runs a config dkc does not manage")

// checkConfigFlag accepts the running kubelet's --config value when it is the node's local config
// (--kubelet-config) or one of dkc's checkpoints (inside --dynamic-config-dir). Anything else means
// --kubelet-config is wrong: the next restart dkc makes would replace the kubelet's real config with it. No
// --config at all is accepted: the kubelet then runs on flags and defaults, and there is no path to compare.
func checkConfigFlag(running, local, dynamicConfigDir string) error {
	if running == "" || filepath.Clean(running) == filepath.Clean(local) {
		return nil
	}
	if rel, err := filepath.Rel(dynamicConfigDir, running); err == nil && filepath.IsAbs(running) && rel != "." &&
		rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return nil
	}
	return fmt.Errorf("%w: the kubelet runs with --config=%s, which is neither --kubelet-config=%s nor inside --dynamic-config-dir=%s; "+
		"fix --kubelet-config (a restart by dkc would switch the kubelet to that file)", errForeignConfig, running, local, dynamicConfigDir)
}

func sourceFields(src *corev1.NodeConfigSource) []zap.Field {
	if src == nil || src.ConfigMap == nil {
		return []zap.Field{zap.String("source", "local")}
	}
	cm := src.ConfigMap
	return []zap.Field{zap.String("source", cm.Namespace+"/"+cm.Name), zap.String("uid", string(cm.UID)),
		zap.String("resourceVersion", cm.ResourceVersion), zap.String("kubeletConfigKey", cm.KubeletConfigKey)}
}

func newRestartID() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
