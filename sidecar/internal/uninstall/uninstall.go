// SPDX-License-Identifier: Apache-2.0

// Package uninstall takes dkc off a node (`dkc-sidecar --uninstall`): it returns the kubelet to the node's
// local config and removes what dkc wrote on the node — the kubelet drop-in, the env file it loads, the
// checkpoints, meta/ and the sidecar's own state — and puts none of it back, except onto a kubelet that did
// not come up healthy on its local config (below).
//
// The order is what makes it safe to interrupt anywhere and to run again: each step leaves a node whose
// kubelet starts at its next restart and is never told to use a file that is gone.
//
//  1. the drop-in goes first, then systemd re-reads the unit (daemon-reload): from then on a kubelet start,
//     whoever causes it, runs the unit's own --config, whatever kubelet.env says;
//  2. kubelet.env goes only once the loaded unit no longer lists it (dkc's drop-in loads it with a "-" prefix,
//     so even a stale unit would start without it, but a drop-in of someone else's might not);
//  3. a kubelet still running a checkpoint is restarted, and the cleanup waits until it is healthy on its
//     local config; a kubelet already on it is not restarted;
//  4. only then do meta/ and checkpoints/ go: while the kubelet might still run a checkpoint they stay, and
//     while the kubelet is not healthy on its local config they stay too, as the operator's way back.
//
// Before step 1, a node whose kubelet will be restarted has its local config validated with the kubelet's
// code of the node's minor (the dkc-kubelet-check helper): a config that does not pass is refused, and the
// node is left as it is, on its dkc config (ErrRefused). A kubelet that passes but does not come back
// healthy on its local config is put back on the dkc config it ran (drop-in, env file, daemon-reload,
// restart) and the cleanup is refused too; the local config is not tried again until its content changes
// (failedLocalFile records which content failed), so the retries that follow restart nothing.
//
// The local config file is never touched, nor anything outside the dynamic config dir but the drop-in.
package uninstall

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	"sigs.k8s.io/yaml"

	"github.com/dkc-dev/dkc/internal/configcheck"
	"github.com/dkc-dev/dkc/internal/durable"
	"github.com/dkc-dev/dkc/sidecar/internal/kubeletunit"
)

// DefaultDropIn is where the DaemonSet's init container installs dkc's kubelet drop-in.
const DefaultDropIn = "/etc/systemd/system/kubelet.service.d/20-dkc.conf"

// Unit is the kubelet's systemd unit; implemented by systemd.Manager.
type Unit interface {
	// Reload is `systemctl daemon-reload`.
	Reload(ctx context.Context) error
	// Restart is `systemctl restart <kubelet unit>`: it returns when the restart job has finished.
	Restart(ctx context.Context) error
	// MainPID is `systemctl show --property MainPID <kubelet unit>`: 0 when it runs no process.
	MainPID(ctx context.Context) (int, error)
	// LoadsEnvironmentFile says whether `systemctl show --property EnvironmentFiles <kubelet unit>` lists path.
	LoadsEnvironmentFile(ctx context.Context, path string) (bool, error)
}

// Kubelet is the node's kubelet as a config file makes it serve.
type Kubelet interface {
	// Healthz is GET /healthz on the kubelet's healthz address and port of config (a config file's path).
	Healthz(ctx context.Context, config string) error
}

// ErrRefused: the cleanup would leave the kubelet on a local config that does not validate, or did not run
// healthy; the node stays on its dkc config, and the error says why and what to fix.
var ErrRefused = errors.New("uninstall refused")

// RefusedMessage is the message Run logs a refusal with (at error level, the reason in "error"): kubectl dkc
// uninstall looks for it in the cleanup pod's log to say which node refused and why.
const RefusedMessage = "uninstall refused; the node stays on its dkc config"

// failedLocalFile, in the dynamic config dir, records the hash of the local config's content that did not
// run healthy: the same content is not restarted into again.
const failedLocalFile = "dkc-uninstall-failed-local-config"

