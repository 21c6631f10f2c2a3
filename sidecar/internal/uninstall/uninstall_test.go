// SPDX-License-Identifier: Apache-2.0

package uninstall

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dkc-dev/dkc/internal/configcheck"
	"github.com/dkc-dev/dkc/internal/poll"
	"github.com/dkc-dev/dkc/sidecar/internal/kubeletunit"
)

// node is a node's disk in a temporary directory, and a recording fake of its systemd and kubelet: the
// unit loads the env file while the drop-in was present at the last daemon-reload, and a restarted kubelet
// runs what the loaded unit names (the env file's config, else the local one), as systemd would.
type node struct {
	t                             *testing.T
	dir, dropIn, local, proc, env string
	checkpoint                    string
	loaded                        bool // systemd's view: the unit lists the env file
	otherDropIn                   bool // another drop-in loads it too, whatever dkc's does
	pid                           int
	healthy                       bool
	localUnhealthy                bool // the kubelet is not healthy when it runs the local config
	invalid                       bool // the local config does not validate
	checked                       []configcheck.Request
	calls                         []string
	restarts                      int
	interruptAt                   int // the nth call cancels the context and fails, as a SIGTERM there would
	cancel                        context.CancelFunc
	violations                    []string
	n                             int
}

func newNode(t *testing.T) *node {
	root := t.TempDir()
	nd := &node{t: t, dir: filepath.Join(root, "dynamic-config"), dropIn: filepath.Join(root, "kubelet.service.d", "20-dkc.conf"),
		local: filepath.Join(root, "config.yaml"), proc: filepath.Join(root, "proc"), healthy: true}
	nd.env = kubeletunit.New(nd.dir).Path
	nd.checkpoint = filepath.Join(nd.dir, "checkpoints", "uid-1", "7", "kubelet")
	for _, d := range []string{filepath.Dir(nd.checkpoint), filepath.Join(nd.dir, "meta"), filepath.Dir(nd.dropIn), nd.proc} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	nd.write(nd.local, "kind: KubeletConfiguration\n")
	nd.write(nd.checkpoint, "kind: KubeletConfiguration\neventRecordQPS: 7\n")
	nd.write(filepath.Join(nd.dir, "meta", "assigned"), "assigned\n")
	nd.write(filepath.Join(nd.dir, "dkc-sidecar-state.json"), "{}\n")
	nd.write(filepath.Join(nd.dir, "dkc-sidecar.lock"), "")
	return nd
}

func (nd *node) write(path, content string) {
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		nd.t.Fatal(err)
	}
}

func exists(path string) bool { _, err := os.Lstat(path); return err == nil }

// installed: the drop-in loaded, the env file naming config, the kubelet running it.
func (nd *node) installed(config string) *node {
	nd.write(nd.dropIn, kubeletunit.DropIn(nd.dir))
	if err := kubeletunit.New(nd.dir).Set(config); err != nil {
		nd.t.Fatal(err)
	}
	nd.loaded = true
	nd.run(config)
	return nd
}

// run starts a kubelet process running config.
func (nd *node) run(config string) {
	nd.pid++
	dir := filepath.Join(nd.proc, strconv.Itoa(nd.pid))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		nd.t.Fatal(err)
	}
	nd.write(filepath.Join(dir, "cmdline"), strings.Join([]string{"/usr/bin/kubelet", "--kubeconfig=/etc/kubernetes/kubelet.conf", "--config=" + config, "--v=2"}, "\x00")+"\x00")
}

// call records a call, checks the invariants there, and interrupts when it is the chosen one.
func (nd *node) call(ctx context.Context, name string) error {
	nd.n++
	nd.calls = append(nd.calls, name)
	nd.check(name)
	if ctx.Err() != nil {
		return fmt.Errorf("%s: %w", name, ctx.Err())
	}
	if nd.n == nd.interruptAt {
		nd.cancel()
		return fmt.Errorf("%s: %w", name, ctx.Err())
	}
	return nil
}

