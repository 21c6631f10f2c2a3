// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"

	"github.com/dkc-dev/dkc/internal/configcheck"
	"github.com/dkc-dev/dkc/internal/kubeletcheck"
	"github.com/dkc-dev/dkc/sidecar/app"
)

// localConfig is each simulated node's own kubelet config.
const localConfig = "apiVersion: kubelet.config.k8s.io/v1beta1\n" +
	"kind: KubeletConfiguration\n" +
	"failSwapOn: false\n" +
	"failCgroupV1: false\n"

// sharedChecker runs the kubelet's config code once per distinct file content. A real node validates on its
// own CPU; thousands of simulated nodes share this machine's few cores, and letting each re-run the kubelet's
// loader on the same bytes would measure that sharing, not dkc. The file is still read from the node's own
// checkpoint every time.
type sharedChecker struct {
	mu    sync.Mutex
	cache map[[32]byte]*configcheck.Checked
}

func (s *sharedChecker) Check(ctx context.Context, req configcheck.Request) (*configcheck.Checked, error) {
	path, flags := req.File, req.Flags
	data, err := os.ReadFile(path)
	if err != nil {
		return kubeletcheck.Check(ctx, path, flags) // the kubelet's own error for a missing file
	}
	key := sha256.Sum256([]byte(string(data) + "\x00" + strings.Join(flags, "\x00")))
	s.mu.Lock()
	c, ok := s.cache[key]
	s.mu.Unlock()
	if ok {
		return c, nil
	}
	c, err = kubeletcheck.Check(ctx, path, flags)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.cache[key] = c
	s.mu.Unlock()
	return c, nil
}

// standInKubelet is a simulated node's kubelet. It behaves as a kubelet under systemd does, in time: a
// restart job takes restartJob, and the kubelet answers /healthz only startup later; it runs the file its
// env file names (what the real drop-in makes a kubelet do).
type standInKubelet struct {
	dynamic string // the node's --dynamic-config-dir
	local   string
	checker configcheck.Checker

	mu        sync.Mutex
	healthyAt time.Time
}

const (
	restartJob = 100 * time.Millisecond
	startup    = 2 * time.Second
)

func (k *standInKubelet) Restart(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(restartJob):
	}
	k.mu.Lock()
	k.healthyAt = time.Now().Add(startup)
	k.mu.Unlock()
	return nil
}

// MainPID is never 0: the stand-in kubelet is always running (its restarts take restartJob), and an agent
// that found its kubelet not running would restart it and wait out startup at every simulated node's start.
// The PID is only compared with 0: the simulated nodes' flags are given (KubeletFlags), never read from
// /proc/<pid>/cmdline.
func (k *standInKubelet) MainPID(context.Context) (int, error) { return 1, nil }

func (k *standInKubelet) Healthz(context.Context, *configcheck.Checked) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if time.Now().Before(k.healthyAt) {
		return errors.New("connection refused (kubelet starting)")
	}
	return nil
}

// Foreign: the stand-in listens wherever it is told.
func (k *standInKubelet) Foreign(*configcheck.Checked) error { return nil }

func (k *standInKubelet) Configz(ctx context.Context, _ *configcheck.Checked) (map[string]any, error) {
	file, err := app.KubeletConfigFile(k.dynamic)
	if err != nil {
		return nil, err
	}
	if file == "" {
		file = k.local
	}
	c, err := k.checker.Check(ctx, configcheck.Request{File: file})
	if err != nil {
		return nil, err
	}
	return c.Fields, nil
}

// recorder notes when each node durably checkpointed each config version, and the first simulated node
// whose sidecar failed.
type recorder struct {
	mu     sync.Mutex
	failed error
	at     map[string]time.Time // event + node + configmap name + resourceVersion, \x00-separated
	wake   chan struct{}
}

func newRecorder() *recorder {
	return &recorder{at: map[string]time.Time{}, wake: make(chan struct{}, 1)}
}

func recordKey(event, node, cm, rv string) string {
	return event + "\x00" + node + "\x00" + cm + "\x00" + rv
}

