// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	statsapi "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
	kubeletconfiginternal "k8s.io/kubernetes/pkg/kubelet/apis/config"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/dkc-dev/dkc/internal/configcheck"
	"github.com/dkc-dev/dkc/internal/kubeletcheck"
	"github.com/dkc-dev/dkc/internal/nodeconfig"

	"github.com/dkc-dev/dkc/internal/payload"
	"github.com/dkc-dev/dkc/internal/poll"
	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
	"github.com/dkc-dev/dkc/sidecar/internal/checkpoint"
	"github.com/dkc-dev/dkc/sidecar/internal/kubeletunit"
	"github.com/dkc-dev/dkc/sidecar/internal/probe"
	"github.com/dkc-dev/dkc/sidecar/internal/systemd"
)

// fakeKubelet records restarts (as a systemd fake would) and "runs" the config file the env file names at
// each restart. A config with maxPods: 13 validates but never becomes healthy.
type fakeKubelet struct {
	mu       sync.Mutex
	env      kubeletunit.EnvFile
	local    string
	running  string
	restarts []string
	// stopped: the kubelet does not run (its unit failed); a restart starts it again.
	stopped bool
	// failRestarts: so many next restarts fail as a refused systemd job does, the kubelet left stopped.
	failRestarts int
	// exitOnStart: so many next restarts start the kubelet, which exits at once; the job fails as on a
	// Type=notify unit (a systemd.StartFailedError).
	exitOnStart int
	// configzErr: /configz fails with it, as for a kubelet that cannot reach the apiserver to authenticate
	// (probe.ErrRefused: 401; probe.ErrNoAnswer: no answer in time).
	configzErr error
	// cpuState is the CPU manager policy the kubelet's cpu_manager_state was written under ("": no file).
	// A start with another policy fails as the kubelet's does (it exits: a systemd.StartFailedError); any
	// other start writes the file under its policy.
	cpuState string
	// calls are the stops, removals and restarts, in order: "stop", "remove PATHS", "restart FILE".
	calls []string
	// failRemove: so many next removals fail, as a failed transient unit does.
	failRemove int
	// failStop: so many next stops fail, as a stop job that failed does — after killing the kubelet all
	// the same (the worst case: a caller that believes the failure leaves it stopped).
	failStop int
	// afterRemove, if set, runs at each removal before its result (outside the lock), as what happens on
	// the node meanwhile (the sidecar told to stop, a disk that fails).
	afterRemove func()
	// summary and pods are what /stats/summary and /pods answer; a nil summary fails both, as a kubelet
	// refusing a sidecar without nodes/stats does.
	summary *statsapi.Summary
	pods    []corev1.Pod
	// flags are the kubelet's command line (without --config): /configz shows the config with them (and
	// the drop-ins of their --config-dir) applied.
	flags []string
}

func (k *fakeKubelet) Summary(context.Context, *configcheck.Checked) (*statsapi.Summary, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.summary == nil {
		return nil, fmt.Errorf("%w: GET https://127.0.0.1:10250/stats/summary: 403 Forbidden", probe.ErrRefused)
	}
	return k.summary, nil
}

func (k *fakeKubelet) Pods(context.Context, *configcheck.Checked) ([]corev1.Pod, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.summary == nil {
		return nil, fmt.Errorf("%w: GET https://127.0.0.1:10250/pods: 403 Forbidden", probe.ErrRefused)
	}
	return k.pods, nil
}

// Stop is `systemctl stop kubelet`.
func (k *fakeKubelet) Stop(context.Context) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.stopped = true
	k.calls = append(k.calls, "stop")
	if k.failStop > 0 {
		k.failStop--
		return errors.New("stop kubelet.service: job did not complete: failed")
	}
	return nil
}

// RemoveFiles is the transient unit's rm: it removes the fake's cpu_manager_state when named.
func (k *fakeKubelet) RemoveFiles(_ context.Context, paths []string) error {
	k.mu.Lock()
	after := k.afterRemove
	k.mu.Unlock()
	if after != nil {
		after()
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.calls = append(k.calls, "remove "+strings.Join(paths, " "))
	if k.failRemove > 0 {
		k.failRemove--
		return errors.New("remove: start dkc-remove-kubelet-state-1.service: job did not complete: failed")
	}
	for _, p := range paths {
		if filepath.Base(p) == "cpu_manager_state" {
			k.cpuState = ""
		}
	}
	return nil
}

func (k *fakeKubelet) callLog() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]string(nil), k.calls...)
}

func (k *fakeKubelet) Restart(ctx context.Context) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := ctx.Err(); err != nil {
		// As systemd.Manager's: the job is not queued, or not waited for, once ctx is done.
		return fmt.Errorf("restart kubelet.service: %w", err)
	}
	if k.failRestarts > 0 {
		k.failRestarts--
		k.stopped = true
		return errors.New("restart kubelet.service: job did not complete: failed")
	}
	if k.exitOnStart > 0 {
		k.exitOnStart--
		k.stopped = true
		f, _ := k.env.Get()
		k.restarts = append(k.restarts, f)
		return &systemd.StartFailedError{Unit: "kubelet.service", Result: "exit-code", Err: errors.New("restart kubelet.service: job did not complete: failed")}
	}
	f, _ := k.env.Get()
	if f == "" {
		f = k.local
	}
	k.calls = append(k.calls, "restart "+f)
	policy := "none"
	if r, err := kubeletcheck.Load(context.Background(), f, nil); err == nil {
		policy = r.Config.CPUManagerPolicy
	}
	if k.cpuState != "" && k.cpuState != policy {
		// "configured policy ... differs from state checkpoint policy ..., please drain this node and delete
		// the CPU manager checkpoint file": the kubelet exits.
		k.stopped, k.running = true, f
		k.restarts = append(k.restarts, f)
		return &systemd.StartFailedError{Unit: "kubelet.service", Result: "exit-code",
			Err: errors.New("restart kubelet.service: job did not complete: failed")}
	}
	k.cpuState = policy
	k.stopped = false
	k.running = f
	k.restarts = append(k.restarts, f)
	return nil
}

func (k *fakeKubelet) MainPID(context.Context) (int, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.stopped {
		return 0, nil
	}
	return 4242, nil
}

func (k *fakeKubelet) runningConfig() (*kubeletconfiginternal.KubeletConfiguration, error) {
	k.mu.Lock()
	f, flags := k.running, k.flags
	k.mu.Unlock()
	r, err := kubeletcheck.Load(context.Background(), f, flags)
	if err != nil {
		return nil, err
	}
	return r.Config, nil
}

func (k *fakeKubelet) Healthz(context.Context, *configcheck.Checked) error {
	k.mu.Lock()
	stopped := k.stopped
	k.mu.Unlock()
	if stopped {
		return errors.New("connection refused")
	}
	kc, err := k.runningConfig()
	if err != nil {
		return err
	}
	if kc.MaxPods == 13 {
		return errors.New("connection refused")
	}
	return nil
}

