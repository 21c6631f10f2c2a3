// SPDX-License-Identifier: Apache-2.0

//go:build integration

package installed

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/dkc-dev/dkc/cli/plugin"
	"github.com/dkc-dev/dkc/internal/poll"
	"github.com/dkc-dev/dkc/test/devcluster"
	"github.com/dkc-dev/dkc/test/devcluster/devclustertest"
)

// kubectlDKC runs `kubectl dkc args...` in process against the cluster.
func kubectlDKC(ctx context.Context, args ...string) (string, error) {
	var out bytes.Buffer
	cmd := plugin.NewCommand(genericiooptions.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &out})
	cmd.SetArgs(append([]string{"--kubeconfig=" + cluster.KubeconfigPath()}, args...))
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	err := cmd.ExecuteContext(ctx)
	return out.String(), err
}

// TestSidecarRollingUpdate: a new sidecar image rolls over the DaemonSet while both nodes run assigned
// configs and node-1's sidecar is in its post-restart health wait for a new one. The wait is held open by
// dropping the node's loopback traffic to the kubelet's /healthz and /configz (a kubelet that takes long to
// come back), so the old sidecar is stopped inside it; the drop is lifted once the replacement pod runs.
// No kubelet restarts beyond the one the assignment needs, no good config rolled back.
func TestSidecarRollingUpdate(t *testing.T) {
	resetAfter(t)
	a := createConfig(t, "installed-update-a", "node-1", 51)
	b := createConfig(t, "installed-update-b", "node-1", 52)
	for _, n := range nodes {
		assign(t, n, a)
	}
	for _, n := range nodes {
		waitRunning(t, n, a, 2*time.Minute)
	}
	dir := t.TempDir()
	// Not ctxFor's 5 minutes: linking the image's binaries is disk-bound, and on a busy 2-core machine with a
	// slow disk (CI, the other suite building beside this one) it took longer than that.
	buildCtx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	if err := devclustertest.BuildImages(buildCtx, dir, "-tag", "update", "-images", "dkc-sidecar"); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if err := cluster.ImportImage(ctxFor(t), n, filepath.Join(dir, "dkc-sidecar.tar")); err != nil {
			t.Fatal(err)
		}
	}
	// Both containers of the pod run the sidecar image.
	setImage := func(tag string) (string, error) {
		image := devcluster.ImageRepo + "/dkc-sidecar:" + tag
		return kubectl(t, "-n", "kube-system", "set", "image", "daemonset/dkc-sidecar", "dkc-sidecar="+image, "install-kubelet-dropin="+image)
	}
	t.Cleanup(func() {
		_, _ = setImage(devcluster.ImageTag)
		waitRolledOut(t, "daemonset/dkc-sidecar")
	})
	// Both pods replaced at once (the test's choice; deploy/ rolls 10% at a time), so that node-1's is
	// replaced the moment the update starts, inside its health wait.
	strategy := func(v string) string {
		return `{"spec":{"updateStrategy":{"rollingUpdate":{"maxUnavailable":"` + v + `"}}}}`
	}
	if out, err := kubectl(t, "-n", "kube-system", "patch", "daemonset/dkc-sidecar", "-p", strategy("100%")); err != nil {
		t.Fatalf("patch the update strategy: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		_, _ = kubectl(t, "-n", "kube-system", "patch", "daemonset/dkc-sidecar", "-p", strategy("10%"))
	})
	before := map[string]int{}
	for _, n := range nodes {
		before[n] = kubeletStarts(t, n)
	}
	old := sidecarPod(t, "node-1")
	// From before the assignment, so that no probe can be answered between the restart and the drop. The
	// sidecar probes nothing on the way to the restart (it validates with the kubelet's code, offline).
	lift := dropKubeletProbes(t, "node-1")
	assign(t, "node-1", b)
	// The kubelet has restarted into b: the sidecar is now in its health wait, which the dropped probes
	// hold open until the update has replaced it.
	poll.For(t, time.Minute, 50*time.Millisecond, "node-1's kubelet to restart into the new config", func() bool {
		return kubeletStarts(t, "node-1") != before["node-1"]
	})
	// The replaced pod's log goes with the pod: keep it open (an open file outlives its unlinking). Its
	// newest container's log: the one running now (<restartCount>.log).
	logs, _ := filepath.Glob(filepath.Join(cluster.NodeLogDir("node-1"), "pods", "kube-system_"+old+"_*", "dkc-sidecar", "*.log"))
	if len(logs) == 0 {
		t.Fatalf("no log of %s under %s", old, cluster.NodeLogDir("node-1"))
	}
	slices.SortFunc(logs, func(x, y string) int { return logNumber(x) - logNumber(y) })
	f, err := os.Open(logs[len(logs)-1])
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if out, err := setImage("update"); err != nil {
		t.Fatalf("set image: %v\n%s", err, out)
	}
	// Lifted once the old pod is gone, not when the rollout is done: the new sidecar's own health wait
	// (20s here) starts with it, and must see the kubelet.
	poll.ForNil(t, 2*time.Minute, 200*time.Millisecond, old+" to go after the image changed", func() error {
		_, err := admin(t).CoreV1().Pods("kube-system").Get(ctxFor(t), old, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return nil
		case err == nil:
			return errors.New("still there")
		}
		return err
	})
	if err := lift(); err != nil {
		t.Fatal(err)
	}
	waitRolledOut(t, "daemonset/dkc-sidecar")
	// The old sidecar restarted the kubelet into b and was stopped before it saw the kubelet healthy.
	raw, _ := io.ReadAll(f)
	i := strings.LastIndex(string(raw), "restarting kubelet to use config")
	switch {
	case i < 0:
		t.Errorf("%s never logged the restart into the new config (%s)", old, f.Name())
	case strings.Contains(string(raw[i:]), "kubelet healthy with config"):
		t.Errorf("%s saw the kubelet healthy before it was replaced; the update did not land inside the health wait", old)
	case !strings.Contains(string(raw[i:]), "dkc-sidecar stopped"):
		t.Errorf("%s did not log its stop after the restart; its log:\n%s", old, raw[i:])
	}
	waitRunning(t, "node-1", b, 2*time.Minute)
	waitRunning(t, "node-2", a, time.Minute)
	if d := kubeletStarts(t, "node-1") - before["node-1"]; d != 1 {
		t.Errorf("node-1: kubelet started %d times for one assignment across the sidecar update, want 1", d)
	}
	if d := kubeletStarts(t, "node-2") - before["node-2"]; d != 0 {
		t.Errorf("node-2: kubelet started %d times during the sidecar update, want 0", d)
	}
	if got := configzQPS(t, "node-1"); got != 52 {
		t.Errorf("node-1 configz eventRecordQPS = %v, want 52", got)
	}
}