// check records a state a kill at this instant would leave and that the next kubelet start would not
// survive, or that loses the kubelet's config under it.
func (nd *node) check(at string) {
	if !exists(nd.env) && (exists(nd.dropIn) || nd.loaded) {
		nd.violations = append(nd.violations, at+": kubelet.env removed while the drop-in is still in place or loaded")
	}
	if !exists(filepath.Join(nd.dir, "checkpoints")) {
		if nd.loaded {
			nd.violations = append(nd.violations, at+": checkpoints removed while the unit still loads the env file")
		}
		if cfg, _ := nd.running(); strings.HasPrefix(cfg, nd.dir) {
			nd.violations = append(nd.violations, at+": checkpoints removed while the kubelet runs "+cfg)
		}
	}
	if !exists(nd.local) {
		nd.violations = append(nd.violations, at+": the local config was removed")
	}
}

func (nd *node) running() (string, bool) {
	if nd.pid == 0 {
		return "", false
	}
	raw, err := os.ReadFile(filepath.Join(nd.proc, strconv.Itoa(nd.pid), "cmdline"))
	if err != nil {
		return "", false
	}
	for _, a := range strings.Split(string(raw), "\x00") {
		if v, ok := strings.CutPrefix(a, "--config="); ok {
			return v, true
		}
	}
	return "", true
}

func (nd *node) Reload(ctx context.Context) error {
	if err := nd.call(ctx, "daemon-reload"); err != nil {
		return err
	}
	nd.loaded = exists(nd.dropIn) || nd.otherDropIn
	return nil
}

func (nd *node) Restart(ctx context.Context) error {
	if err := nd.call(ctx, "restart"); err != nil {
		return err
	}
	nd.restarts++
	config := nd.local
	if nd.loaded {
		if c, err := kubeletunit.New(nd.dir).Get(); err == nil && c != "" {
			config = c
		}
	}
	nd.run(config)
	return nil
}

func (nd *node) MainPID(ctx context.Context) (int, error) {
	if err := nd.call(ctx, "mainpid"); err != nil {
		return 0, err
	}
	return nd.pid, nil
}

func (nd *node) LoadsEnvironmentFile(ctx context.Context, path string) (bool, error) {
	if err := nd.call(ctx, "loads-env"); err != nil {
		return false, err
	}
	return path == nd.env && nd.loaded, nil
}

func (nd *node) Healthz(ctx context.Context, config string) error {
	if err := nd.call(ctx, "healthz"); err != nil {
		return err
	}
	if running, _ := nd.running(); !nd.healthy || nd.localUnhealthy && running == nd.local {
		return errors.New("connection refused")
	}
	return nil
}

// Check is the dkc-kubelet-check helper's validation of the local config.
func (nd *node) Check(_ context.Context, req configcheck.Request) (*configcheck.Checked, error) {
	nd.checked = append(nd.checked, req)
	if nd.invalid {
		return nil, fmt.Errorf("%w: eventRecordQPS: Invalid value: -1", configcheck.ErrValidate)
	}
	return &configcheck.Checked{}, nil
}

func (nd *node) cleaner() *Cleaner {
	return New(Config{Unit: nd, Kubelet: nd, DynamicConfigDir: nd.dir, KubeletConfig: nd.local, DropIn: nd.dropIn, ProcDir: nd.proc,
		HealthTimeout: 50 * time.Millisecond, PollInterval: time.Millisecond, Files: []string{"dkc-sidecar-state.json", "dkc-sidecar.lock"},
		Checker: nd, KubeletVersion: "v1.37.0", KubeletFlags: []string{"--recorded"}})
}

func (nd *node) clean() error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	nd.cancel = cancel
	return nd.cleaner().Clean(ctx)
}

// dkcFiles are dkc's files left on the node.
func (nd *node) dkcFiles() []string {
	var left []string
	if exists(nd.dropIn) {
		left = append(left, "drop-in")
	}
	entries, _ := os.ReadDir(nd.dir)
	for _, e := range entries {
		left = append(left, e.Name())
	}
	return left
}