// Config of a Cleaner.
type Config struct {
	// Log is where each step is logged; nil: nowhere.
	Log *zap.Logger
	// Unit is the kubelet's unit (systemd over D-Bus). Required.
	Unit Unit
	// Kubelet answers health checks. Required.
	Kubelet Kubelet

	// DynamicConfigDir is dkc's directory on the node (--dynamic-config-dir).
	DynamicConfigDir string
	// KubeletConfig is the node's local kubelet config (--kubelet-config), which is never removed.
	KubeletConfig string
	// DropIn is dkc's kubelet drop-in (--kubelet-dropin).
	DropIn string
	// ProcDir is the node's /proc, where the kubelet's command line is read (--host-proc; "": /proc).
	ProcDir string
	// HealthTimeout bounds the wait for the kubelet to be healthy on its local config.
	HealthTimeout time.Duration
	// PollInterval is how often health is checked during that wait; 0: 500ms.
	PollInterval time.Duration
	// RetryInterval is how long Run waits before trying a failed cleanup again; 0: 30s.
	RetryInterval time.Duration
	// Files are more names in DynamicConfigDir that dkc owns and Clean removes last (the sidecar's state
	// file and lock).
	Files []string
	// Checker validates the local config with the node kubelet's code before the kubelet is restarted onto
	// it (the dkc-kubelet-check helpers); nil: not validated.
	Checker configcheck.Checker
	// KubeletVersion is the node kubelet's version, whose minor's code checks; "": the local config is not
	// validated (logged), and only the health check after the restart guards the node.
	KubeletVersion string
	// KubeletFlags are the kubelet's flags (without --config) for when it runs no process whose command line
	// can be read: the sidecar's record. A running kubelet's are read from its command line.
	KubeletFlags []string
}

// Cleaner takes dkc off one node.
type Cleaner struct {
	cfg Config
	log *zap.Logger

	mu     sync.Mutex
	done   bool
	status string
}

// New returns the cleaner for cfg.
func New(cfg Config) *Cleaner {
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	if cfg.ProcDir == "" {
		cfg.ProcDir = "/proc"
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 500 * time.Millisecond
	}
	if cfg.RetryInterval == 0 {
		cfg.RetryInterval = 30 * time.Second
	}
	return &Cleaner{cfg: cfg, log: cfg.Log, status: "cleanup not finished yet"}
}

// Ready says whether the node is clean; otherwise msg says why not yet (the last failure, if any).
func (c *Cleaner) Ready() (ready bool, msg string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.done, c.status
}

func (c *Cleaner) setStatus(done bool, msg string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.done, c.status = done, msg
}