// TestGrpcurlThroughPortForward is docs/dkc-server.md's in-cluster debugging recipe: port-forward to the Service,
// then grpcurl list, describe, health and WatchConfig with a node's token.
func TestGrpcurlThroughPortForward(t *testing.T) {
	diagnoseOnFailure(t)
	root, err := devcluster.RepoRoot(mustWd(t))
	if err != nil {
		t.Fatal(err)
	}
	// `go tool` builds grpcurl on its first run (minutes on a cold cache): not inside the calls' deadline.
	build, cancelBuild := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancelBuild()
	warm := exec.CommandContext(build, "go", "tool", "-modfile=hack/tools/go.mod", "grpcurl", "-version")
	warm.Dir = root
	if out, err := warm.CombinedOutput(); err != nil {
		t.Fatalf("build grpcurl: %v\n%s", err, out)
	}
	waitServerSettled(t) // port-forward picks one pod of the Service and must not pick a terminating one
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	addr := portForward(t, ctx)
	ca := filepath.Join(cluster.InstallDir(), "deploy/overlays/self-signed/ca.crt")
	// grpcurl [flags] ADDRESS [method], the tool pinned in hack/tools, trusting the CA gen-certs.sh wrote.
	grpcurl := func(flags []string, method ...string) (string, error) {
		args := append([]string{"tool", "-modfile=hack/tools/go.mod", "grpcurl", "-cacert", ca, "-servername", "dkc-server.kube-system.svc"}, flags...)
		cmd := exec.CommandContext(ctx, "go", append(append(args, addr), method...)...)
		cmd.Dir = root
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := grpcurl(nil, "list"); err != nil || !strings.Contains(out, "dkc.v1.ConfigService") {
		t.Errorf("grpcurl list: %v\n%s", err, out)
	}
	if out, err := grpcurl(nil, "describe", "dkc.v1.ConfigService"); err != nil || !strings.Contains(out, "WatchConfig") {
		t.Errorf("grpcurl describe: %v\n%s", err, out)
	}
	if out, err := grpcurl(nil, "grpc.health.v1.Health/Check"); err != nil || !strings.Contains(out, "SERVING") {
		t.Errorf("grpcurl health: %v\n%s", err, out)
	}
	token, err := cluster.NodeToken(ctx, "node-1")
	if err != nil {
		t.Fatal(err)
	}
	// The stream stays open: grpcurl ends at -max-time, after printing what the service sent.
	out, _ := grpcurl([]string{"-max-time", "5", "-H", "authorization: Bearer " + token, "-d", `{"nodeName":"node-1"}`}, "dkc.v1.ConfigService/WatchConfig")
	if !strings.Contains(out, `"resolvedTime"`) {
		t.Errorf("grpcurl WatchConfig as node-1 received nothing:\n%s", out)
	}
	t.Logf("WatchConfig as node-1:\n%s", out)
}

func mustWd(t *testing.T) string {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return wd
}

// TestNodeDeletedAndRejoined: a node running an assigned config is drained and deleted, then its kubelet
// registers it again under the same name. The new Node object has no config source, so the node goes back to
// its local config, and nothing of the old object's status is written onto the new one.
func TestNodeDeletedAndRejoined(t *testing.T) {
	const node = "node-2"
	resetAfter(t)
	local := configzQPS(t, node)
	before := kubeletStarts(t, node)
	cm := createConfig(t, "installed-rejoin", node, 61)
	assign(t, node, cm)
	waitRunning(t, node, cm, 2*time.Minute)

	if out, err := kubectl(t, "drain", node, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=2m"); err != nil {
		t.Fatalf("drain: %v\n%s", err, out)
	}
	if out, err := kubectl(t, "delete", "node", node); err != nil {
		t.Fatalf("delete node: %v\n%s", err, out)
	}
	if err := cluster.RestartUnit(ctxFor(t), node, "kubelet.service"); err != nil {
		t.Fatalf("restart the kubelet of %s to re-register it: %v", node, err)
	}
	// From the moment the new Node exists until it settles on its local config, it never shows the old
	// object's assignment.
	poll.ForNil(t, 3*time.Minute, 300*time.Millisecond, "the re-joined "+node+" to settle on its local config", func() error {
		n, err := admin(t).CoreV1().Nodes().Get(ctxFor(t), node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		v := view(t, node)
		if srcName(v.status.Assigned) == name(cm) {
			t.Fatalf("the re-joined %s shows the deleted object's assignment: %s", node, v)
		}
		if n.Annotations["dkc.dev/config-status"] != "" && v.status.Assigned == nil && v.status.Active == nil && v.status.Error == "" &&
			v.configOK != nil && v.configOK.Status == corev1.ConditionTrue {
			return nil
		}
		return errors.New(v.String())
	})
	if got := configzQPS(t, node); got != local {
		t.Errorf("%s: configz eventRecordQPS = %v, want the local config's %v (61 would be the deleted object's config)", node, got, local)
	}
	// The assignment's start, the test's restart that re-registers the node, and the reset to the local
	// config the new Node asks for (it has no source).
	if d := kubeletStarts(t, node) - before; d != 3 {
		t.Errorf("%s: kubelet started %d times, want 3 (assignment, re-registration, reset to local)", node, d)
	}
	waitServerSettled(t)
}

// portForward runs `kubectl -n kube-system port-forward svc/dkc-server :9443` until ctx ends and returns the
// local address. A kubelet restarted a moment ago (the previous test's reset restarts them) does not know its
// pods yet and refuses the stream ("pod does not exist"); like a user, try again.
func portForward(t *testing.T, ctx context.Context) string {
	t.Helper()
	re := regexp.MustCompile(`Forwarding from (127\.0\.0\.1:\d+) -> 9443`)
	var addr string
	poll.ForNil(t, time.Minute, time.Second, "kubectl port-forward to print a local address", func() error {
		pf := exec.CommandContext(ctx, "kubectl", "--kubeconfig", cluster.KubeconfigPath(), "-n", "kube-system", "port-forward", "svc/dkc-server", ":9443")
		stdout, err := pf.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		var stderr bytes.Buffer
		pf.Stderr = &stderr
		if err := pf.Start(); err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				go func() { _, _ = io.Copy(io.Discard, stdout) }()
				t.Cleanup(func() { _ = pf.Process.Kill(); _ = pf.Wait() })
				addr = m[1]
				return nil
			}
		}
		_ = pf.Wait()
		t.Logf("port-forward: %s; retrying", strings.TrimSpace(stderr.String()))
		return errors.New(strings.TrimSpace(stderr.String()))
	})
	return addr
}

