//go:build integration

package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/dkc-dev/dkc/cli/plugin"
	"github.com/dkc-dev/dkc/internal/nodeconfig"
	"github.com/dkc-dev/dkc/sidecar/kubeletcheck"
)

// kubectlDKC runs `kubectl dkc args...` in process against the test cluster.
func kubectlDKC(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd := plugin.NewCommand(genericiooptions.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut})
	cmd.SetArgs(append([]string{"--kubeconfig=" + cluster.KubeconfigPath()}, args...))
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	err := cmd.ExecuteContext(ctx)
	return out.String(), errOut.String(), err
}

func TestKubectlDKCAssignStatusDumpDiffReset(t *testing.T) {
	const node = "sim-2"
	t.Cleanup(func() { _, _, _ = kubectlDKC(t, "reset", node) })
	createConfigMap(t, "cli-config", map[string]string{"kubelet": simConfigFor(t, node, "eventRecordQPS: 23\n")})
	name := "cli-config@" + mustRV(t, "cli-config")

	out, _, err := kubectlDKC(t, "assign", node, "--configmap", "kube-system/cli-config")
	if err != nil || !strings.Contains(out, "node/sim-2 assigned kube-system/cli-config (key kubelet) via annotation dkc.dev/config-source") {
		t.Fatalf("assign: %v\n%s", err, out)
	}
	waitNodeStatus(t, node, name, name, "*", "", time.Minute)

	out, _, err = kubectlDKC(t, "status", node)
	if err != nil || !strings.Contains(out, "ASSIGNED") || !strings.Contains(out, "kube-system/"+name) || !strings.Contains(out, "True") {
		t.Errorf("status table: %v\n%s", err, out)
	}
	out, _, err = kubectlDKC(t, "status", "-o", "json", node)
	var rows []plugin.NodeStatus
	if err != nil || json.Unmarshal([]byte(out), &rows) != nil || len(rows) != 1 || rows[0].Status.Active == nil || rows[0].ConfigOK != "True" {
		t.Errorf("status -o json: %v\n%s", err, out)
	}
	if out, _, err = kubectlDKC(t, "status", "-o", "yaml", node); err != nil || !strings.Contains(out, "node: sim-2") {
		t.Errorf("status -o yaml: %v\n%s", err, out)
	}

	// dump (on the real node: the apiserver proxies configz to real kubelets only): the running config as
	// a KubeletConfiguration that loads back as it runs.
	resetRealNode(t)
	out, _, err = kubectlDKC(t, "dump", realNode)
	if err != nil || !strings.Contains(out, "kind: KubeletConfiguration") || !strings.Contains(out, "enforceNodeAllocatable: []") {
		t.Fatalf("dump: %v\n%s", err, out)
	}
	file := filepath.Join(t.TempDir(), "dumped.yaml")
	if err := os.WriteFile(file, []byte(out), 0o644); err != nil {
		t.Fatal(err)
	}
	if r, err := kubeletcheck.Load(context.Background(), file, nil); err != nil || len(r.Config.EnforceNodeAllocatable) != 0 {
		t.Errorf("dumped config does not load back as running: %v", err)
	}

	// diff: the dump itself changes nothing; another config shows each field with its safety.
	createConfigMap(t, "cli-dumped", map[string]string{"kubelet": out})
	if out, _, err = kubectlDKC(t, "diff", realNode, "--configmap", "kube-system/cli-dumped", "--kubelet-check-dir", cluster.KubeletCheckDir()); err != nil || !strings.Contains(out, "no changes") {
		t.Errorf("diff against the dumped running config: %v\n%s", err, out)
	}
	createConfigMap(t, "cli-next", map[string]string{"kubelet": kubeletConfig(t, "eventRecordQPS: 24\ncpuManagerPolicy: static\nmaxPods: 50\n")})
	out, _, err = kubectlDKC(t, "diff", realNode, "--configmap", "kube-system/cli-next", "--kubelet-check-dir", cluster.KubeletCheckDir())
	if err != nil {
		t.Fatalf("diff: %v\n%s", err, out)
	}
	for _, want := range []string{"eventRecordQPS", "restart-safe", "cpuManagerPolicy", "needs-state-reset-and-drain", "maxPods", "disruptive"} {
		if !strings.Contains(out, want) {
			t.Errorf("diff lacks %q:\n%s", want, out)
		}
	}
	if out, _, err = kubectlDKC(t, "diff", realNode, "--configmap", "kube-system/cli-next", "-o", "json", "--kubelet-check-dir", cluster.KubeletCheckDir()); err != nil || !strings.Contains(out, `"safety": "needs-state-reset-and-drain"`) {
		t.Errorf("diff -o json: %v\n%s", err, out)
	}

	// Refusals with the apiserver's messages, before anything is written.
	if _, _, err := kubectlDKC(t, "assign", node, "--configmap", "kube-system/cli-config", "--key", "../x"); err == nil ||
		!strings.Contains(err.Error(), "spec.configSource.configMap.kubeletConfigKey: Invalid value") {
		t.Errorf("bad key accepted: %v", err)
	}
	if _, _, err := kubectlDKC(t, "assign", node, "--configmap", "kube-system/no-such"); err == nil {
		t.Error("assign of a missing ConfigMap accepted")
	}

	if out, _, err = kubectlDKC(t, "reset", node); err != nil || !strings.Contains(out, "reset") {
		t.Fatalf("reset: %v\n%s", err, out)
	}
	waitNodeStatus(t, node, "local", "local", "local", "", time.Minute)
}