// Run cleans the node, trying again every RetryInterval after a failure, then waits for ctx to end: the
// process stays up so that its readiness tells the DaemonSet's rollout that this node is clean. It returns
// nil when ctx ends (SIGTERM), whatever the state: an interrupted cleanup is continued by the next run.
func (c *Cleaner) Run(ctx context.Context) error {
	for {
		err := c.Clean(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err == nil {
			c.setStatus(true, "dkc removed from this node; the kubelet runs its local config")
			<-ctx.Done()
			return nil
		}
		c.setStatus(false, err.Error())
		if errors.Is(err, ErrRefused) {
			c.log.Error(RefusedMessage, zap.Duration("retryIn", c.cfg.RetryInterval), zap.Error(err))
		} else {
			c.log.Error("uninstall failed; retrying", zap.Duration("retryIn", c.cfg.RetryInterval), zap.Error(err))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(c.cfg.RetryInterval):
		}
	}
}

// Clean makes one pass of the cleanup (see the package documentation for the order); every step is
// skipped when already done, so a pass after an interrupted one continues it.
func (c *Cleaner) Clean(ctx context.Context) error {
	cfg := c.cfg
	if err := c.checkLayout(); err != nil {
		return err
	}
	// back is the dkc config the kubelet runs (or is set to run), put back if the local one does not run.
	back, err := c.checkLocal(ctx)
	if err != nil {
		return err
	}
	if err := c.removeDropIn(ctx); err != nil {
		return err
	}
	restarted, err := c.restartOntoLocal(ctx)
	if err != nil {
		return err
	}
	start := time.Now()
	if err := c.waitHealthy(ctx); err != nil {
		if restarted && back != "" && ctx.Err() == nil {
			return c.putBack(ctx, back, err)
		}
		return err
	}
	c.log.Info("uninstall: kubelet healthy on its local config", zap.String("config", cfg.KubeletConfig),
		zap.Duration("took", time.Since(start)))
	return c.removeState()
}

// removeDropIn is steps 1 and 2: it removes the drop-in and has systemd re-read the unit, then removes the
// env file the drop-in loaded, but only once the loaded unit no longer lists it.
func (c *Cleaner) removeDropIn(ctx context.Context) error {
	cfg := c.cfg
	env := kubeletunit.New(cfg.DynamicConfigDir).Path
	removed, err := removeFile(cfg.DropIn)
	if err != nil {
		return fmt.Errorf("remove kubelet drop-in: %w", err)
	}
	c.step("kubelet drop-in", cfg.DropIn, removed)

	loads, err := cfg.Unit.LoadsEnvironmentFile(ctx, env)
	if err != nil {
		return err
	}
	if removed || loads {
		if err := cfg.Unit.Reload(ctx); err != nil {
			return err
		}
		c.log.Info("uninstall: daemon-reload", zap.String("result", "done"))
		if loads, err = cfg.Unit.LoadsEnvironmentFile(ctx, env); err != nil {
			return err
		}
	}
	if loads {
		// Not dkc's drop-in (gone): one of the node's provisioning. Removing the env file under it could keep
		// the kubelet from starting, if it loads it without "-".
		return fmt.Errorf("the kubelet's unit still loads %s after %s was removed and systemd reloaded: "+
			"another drop-in names it (node provisioning, --print-kubelet-dropin?); remove that one and "+
			"daemon-reload, then this continues", env, cfg.DropIn)
	}

	if removed, err = removeFile(env); err != nil {
		return fmt.Errorf("remove kubelet env file: %w", err)
	}
	c.step("kubelet env file", env, removed)
	return nil
}

// restartOntoLocal is step 3's restart: a kubelet that runs a checkpoint, or whose config is unknown, is
// restarted onto its local config (restarted true); one already on a config not dkc's is left running.
func (c *Cleaner) restartOntoLocal(ctx context.Context) (restarted bool, err error) {
	cfg := c.cfg
	running, known, err := c.runningConfig(ctx)
	if err != nil {
		return false, err
	}
	restarted = !known || c.inDynamicConfigDir(running)
	switch {
	case !known:
		c.log.Info("uninstall: the kubelet's config is unknown (not running, or its command line unreadable); " +
			"restarting it onto its local config")
		fallthrough
	case c.inDynamicConfigDir(running):
		c.log.Info("uninstall: restarting the kubelet onto its local config", zap.String("running", running),
			zap.String("local", cfg.KubeletConfig))
		if err := cfg.Unit.Restart(ctx); err != nil {
			return false, fmt.Errorf("restart the kubelet onto its local config %s: %w", cfg.KubeletConfig, err)
		}
		c.log.Info("uninstall: kubelet restarted", zap.String("result", "done"))
	default:
		c.log.Info("uninstall: the kubelet runs no config of dkc's; not restarted", zap.String("running", running),
			zap.String("local", cfg.KubeletConfig))
	}
	return restarted, nil
}

// removeState is step 4, run only once the kubelet is healthy on its local config: until then meta/ and
// the checkpoints are the operator's way back. It removes them, dkc's other files in the dynamic config
// dir, and the leftovers of interrupted writes.
func (c *Cleaner) removeState() error {
	cfg := c.cfg
	for _, name := range append([]string{"meta", "checkpoints", failedLocalFile}, cfg.Files...) {
		path := filepath.Join(cfg.DynamicConfigDir, name)
		if _, err := os.Lstat(path); errors.Is(err, os.ErrNotExist) {
			c.step(name, path, false)
			continue
		}
		if err := durable.RemoveAll(path); err != nil {
			return fmt.Errorf("remove %s: %w", path, err)
		}
		c.step(name, path, true)
	}
	if left, err := durable.CleanTemp(cfg.DynamicConfigDir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	} else if len(left) > 0 {
		c.log.Info("uninstall: removed leftovers of interrupted writes", zap.Strings("names", left))
	}
	c.log.Info("uninstall: node clean", zap.String("dynamicConfigDir", cfg.DynamicConfigDir))
	return nil
}

// checkLayout refuses a local config inside what Clean removes: it must never go.
func (c *Cleaner) checkLayout() error {
	local := filepath.Clean(c.cfg.KubeletConfig)
	for _, name := range append([]string{"meta", "checkpoints", failedLocalFile, kubeletunit.EnvFileName},
		c.cfg.Files...) {
		if within(filepath.Join(c.cfg.DynamicConfigDir, name), local) {
			return fmt.Errorf("--kubelet-config %s is inside %s, which the uninstall removes: refusing "+
				"to touch the node's local config", local, name)
		}
	}
	if filepath.Clean(c.cfg.DropIn) == local {
		return fmt.Errorf("--kubelet-dropin and --kubelet-config are both %s", local)
	}
	return nil
}

func (c *Cleaner) step(what, path string, removed bool) {
	result := "removed"
	if !removed {
		result = "already gone"
	}
	c.log.Info("uninstall: "+what, zap.String("path", path), zap.String("result", result))
}

// runningConfig is the running kubelet's --config ("" for none) read from its command line; known is
// false when there is no kubelet process or its command line cannot be read (a host /proc with hidepid).
func (c *Cleaner) runningConfig(ctx context.Context) (config string, known bool, err error) {
	pid, err := c.cfg.Unit.MainPID(ctx)
	if err != nil {
		return "", false, err
	}
	if pid <= 0 {
		return "", false, nil
	}
	args, err := kubeletunit.CommandLine(c.cfg.ProcDir, pid)
	if err != nil {
		c.log.Warn("uninstall: cannot read the kubelet's command line", zap.Int("pid", pid), zap.Error(err))
		return "", false, nil
	}
	if len(args) == 0 {
		return "", false, nil // a process that just exited
	}
	config, _ = configcheck.ConfigFlag(args[1:])
	return config, true, nil
}

// inDynamicConfigDir says whether the kubelet's config file is one of dkc's (a checkpoint).
func (c *Cleaner) inDynamicConfigDir(config string) bool {
	return config != "" && within(c.cfg.DynamicConfigDir, config)
}

// waitHealthy waits until the kubelet answers /healthz and its command line names no file of dkc's: the
// kubelet reads --config only when it starts, so a healthy process started with the local config runs it.
// (/configz is not compared, as the sidecar's own health wait does: that needs the config checked by the
// kubelet's code of the node's minor, which only dkc-server tells, and dkc-server is not asked here.)
func (c *Cleaner) waitHealthy(ctx context.Context) error {
	deadline := time.Now().Add(c.cfg.HealthTimeout)
	for {
		err := c.healthy(ctx)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the kubelet is not healthy on its local config %s after %v: %w; dkc's drop-in and env file "+
				"stay removed (its unit runs the local config from now on) and the checkpoints stay in %s until it is: fix the "+
				"local config or the kubelet (journalctl -u kubelet)", c.cfg.KubeletConfig, c.cfg.HealthTimeout, err,
				c.cfg.DynamicConfigDir)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for the kubelet to be healthy on its local config: %w", ctx.Err())
		case <-time.After(c.cfg.PollInterval):
		}
	}
}