// TestNodesMovingBetweenReplicas: with --max-connection-age short, every sidecar's stream is moved between
// the two replicas again and again while assignments change; no replica ever writes an older status over a
// newer one, and every node ends on its last config.
func TestNodesMovingBetweenReplicas(t *testing.T) {
	resetAfter(t)
	patch := `[{"op":"add","path":"/spec/template/spec/containers/0/args/-","value":"--max-connection-age=5s"},` +
		`{"op":"add","path":"/spec/template/spec/containers/0/args/-","value":"--max-connection-age-grace=2s"}]`
	if out, err := kubectl(t, "-n", "kube-system", "patch", "deployment/dkc-server", "--type=json", "-p", patch); err != nil {
		t.Fatalf("patch: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		if out, err := kubectl(t, "-n", "kube-system", "rollout", "undo", "deployment/dkc-server"); err != nil {
			t.Errorf("rollout undo: %v\n%s", err, out)
		}
		waitRolledOut(t, "deployment/dkc-server")
		waitServerSettled(t)
	})
	waitRolledOut(t, "deployment/dkc-server")
	waitServerSettled(t)

	before := map[string]int{}
	for _, n := range nodes {
		before[n] = kubeletStarts(t, n)
	}
	reconnectsBefore := reconnects(t)
	const rounds = 4
	last := map[string]*corev1.ConfigMap{}
	var history []map[string]string // what each round assigned, to recognise a stale write
	// Sampled all along, not only once settled: the round a node's status names must never go back, as
	// it would if a replica the node left wrote its older report over the newer one.
	var mu sync.Mutex
	roundOf := map[string]int{} // "node/config@rv" → round
	var backwards []string
	seen := map[string]int{}
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			select {
			case <-stop:
				return
			case <-time.After(300 * time.Millisecond):
			}
			for _, n := range nodes {
				node, err := admin(t).CoreV1().Nodes().Get(context.Background(), n, metav1.GetOptions{})
				if err != nil {
					continue
				}
				var st corev1.NodeConfigStatus
				if json.Unmarshal([]byte(node.Annotations["dkc.dev/config-status"]), &st) != nil {
					continue
				}
				mu.Lock()
				if r, ok := roundOf[n+"/"+srcName(st.Assigned)]; ok {
					if prev, ok := seen[n]; ok && r < prev {
						backwards = append(backwards, fmt.Sprintf("%s: round %d after round %d (%s)", n, r, prev, srcName(st.Assigned)))
					}
					seen[n] = max(seen[n], r)
				}
				mu.Unlock()
			}
		}
	}()
	for r := 0; r < rounds; r++ {
		round := map[string]string{}
		for _, n := range nodes {
			last[n] = createConfig(t, fmt.Sprintf("installed-move-%s-r%d", n, r), n, 70+r)
			mu.Lock()
			roundOf[n+"/"+name(last[n])] = r
			mu.Unlock()
			assign(t, n, last[n])
			round[n] = name(last[n])
		}
		history = append(history, round)
		for _, n := range nodes {
			waitRunning(t, n, last[n], 2*time.Minute)
		}
		time.Sleep(6 * time.Second) // at least one forced reconnect per round
	}
	// Several more connection ages pass; the status must not move back to an earlier round's config.
	for end := time.Now().Add(15 * time.Second); time.Now().Before(end); time.Sleep(500 * time.Millisecond) {
		for _, n := range nodes {
			v := view(t, n)
			if srcName(v.status.Assigned) != name(last[n]) || srcName(v.status.Active) != name(last[n]) || v.configOK == nil || v.configOK.Status != corev1.ConditionTrue {
				t.Fatalf("%s: status moved to %s after settling on %s (rounds: %v)", n, v, name(last[n]), history)
			}
		}
	}
	close(stop)
	<-sampled
	mu.Lock()
	if len(backwards) > 0 {
		t.Errorf("a node's status went back to an earlier round while it moved between replicas: %v (rounds: %v)", backwards, history)
	}
	mu.Unlock()
	for _, n := range nodes {
		if d := kubeletStarts(t, n) - before[n]; d != rounds {
			t.Errorf("%s: kubelet started %d times for %d assignments, want %d (reconnects must not restart it)", n, d, rounds, rounds)
		}
	}
	if got := reconnects(t) - reconnectsBefore; got < 2*rounds {
		t.Errorf("the sidecars reconnected %d times during the rounds; --max-connection-age=5s should have moved each at least once a round", got)
	}
}