func count(calls []string, name string) int {
	n := 0
	for _, c := range calls {
		if c == name {
			n++
		}
	}
	return n
}

func TestClean(t *testing.T) {
	for _, tc := range []struct {
		name         string
		setup        func(*node)
		wantReloads  int
		wantRestarts int
		wantErr      string
		wantLeft     []string // dkc's files left after the pass
	}{
		{
			name:        "assigned node: restarted once onto its local config",
			setup:       func(nd *node) { nd.installed(nd.checkpoint) },
			wantReloads: 1, wantRestarts: 1,
		},
		{
			name:        "never assigned: the kubelet already runs its local config, no restart",
			setup:       func(nd *node) { nd.installed(nd.local) },
			wantReloads: 1, wantRestarts: 0,
		},
		{
			name: "interrupted after the drop-in's removal before daemon-reload",
			setup: func(nd *node) {
				nd.installed(nd.checkpoint)
				os.Remove(nd.dropIn)
			},
			wantReloads: 1, wantRestarts: 1,
		},
		{
			name: "interrupted after the restart: no second restart, the checkpoints go",
			setup: func(nd *node) {
				nd.run(nd.local)
			},
			wantReloads: 0, wantRestarts: 0,
		},
		{
			name: "already clean",
			setup: func(nd *node) {
				for _, p := range []string{"meta", "checkpoints", "dkc-sidecar-state.json", "dkc-sidecar.lock"} {
					os.RemoveAll(filepath.Join(nd.dir, p))
				}
				nd.run(nd.local)
			},
		},
		{
			name: "kubelet not running: started onto its local config",
			setup: func(nd *node) {
				nd.installed(nd.checkpoint)
				nd.pid = 0
			},
			wantReloads: 1, wantRestarts: 1,
		},
		{
			name: "kubelet unhealthy on its local config: put back on its dkc config, healthy; refused",
			setup: func(nd *node) {
				nd.installed(nd.checkpoint)
				nd.localUnhealthy = true
			},
			wantReloads: 2, wantRestarts: 2,
			wantErr: "put back on its dkc config",
			wantLeft: []string{"drop-in", "checkpoints", "dkc-sidecar-state.json", "dkc-sidecar.lock", "dkc-uninstall-failed-local-config",
				"kubelet.env", "meta"},
		},
		{
			name: "kubelet unhealthy on any config: the put-back fails too; checkpoints kept",
			setup: func(nd *node) {
				nd.installed(nd.checkpoint)
				nd.healthy = false
			},
			wantReloads: 2, wantRestarts: 2,
			wantErr: "putting it back on its dkc config",
			wantLeft: []string{"drop-in", "checkpoints", "dkc-sidecar-state.json", "dkc-sidecar.lock", "dkc-uninstall-failed-local-config",
				"kubelet.env", "meta"},
		},
		{
			name: "local config does not validate: refused before anything is removed or restarted",
			setup: func(nd *node) {
				nd.installed(nd.checkpoint)
				nd.invalid = true
			},
			wantReloads: 0, wantRestarts: 0,
			wantErr:  "does not pass the kubelet's validation",
			wantLeft: []string{"drop-in", "checkpoints", "dkc-sidecar-state.json", "dkc-sidecar.lock", "kubelet.env", "meta"},
		},
		{
			name: "local config invalid but the kubelet runs it already: not restarted so not checked",
			setup: func(nd *node) {
				nd.installed(nd.local)
				nd.invalid = true
			},
			wantReloads: 1, wantRestarts: 0,
		},
		{
			name: "another drop-in loads the env file: it stays; nothing restarted",
			setup: func(nd *node) {
				nd.installed(nd.checkpoint)
				nd.otherDropIn = true
			},
			wantReloads: 1, wantRestarts: 0,
			wantErr:  "another drop-in names it",
			wantLeft: []string{"checkpoints", "dkc-sidecar-state.json", "dkc-sidecar.lock", "kubelet.env", "meta"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nd := newNode(t)
			tc.setup(nd)
			err := nd.clean()
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("Clean: %v; want error %q", err, tc.wantErr)
			}
			if got := count(nd.calls, "daemon-reload"); got != tc.wantReloads {
				t.Errorf("%d daemon-reloads, want %d (calls %v)", got, tc.wantReloads, nd.calls)
			}
			if nd.restarts != tc.wantRestarts {
				t.Errorf("%d restarts, want %d (calls %v)", nd.restarts, tc.wantRestarts, nd.calls)
			}
			if got := strings.Join(nd.dkcFiles(), " "); got != strings.Join(tc.wantLeft, " ") {
				t.Errorf("dkc's files left: %q, want %q", got, strings.Join(tc.wantLeft, " "))
			}
			nd.check("end")
			if len(nd.violations) > 0 {
				t.Errorf("unsafe states:\n%s", strings.Join(nd.violations, "\n"))
			}
			if tc.wantErr != "" {
				// A further pass restarts nothing again and changes no file.
				restarts, left := nd.restarts, nd.dkcFiles()
				if err := nd.clean(); err == nil {
					t.Error("second pass succeeded")
				}
				if nd.restarts != restarts || strings.Join(nd.dkcFiles(), " ") != strings.Join(left, " ") {
					t.Errorf("second pass: %d restarts more, files %v, were %v", nd.restarts-restarts, nd.dkcFiles(), left)
				}
			}
		})
	}
}