// Foreign: the fake node's addresses are loopback alone.
func (k *fakeKubelet) Foreign(kc *configcheck.Checked) error {
	switch kc.Address {
	case "", "0.0.0.0", "::", "127.0.0.1":
		return nil
	}
	return fmt.Errorf("%w: address %s is neither loopback nor an address of this node's interfaces",
		probe.ErrForeignAddress, kc.Address)
}

func (k *fakeKubelet) Configz(context.Context, *configcheck.Checked) (map[string]any, error) {
	k.mu.Lock()
	configzErr, stopped := k.configzErr, k.stopped
	k.mu.Unlock()
	if stopped {
		return nil, errors.New("dial tcp 127.0.0.1:10250: connection refused")
	}
	kc, err := k.runningConfig()
	if err != nil {
		return nil, err
	}
	if configzErr != nil {
		return nil, fmt.Errorf("%w: GET https://127.0.0.1:10250/configz", configzErr)
	}
	// A kubelet that cannot authenticate anyone (no webhook, no anonymous access) refuses every request.
	if !kc.Authentication.Webhook.Enabled && !kc.Authentication.Anonymous.Enabled {
		return nil, fmt.Errorf("%w: GET https://127.0.0.1:10250/configz: 401 Unauthorized", probe.ErrRefused)
	}
	return kubeletcheck.ToV1beta1JSON(kc)
}

func (k *fakeKubelet) count() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.restarts)
}

type recordingReporter struct {
	mu        sync.Mutex
	last      *dkcv1.NodeConfigStatus
	restarts  []*dkcv1.KubeletRestart
	following string // the Node object the reports are about (Follow)
	reports   []reported
}

type reported struct {
	status  *dkcv1.NodeConfigStatus
	nodeUID string
	preview *dkcv1.PreviewResult
	drift   *dkcv1.Drift
}

func (r *recordingReporter) lastStatus() *dkcv1.NodeConfigStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last
}

func (r *recordingReporter) Report(st *dkcv1.NodeConfigStatus, _ string, preview *dkcv1.PreviewResult,
	drift *dkcv1.Drift, restart *dkcv1.KubeletRestart) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.last = st
	r.reports = append(r.reports, reported{status: st, nodeUID: r.following, preview: preview, drift: drift})
	if restart != nil {
		r.restarts = append(r.restarts, restart)
	}
}

func (r *recordingReporter) Follow(nodeUID string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.following = nodeUID
}

// reportsSince returns the reports from the i-th on.
func (r *recordingReporter) reportsSince(i int) []reported {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]reported(nil), r.reports[min(i, len(r.reports)):]...)
}

type node struct {
	t        *testing.T
	dir      string
	local    string
	kubelet  *fakeKubelet
	reporter *recordingReporter
	clock    *clocktesting.FakeClock
	// trial, if set, is the agent's TrialClock (the monotonic clock the trial is measured on), apart from
	// clock (the wall clock); nil: clock is both.
	trial *clocktesting.FakeClock
	agent *Agent
}

// cfgHeader starts every config; failCgroupV1 is off because kubelets from 1.35 refuse a cgroup v1 host in
// validation, and the machines these tests run on may be cgroup v1.
const cfgHeader = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nfailCgroupV1: false\n"