func (c *Cleaner) healthy(ctx context.Context) error {
	running, known, err := c.runningConfig(ctx)
	switch {
	case err != nil:
		return err
	case !known:
		return errors.New("no kubelet process running, or its command line unreadable")
	case c.inDynamicConfigDir(running):
		return fmt.Errorf("the kubelet still runs %s", running)
	}
	hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := c.cfg.Kubelet.Healthz(hctx, c.cfg.KubeletConfig); err != nil {
		return fmt.Errorf("healthz: %w", err)
	}
	return nil
}

// checkLocal decides, before anything is removed, whether the local config may be restarted into, when the
// kubelet is to be restarted onto it: the kubelet runs (or its unit is set to run) a dkc config, or no
// process can be read. It refuses (ErrRefused) a local config that does not validate with the kubelet's
// code of the node's minor, or whose content did not run healthy before. It returns the dkc config to put
// back if the restarted kubelet does not come up healthy ("": none to put back: the kubelet runs the local
// config already, or dkc's config is not known).
func (c *Cleaner) checkLocal(ctx context.Context) (back string, err error) {
	running, known, err := c.runningConfig(ctx)
	if err != nil {
		return "", err
	}
	if known && !c.inDynamicConfigDir(running) {
		return "", nil // no restart: the kubelet runs its local config (or none) already
	}
	back = running
	if !known {
		if set, err := kubeletunit.New(c.cfg.DynamicConfigDir).Get(); err == nil && c.inDynamicConfigDir(set) {
			back = set
		}
	}
	if back != "" {
		if _, err := os.Stat(back); err != nil {
			back = "" // gone already (an interrupted cleanup): nothing to put back
		}
	}
	content, err := os.ReadFile(c.cfg.KubeletConfig)
	if err != nil {
		return "", fmt.Errorf("%w: read the local kubelet config: %w; the node stays on its dkc config", ErrRefused, err)
	}
	if failed, err := os.ReadFile(filepath.Join(c.cfg.DynamicConfigDir, failedLocalFile)); err == nil &&
		strings.TrimSpace(string(failed)) == hash(content) {
		return "", fmt.Errorf("%w: the kubelet did not run healthy on its local config %s before, which has not "+
			"changed since; the node stays on its dkc config %s: fix the local config (journalctl -u kubelet said "+
			"why), this then continues by itself",
			ErrRefused, c.cfg.KubeletConfig, back)
	}
	if c.cfg.Checker == nil {
		return back, nil
	}
	if c.cfg.KubeletVersion == "" {
		c.log.Warn("uninstall: the kubelet's version was never recorded on this node: the local config is not validated, "+
			"only the kubelet's health after the restart guards it", zap.String("local", c.cfg.KubeletConfig))
		return back, nil
	}
	flags := c.cfg.KubeletFlags
	if args, ok := c.commandLine(ctx); ok {
		_, flags = configcheck.ConfigFlag(args[1:])
	}
	if flags == nil {
		flags = []string{}
	}
	if _, err := c.cfg.Checker.Check(ctx,
		configcheck.Request{File: c.cfg.KubeletConfig, Flags: flags, KubeletVersion: c.cfg.KubeletVersion}); err != nil {
		if errors.Is(err, configcheck.ErrLoad) || errors.Is(err, configcheck.ErrValidate) ||
			errors.Is(err, configcheck.ErrFlags) {
			return "", fmt.Errorf("%w: the local kubelet config %s does not pass the kubelet's validation (kubelet "+
				"%s, its flags applied): %w; the node stays on its dkc config %s, not restarted: fix the local "+
				"config, this then continues by itself",
				ErrRefused, c.cfg.KubeletConfig, c.cfg.KubeletVersion, err, back)
		}
		return "", fmt.Errorf("validate the local kubelet config %s (kubelet %s): %w; the node "+
			"stays on its dkc config, retried",
			c.cfg.KubeletConfig, c.cfg.KubeletVersion, err)
	}
	c.log.Info("uninstall: local config validated", zap.String("local", c.cfg.KubeletConfig),
		zap.String("kubeletVersion", c.cfg.KubeletVersion))
	return back, nil
}