// reconnects counts the sidecars' "config stream ended; reconnecting" log lines on every node.
func reconnects(t *testing.T) int {
	t.Helper()
	total := 0
	for _, n := range nodes {
		total += sidecarLogLines(t, n, "", "config stream ended; reconnecting")
	}
	return total
}

// sidecarLogLines counts the lines holding text in the dkc-sidecar container logs on node: those of pod, or
// of every sidecar pod the node still has logs of (""). A pod's logs go when the pod is removed.
func sidecarLogLines(t *testing.T, node, pod, text string) int {
	t.Helper()
	dir := "kube-system_dkc-sidecar-*"
	if pod != "" {
		dir = "kube-system_" + pod + "_*"
	}
	logs, _ := filepath.Glob(filepath.Join(cluster.NodeLogDir(node), "pods", dir, "dkc-sidecar", "*.log"))
	n := 0
	for _, l := range logs {
		raw, err := os.ReadFile(l)
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		n += strings.Count(string(raw), text)
	}
	return n
}

// TestSidecarStoppedDuringHealthWait: node-1's sidecar pod is deleted (SIGTERM) the moment it has restarted
// the kubelet into a new config, while it waits for the kubelet to come back healthy. The replacement pod
// picks up from disk: the config is not blamed or rolled back, and the kubelet is not restarted again.
func TestSidecarStoppedDuringHealthWait(t *testing.T) {
	const node = "node-1"
	resetAfter(t)
	pod := sidecarPod(t, node)
	logs, _ := filepath.Glob(filepath.Join(cluster.NodeLogDir(node), "pods", "kube-system_"+pod+"_*", "dkc-sidecar", "*.log"))
	if len(logs) == 0 {
		t.Fatalf("no log of %s under %s", pod, cluster.NodeLogDir(node))
	}
	seen := func() int { return sidecarLogLines(t, node, pod, "restarting kubelet to use config") }
	restartsLogged := seen()
	before := kubeletStarts(t, node)
	cm := createConfig(t, "installed-healthwait", node, 81)
	assign(t, node, cm)
	poll.For(t, time.Minute, 20*time.Millisecond, "the sidecar to log the kubelet restart", func() bool { return seen() != restartsLogged })
	if err := admin(t).CoreV1().Pods("kube-system").Delete(ctxFor(t), pod, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete %s: %v", pod, err)
	}
	// Informational: whether the SIGTERM landed before the health wait ended (it usually does: the kubelet
	// takes seconds to serve /configz again, the deletion milliseconds).
	inWait := "yes"
	for _, l := range logs {
		raw, _ := os.ReadFile(l)
		if i := strings.LastIndex(string(raw), "restarting kubelet to use config"); i >= 0 && strings.Contains(string(raw[i:]), "kubelet healthy with config") {
			inWait = "no, the health wait had ended"
		}
	}
	t.Logf("deleted %s right after it restarted the kubelet; in its health wait: %s", pod, inWait)
	waitRolledOut(t, "daemonset/dkc-sidecar")
	waitRunning(t, node, cm, 2*time.Minute)
	if d := kubeletStarts(t, node) - before; d != 1 {
		t.Errorf("%s: kubelet started %d times, want 1 (the replacement sidecar must not restart it again)", node, d)
	}
	if got := configzQPS(t, node); got != 81 {
		t.Errorf("%s: configz eventRecordQPS = %v, want 81", node, got)
	}
}