func newNode(t *testing.T) *node {
	t.Helper()
	root := t.TempDir()
	n := &node{t: t, dir: filepath.Join(root, "dynamic-config"), local: filepath.Join(root, "config.yaml"),
		clock: clocktesting.NewFakeClock(time.Now())}
	if err := os.WriteFile(n.local, []byte(cfgHeader+"eventRecordQPS: 50\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	n.kubelet = &fakeKubelet{env: kubeletunit.New(n.dir), local: n.local, running: n.local}
	n.start()
	return n
}

// start (re)starts the sidecar on the node, as after a crash or upgrade.
func (n *node) start() {
	n.t.Helper()
	n.reporter = &recordingReporter{}
	cfg := Config{
		Log: zap.NewNop(), Store: checkpoint.New(n.dir), Service: n.kubelet, Kubelet: n.kubelet, Reporter: n.reporter, Clock: n.clock,
		LocalConfig: n.local, KubeletFlags: []string{}, Checker: kubeletcheck.InProcess{}, TrialDuration: 10 * time.Minute, HealthTimeout: time.Second,
		KeepCheckpoints: 2, TrialCheckInterval: time.Second}
	if n.trial != nil {
		cfg.TrialClock = n.trial
	}
	n.agent = New(cfg)
	stop := n.drive()
	err := n.agent.Init(context.Background())
	stop()
	if err != nil {
		n.t.Fatal(err)
	}
}

// drive lets the agent's waits on its fake clock (the health wait's pauses) pass at once, until the
// returned stop: the clock does not advance by itself.
func (n *node) drive() (stop func()) {
	n.t.Helper()
	return poll.Drive(n.t, n.clock, 600*time.Millisecond)
}

func assignment(uid, rv, kubelet string) *dkcv1.Assignment {
	src := &dkcv1.ConfigMapNodeConfigSource{Namespace: "kube-system", Name: "c", Uid: uid, ResourceVersion: rv, KubeletConfigKey: "kubelet"}
	files := map[string]string{"kubelet": kubelet}
	return &dkcv1.Assignment{Source: &dkcv1.NodeConfigSource{ConfigMap: src}, Files: files, ContentHash: payload.Hash(src, files)}
}

func (n *node) apply(a *dkcv1.Assignment, syncErr string) {
	n.t.Helper()
	defer n.drive()()
	n.agent.Apply(context.Background(), Desired{Assignment: a, SyncError: syncErr})
}

func rv(s *dkcv1.NodeConfigSource) string {
	if s.GetConfigMap() == nil {
		return "local"
	}
	return s.GetConfigMap().GetResourceVersion()
}

func (n *node) expect(assigned, active, lkg, errText string, restarts int) {
	n.t.Helper()
	st := n.reporter.last
	if st == nil {
		n.t.Fatal("no status reported")
	}
	if rv(st.GetAssigned()) != assigned || rv(st.GetActive()) != active || rv(st.GetLastKnownGood()) != lkg || st.GetError() != errText {
		n.t.Errorf("status assigned=%s active=%s lkg=%s error=%q; want %s %s %s %q",
			rv(st.GetAssigned()), rv(st.GetActive()), rv(st.GetLastKnownGood()), st.GetError(), assigned, active, lkg, errText)
	}
	if got := n.kubelet.count(); got != restarts {
		n.t.Errorf("kubelet restarts = %d, want %d (%v)", got, restarts, n.kubelet.restarts)
	}
}

func TestFreshNodeDoesNotRestart(t *testing.T) {
	n := newNode(t)
	n.expect("local", "local", "local", "", 0)
	n.apply(&dkcv1.Assignment{}, "")
	n.expect("local", "local", "local", "", 0)
}

func TestValidAssignmentRestartsOnceAndSurvivesSidecarRestart(t *testing.T) {
	n := newNode(t)
	n.apply(assignment("u", "1", cfgHeader+"eventRecordQPS: 7\n"), "")
	n.expect("1", "1", "local", "", 1)
	if f, _ := n.kubelet.env.Get(); f != filepath.Join(n.dir, "checkpoints/u/1/kubelet") {
		t.Errorf("env file names %s", f)
	}
	if len(n.reporter.restarts) != 1 || n.reporter.restarts[0].GetTarget().GetConfigMap().GetResourceVersion() != "1" {
		t.Errorf("restart reports = %v", n.reporter.restarts)
	}
	n.apply(assignment("u", "1", cfgHeader+"eventRecordQPS: 7\n"), "") // the same again
	n.expect("1", "1", "local", "", 1)
	n.start() // sidecar restart
	n.expect("1", "1", "local", "", 1)
	// A sync error from the service overrides the status error but changes nothing else.
	n.apply(nil, "failed to sync: failed to download config, see Kubelet log for details")
	n.expect("1", "1", "local", "failed to sync: failed to download config, see Kubelet log for details", 1)
}

func TestInvalidAssignmentsNeverReachTheKubelet(t *testing.T) {
	for _, tc := range []struct{ name, content, err string }{
		{"invalid", cfgHeader + "eventRecordQPS: -1\n", string(nodeconfig.ValidateError)},
		{"unparsable", "{{{ not yaml", string(nodeconfig.LoadError)},
		{"wrong kind", "apiVersion: v1\nkind: ConfigMap\n", string(nodeconfig.LoadError)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNode(t)
			n.apply(assignment("u", "1", tc.content), "")
			n.expect("1", "local", "local", tc.err, 0)
			n.start()
			n.expect("1", "local", "local", tc.err, 0)
		})
	}
}

func TestUnhealthyConfigIsRolledBackOnce(t *testing.T) {
	n := newNode(t)
	n.apply(assignment("u", "1", cfgHeader+"maxPods: 13\n"), "")
	// Restarted into the bad config, then back to local: two restarts, and no more.
	n.expect("1", "local", "local", string(nodeconfig.HealthError), 2)
	n.start()
	n.expect("1", "local", "local", string(nodeconfig.HealthError), 2)
	n.apply(assignment("u", "2", cfgHeader+"eventRecordQPS: 9\n"), "")
	n.expect("2", "2", "local", "", 3)
}

func TestTrialPromotesAndLastKnownGoodIsTheFallback(t *testing.T) {
	n := newNode(t)
	n.apply(assignment("u", "1", cfgHeader+"eventRecordQPS: 7\n"), "")
	n.expect("1", "1", "local", "", 1)
	n.clock.Step(5 * time.Minute)
	n.agent.CheckTrial(context.Background())
	n.expect("1", "1", "local", "", 1)
	n.start() // the trial start is on disk: a sidecar restart does not reset it
	n.clock.Step(6 * time.Minute)
	n.agent.CheckTrial(context.Background())
	n.expect("1", "1", "1", "", 1)

	// A bad new config falls back to last-known-good, which already runs: no restart.
	n.apply(assignment("u", "2", cfgHeader+"eventRecordQPS: -1\n"), "")
	n.expect("2", "1", "1", string(nodeconfig.ValidateError), 1)
	// A good one replaces it; last-known-good moves only after its own trial.
	n.apply(assignment("u", "3", cfgHeader+"eventRecordQPS: 8\n"), "")
	n.expect("3", "3", "1", "", 2)
	n.clock.Step(11 * time.Minute)
	n.agent.CheckTrial(context.Background())
	n.expect("3", "3", "3", "", 2)

	// Reset: local config, last-known-good forgotten at once.
	n.apply(&dkcv1.Assignment{}, "")
	n.expect("local", "local", "local", "", 3)
}

// newNodeWithTrialClock is a node whose agent measures trials on a clock of their own (n.trial), as the
// real clock's monotonic readings do, apart from the wall clock (n.clock).
func newNodeWithTrialClock(t *testing.T) *node {
	t.Helper()
	root := t.TempDir()
	n := &node{t: t, dir: filepath.Join(root, "dynamic-config"), local: filepath.Join(root, "config.yaml"),
		clock: clocktesting.NewFakeClock(time.Now()), trial: clocktesting.NewFakeClock(time.Unix(1000, 0))}
	if err := os.WriteFile(n.local, []byte(cfgHeader+"eventRecordQPS: 50\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	n.kubelet = &fakeKubelet{env: kubeletunit.New(n.dir), local: n.local, running: n.local}
	n.start()
	return n
}

// remaining is how much of the running config's trial is left.
func (n *node) remaining() time.Duration {
	n.t.Helper()
	elapsed, ok := n.agent.state.trialElapsed(n.agent.active, n.agent.trial.Now())
	if !ok {
		n.t.Fatal("no trial recorded for the active config")
	}
	return n.agent.cfg.TrialDuration - elapsed
}

// The trial ends at its duration to the nanosecond, before and after a sidecar restart: CheckTrial's
// in-memory shortcut (it runs every second on every node) must never delay or advance a promotion.
func TestTrialEndsAtItsDuration(t *testing.T) {
	n := newNodeWithTrialClock(t)
	// stepTo moves the trial clock on until the trial has run d.
	stepTo := func(d time.Duration) {
		t.Helper()
		n.trial.Step(d - (n.agent.cfg.TrialDuration - n.remaining()))
		n.agent.CheckTrial(context.Background())
	}
	n.apply(assignment("u", "1", cfgHeader+"eventRecordQPS: 7\n"), "")
	n.expect("1", "1", "local", "", 1)
	stepTo(10*time.Minute - time.Nanosecond)
	n.expect("1", "1", "local", "", 1)
	stepTo(10 * time.Minute)
	n.expect("1", "1", "1", "", 1)

	n.apply(assignment("u", "2", cfgHeader+"eventRecordQPS: 8\n"), "")
	n.expect("2", "2", "1", "", 2)
	stepTo(5 * time.Minute)
	n.start()
	stepTo(10*time.Minute - time.Nanosecond)
	n.expect("2", "2", "1", "", 2)
	stepTo(10 * time.Minute)
	n.expect("2", "2", "2", "", 2)
}

// TestTrialIgnoresWallClockSteps: a step of the wall clock, forward or back, while the sidecar runs or
// while it is down, leaves the trial's remaining duration as it was; a restarted sidecar continues the
// trial from what was saved (all of it after a graceful stop, up to the last save after a crash), and the
// time it was down does not count.
func TestTrialIgnoresWallClockSteps(t *testing.T) {
	n := newNodeWithTrialClock(t)
	n.apply(assignment("u", "1", cfgHeader+"eventRecordQPS: 7\n"), "")
	n.expect("1", "1", "local", "", 1)
	want := 10 * time.Minute
	check := func(when string) {
		t.Helper()
		n.agent.CheckTrial(context.Background())
		if got := n.remaining(); got != want {
			t.Errorf("%s: %v of the trial left, want %v", when, got, want)
		}
		n.expect("1", "1", "local", "", 1)
	}
	check("trial started")
	n.trial.Step(4 * time.Minute)
	want -= 4 * time.Minute
	check("after 4 minutes")
	n.clock.Step(time.Hour)
	check("wall clock stepped 1h forward")
	n.clock.Step(-2 * time.Hour)
	check("wall clock stepped back to 1h before")

	// A crash: the last save (at the check after 4 minutes) is what the next sidecar continues from.
	n.trial.Step(30 * time.Second)
	n.start()
	n.clock.Step(time.Hour)
	check("sidecar crashed, restarted, wall clock 1h forward")

	// A graceful stop saves what was measured; the time the sidecar is down does not count.
	n.trial.Step(50 * time.Second)
	want -= 50 * time.Second
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := n.agent.Run(ctx, nil); err != nil {
		t.Fatal(err)
	}
	n.trial.Step(time.Hour) // down for an hour
	n.clock.Step(-3 * time.Hour)
	n.start()
	check("sidecar stopped, down an hour, restarted, wall clock 2h back")

	n.trial.Step(want - time.Nanosecond)
	want = time.Nanosecond
	check("a nanosecond before the end")
	n.trial.Step(time.Nanosecond)
	n.agent.CheckTrial(context.Background())
	n.expect("1", "1", "1", "", 1)
}

// TestTrialOfAnOlderSidecarIsTakenUp: a state file that records the trial's wall-clock start only (an older
// sidecar's) is continued: its elapsed time is taken from the wall clock once, then measured on the trial
// clock, and saved in the new form.
func TestTrialOfAnOlderSidecarIsTakenUp(t *testing.T) {
	n := newNodeWithTrialClock(t)
	n.apply(assignment("u", "1", cfgHeader+"eventRecordQPS: 7\n"), "")
	n.expect("1", "1", "local", "", 1)
	path := filepath.Join(n.dir, StateFileName)
	var old map[string]any
	data, err := os.ReadFile(path)
	if err == nil {
		err = json.Unmarshal(data, &old)
	}
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := old["trialElapsed"]; !ok {
		t.Fatalf("the state file records no trialElapsed: %s", data)
	}
	delete(old, "trialElapsed")
	started := n.clock.Now().Add(-4 * time.Minute)
	old["trialStart"] = started
	if data, err = json.Marshal(old); err == nil {
		err = os.WriteFile(path, data, 0o644)
	}
	if err != nil {
		t.Fatal(err)
	}
	n.start()
	// The wall clock moves on by itself while the agent starts (the health wait's steps): read it after.
	if got, most := n.remaining(), 6*time.Minute; got > most || got < most-n.clock.Since(started)+4*time.Minute {
		t.Errorf("%v of the taken-up trial left, want %v less what the wall clock moved since", got, most)
	}
	left := n.remaining()
	n.clock.Step(time.Hour)
	n.trial.Step(time.Minute)
	n.agent.CheckTrial(context.Background()) // saves: a minute unsaved
	if got := n.remaining(); got != left-time.Minute {
		t.Errorf("%v left after a minute and a wall clock step, want %v", got, left-time.Minute)
	}
	disk := &stateFile{path: path}
	if err := disk.load(); err != nil || disk.s.TrialElapsed == nil || disk.s.TrialElapsed.Duration != 10*time.Minute-left+time.Minute {
		t.Errorf("saved trial %+v (%v), want %v elapsed", disk.s.TrialElapsed, err, 10*time.Minute-left+time.Minute)
	}
	n.trial.Step(left - time.Minute)
	n.agent.CheckTrial(context.Background())
	n.expect("1", "1", "1", "", 1)
}

func TestRefusedPayload(t *testing.T) {
	n := newNode(t)
	bad := assignment("u", "1", cfgHeader)
	bad.Files["../escape"] = "x"
	n.apply(bad, "")
	n.expect("local", "local", "local", string(nodeconfig.PayloadError), 0)
	if _, err := os.Stat(filepath.Join(n.dir, "..", "escape")); !os.IsNotExist(err) {
		t.Error("payload escaped the dynamic config dir")
	}
}

// TestInitRefusesPathsTheEnvFileCannotName: a local config or dynamic config dir that would split the
// kubelet's --config flag stops the sidecar at start, before anything is written.
func TestInitRefusesPathsTheEnvFileCannotName(t *testing.T) {
	for _, tc := range []struct {
		name, local, dir, offender string
	}{
		{"tab in local config", "/etc/kubernetes/kubelet.yaml\t--authorization-mode=AlwaysAllow", "/var/lib/kubelet/dynamic-config",
			"/etc/kubernetes/kubelet.yaml\t--authorization-mode=AlwaysAllow"},
		{"space in dynamic config dir", "/etc/kubernetes/kubelet.yaml", "/var/lib/kubelet/dynamic config", "/var/lib/kubelet/dynamic config"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := New(Config{Log: zap.NewNop(), Store: checkpoint.New(tc.dir), LocalConfig: tc.local})
			if err := a.Init(context.Background()); err == nil {
				t.Fatal("Init accepted")
			} else if want := fmt.Sprintf("%q", tc.offender); !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not name %s", err, want)
			}
		})
	}
}

func TestUnknownFlagsAreRetried(t *testing.T) {
	n := newNode(t)
	n.agent.cfg.KubeletFlags = nil // read them from the running kubelet, which has no PID yet
	// The fake's PID (4242) must not be found: on a busy machine a real process may hold it, and its command
	// line would be read as the kubelet's.
	n.agent.cfg.ProcDir = t.TempDir()
	n.agent.Apply(context.Background(), Desired{Assignment: &dkcv1.Assignment{}})
	if st := n.reporter.last; st.GetError() != string(nodeconfig.InternalError) || !n.agent.retry {
		t.Fatalf("status %v, retry %v; want an internal error to be retried", st, n.agent.retry)
	}
	n.agent.cfg.KubeletFlags = []string{} // the kubelet came up
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = n.agent.Run(ctx, make(chan *dkcv1.WatchConfigResponse)); close(done) }()
	n.tickUntil("a retry to clear the error", func(st *dkcv1.NodeConfigStatus) bool { return st.GetError() == "" })
	cancel()
	<-done
}