// commandLine is the running kubelet's command line; ok is false when no process runs or it is unreadable.
func (c *Cleaner) commandLine(ctx context.Context) (args []string, ok bool) {
	pid, err := c.cfg.Unit.MainPID(ctx)
	if err != nil || pid <= 0 {
		return nil, false
	}
	args, err = kubeletunit.CommandLine(c.cfg.ProcDir, pid)
	return args, err == nil && len(args) > 0
}

// putBack returns a kubelet that did not come up healthy on its local config (why) to the dkc config it
// ran, back: env file, drop-in, daemon-reload, restart, health. It records the local config's content as
// failed, so that the next passes restart nothing, and returns ErrRefused saying what happened.
func (c *Cleaner) putBack(ctx context.Context, back string, why error) error {
	cfg := c.cfg
	c.log.Error("uninstall: the kubelet is not healthy on its local config; putting it back on its dkc config",
		zap.String("local", cfg.KubeletConfig), zap.String("dkcConfig", back), zap.Error(why))
	fail := func(err error) error {
		return fmt.Errorf("%w: the kubelet did not come up healthy on its local config %s (%w), and putting it back on its "+
			"dkc config %s failed: %w; the checkpoints stay in %s", ErrRefused, cfg.KubeletConfig, why, back, err,
			cfg.DynamicConfigDir)
	}
	if content, err := os.ReadFile(cfg.KubeletConfig); err == nil {
		if err := durable.WriteFile(filepath.Join(cfg.DynamicConfigDir, failedLocalFile), []byte(hash(content)+"\n"),
			0o644); err != nil {
			c.log.Warn("uninstall: cannot record the local config that failed; the next pass may try it again", zap.Error(err))
		}
	}
	if err := kubeletunit.New(cfg.DynamicConfigDir).Set(back); err != nil {
		return fail(err)
	}
	if err := durable.MkdirAll(filepath.Dir(cfg.DropIn), 0o755); err != nil {
		return fail(err)
	}
	if err := durable.WriteFile(cfg.DropIn, []byte(kubeletunit.DropIn(cfg.DynamicConfigDir)), 0o644); err != nil {
		return fail(err)
	}
	if err := cfg.Unit.Reload(ctx); err != nil {
		return fail(err)
	}
	if err := cfg.Unit.Restart(ctx); err != nil {
		return fail(err)
	}
	deadline := time.Now().Add(cfg.HealthTimeout)
	for {
		err := c.runsHealthy(ctx, back)
		if err == nil {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fail(err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(cfg.PollInterval):
		}
	}
	c.log.Info("uninstall: the kubelet is back on its dkc config, healthy", zap.String("dkcConfig", back))
	return fmt.Errorf("%w: the kubelet did not come up healthy on its local config %s: %w; it was put back on its dkc "+
		"config %s, healthy, and the local config is not tried again until it changes: fix it (journalctl -u kubelet says "+
		"why), this then continues by itself",
		ErrRefused, cfg.KubeletConfig, why, back)
}

// runsHealthy says whether the kubelet runs config (its command line's --config) and answers /healthz.
func (c *Cleaner) runsHealthy(ctx context.Context, config string) error {
	running, known, err := c.runningConfig(ctx)
	switch {
	case err != nil:
		return err
	case !known || filepath.Clean(running) != filepath.Clean(config):
		return fmt.Errorf("the kubelet does not run %s yet", config)
	}
	hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return c.cfg.Kubelet.Healthz(hctx, config)
}

func hash(content []byte) string {
	sum := sha256.Sum256(content)
	return hex.EncodeToString(sum[:])
}

// removeFile removes path durably (the directory fsynced, so the order of removals survives a crash) and
// says whether it was there.
func removeFile(path string) (bool, error) {
	if err := os.Remove(path); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return false, nil
		}
		return false, err
	}
	return true, durable.SyncDir(filepath.Dir(path))
}