// TestCleanInterruptedAnywhere kills the cleanup of an assigned node at each of its calls in turn, then
// runs it again: every intermediate state is safe, the second run finishes, and the kubelet was restarted
// exactly once over both.
func TestCleanInterruptedAnywhere(t *testing.T) {
	total := func() int {
		nd := newNode(t)
		nd.installed(nd.checkpoint)
		if err := nd.clean(); err != nil {
			t.Fatal(err)
		}
		return len(nd.calls)
	}()
	for at := 1; at <= total; at++ {
		t.Run(fmt.Sprint("call ", at), func(t *testing.T) {
			nd := newNode(t)
			nd.installed(nd.checkpoint)
			nd.interruptAt = at
			if err := nd.clean(); err == nil {
				t.Fatalf("interrupted at call %d (%v) but Clean succeeded", at, nd.calls)
			}
			first := append([]string(nil), nd.calls...)
			nd.interruptAt = 0
			if err := nd.clean(); err != nil {
				t.Fatalf("after an interruption at %s: %v", first[len(first)-1], err)
			}
			if nd.restarts != 1 {
				t.Errorf("interrupted at %s: %d restarts over both runs, want 1 (calls %v)", first[len(first)-1], nd.restarts, nd.calls)
			}
			if left := nd.dkcFiles(); len(left) > 0 {
				t.Errorf("left %v", left)
			}
			if cfg, _ := nd.running(); cfg != nd.local {
				t.Errorf("the kubelet runs %s, want %s", cfg, nd.local)
			}
			if len(nd.violations) > 0 {
				t.Errorf("unsafe states:\n%s", strings.Join(nd.violations, "\n"))
			}
		})
	}
}

func TestRunReadyOnlyWhenClean(t *testing.T) {
	nd := newNode(t)
	nd.installed(nd.checkpoint)
	nd.healthy = false
	c := nd.cleaner()
	c.cfg.RetryInterval = time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	nd.cancel = cancel
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	poll.UntilNil(t, "a status saying the kubelet is not healthy on its local config", func() error {
		ready, msg := c.Ready()
		if ready {
			t.Fatal("ready while the kubelet is unhealthy")
		}
		if !strings.Contains(msg, "healthy on its local config") {
			return fmt.Errorf("status %q", msg)
		}
		return nil
	})
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run after SIGTERM: %v", err)
	}
}