// failingChecker fails every check (the helper process could not run) until healed.
type failingChecker struct {
	mu     sync.Mutex
	broken bool
}

func (f *failingChecker) Check(ctx context.Context, req configcheck.Request) (*configcheck.Checked, error) {
	f.mu.Lock()
	broken := f.broken
	f.mu.Unlock()
	if broken {
		return nil, errors.New("run dkc-kubelet-check: fork/exec: resource temporarily unavailable")
	}
	return kubeletcheck.InProcess{}.Check(ctx, req)
}

func TestFailedCheckIsRetriedAndTouchesNothing(t *testing.T) {
	n := newNode(t)
	checker := &failingChecker{broken: true}
	n.agent.cfg.Checker = checker
	n.apply(assignment("u1", "1", cfgHeader+"eventRecordQPS: 7\n"), "")
	if st := n.reporter.lastStatus(); st.GetError() != string(nodeconfig.InternalError) || !n.agent.retry || n.kubelet.count() != 0 {
		t.Fatalf("status %v, retry %v, restarts %d; want an internal error, a retry and no restart", st, n.agent.retry, n.kubelet.count())
	}
	checker.mu.Lock()
	checker.broken = false
	checker.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = n.agent.Run(ctx, make(chan *dkcv1.WatchConfigResponse)); close(done) }()
	n.tickUntil("a retry to apply config 1", func(st *dkcv1.NodeConfigStatus) bool { return rv(st.GetActive()) == "1" })
	cancel()
	<-done
	if st := n.reporter.lastStatus(); st.GetError() != "" || rv(st.GetActive()) != "1" {
		t.Fatalf("not retried: %v", st)
	}
}

