// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/dkc-dev/dkc/internal/configcheck"
	"github.com/dkc-dev/dkc/internal/kubeletcheck"
	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
	"github.com/dkc-dev/dkc/sidecar/internal/checkpoint"
	"github.com/dkc-dev/dkc/sidecar/internal/kubeletunit"
)

// systemdKubelet is the fake kubelet under a fake systemd that tells the unit's runs apart (InvocationID) and
// shows how the unit is wired (EnvironmentFiles, DropInPaths).
type systemdKubelet struct {
	*fakeKubelet
	mu       sync.Mutex
	external int      // starts made by something else than the sidecar
	loadsEnv bool     // the unit loads dkc's env file
	dropIns  []string // the unit's drop-ins
	// installs are the files installed (DropInInstaller), "SRC DST"; reloads the daemon-reloads.
	installs []string
	reloads  int
	// failInstall: installs fail, as a failed transient unit does; onInstall, if set, runs at each first.
	failInstall bool
	onInstall   func(src, dst string)
}

func (u *systemdKubelet) InvocationID(context.Context) (string, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return fmt.Sprintf("%d-%d", u.count(), u.external), nil
}

func (u *systemdKubelet) LoadsEnvironmentFile(_ context.Context, path string) (bool, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.loadsEnv && path == u.env.Path, nil
}

func (u *systemdKubelet) DropInPaths(context.Context) ([]string, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Clone(u.dropIns), nil
}

// startElsewhere starts the kubelet as something else than the sidecar does (kubeadm upgrade, an operator's
// systemctl restart): on the config the env file names, the unit's own without one, with flags.
func (u *systemdKubelet) startElsewhere(flags []string) {
	u.mu.Lock()
	u.external++
	u.mu.Unlock()
	k := u.fakeKubelet
	k.mu.Lock()
	defer k.mu.Unlock()
	f, _ := k.env.Get()
	if f == "" {
		f = k.local
	}
	k.running, k.flags, k.stopped = f, flags, false
}

// minorChecker checks with the kubelet code linked in, and says it was of version (when set) instead.
type minorChecker struct {
	mu      sync.Mutex
	version string
}

func (c *minorChecker) Check(ctx context.Context, req configcheck.Request) (*configcheck.Checked, error) {
	r, err := kubeletcheck.InProcess{}.Check(ctx, req)
	c.mu.Lock()
	defer c.mu.Unlock()
	if err == nil && c.version != "" {
		r.KubeletVersion = c.version
	}
	return r, err
}

func (c *minorChecker) set(version string) {
	c.mu.Lock()
	c.version = version
	c.mu.Unlock()
}

// driftNode is a node whose sidecar checks for drift, under the fake systemd.
type driftNode struct {
	*node
	unit     *systemdKubelet
	dropIn   string // dkc's drop-in
	checker  *minorChecker
	metrics  *Metrics
	logs     *observer.ObservedLogs
	interval time.Duration
	// cfg is the agent's config, for a restarted sidecar's.
	cfg Config
}

