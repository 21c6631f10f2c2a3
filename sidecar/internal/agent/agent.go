// SPDX-License-Identifier: Apache-2.0

// Package agent is the node's state machine: it checkpoints what the config service assigns, decides which
// config the kubelet should run (assigned if it loads, validates and runs; else last-known-good; else the
// local config), makes the kubelet use it and restarts it through the service manager only when that changes,
// checks that the kubelet came back healthy with the intended config, rolls back when it did not, promotes a
// config that ran healthy for the trial duration to last-known-good, and reports the node's status.
//
// Everything it decides from survives a restart of the sidecar: the checkpoint store, the kubelet env file
// and a small state file (trial start, configs that failed to run, the kubelet's flags). A sidecar restart
// alone therefore never restarts the kubelet.
//
// The files say what they own: agent.go the loop (Init, Run, Apply); assign.go checkpointing what the service
// assigns; decide.go the rollback rules as pure decisions, and the Phase and Outcome they speak in
// (docs/design.md, "The rollback rules"); reconcile.go carrying a round's decisions out; restart.go making the
// kubelet run a config and judging the outcome; trial.go promotion to last-known-good; report.go the status;
// phase.go recording the phase; kubeletflags.go the kubelet's command line; state.go the state file;
// preview.go answering a pool's preview of a revision, which judges it as a restart would without touching
// the kubelet or what is assigned; drift.go finding the kubelet running something else than it should
// (ReportStatusRequest.drift) without changing anything; repair.go repairing dkc's wiring of the kubelet
// once when a pool asks (WatchConfigResponse.drift_repair); upgrade.go finding a kubelet upgraded in place
// to a minor that does not run it.
package agent

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
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
)

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

// StateResetter is a ServiceManager that can also remove the kubelet state a config change invalidates,
// with the kubelet stopped; implemented by systemd.Manager. A ServiceManager without it (systemd.Signal,
// whose kubelet another supervisor restarts at once) cannot make such a change, drained or not: the config
// is refused as one the kubelet would not run (reset.go, cannotReset). (An interface of its own rather than
// more methods on ServiceManager: the simulated nodes and the benchmark's stand-ins are ServiceManagers that
// never reset state.)
type StateResetter interface {
	// Stop is `systemctl stop kubelet`: it returns when the stop job finished.
	Stop(ctx context.Context) error
	// RemoveFiles is `systemd-run --wait --property Type=oneshot /bin/rm -f -- PATHS` (absolute paths): it
	// returns when rm has exited, with an error unless it succeeded.
	RemoveFiles(ctx context.Context, paths []string) error
}

// Prober asks the running kubelet how it is; implemented by probe.Kubelet.
type Prober interface {
	Healthz(ctx context.Context, kc *configcheck.Checked) error
	Configz(ctx context.Context, kc *configcheck.Checked) (map[string]any, error)
	// Foreign says why the kubelet cannot listen where kc puts it on this node (an address that is not the
	// node's), or nil.
	Foreign(kc *configcheck.Checked) error
}

// Reporter delivers status to the config service, retrying until acknowledged; implemented by the client.
type Reporter interface {
	// Report records the node's latest status and, if restart is not nil, queues that restart behind the
	// ones not yet acknowledged: each restart is delivered (and becomes its Event) once, in order. preview
	// is the node's answer to the pool preview that stands (nil: none stands), drift the difference the last
	// drift check found (nil: none, or no check yet); both are part of that status and ride on every report
	// of it. The agent never changes a PreviewResult or Drift it passed.
	Report(status *dkcv1.NodeConfigStatus, message string, preview *dkcv1.PreviewResult, drift *dkcv1.Drift,
		restart *dkcv1.KubeletRestart)
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
	// Drained: the node is cordoned and drained for Assignment (WatchConfigResponse.drained), so the kubelet
	// state that going from the running config to Assignment's invalidates may be removed. It holds for that
	// assignment only; without an assignment, false withdraws what an earlier update said.
	Drained bool
	// Preview is the pool preview that stands (WatchConfigResponse.preview); nil: none stands any more.
	// It is judged (preview.go) after the assignment is applied, and never touches the kubelet.
	Preview *dkcv1.Preview
	// DriftRepair is a pool's request to repair the node's drift (WatchConfigResponse.drift_repair), for
	// Assignment (without one: for the assignment last received); nil: none stands. Acted on at most once
	// (repair.go).
	DriftRepair *dkcv1.DriftRepair
}