// tickUntil steps the fake clock through the ticks of the agent's running loop (TrialCheckInterval, 1s)
// until the last status reported satisfies done.
func (n *node) tickUntil(what string, done func(*dkcv1.NodeConfigStatus) bool) {
	n.t.Helper()
	poll.SteppingNil(n.t, what, n.clock, time.Second, func() error {
		if st := n.reporter.lastStatus(); !done(st) {
			return fmt.Errorf("last status %v", st)
		}
		return nil
	})
}

// runUntil runs the agent's loop, stepping the fake clock through its ticks, until done holds; it returns
// the last status reported.
func (n *node) runUntil(what string, done func(*dkcv1.NodeConfigStatus) bool) *dkcv1.NodeConfigStatus {
	n.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { _ = n.agent.Run(ctx, make(chan *dkcv1.WatchConfigResponse)); close(stopped) }()
	defer func() { cancel(); <-stopped }()
	n.tickUntil(what, done)
	return n.reporter.lastStatus()
}

// TestFailedCheckpointWriteIsRetried: the service sends an assignment once; a checkpoint write that fails
// (here: checkpoints/ replaced by a file, which stops root too) must not drop it until the next reconnect.
// The status says so meanwhile, and the assignment is applied at a tick once the disk takes writes again.
func TestFailedCheckpointWriteIsRetried(t *testing.T) {
	n := newNode(t)
	cps := filepath.Join(n.dir, "checkpoints")
	if err := os.RemoveAll(cps); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cps, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	n.apply(assignment("u", "1", cfgHeader+"eventRecordQPS: 7\n"), "")
	n.expect("local", "local", "local", string(nodeconfig.SyncInternalError), 0)
	// Still failing: every tick keeps saying so, and nothing restarts.
	before := len(n.reporter.reportsSince(0))
	st := n.runUntil("5 ticks' reports", func(*dkcv1.NodeConfigStatus) bool { return len(n.reporter.reportsSince(before)) >= 5 })
	if st.GetError() != string(nodeconfig.SyncInternalError) || n.kubelet.count() != 0 {
		t.Fatalf("while the disk refuses writes: status %v, restarts %d", st, n.kubelet.count())
	}
	if err := os.Remove(cps); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(cps, 0o755); err != nil {
		t.Fatal(err)
	}
	st = n.runUntil("the assignment to be applied", func(st *dkcv1.NodeConfigStatus) bool { return rv(st.GetActive()) == "1" })
	if rv(st.GetAssigned()) != "1" || rv(st.GetActive()) != "1" || st.GetError() != "" {
		t.Fatalf("assignment not retried after the disk recovered: %v", st)
	}
}

func TestCheckConfigFlag(t *testing.T) {
	const local, dir = "/var/lib/kubelet/config.yaml", "/var/lib/kubelet/dynamic-config"
	for _, tc := range []struct {
		name, running string
		ok            bool
	}{
		{"local config", local, true},
		{"local config, unclean", "/var/lib/kubelet//config.yaml", true},
		{"dkc checkpoint", dir + "/checkpoints/u/1/kubelet", true},
		{"no --config", "", true},
		{"another file", "/etc/kubernetes/kubelet.yaml", false},
		{"beside the dynamic config dir", "/var/lib/kubelet/dynamic-config-other/kubelet", false},
		{"the dynamic config dir itself", dir, false},
		{"escaping the dynamic config dir", dir + "/../other.yaml", false},
		{"relative", "dynamic-config/checkpoints/u/1/kubelet", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkConfigFlag(tc.running, local, dir)
			if (err == nil) != tc.ok {
				t.Fatalf("checkConfigFlag(%q) = %v, want ok=%v", tc.running, err, tc.ok)
			}
			if err != nil && (!errors.Is(err, errForeignConfig) || !strings.Contains(err.Error(), tc.running) || !strings.Contains(err.Error(), local)) {
				t.Errorf("error %q does not name both paths", err)
			}
		})
	}
}

// pidKubelet is a fakeKubelet whose MainPID is a real process, so the agent reads its command line.
type pidKubelet struct {
	*fakeKubelet
	pid int
}

func (k pidKubelet) MainPID(context.Context) (int, error) { return k.pid, nil }