// TestCleanValidatesTheLocalConfigWithTheKubeletsFlags: the check runs the node kubelet's version and its
// flags (without --config) from its command line, or the recorded ones when no kubelet runs.
func TestCleanValidatesTheLocalConfigWithTheKubeletsFlags(t *testing.T) {
	nd := newNode(t)
	nd.installed(nd.checkpoint)
	nd.invalid = true
	if err := nd.clean(); !errors.Is(err, ErrRefused) {
		t.Fatalf("Clean: %v, want ErrRefused", err)
	}
	nd.pid = 0
	_ = nd.clean()
	want := []string{"--kubeconfig=/etc/kubernetes/kubelet.conf --v=2", "--recorded"}
	if len(nd.checked) != 2 {
		t.Fatalf("checked %d times, want 2", len(nd.checked))
	}
	for i, req := range nd.checked {
		if req.File != nd.local || req.KubeletVersion != "v1.37.0" || strings.Join(req.Flags, " ") != want[i] {
			t.Errorf("check %d: %+v, want the local config, v1.37.0, flags %q", i, req, want[i])
		}
	}
}

// TestCleanContinuesOnceTheLocalConfigIsFixed: a local config that did not run healthy is not tried again
// while unchanged; once changed, it is, and the cleanup finishes.
func TestCleanContinuesOnceTheLocalConfigIsFixed(t *testing.T) {
	nd := newNode(t)
	nd.installed(nd.checkpoint)
	nd.localUnhealthy = true
	if err := nd.clean(); !errors.Is(err, ErrRefused) {
		t.Fatalf("Clean: %v, want ErrRefused", err)
	}
	if cfg, _ := nd.running(); cfg != nd.checkpoint || nd.restarts != 2 {
		t.Fatalf("the kubelet runs %s after %d restarts, want %s after 2", cfg, nd.restarts, nd.checkpoint)
	}
	nd.localUnhealthy = false // fixed, but the file is the same: not tried again
	if err := nd.clean(); err == nil || !strings.Contains(err.Error(), "has not changed") || nd.restarts != 2 {
		t.Fatalf("Clean with the same local config: %v after %d restarts", err, nd.restarts)
	}
	nd.write(nd.local, "kind: KubeletConfiguration\neventRecordQPS: 5\n")
	if err := nd.clean(); err != nil {
		t.Fatalf("Clean with a changed local config: %v", err)
	}
	if cfg, _ := nd.running(); cfg != nd.local || nd.restarts != 3 || len(nd.dkcFiles()) != 0 {
		t.Errorf("the kubelet runs %s after %d restarts, files left %v; want the local config, 3, none", cfg, nd.restarts, nd.dkcFiles())
	}
	if len(nd.violations) > 0 {
		t.Errorf("unsafe states:\n%s", strings.Join(nd.violations, "\n"))
	}
}

func TestCleanRefusesALocalConfigInsideWhatItRemoves(t *testing.T) {
	nd2 := newNode(t)
	nd2.installed(nd2.checkpoint)
	nd2.local = filepath.Join(nd2.dir, "checkpoints", "config.yaml")
	nd2.write(nd2.local, "kind: KubeletConfiguration\n")
	if err := nd2.clean(); err == nil || !strings.Contains(err.Error(), "refusing") {
		t.Fatalf("Clean: %v", err)
	}
	if !exists(nd2.dropIn) {
		t.Error("the drop-in was removed before the refusal")
	}
}

func TestHealthzEndpoint(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		config   string
		wantAddr string
		wantPort int32
	}{
		{"kind: KubeletConfiguration\n", "127.0.0.1", 10248},
		{"healthzBindAddress: 0.0.0.0\nhealthzPort: 10300\n", "0.0.0.0", 10300},
		{"healthzPort: 0\n", "127.0.0.1", 0},
	} {
		p := filepath.Join(dir, "c.yaml")
		if err := os.WriteFile(p, []byte(tc.config), 0o644); err != nil {
			t.Fatal(err)
		}
		kc, err := HealthzEndpoint(p)
		if err != nil || kc.HealthzBindAddress != tc.wantAddr || kc.HealthzPort != tc.wantPort {
			t.Errorf("%q: %+v %v; want %s:%d", tc.config, kc, err, tc.wantAddr, tc.wantPort)
		}
	}
}