// Config of the agent: what it acts through, then how it behaves.
type Config struct {
	// Log is where the agent logs; nil: nowhere.
	Log *zap.Logger
	// NodeName names the node in the few messages an operator acts on from another machine (a drain to
	// make); "": NODE.
	NodeName string
	// Store is the node's checkpoint store (--dynamic-config-dir), which also holds the kubelet env file and
	// the state file. Required.
	Store *checkpoint.Store
	// Service restarts the kubelet (systemd.Manager, systemd.Signal). Required by Init and Run.
	Service ServiceManager
	// Kubelet probes the running kubelet (probe.Kubelet). Required by Init and Run.
	Kubelet Prober
	// Reporter delivers the node's status to the service (the client); nil: nothing is reported.
	Reporter Reporter
	// Metrics records the node_config gauges, restarts and the phase; nil: no metrics.
	Metrics *Metrics
	// Clock is the wall clock: times reported and recorded, ticks, waits; nil: the real clock.
	Clock clock.WithTicker
	// TrialClock measures how long a trial has run: only differences of its own readings within this
	// process are used, which on the real clock are monotonic, so that no step of the wall clock shortens or
	// extends a trial. nil: Clock.
	TrialClock clock.PassiveClock

	// LocalConfig is the node's own kubelet config file, used when nothing (valid) is assigned.
	LocalConfig string
	// KubeletFlags, if not nil, are the kubelet's command-line flags; otherwise they are read from the
	// running kubelet's <ProcDir>/<pid>/cmdline (and remembered for when it is not running).
	KubeletFlags []string
	// ProcDir is the node's /proc ("": /proc); in a pod, the host's /proc mounted read-only, which shows the
	// kubelet's command line without sharing the host's PID namespace (and so without being able to signal
	// the node's processes).
	ProcDir string
	// TrialDuration a config must run healthy before it becomes last-known-good (0: promoted at the first
	// trial check). It counts only while a sidecar runs on the node: time while none ran is not counted
	// (nobody watched the kubelet), nor, after a crash, what the crashed one measured since its last save
	// (at most trialSaveInterval).
	TrialDuration time.Duration
	// HealthTimeout bounds the wait for the kubelet to come back healthy with a new config.
	HealthTimeout time.Duration
	// KeepCheckpoints is how many unreferenced checkpoints are kept besides assigned and last-known-good
	// (0: none).
	KeepCheckpoints int
	// TrialCheckInterval is how often the trial is checked, and retries made; 0: 10s, as the original.
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
	// DriftInterval is how often the kubelet is checked for drift besides after each start of it the
	// sidecar did not make (drift.go); 0: only after those starts.
	DriftInterval time.Duration
	// KubeletDropIn is dkc's kubelet drop-in (--kubelet-dropin), part of the wiring the drift check
	// verifies: over the service manager (the unit loads it and dkc's env file), and by its content where
	// the sidecar sees the file. "": not checked by path.
	KubeletDropIn string
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
	trial    clock.PassiveClock
	state    *stateFile

	// What the node knows now.
	syncError      nodeconfig.StatusError   // from the service
	nodeUID        string                   // the Node object the service's last update was resolved from
	kubeletVersion string                   // the node kubelet's version, as the service last sent it
	nodeCapacity   corev1.ResourceList      // the Node's capacity, as the service last sent it
	localSyncError nodeconfig.StatusError   // checkpointing failed here
	localSyncWhy   string                   // why, for humans
	configError    nodeconfig.StatusError   // assigned could not be used
	detail         string                   // why, for humans
	active         *corev1.NodeConfigSource // config the kubelet runs, nil = local
	activeKnown    bool                     // active proven by this process; else active is the last proven one
	activeRecorded bool                     // active was ever proven on this node (state file or this process)
	clearPending   bool                     // the assignment's clearAssigned failed: retried with it
	// the last reconcile could not decide (e.g. kubelet flags unknown yet): try again
	retry bool
	// noCapacityLogged: that admission is not predicted for want of a capacity was said once.
	noCapacityLogged bool
	// unsynced is the last assignment from the service that could not be checkpointed (a failed disk write,
	// not a refused payload). The service sends an assignment once per change, so without this the node
	// would drop it until its next reconnect; it is retried at every tick instead, as the original re-synced
	// every 10s, until written or replaced by a newer one.
	unsynced *dkcv1.Assignment
	// drained is the service's last word on the node's drain, with the assignment it came with: the node is
	// drained for that assignment only (a later one needs its own drain).
	drained drainMark
	// phase is where the node stands in the rollback rules (decide.go); outcome is the last one logged.
	phase   Phase
	outcome string
	// preview is the pool preview that stands and the node's answer to it (preview.go).
	preview previewState
	// drift is what the drift check found and what it watches (drift.go).
	drift driftState
	// repair is the pool's drift repair request that stands, and what was done and said of it (repair.go).
	repair repairState
	// upgrade watches for a kubelet upgraded in place that does not come up (upgrade.go).
	upgrade upgradeState
	// Restarts since the last report, in order. One reconcile can restart the kubelet more than once (into
	// the assigned config, then back to last-known-good when it does not run), and each restart is an Event.
	pendingRestarts []*dkcv1.KubeletRestart
}