func newDriftNode(t *testing.T, flags []string, interval time.Duration) *driftNode {
	t.Helper()
	root := t.TempDir()
	n := &node{t: t, dir: filepath.Join(root, "dynamic-config"), local: filepath.Join(root, "config.yaml"),
		clock: clocktesting.NewFakeClock(time.Now())}
	if err := os.WriteFile(n.local, []byte(cfgHeader+"maxPods: 30\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	n.kubelet = &fakeKubelet{env: kubeletunit.New(n.dir), local: n.local, running: n.local, flags: flags}
	d := &driftNode{node: n, dropIn: filepath.Join(root, "kubelet.service.d", "20-dkc.conf"), checker: &minorChecker{},
		interval: interval}
	d.unit = &systemdKubelet{fakeKubelet: n.kubelet, loadsEnv: true, dropIns: []string{d.dropIn}}
	if err := os.MkdirAll(filepath.Dir(d.dropIn), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(d.dropIn, []byte(kubeletunit.DropIn(n.dir)), 0o644); err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.InfoLevel)
	d.logs, d.metrics = logs, NewMetrics(prometheus.NewRegistry())
	n.reporter = &recordingReporter{}
	d.cfg = Config{Log: zap.New(core), NodeName: "node-1", Store: checkpoint.New(n.dir), Service: d.unit,
		Kubelet: n.kubelet, Reporter: n.reporter, Metrics: d.metrics, Clock: n.clock, LocalConfig: n.local,
		KubeletFlags: append([]string{}, flags...), Checker: d.checker, TrialDuration: 10 * time.Minute,
		HealthTimeout: time.Second, KeepCheckpoints: 2, TrialCheckInterval: time.Second, DriftInterval: interval,
		KubeletDropIn: d.dropIn}
	n.agent = New(d.cfg)
	stop := n.drive()
	err := n.agent.Init(context.Background())
	stop()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// tick is one turn of the agent loop's ticker.
func (d *driftNode) tick() {
	d.t.Helper()
	defer d.drive()()
	d.agent.tick(context.Background())
}

// checks is how many drift checks ended with result.
func (d *driftNode) checks(result string) int {
	return int(testutil.ToFloat64(d.metrics.driftChecks.WithLabelValues(result)))
}

// lastDrift is the drift the last report carried.
func (d *driftNode) lastDrift() *dkcv1.Drift {
	d.t.Helper()
	r := d.reporter.reportsSince(0)
	if len(r) == 0 {
		d.t.Fatal("nothing reported")
	}
	return r[len(r)-1].drift
}

// expectDrift checks the standing drift, the last report's and the gauge: cause "" is none.
func (d *driftNode) expectDrift(cause string, fields []string, inMessage ...string) {
	d.t.Helper()
	got := d.agent.Drift()
	if cause == "" {
		if got != nil {
			d.t.Errorf("drift %v, want none", got)
		}
	} else if got.GetCause() != cause || !slices.Equal(got.GetFields(), fields) {
		d.t.Errorf("drift %q %v (%s), want %q %v", got.GetCause(), got.GetFields(), got.GetMessage(), cause, fields)
	}
	for _, s := range inMessage {
		if !strings.Contains(got.GetMessage(), s) {
			d.t.Errorf("drift message %q does not say %q", got.GetMessage(), s)
		}
	}
	// Reports say what the last check found: the drift, or a Drift without a cause (none found).
	if r := d.lastDrift(); (got != nil && r != got) || (got == nil && (r == nil || r.GetCause() != "")) {
		d.t.Errorf("the last report carries drift %v, want %v", r, got)
	}
	for _, c := range DriftCauses {
		want := 0.0
		if c == cause {
			want = 1
		}
		if v := testutil.ToFloat64(d.metrics.drift.WithLabelValues(c)); v != want {
			d.t.Errorf("dkc_sidecar_config_drift{cause=%q} = %v, want %v", c, v, want)
		}
	}
}

// TestDriftCauses: what the kubelet runs compared with what it should, and the cause named.
func TestDriftCauses(t *testing.T) {
	const config = cfgHeader + "maxPods: 110\neventRecordQPS: 7\n"
	checkpointFile := func(d *driftNode) string { return filepath.Join(d.dir, "checkpoints/u/1/kubelet") }
	for _, tc := range []struct {
		name   string
		flags  func(configDir string) []string
		dropIn string // content of <configDir>/50-pods.conf, if set
		proven string // the kubelet version the config is proven with ("": the code's own)
		change func(t *testing.T, d *driftNode)
		cause  string // "": no drift
		// standing: the drift is there from the start (the node's flags, its drop-ins): the check after the
		// sidecar's own restart finds it already
		standing bool
		fields   []string
		says     []string
	}{
		{name: "no difference", change: func(*testing.T, *driftNode) {}},
		{name: "the local config rewritten as kubeadm upgrade does, the kubelet restarted", change: func(t *testing.T, d *driftNode) {
			if err := os.WriteFile(d.local, []byte(cfgHeader+"maxPods: 50\nclusterDomain: upgraded.local\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			d.unit.startElsewhere(nil)
		}},
		{name: "env file removed", change: func(t *testing.T, d *driftNode) {
			if err := os.Remove(d.kubelet.env.Path); err != nil {
				t.Fatal(err)
			}
		}, cause: DriftWiringRemoved, says: []string{"kubelet.env is gone"}},
		{name: "drop-in no longer loaded", change: func(t *testing.T, d *driftNode) {
			d.unit.mu.Lock()
			d.unit.loadsEnv, d.unit.dropIns = false, nil
			d.unit.mu.Unlock()
		}, cause: DriftWiringRemoved, says: []string{"no longer loads dkc's drop-in"}},
		{name: "drop-in file removed before a daemon-reload", change: func(t *testing.T, d *driftNode) {
			if err := os.Remove(d.dropIn); err != nil {
				t.Fatal(err)
			}
		}, cause: DriftWiringRemoved, says: []string{"20-dkc.conf is gone"}},
		{name: "the unit loads the env file through a drop-in of another name", change: func(t *testing.T, d *driftNode) {
			d.unit.mu.Lock()
			d.unit.dropIns = []string{filepath.Join(filepath.Dir(d.dropIn), "10-site.conf")}
			d.unit.mu.Unlock()
			if err := os.Remove(d.dropIn); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "env file replaced", change: func(t *testing.T, d *driftNode) {
			if err := os.WriteFile(d.kubelet.env.Path, []byte(kubeletunit.Variable+"=--config="+d.local+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, cause: DriftWiringReplaced, says: []string{"does not hold what dkc wrote"}},
		{name: "drop-in replaced", change: func(t *testing.T, d *driftNode) {
			if err := os.WriteFile(d.dropIn, []byte("[Service]\nEnvironment=FOO=bar\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, cause: DriftWiringReplaced, says: []string{"20-dkc.conf does not hold what dkc installed"}},
		{name: "drop-in loaded but no longer loading the env file", change: func(t *testing.T, d *driftNode) {
			d.unit.mu.Lock()
			d.unit.loadsEnv = false
			d.unit.mu.Unlock()
		}, cause: DriftWiringReplaced, says: []string{"no longer makes the kubelet unit load"}},
		{name: "a flag overrides a field", flags: func(string) []string { return []string{"--max-pods=50"} },
			change: func(*testing.T, *driftNode) {}, cause: DriftFlagOverride, standing: true, fields: []string{"maxPods"},
			says: []string{"maxPods: expected 110, running 50 (set by the kubelet flag --max-pods)"}},
		{name: "a flag sets a field the config does not set", flags: func(string) []string {
			return []string{"--kube-api-qps=7", "--max-open-files=1000"}
		}, change: func(*testing.T, *driftNode) {}},
		{name: "a --config-dir drop-in overrides a field",
			flags:  func(dir string) []string { return []string{"--config-dir=" + dir} },
			dropIn: "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nmaxPods: 60\n",
			change: func(*testing.T, *driftNode) {}, cause: DriftConfigDirDropIn, standing: true, fields: []string{"maxPods"},
			says: []string{"expected 110, running 60 (set by the drop-in ", "50-pods.conf)"}},
		{name: "the kubelet runs values nothing on the node explains", change: func(t *testing.T, d *driftNode) {
			d.kubelet.mu.Lock()
			d.kubelet.running = d.local // e.g. a checkpoint edited in place after the kubelet read it
			d.kubelet.mu.Unlock()
		}, cause: DriftUnknown, fields: []string{"eventRecordQPS", "maxPods"}, says: []string{"maxPods: expected 110, running 30"}},
		{name: "kubelet minor changed", proven: "v1.30.2", change: func(t *testing.T, d *driftNode) {
			d.checker.set("")
			d.unit.startElsewhere(nil)
			d.kubelet.mu.Lock()
			d.kubelet.running = d.local
			d.kubelet.mu.Unlock()
		}, cause: DriftKubeletMinorChanged, fields: []string{"eventRecordQPS", "maxPods"},
			says: []string{"proven running under 1.30"}},
		{name: "kubelet minor changed and the config runs as it says", proven: "v1.30.2", change: func(t *testing.T, d *driftNode) {
			d.checker.set("")
			d.unit.startElsewhere(nil)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			configDir := filepath.Join(t.TempDir(), "kubelet.conf.d")
			if err := os.MkdirAll(configDir, 0o755); err != nil {
				t.Fatal(err)
			}
			if tc.dropIn != "" {
				if err := os.WriteFile(filepath.Join(configDir, "50-pods.conf"), []byte(tc.dropIn), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			var flags []string
			if tc.flags != nil {
				flags = tc.flags(configDir)
			}
			d := newDriftNode(t, flags, time.Hour)
			d.checker.set(tc.proven)
			d.apply(assignment("u", "1", config), "")
			d.expect("1", "1", "local", "", 1)
			if f, _ := d.kubelet.env.Get(); f != checkpointFile(d) {
				t.Fatalf("env file names %s", f)
			}
			d.tick() // the check after the sidecar's own restart
			result := driftCheckNone
			if tc.standing {
				result = driftCheckDrift
			}
			if d.checks(result) != 1 {
				t.Fatalf("%d checks found nothing, %d drift, %d failed; want 1 that found %s before the change",
					d.checks(driftCheckNone), d.checks(driftCheckDrift), d.checks(driftCheckError), result)
			}
			before := len(d.reporter.reportsSince(0))
			d.clock.Step(time.Hour)
			tc.change(t, d)
			d.tick()
			if n := d.checks(driftCheckError); n != 0 {
				t.Fatalf("%d checks failed: %v", n, d.logs.FilterMessage("drift check could not be made").All())
			}
			if tc.cause == "" {
				if got := d.agent.Drift(); got != nil {
					t.Errorf("drift %v, want none", got)
				}
				for _, r := range d.reporter.reportsSince(before) {
					if r.drift.GetCause() != "" {
						t.Errorf("reported drift %v", r.drift)
					}
				}
				return
			}
			d.expectDrift(tc.cause, tc.fields, tc.says...)
			if lines := d.logs.FilterMessage("kubelet config drift").All(); len(lines) != 1 ||
				lines[0].ContextMap()["node"] != "node-1" || lines[0].ContextMap()["cause"] != tc.cause {
				t.Errorf("drift log lines %v, want one naming node-1 and %s", lines, tc.cause)
			}
		})
	}
}

// TestDriftCheckedAfterAKubeletStartNotMadeByTheSidecar: without a periodic check, a start of the kubelet
// by something else than the sidecar is checked; the sidecar's own restarts are not taken for one.
func TestDriftCheckedAfterAKubeletStartNotMadeByTheSidecar(t *testing.T) {
	d := newDriftNode(t, nil, 0)
	d.apply(assignment("u", "1", cfgHeader+"maxPods: 110\n"), "")
	d.expect("1", "1", "local", "", 1)
	d.tick() // the check after its own restart
	d.apply(assignment("u", "2", cfgHeader+"maxPods: 100\n"), "")
	d.expect("2", "2", "local", "", 2)
	d.tick()
	if n := d.checks(driftCheckNone); n != 2 {
		t.Fatalf("%d checks, want 2 (one after each of the sidecar's restarts)", n)
	}
	if l := d.logs.FilterMessage("kubelet started, not by the sidecar; checking it for drift").Len(); l != 0 {
		t.Errorf("the sidecar's own restarts taken for another's (%d log lines)", l)
	}
	if err := os.Remove(d.kubelet.env.Path); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		d.clock.Step(time.Hour)
		d.tick()
	}
	if d.agent.Drift() != nil || d.checks(driftCheckNone)+d.checks(driftCheckDrift) != 2 {
		t.Fatalf("checked without a kubelet start: drift %v", d.agent.Drift())
	}
	d.unit.startElsewhere(nil) // the unit's own config now: the env file is gone
	d.tick()
	d.expectDrift(DriftWiringRemoved, nil, "kubelet.env is gone")
	if l := d.logs.FilterMessage("kubelet started, not by the sidecar; checking it for drift").Len(); l != 1 {
		t.Errorf("%d log lines of a start not made by the sidecar, want 1", l)
	}
}

// TestPeriodicDriftCheck: every --drift-interval; the drift rides on the reports while it stands, keeps
// the time it was first found, and goes when a check finds none.
func TestPeriodicDriftCheck(t *testing.T) {
	d := newDriftNode(t, nil, 10*time.Minute)
	d.apply(assignment("u", "1", cfgHeader+"maxPods: 110\n"), "")
	d.tick()
	if n := d.checks(driftCheckNone); n != 1 {
		t.Fatalf("%d checks, want 1", n)
	}
	// The first check that found none says so, so that a Node's drift from before the sidecar started clears.
	if r := d.lastDrift(); r == nil || r.GetCause() != "" {
		t.Fatalf("the report after the first check carries %v, want a Drift without a cause", r)
	}
	data, err := os.ReadFile(d.kubelet.env.Path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(d.kubelet.env.Path, append(data, "# edited\n"...), 0o644); err != nil {
		t.Fatal(err)
	}
	d.clock.Step(9 * time.Minute)
	d.tick()
	if d.agent.Drift() != nil || d.checks(driftCheckDrift) != 0 {
		t.Fatalf("checked before the interval: drift %v", d.agent.Drift())
	}
	d.clock.Step(time.Minute)
	found := d.clock.Now()
	d.tick()
	d.expectDrift(DriftWiringReplaced, nil, "does not hold what dkc wrote")
	reports := len(d.reporter.reportsSince(0))

	// Standing: found again, no new report, the first time kept; any status report carries it.
	d.clock.Step(10 * time.Minute)
	d.tick()
	if d.checks(driftCheckDrift) != 2 || len(d.reporter.reportsSince(0)) != reports {
		t.Errorf("%d checks found drift, %d reports; want 2, and no report for the same drift",
			d.checks(driftCheckDrift), len(d.reporter.reportsSince(0))-reports)
	}
	if got := d.agent.Drift().GetDetectedTime().AsTime(); !got.Equal(found) {
		t.Errorf("detected %v, want %v (when first found)", got, found)
	}
	d.apply(nil, "failed to sync: failed to download config, see Kubelet log for details")
	if r := d.lastDrift(); r.GetCause() != DriftWiringReplaced {
		t.Errorf("a status report carries drift %v, want the standing one", r)
	}

	// Gone.
	if err := os.WriteFile(d.kubelet.env.Path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	d.clock.Step(10 * time.Minute)
	d.tick()
	d.expectDrift("", nil)
	if l := d.logs.FilterMessage("kubelet config drift gone").All(); len(l) != 1 || l[0].ContextMap()["cause"] != DriftWiringReplaced {
		t.Errorf("log lines of the drift gone: %v", l)
	}
}

// TestDriftNotCheckedWhileARoundIsUnfinished: a retry pending (the kubelet's flags unknown) holds the check.
func TestDriftNotCheckedWhileARoundIsUnfinished(t *testing.T) {
	d := newDriftNode(t, nil, time.Minute)
	d.apply(assignment("u", "1", cfgHeader+"maxPods: 110\n"), "")
	d.agent.retry = true
	d.tick() // reconciles (settles: the flags are given) ...
	d.agent.retry = true
	d.clock.Step(2 * time.Minute)            // a check is due ...
	d.agent.watchDrift(context.Background()) // ... but a round left unfinished is not checked
	if n := d.checks(driftCheckNone) + d.checks(driftCheckDrift) + d.checks(driftCheckError); n != 1 {
		t.Errorf("%d checks, want the one of the settled tick", n)
	}
}

func TestFlagFor(t *testing.T) {
	for _, tc := range []struct {
		path  string
		flags []string
		want  string
	}{
		{"maxPods", []string{"--max-pods=50"}, "--max-pods"},
		{"maxPods", []string{"--max_pods", "50"}, "--max-pods"},
		{"maxPods", []string{"--pods-per-core=2"}, ""},
		{"evictionHard.memory.available", []string{"--eviction-hard=memory.available<1Gi"}, "--eviction-hard"},
		{"podCIDR", []string{"--pod-cidr=10.0.0.0/24"}, "--pod-cidr"},
		{"cpuCFSQuota", []string{"--cpu-cfs-quota=false"}, "--cpu-cfs-quota"},
		{"eventRecordQPS", []string{"--event-qps=1"}, "--event-qps"},
		{"podPidsLimit", []string{"--pod-max-pids=100"}, "--pod-max-pids"},
		{"reservedSystemCPUs", []string{"--reserved-cpus=0-1"}, "--reserved-cpus"},
		{"kubeAPIQPS", []string{"--kube-api-qps=1"}, "--kube-api-qps"},
		{"staticPodPath", []string{"--pod-manifest-path=/etc/k"}, "--pod-manifest-path"},
		{"authentication.x509.clientCAFile", []string{"--client-ca-file=/ca"}, "--client-ca-file"},
		{"authentication.anonymous.enabled", []string{"--client-ca-file=/ca"}, ""},
	} {
		if got := flagFor(tc.path, tc.flags); got != tc.want {
			t.Errorf("flagFor(%q, %q) = %q, want %q", tc.path, tc.flags, got, tc.want)
		}
	}
}

func TestLeafAndDiffLeaves(t *testing.T) {
	want := map[string]any{"maxPods": 110.0, "evictionHard": map[string]any{"memory.available": "100Mi",
		"nodefs.available": "10%"}}
	running := map[string]any{"maxPods": 110.0, "evictionHard": map[string]any{"memory.available": "200Mi",
		"nodefs.available": "10%", "imagefs.available": "15%"}}
	var paths []string
	for _, k := range []string{"maxPods", "evictionHard"} {
		diffLeaves(k, want[k], running[k], &paths)
	}
	if !slices.Equal(paths, []string{"evictionHard.memory.available"}) {
		t.Errorf("paths %v, want [evictionHard.memory.available] (a key only the running config has is not set)", paths)
	}
	if got := leaf(running, "evictionHard.memory.available"); got != "200Mi" {
		t.Errorf("leaf = %v, want 200Mi", got)
	}
}

// TestFailedDriftCheckStaysDue: a check that cannot be made (the kubelet not serving /configz yet after a
// start) is made again at the next tick, not an interval later, and reports say nothing meanwhile.
func TestFailedDriftCheckStaysDue(t *testing.T) {
	d := newDriftNode(t, nil, time.Hour)
	d.apply(assignment("u", "1", cfgHeader+"maxPods: 110\n"), "")
	d.kubelet.configzErr = errors.New("connection refused")
	d.tick()
	if d.checks(driftCheckError) == 0 || d.checks(driftCheckNone) != 0 {
		t.Fatalf("checks: %v failed, %v none; want a failure first", d.checks(driftCheckError), d.checks(driftCheckNone))
	}
	if r := d.lastDrift(); r != nil {
		t.Errorf("a report before any check succeeded carries %v, want none", r)
	}
	d.kubelet.configzErr = nil
	d.tick()
	if d.checks(driftCheckNone) != 1 {
		t.Fatalf("no check at the next tick after a failed one (%v none)", d.checks(driftCheckNone))
	}
}