// TestInitRefusesAKubeletRunningAnotherConfig: with the kubelet started with --config=/other/path and the
// sidecar told --kubelet-config=<local>, the first restart would silently switch the node to <local>. Init
// must refuse, naming both paths, and restart nothing.
func TestInitRefusesAKubeletRunningAnotherConfig(t *testing.T) {
	// sh stays the process (a second command stops it from exec'ing sleep), its argv ending in the flag.
	cmd := exec.Command("sh", "-c", "sleep 60; :", "kubelet", "--config=/other/path")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	root := t.TempDir()
	dir, local := filepath.Join(root, "dynamic-config"), filepath.Join(root, "config.yaml")
	if err := os.WriteFile(local, []byte(cfgHeader), 0o644); err != nil {
		t.Fatal(err)
	}
	fk := &fakeKubelet{env: kubeletunit.New(dir), local: local, running: local}
	k := pidKubelet{fakeKubelet: fk, pid: cmd.Process.Pid}
	rep := &recordingReporter{}
	a := New(Config{Log: zap.NewNop(), Store: checkpoint.New(dir), Service: k, Kubelet: k, Reporter: rep, LocalConfig: local, Checker: kubeletcheck.InProcess{}, HealthTimeout: time.Second})
	err := a.Init(context.Background())
	if err == nil || !strings.Contains(err.Error(), "/other/path") || !strings.Contains(err.Error(), local) {
		t.Fatalf("Init = %v; want a refusal naming /other/path and %s", err, local)
	}
	if fk.count() != 0 {
		t.Errorf("kubelet restarted %d times", fk.count())
	}
	// Found later (the kubelet restarted by someone else): an internal failure in status, nothing restarted.
	a.Apply(context.Background(), Desired{Assignment: assignment("u", "1", cfgHeader+"eventRecordQPS: 7\n")})
	if st := rep.lastStatus(); st.GetError() != string(nodeconfig.InternalError) || fk.count() != 0 {
		t.Errorf("status %v, restarts %d; want %q and none", st, fk.count(), string(nodeconfig.InternalError))
	}
}

// TestKubeletCommandLineReadFromProcDir: in a pod, the host's /proc is mounted at --host-proc (no host PID
// namespace); the kubelet's MainPID, a host PID, is looked up there and not in the pod's own /proc.
func TestKubeletCommandLineReadFromProcDir(t *testing.T) {
	root := t.TempDir()
	dir, local, proc := filepath.Join(root, "dynamic-config"), filepath.Join(root, "config.yaml"), filepath.Join(root, "host-proc")
	if err := os.WriteFile(local, []byte(cfgHeader), 0o644); err != nil {
		t.Fatal(err)
	}
	// A PID no process of this test has (pid_max is at most 2^22): only the mounted /proc knows it.
	const hostPID = 1 << 23
	if err := os.MkdirAll(filepath.Join(proc, strconv.Itoa(hostPID)), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(proc, strconv.Itoa(hostPID), "cmdline"), []byte("/usr/bin/kubelet\x00--config=/other/path\x00"), 0o444); err != nil {
		t.Fatal(err)
	}
	fk := &fakeKubelet{env: kubeletunit.New(dir), local: local, running: local}
	k := pidKubelet{fakeKubelet: fk, pid: hostPID}
	a := New(Config{Log: zap.NewNop(), Store: checkpoint.New(dir), Service: k, Kubelet: k, Reporter: &recordingReporter{}, LocalConfig: local, Checker: kubeletcheck.InProcess{}, HealthTimeout: time.Second, ProcDir: proc})
	if err := a.Init(context.Background()); err == nil || !strings.Contains(err.Error(), "/other/path") {
		t.Fatalf("Init = %v; want the refusal of the --config read from %s/%d/cmdline", err, proc, hostPID)
	}
}

// unitKubelet is a fakeKubelet whose unit sets its own --config (systemd's Environment=).
type unitKubelet struct {
	*fakeKubelet
	unitConfig string
}

func (u unitKubelet) UnitConfigFlag(context.Context) (string, error) { return u.unitConfig, nil }

// TestInitRefusesAUnitWithAnotherLocalConfig: the kubelet runs a checkpoint (its command line names dkc's
// file), but its unit's own --config, the one a reset returns to, is not --kubelet-config: refuse to start,
// naming both, rather than switch the node to another file at the next reset.
func TestInitRefusesAUnitWithAnotherLocalConfig(t *testing.T) {
	for _, tc := range []struct {
		name, unitConfig string
		wantErr          bool
	}{
		{"the unit's --config is --kubelet-config", "", false},
		{"another file", "/etc/kubernetes/other-kubelet.yaml", true},
		{"the unit sets none", "-", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNode(t)
			n.apply(assignment("u", "1", cfgHeader+"eventRecordQPS: 7\n"), "")
			n.expect("1", "1", "local", "", 1)
			unit := tc.unitConfig
			switch unit {
			case "":
				unit = n.local
			case "-":
				unit = ""
			}
			svc := unitKubelet{fakeKubelet: n.kubelet, unitConfig: unit}
			a := New(Config{
				Log: zap.NewNop(), Store: checkpoint.New(n.dir), Service: svc, Kubelet: n.kubelet, Reporter: &recordingReporter{}, Clock: n.clock,
				LocalConfig: n.local, Checker: kubeletcheck.InProcess{}, TrialDuration: 10 * time.Minute, HealthTimeout: time.Second,
				KeepCheckpoints: 2, TrialCheckInterval: time.Second})
			err := a.Init(context.Background())
			if tc.wantErr {
				if err == nil || !strings.Contains(err.Error(), tc.unitConfig) || !strings.Contains(err.Error(), n.local) {
					t.Fatalf("Init = %v; want a refusal naming %s and %s", err, tc.unitConfig, n.local)
				}
			} else if err != nil {
				t.Fatalf("Init: %v", err)
			}
			if got := n.kubelet.count(); got != 1 {
				t.Errorf("kubelet restarted %d times, want only the assignment's", got)
			}
		})
	}
}

// TestActiveIsNotLocalWhileUnknown: a node runs an assigned config; its sidecar restarts while the kubelet
// is stopped and without ever having seen the kubelet's flags, so it cannot check or prove anything. Its
// status must not claim the local config is active (the service writes an absent active as local); it says
// what was last proven, next to the internal error.
func TestActiveIsNotLocalWhileUnknown(t *testing.T) {
	n := newNode(t) // flags given by configuration (--kubelet-flags): never read from the kubelet, never saved
	n.apply(assignment("u", "1", cfgHeader+"eventRecordQPS: 7\n"), "")
	n.expect("1", "1", "local", "", 1)

	n.kubelet.mu.Lock()
	n.kubelet.stopped = true
	n.kubelet.mu.Unlock()
	n.reporter = &recordingReporter{}
	n.agent = New(Config{
		Log: zap.NewNop(), Store: checkpoint.New(n.dir), Service: n.kubelet, Kubelet: n.kubelet, Reporter: n.reporter, Clock: n.clock,
		LocalConfig: n.local, Checker: kubeletcheck.InProcess{}, TrialDuration: 10 * time.Minute, HealthTimeout: time.Second,
		KeepCheckpoints: 2, TrialCheckInterval: time.Second})
	if err := n.agent.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	n.expect("1", "1", "local", string(nodeconfig.InternalError), 1)
}