// logNumber is the restart count a container log file is named for (<n>.log).
func logNumber(path string) int {
	n, _ := strconv.Atoi(strings.TrimSuffix(filepath.Base(path), ".log"))
	return n
}

// dropKubeletProbes drops node's loopback traffic to the kubelet's healthz (10248) and HTTPS (10250) ports,
// in the node's network namespace (the sidecar runs in it: hostNetwork): the sidecar's probes go unanswered,
// as of a kubelet slow to come back. It returns the function that lifts the drop (also run at cleanup).
func dropKubeletProbes(t *testing.T, node string) func() error {
	t.Helper()
	var netns string
	for _, n := range cluster.State().Nodes {
		if n.Name == node {
			netns = n.Netns
		}
	}
	rule := []string{"OUTPUT", "-o", "lo", "-p", "tcp", "-m", "multiport", "--dports", "10248,10250", "-j", "DROP"}
	iptables := func(op string) error {
		out, err := exec.Command("ip", append([]string{"netns", "exec", netns, "iptables", op}, rule...)...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("iptables %s %v in %s: %w: %s", op, rule, netns, err, out)
		}
		return nil
	}
	if netns == "" {
		t.Fatalf("no network namespace for %s", node)
	}
	if err := iptables("-I"); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	var lifted error
	lift := func() error {
		once.Do(func() { lifted = iptables("-D") })
		return lifted
	}
	t.Cleanup(func() { _ = lift() })
	return lift
}

// sidecarPod is the name of the dkc-sidecar pod on node.
func sidecarPod(t *testing.T, node string) string {
	t.Helper()
	pods, err := admin(t).CoreV1().Pods("kube-system").List(ctxFor(t), metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/name=dkc-sidecar", FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
			return p.Name
		}
	}
	t.Fatalf("no running dkc-sidecar pod on %s", node)
	return ""
}