// within says whether path is dir or inside it.
func within(dir, path string) bool {
	rel, err := filepath.Rel(filepath.Clean(dir), filepath.Clean(path))
	return err == nil && filepath.IsAbs(path) && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
}

// HealthzEndpoint is where the kubelet serves /healthz by the local config file: healthzBindAddress and
// healthzPort, or the kubelet's defaults (127.0.0.1, 10248); port 0 disables it.
func HealthzEndpoint(localConfig string) (*configcheck.Checked, error) {
	raw, err := os.ReadFile(localConfig)
	if err != nil {
		return nil, fmt.Errorf("read the local kubelet config: %w", err)
	}
	var f struct {
		HealthzBindAddress *string `json:"healthzBindAddress"`
		HealthzPort        *int32  `json:"healthzPort"`
	}
	if err := yaml.Unmarshal(raw, &f); err != nil {
		return nil, fmt.Errorf("parse the local kubelet config %s: %w", localConfig, err)
	}
	kc := &configcheck.Checked{HealthzBindAddress: "127.0.0.1", HealthzPort: 10248}
	if f.HealthzBindAddress != nil && *f.HealthzBindAddress != "" {
		kc.HealthzBindAddress = *f.HealthzBindAddress
	}
	if f.HealthzPort != nil {
		kc.HealthzPort = *f.HealthzPort
	}
	return kc, nil
}