// TestNothingReportedUntilActiveIsKnown: a sidecar that has never seen what the kubelet runs (upgraded from a
// version whose state file kept no proven active config, before its first proof) must not report: the service
// writes an absent active as local, which may be false. An error is reported all the same (the operator must
// see why the node is stuck), and once the kubelet proves its config the report says so.
func TestNothingReportedUntilActiveIsKnown(t *testing.T) {
	n := newNode(t)
	n.apply(assignment("u", "1", cfgHeader+"eventRecordQPS: 7\n"), "")
	n.expect("1", "1", "local", "", 1)
	src, err := n.agent.store.Assigned()
	if err != nil || src == nil {
		t.Fatalf("assigned = %v, %v", src, err)
	}

	fresh := func() (*Agent, *recordingReporter) {
		rep := &recordingReporter{}
		a := New(Config{
			Log: zap.NewNop(), Store: checkpoint.New(n.dir), Service: n.kubelet, Kubelet: n.kubelet, Reporter: rep, Clock: n.clock,
			LocalConfig: n.local, KubeletFlags: []string{}, Checker: kubeletcheck.InProcess{}, TrialDuration: 10 * time.Minute,
			HealthTimeout: time.Second, KeepCheckpoints: 2, TrialCheckInterval: time.Second})
		return a, rep // state not loaded: as after an upgrade, before anything is proven
	}
	a, rep := fresh()
	a.report()
	if got := rep.lastStatus(); got != nil {
		t.Fatalf("reported %v before anything proved what the kubelet runs", got)
	}
	a.configError = nodeconfig.InternalError
	a.report()
	if got := rep.lastStatus(); got.GetError() != string(nodeconfig.InternalError) {
		t.Fatalf("an error while active is unknown: reported %v, want %q", got, string(nodeconfig.InternalError))
	}
	a, rep = fresh()
	a.setActive(src)
	a.report()
	if got := rep.lastStatus(); got.GetActive().GetConfigMap().GetResourceVersion() != "1" || got.GetError() != "" {
		t.Fatalf("after the proof: reported %v, want active 1 without error", got)
	}
}

// TestUnverifiableConfigzBlamesNothing: while the kubelet refuses /configz or does not answer it in time
// (its apiserver unreachable, nothing in its authentication cache), neither a restart into a new config nor
// a sidecar restart blames the config: no rollback, no further restart; once /configz answers again the
// config is proven active.
func TestUnverifiableConfigzBlamesNothing(t *testing.T) {
	for _, tc := range []struct {
		name      string
		configz   error
		wantError string
	}{
		{"refused", probe.ErrRefused, string(nodeconfig.VerifyError)},
		{"not answered", probe.ErrNoAnswer, string(nodeconfig.VerifyTimeoutError)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNode(t)
			n.kubelet.mu.Lock()
			n.kubelet.configzErr = tc.configz
			n.kubelet.mu.Unlock()
			n.apply(assignment("u", "1", cfgHeader+"eventRecordQPS: 7\n"), "")
			n.expect("1", "local", "local", tc.wantError, 1)

			n.start() // the sidecar restarts during the outage
			n.apply(assignment("u", "1", cfgHeader+"eventRecordQPS: 7\n"), "")
			n.expect("1", "local", "local", tc.wantError, 1)

			n.kubelet.mu.Lock()
			n.kubelet.configzErr = nil
			n.kubelet.mu.Unlock()
			n.agent.reconcile(context.Background()) // the next tick's retry
			n.expect("1", "1", "local", "", 1)
		})
	}
}

// TestRefusedConfigzOfAConfigThatChangesAuthIsItsFault: a config that changes how the kubelet authenticates
// (here: no webhook, no anonymous access) may be why /configz is refused; it is rolled back like any config
// that does not come up healthy.
func TestRefusedConfigzOfAConfigThatChangesAuthIsItsFault(t *testing.T) {
	n := newNode(t)
	n.apply(assignment("u", "1", cfgHeader+"authentication:\n  anonymous:\n    enabled: false\n  webhook:\n    enabled: false\n"), "")
	n.expect("1", "local", "local", string(nodeconfig.HealthError), 2)
}

// TestReportsFollowTheNodeObject: the reports that follow an update are about the Node object it was
// resolved from (Follow is called before they are made), and a new object gets the node's status even when
// the update changes nothing on the node (a Node deleted and registered again with the same config).
func TestReportsFollowTheNodeObject(t *testing.T) {
	n := newNode(t)
	ctx, cancel := context.WithCancel(context.Background())
	updates := make(chan *dkcv1.WatchConfigResponse)
	stopped := make(chan struct{})
	go func() { _ = n.agent.Run(ctx, updates); close(stopped) }()
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); <-stopped }) }
	t.Cleanup(stop)
	// waitFor steps the fake clock (the health wait) until a report since the i-th one matches.
	waitFor := func(i int, what string, match func(reported) bool) (next int) {
		t.Helper()
		poll.SteppingNil(t, "a report "+what, n.clock, 600*time.Millisecond, func() error {
			for j, r := range n.reporter.reportsSince(i) {
				if match(r) {
					next = i + j + 1
					return nil
				}
			}
			return fmt.Errorf("reports since #%d: %v", i, n.reporter.reportsSince(i))
		})
		return next
	}
	seen := len(n.reporter.reportsSince(0))
	updates <- &dkcv1.WatchConfigResponse{Assignment: assignment("u", "1", cfgHeader+"eventRecordQPS: 7\n"), NodeUid: "node-a"}
	seen = waitFor(seen, "of config 1 running, about node-a", func(r reported) bool {
		return rv(r.status.GetActive()) == "1" && r.nodeUID == "node-a"
	})
	// The Node is deleted and registered again: the new object has no source (local config).
	updates <- &dkcv1.WatchConfigResponse{Assignment: &dkcv1.Assignment{}, NodeUid: "node-b"}
	first := len(n.reporter.reportsSince(0)) // the agent took the update: every report from here on is after it
	seen = waitFor(seen, "of local config running, about node-b", func(r reported) bool {
		return rv(r.status.GetAssigned()) == "local" && rv(r.status.GetActive()) == "local" && r.nodeUID == "node-b"
	})
	for _, r := range n.reporter.reportsSince(first) {
		if r.nodeUID != "node-b" {
			t.Errorf("a report after node-b's update names %q: %v", r.nodeUID, r.status)
		}
	}
	// And again, with the same (local) config: nothing to apply, but node-c must hear the status.
	updates <- &dkcv1.WatchConfigResponse{Assignment: &dkcv1.Assignment{}, NodeUid: "node-c"}
	waitFor(seen, "about node-c", func(r reported) bool { return r.nodeUID == "node-c" && rv(r.status.GetActive()) == "local" })
	if got := n.kubelet.count(); got != 2 {
		t.Errorf("kubelet restarts = %d, want 2 (into config 1, back to local)", got)
	}
	// A restarted sidecar's first reports name the object it followed last.
	stop()
	n.start()
	reports := n.reporter.reportsSince(0)
	if len(reports) == 0 {
		t.Fatal("a restarted sidecar reported nothing")
	}
	for _, r := range reports {
		if r.nodeUID != "node-c" {
			t.Errorf("a restarted sidecar's report names %q, want node-c: %v", r.nodeUID, r.status)
		}
	}
}