// trace is the agent's Config.Trace for node.
func (r *recorder) trace(node, event string, src *corev1.NodeConfigSource) {
	if src == nil || src.ConfigMap == nil {
		return
	}
	now := time.Now()
	key := recordKey(event, node, src.ConfigMap.Name, src.ConfigMap.ResourceVersion)
	r.mu.Lock()
	if _, ok := r.at[key]; !ok {
		r.at[key] = now
	}
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// get is when node checkpointed cm at rv.
func (r *recorder) get(node, cm, rv string) (time.Time, bool) {
	return r.getEvent(app.TraceCheckpointed, node, cm, rv)
}

func (r *recorder) getEvent(event, node, cm, rv string) (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	t, ok := r.at[recordKey(event, node, cm, rv)]
	return t, ok
}

// wait returns when every node has checkpointed cm at rv, or fails at the deadline naming how many did not.
func (r *recorder) wait(ctx context.Context, nodes []string, cm, rv string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		missing := 0
		for _, n := range nodes {
			if _, ok := r.get(n, cm, rv); !ok {
				missing++
			}
		}
		if missing == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d of %d nodes did not checkpoint %s@%s within %v%s", missing, len(nodes), cm, rv, timeout,
				r.failure())
		case <-r.wake:
		case <-tick.C:
		}
	}
}

// simNode is one simulated node in this process: the real sidecar (app.New, as the daemon builds it) with a
// stand-in kubelet, its own directory, its own token and its own gRPC connection to dkc-server.
type simNode struct {
	name   string
	cancel context.CancelFunc
	done   chan struct{}
}

type simConfig struct {
	server, caFile, token, dir string
	trial                      time.Duration
	checker                    configcheck.Checker
	rec                        *recorder
	log                        *zap.Logger
}

func startSimNode(ctx context.Context, name string, cfg simConfig) (*simNode, error) {
	dynamic := filepath.Join(cfg.dir, "dynamic-config")
	if err := os.MkdirAll(dynamic, 0o755); err != nil {
		return nil, err
	}
	local := filepath.Join(cfg.dir, "kubelet.yaml")
	if err := os.WriteFile(local, []byte(localConfig), 0o644); err != nil {
		return nil, err
	}
	log := cfg.log // the sidecar names its node in every line itself (app.Run)
	kubelet := &standInKubelet{dynamic: dynamic, local: local, checker: cfg.checker}
	sc := app.New(app.Config{
		Log: log, ServiceManager: kubelet, Prober: kubelet, Checker: cfg.checker, KubeletArgs: []string{}, NoNodeLock: true,
		// Trial checks every second, not every 10s: a real cluster's nodes tick independently, while the
		// tickers of nodes started together here would promote their configs in bursts of hundreds.
		TrialCheckInterval: time.Second,
		Trace:              func(event string, src *corev1.NodeConfigSource) { cfg.rec.trace(name, event, src) },
		NodeName:           name, Server: cfg.server, ServerCAFile: cfg.caFile, TokenFile: cfg.token,
		DynamicConfigDir: dynamic, KubeletConfig: local, HostProc: "/proc",
		// The shipped health timeout: thousands of simulated nodes share this machine's cores, and a kubelet
		// that answers late here because the machine is busy must not be blamed for its config, as a real
		// node's own kubelet would not be (a 10s timeout rolled nodes back when 5,000 sidecars started at once).
		TrialDuration: cfg.trial, HealthTimeout: app.DefaultConfig().HealthTimeout, KeepCheckpoints: 1,
	})
	ctx, cancel := context.WithCancel(ctx)
	s := &simNode{name: name, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		if err := sc.Run(ctx); err != nil {
			log.Error("simulated node's sidecar failed", zap.String("node", name), zap.Error(err))
			cfg.rec.fail(name, err)
		}
	}()
	return s, nil
}

func (s *simNode) stop() {
	s.cancel()
	<-s.done
}

// fail records a simulated node's sidecar ending with err.
func (r *recorder) fail(node string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failed == nil {
		r.failed = fmt.Errorf("node %s: %w", node, err)
	}
}

// failure is "" or, for error messages, the first simulated node that failed.
func (r *recorder) failure() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failed == nil {
		return ""
	}
	return fmt.Sprintf(" (a simulated sidecar failed: %v)", r.failed)
}