// simConfigFor is a valid config for a simulated node: its local config (its ports) plus extra fields.
func simConfigFor(t *testing.T, node, extra string) string {
	t.Helper()
	local, err := os.ReadFile(cluster.KubeletConfigPath(node))
	if err != nil {
		t.Fatal(err)
	}
	return string(local) + extra
}

// TestKubectlDKCRolloutAcrossSimulatedNodes rolls one ConfigMap over the simulated nodes one at a time, then
// rolls out a bad one: the rollout pauses at the first node, which falls back, and leaves the rest alone.
func TestKubectlDKCRolloutAcrossSimulatedNodes(t *testing.T) {
	const sel = "dkc.dev/simulated=true"
	t.Cleanup(func() { _, _, _ = kubectlDKC(t, "reset", "-l", sel) })
	header := "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nfailCgroupV1: false\n"
	good := createConfigMap(t, "cli-rollout-good", map[string]string{"kubelet": header + "eventRecordQPS: 33\n"})
	g := "cli-rollout-good@" + good.ResourceVersion

	out, errOut, err := kubectlDKC(t, "rollout", "--configmap", "kube-system/cli-rollout-good", "-l", sel, "--max-unavailable", "40%", "--timeout", "1m")
	if err != nil {
		t.Fatalf("rollout: %v\n%s\n%s", err, out, errOut)
	}
	for _, want := range []string{"to 5 of 5 nodes, 2 at a time", "batch 1: sim-1, sim-2", "batch 3: sim-5", "rollout complete"} {
		if !strings.Contains(out, want) {
			t.Errorf("rollout output lacks %q:\n%s", want, out)
		}
	}
	for _, n := range []string{"sim-1", "sim-2", "sim-3", "sim-4", "sim-5"} {
		waitNodeStatus(t, n, g, g, "*", "", 10*time.Second)
	}
	// Running it again resumes nothing: every node is done.
	if out, _, err = kubectlDKC(t, "rollout", "--configmap", "kube-system/cli-rollout-good", "-l", sel); err != nil || !strings.Contains(out, "to 0 of 5 nodes") {
		t.Errorf("re-run: %v\n%s", err, out)
	}

	// Let the good config pass its trial on sim-1: it is then what sim-1 falls back to.
	waitNodeStatus(t, "sim-1", g, g, g, "", 2*time.Minute)
	createConfigMap(t, "cli-rollout-bad", map[string]string{"kubelet": header + "eventRecordQPS: -3\n"})
	out, errOut, err = kubectlDKC(t, "rollout", "--configmap", "kube-system/cli-rollout-bad", "-l", sel, "--max-unavailable", "1", "--timeout", "1m")
	var paused *plugin.ErrPaused
	if !errors.As(err, &paused) || !strings.Contains(paused.Message, "node sim-1") || !strings.Contains(paused.Message, string(nodeconfig.ValidateError)) {
		t.Fatalf("bad rollout: err %v\n%s\n%s", err, out, errOut)
	}
	if !strings.Contains(errOut, "to resume") || !strings.Contains(errOut, "kubectl dkc reset sim-1") {
		t.Errorf("pause message does not say how to resume or roll back:\n%s", errOut)
	}
	// sim-1 keeps running the good config (its last-known-good); the other nodes were never touched.
	waitNodeStatus(t, "sim-1", "cli-rollout-bad@"+mustRV(t, "cli-rollout-bad"), g, "*", string(nodeconfig.ValidateError), 30*time.Second)
	for _, n := range []string{"sim-2", "sim-3", "sim-4", "sim-5"} {
		waitNodeStatus(t, n, g, g, "*", "", 5*time.Second)
	}
}