// versionChecker records the kubelet version each check was asked for, and refuses versions of minor
// 1.33 as the helpers refuse a minor they have no code for.
type versionChecker struct {
	mu   sync.Mutex
	seen []string
}

func (v *versionChecker) Check(ctx context.Context, req configcheck.Request) (*configcheck.Checked, error) {
	v.mu.Lock()
	v.seen = append(v.seen, req.KubeletVersion)
	v.mu.Unlock()
	if strings.HasPrefix(req.KubeletVersion, "v1.33.") {
		return nil, fmt.Errorf("%w: kubelet %s is not supported by this dkc (kubelet minors 1.34–1.37)", configcheck.ErrUnsupportedKubelet, req.KubeletVersion)
	}
	return kubeletcheck.InProcess{}.Check(ctx, req)
}

func (v *versionChecker) last() string {
	v.mu.Lock()
	defer v.mu.Unlock()
	if len(v.seen) == 0 {
		return ""
	}
	return v.seen[len(v.seen)-1]
}

// TestChecksWithTheKubeletsVersion: configs are checked for the kubelet version the service sends; a
// kubelet no helper speaks leaves the node alone with the unsupported-kubelet status, and the next version
// (the node upgraded) is checked again with the same assignment. A restarted sidecar does not trust the
// version it heard before (the node may have been upgraded meanwhile); --kubelet-version overrides what the
// service says.
func TestChecksWithTheKubeletsVersion(t *testing.T) {
	n := newNode(t)
	checker := &versionChecker{}
	n.agent.cfg.Checker = checker
	ctx, cancel := context.WithCancel(context.Background())
	updates := make(chan *dkcv1.WatchConfigResponse)
	stopped := make(chan struct{})
	go func() { _ = n.agent.Run(ctx, updates); close(stopped) }()
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); <-stopped }) }
	t.Cleanup(stop)
	waitFor := func(what string, match func(*dkcv1.NodeConfigStatus) bool) (last *dkcv1.NodeConfigStatus) {
		t.Helper()
		poll.SteppingNil(t, "a report "+what, n.clock, 600*time.Millisecond, func() error {
			if last = n.reporter.lastStatus(); last == nil || !match(last) {
				return fmt.Errorf("last: %v", last)
			}
			return nil
		})
		return last
	}
	a := assignment("u", "1", cfgHeader+"eventRecordQPS: 7\n")
	updates <- &dkcv1.WatchConfigResponse{Assignment: a, KubeletVersion: "v1.33.5"}
	st := waitFor("of the unsupported kubelet", func(s *dkcv1.NodeConfigStatus) bool {
		return s.GetError() == string(nodeconfig.UnsupportedKubeletError)
	})
	if rv(st.GetAssigned()) != "1" || rv(st.GetActive()) != "local" || n.kubelet.count() != 0 {
		t.Errorf("unsupported kubelet: status %v, %d restarts; want 1 assigned, local active, no restart", st, n.kubelet.count())
	}
	if _, detail := n.agent.Status(); !strings.Contains(detail, "kubelet v1.33.5 is not supported") {
		t.Errorf("detail %q: want the version and the supported minors", detail)
	}
	if checker.last() != "v1.33.5" {
		t.Errorf("checked for kubelet %q, want v1.33.5", checker.last())
	}
	// The node's kubelet upgraded: the same assignment, another version.
	supported := kubeletcheck.Version()
	updates <- &dkcv1.WatchConfigResponse{Assignment: a, KubeletVersion: supported}
	waitFor("of config 1 running", func(s *dkcv1.NodeConfigStatus) bool { return rv(s.GetActive()) == "1" && s.GetError() == "" })
	if checker.last() != supported || n.kubelet.count() != 1 {
		t.Errorf("checked for kubelet %q with %d restarts, want %s and 1", checker.last(), n.kubelet.count(), supported)
	}
	// A restarted sidecar waits for the service's word.
	stop()
	n.start()
	n.agent.cfg.Checker = checker
	if n.agent.kubeletVersion != "" {
		t.Errorf("restarted sidecar: kubelet version %q before the service sent one", n.agent.kubeletVersion)
	}
	// --kubelet-version wins over the service.
	n.agent.cfg.KubeletVersion = "v1.33.9"
	n.apply(a, "")
	if checker.last() != "v1.33.9" {
		t.Errorf("with --kubelet-version: checked for %q, want v1.33.9", checker.last())
	}
}

// TestFirstStartWaitsForTheKubeletVersion: a sidecar whose checker needs the kubelet's version checks
// nothing and reports nothing at its first start, until the service sends the version. Meanwhile its phase
// says so — in memory and in dkc_sidecar_phase, not the previous process's saved phase — and the state file
// keeps the phase of the kubelet's last round, which still holds.
func TestFirstStartWaitsForTheKubeletVersion(t *testing.T) {
	n := newNode(t) // its first round saved PhaseLocal
	checker := &versionChecker{}
	n.reporter = &recordingReporter{}
	metrics := NewMetrics(prometheus.NewRegistry())
	n.agent = New(Config{Log: zap.NewNop(), Store: checkpoint.New(n.dir), Service: n.kubelet, Kubelet: n.kubelet, Reporter: n.reporter,
		Metrics: metrics, Clock: n.clock, LocalConfig: n.local, KubeletFlags: []string{}, Checker: checker, KubeletVersionRequired: true,
		HealthTimeout: time.Second})
	if err := n.agent.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	if checker.last() != "" || len(checker.seen) != 0 || n.reporter.last != nil {
		t.Fatalf("first start without a kubelet version: checks %v, report %v; want none", checker.seen, n.reporter.last)
	}
	checkPhase := func(want Phase) {
		t.Helper()
		if n.agent.phase != want {
			t.Errorf("phase %s, want %s", n.agent.phase, want)
		}
		for _, p := range Phases {
			if v := testutil.ToFloat64(metrics.phase.WithLabelValues(string(p))); (p == want) != (v == 1) {
				t.Errorf("dkc_sidecar_phase{phase=%q} = %v with phase %s", p, v, want)
			}
		}
	}
	checkPhase(PhaseWaitingForKubeletVersion)
	if saved := savedPhase(t, n.dir); saved != string(PhaseLocal) {
		t.Errorf("state file phase %q while waiting, want the last round's %q", saved, PhaseLocal)
	}
	n.agent.kubeletVersion = kubeletcheck.Version() // as Run takes it from the service's first answer
	n.apply(&dkcv1.Assignment{}, "")
	n.expect("local", "local", "local", "", 0)
	if checker.last() != kubeletcheck.Version() {
		t.Errorf("checked for kubelet %q, want %q", checker.last(), kubeletcheck.Version())
	}
	checkPhase(PhaseLocal)
}