// New returns an agent.
func New(cfg Config) *Agent {
	if cfg.TrialCheckInterval == 0 {
		cfg.TrialCheckInterval = 10 * time.Second
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.TrialClock == nil {
		cfg.TrialClock = cfg.Clock
	}
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	return &Agent{trial: cfg.TrialClock,
		cfg: cfg, log: cfg.Log, store: cfg.Store, env: kubeletunit.New(cfg.Store.Dir()),
		svc: cfg.Service, kubelet: cfg.Kubelet,
		reporter: cfg.Reporter, metrics: cfg.Metrics, clock: cfg.Clock,
		state: &stateFile{path: filepath.Join(cfg.Store.Dir(), StateFileName)},
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
	a.state.takeUpTrial(a.clock.Now(), a.trial.Now())
	// Until this process proves what the kubelet runs (it may be stopped, its flags never seen), report what
	// was last proven: the service has no "unknown" for active and writes an absent one as local, which
	// would claim the node's local config while it runs an assigned one.
	a.loadPhase()
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
					"fix --kubelet-config (resetting the node would switch the kubelet to that file)", errForeignConfig, config,
					kubeletunit.Variable, a.cfg.LocalConfig)
			}
		}
	}
	if a.cfg.KubeletVersionRequired && a.cfg.KubeletVersion == "" && a.kubeletVersion == "" {
		a.waitForKubeletVersion()
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
// has. A pool preview that stands is judged between updates, never before one that waits (preview.go).
func (a *Agent) Run(ctx context.Context, updates <-chan *dkcv1.WatchConfigResponse) error {
	tick := a.clock.NewTicker(a.cfg.TrialCheckInterval)
	defer tick.Stop()
	for {
		if a.previewDue() && ctx.Err() == nil {
			// A real assignment goes first: an update already waiting is applied before the preview is
			// judged, and the loop looks again for the next one.
			select {
			case u := <-updates:
				a.take(ctx, u)
				continue
			default:
			}
			a.answerPreview(ctx)
		}
		select {
		case <-ctx.Done():
			a.saveTrial(true) // what this process measured of the trial survives a graceful stop
			return nil
		case u := <-updates:
			a.take(ctx, u)
		case <-tick.C():
			a.tick(ctx)
		}
	}
}

// tick is the loop's periodic work: retries, the trial, then the drift check, which never runs while a
// retry is pending (watchDrift).
func (a *Agent) tick(ctx context.Context) {
	if a.unsynced != nil {
		a.log.Info("retrying checkpoint of the last assignment", sourceFields(checkpoint.SourceOf(a.unsynced))...)
		a.apply(ctx, Desired{Assignment: a.unsynced, SyncError: string(a.syncError),
			Drained: a.drained.of(checkpoint.SourceOf(a.unsynced)), Preview: a.preview.req, DriftRepair: a.repair.req})
	} else if a.retry {
		a.reconcile(ctx)
	}
	a.CheckTrial(ctx)
	a.watchDrift(ctx)
	a.repairDrift(ctx) // after the check: a request waits for a finding made on what the kubelet runs now
}

// take applies an update from the service; a preview it brings is judged by the caller.
func (a *Agent) take(ctx context.Context, u *dkcv1.WatchConfigResponse) {
	if uid := u.GetNodeUid(); uid != "" && uid != a.nodeUID {
		// Another Node object than before (the Node was registered again, or this sidecar never knew):
		// apply's reconcile reports the node's status about it, even when nothing changes on the node.
		a.follow(uid)
		a.state.s.NodeUID = uid
		if err := a.state.save(); err != nil {
			a.log.Warn("cannot record the Node object followed; a restarted sidecar's first reports will not name it",
				zap.String("nodeUID", uid), zap.Error(err))
		}
	}
	if v := u.GetKubeletVersion(); v != "" && a.serviceVersion(v) && v != a.kubeletVersion {
		// Configs are checked with the code of this kubelet's minor from now on.
		a.log.Info("kubelet version", zap.String("kubeletVersion", v), zap.String("was", a.kubeletVersion))
		a.setKubeletVersion(v)
	}
	if m := u.GetNodeCapacity(); len(m) > 0 {
		a.setCapacity(m)
	}
	a.apply(ctx, Desired{Assignment: u.GetAssignment(), SyncError: u.GetSyncError(), Drained: u.GetDrained(),
		Preview: u.GetPreview(), DriftRepair: u.GetDriftRepair()})
}

// follow makes the reports from now on name Node object uid ("": none).
func (a *Agent) follow(uid string) {
	a.nodeUID = uid
	if a.reporter != nil && uid != "" {
		a.reporter.Follow(uid)
	}
}

// Apply takes a desired state from the service, then judges its preview if one is due.
func (a *Agent) Apply(ctx context.Context, d Desired) {
	a.apply(ctx, d)
	if a.previewDue() {
		a.answerPreview(ctx)
	}
}

// apply takes a desired state from the service: its assignment is applied, its preview only taken note of
// (the withdrawal of one is in the reports from here on).
func (a *Agent) apply(ctx context.Context, d Desired) {
	a.syncError = nodeconfig.StatusError(d.SyncError)
	a.takeDrain(d)
	a.takeRepair(d)
	drop := a.takePreview(d.Preview)
	changed := false
	if d.Assignment != nil {
		a.unsynced = nil // a newer assignment replaces one not yet written
		before, _ := a.store.Assigned()
		a.assign(ctx, d.Assignment)
		if after, err := a.store.Assigned(); err == nil && !nodeconfig.SameSource(before, after) {
			changed = true
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
	a.dropPreviewCheckpoint(drop)
	if !changed {
		// Before the round: a round restarts a kubelet whose env file is gone or changed by itself, and a
		// repair the pool asked for is recorded, so that it is never repeated (repair.go). A new assignment
		// is repaired, if at all, once a drift check looked at the kubelet running it (at a tick).
		a.repairDrift(ctx)
	}
	a.reconcile(ctx)
}

func sourceFields(src *corev1.NodeConfigSource) []zap.Field {
	if src == nil || src.ConfigMap == nil {
		return []zap.Field{zap.String("source", "local")}
	}
	cm := src.ConfigMap
	return []zap.Field{zap.String("source", cm.Namespace+"/"+cm.Name), zap.String("uid", string(cm.UID)),
		zap.String("resourceVersion", cm.ResourceVersion), zap.String("kubeletConfigKey", cm.KubeletConfigKey)}
}
