// SPDX-License-Identifier: Apache-2.0

package devcluster

import (
	"context"
	"debug/buildinfo"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dkc-dev/dkc/sidecar/app"
)

// SimNodeState describes a simulated node: a Node object without a real kubelet, a stand-in kubelet
// (hack/fake-kubelet) kept running by a shell loop that re-reads the sidecar's kubelet.env on every start,
// and the real dkc-sidecar in signal mode, all on loopback, each with its own directory.
type SimNodeState struct {
	Name        string `json:"name"`
	KubeletPort int    `json:"kubeletPort"`
	HealthzPort int    `json:"healthzPort"`
	// KubeletVersion is the minor of the kubelet code the stand-in runs (fakeKubeletVersion).
	KubeletVersion string `json:"kubeletVersion,omitempty"`
}

// fakeKubeletVersion is the version of k8s.io/kubernetes the stand-in kubelet links ("v1.37.2"), read from
// its build info; "" if it links none. A simulated Node reports it as status.nodeInfo.kubeletVersion, as a
// real kubelet reports its own, because the sidecar validates configs with the kubelet code of that minor.
func fakeKubeletVersion(bin string) (string, error) {
	info, err := buildinfo.ReadFile(bin)
	if err != nil {
		return "", fmt.Errorf("read the build info of %s: %w", bin, err)
	}
	for _, d := range info.Deps {
		if d.Path == "k8s.io/kubernetes" {
			if d.Replace != nil && d.Replace.Version != "" {
				return d.Replace.Version, nil
			}
			return d.Version, nil
		}
	}
	return "", nil
}

func (c *Cluster) startSimNodes(ctx context.Context) error {
	if c.cfg.SimNodes == 0 {
		return nil
	}
	if c.cfg.FakeKubeletBinary == "" {
		return fmt.Errorf("simulated nodes need Config.FakeKubeletBinary")
	}
	client, err := c.Client()
	if err != nil {
		return err
	}
	version, err := fakeKubeletVersion(c.cfg.FakeKubeletBinary)
	if err != nil {
		return err
	}
	minor := ""
	if f := strings.SplitN(strings.TrimPrefix(version, "v"), ".", 3); len(f) >= 2 {
		minor = f[0] + "." + f[1]
	}
	for i := 1; i <= c.cfg.SimNodes; i++ {
		ports, err := c.freePorts(2)
		if err != nil {
			return err
		}
		s := SimNodeState{Name: fmt.Sprintf("sim-%d", i), KubeletPort: ports[0], HealthzPort: ports[1], KubeletVersion: minor}
		c.state.SimNodes = append(c.state.SimNodes, s)
		if err := c.writeState(); err != nil {
			return err
		}
		dir := c.NodeDir(s.Name)
		for _, d := range []string{dir, c.DynamicConfigDir(s.Name)} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return err
			}
		}
		// The stand-in runtime socket: the fake kubelet refuses to start when its runtime endpoint is missing.
		sock := filepath.Join(dir, "runtime.sock")
		if err := os.WriteFile(sock, nil, 0o644); err != nil {
			return err
		}
		// Ports and the runtime endpoint are the stand-in kubelet's command-line flags, which override any
		// config (seed semantics): so one ConfigMap key fits every simulated node, as on real nodes. The
		// stand-in loads and validates its config with the kubelet's own code, which on these cgroup v1
		// machines refuses it unless failCgroupV1 is false (cgroupV1Config, cgroupV1Flag).
		local := "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nfailSwapOn: false\n" + cgroupV1Config
		if err := os.WriteFile(c.KubeletConfigPath(s.Name), []byte(local), 0o644); err != nil {
			return err
		}
		if _, err := client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: s.Name,
			Labels: map[string]string{"dkc.dev/simulated": "true"}}}, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create simulated node %s: %w", s.Name, err)
		}
		// No kubelet posts a simulated node's status: mark it Ready once, as a healthy node would be, so that
		// rollouts (which wait for Ready) can run on it, and give its kubelet version as a kubelet does. No
		// node lifecycle controller runs to undo it.
		now := metav1.Now()
		status := map[string]any{"conditions": []corev1.NodeCondition{{
			Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", Message: "simulated node",
			LastHeartbeatTime: now, LastTransitionTime: now}}}
		if version != "" {
			status["nodeInfo"] = map[string]any{"kubeletVersion": version}
		}
		ready, _ := json.Marshal(map[string]any{"status": status})
		if _, err := client.CoreV1().Nodes().PatchStatus(ctx, s.Name, ready); err != nil {
			return fmt.Errorf("mark simulated node %s Ready: %w", s.Name, err)
		}
		if _, err := c.NodeToken(ctx, s.Name); err != nil {
			return err
		}
		pidFile := filepath.Join(dir, "kubelet.pid")
		env := app.KubeletEnvFile(c.DynamicConfigDir(s.Name))
		//nolint:lll // the script's command line as the shell runs it
		loop := fmt.Sprintf(`while :; do
  if [ -f %[1]q ]; then . %[1]q; else %[2]s=--config=%[3]s; fi
  FAKE_KUBELET_PID_FILE=%[4]q %[5]q $%[2]s --v=1 %[10]s --address=127.0.0.1 --port=%[6]d --healthz-bind-address=127.0.0.1 --healthz-port=%[7]d --container-runtime-endpoint=unix://%[8]s --cert-dir=%[9]q &
  wait $!
  sleep 0.3
done`, env, app.KubeletConfigVariable, c.KubeletConfigPath(s.Name), pidFile, c.cfg.FakeKubeletBinary,
			s.KubeletPort, s.HealthzPort, sock,
			// its self-signed serving certificate, which the sidecar pins, in the node's own directory
			filepath.Join(dir, "pki"),
			cgroupV1Flag)
		kp, err := startProcess("kubelet-"+s.Name, c.runDir(), c.logFile("kubelet-"+s.Name), nil, "sh", "-c", loop)
		if err != nil {
			return err
		}
		c.procs = append(c.procs, kp)
		if err := kp.waitFor(ctx, "started", func(context.Context) error {
			_, err := os.Stat(pidFile)
			return err
		}); err != nil {
			return err
		}
		fmt.Fprintf(c.cfg.Progress, "starting simulated node %s (stand-in kubelet on "+
			"127.0.0.1:%d, dkc-sidecar in signal mode)\n", s.Name, s.KubeletPort)
		sp, err := startProcess("dkc-sidecar-"+s.Name, c.runDir(), c.logFile("dkc-sidecar-"+s.Name), nil, c.cfg.SidecarBinary,
			"--node-name="+s.Name,
			"--server="+c.ServiceAddress(),
			"--server-ca-file="+c.CAFile(),
			"--token-file="+c.NodeTokenPath(s.Name),
			"--kubelet-token-file="+c.NodeTokenPath(s.Name),
			"--kubelet-config="+c.KubeletConfigPath(s.Name),
			"--dynamic-config-dir="+c.DynamicConfigDir(s.Name),
			"--restart-mode=signal",
			"--kubelet-pid-file="+pidFile,
			"--kubelet-host=127.0.0.1",
			"--trial-duration="+c.simTrialDuration(),
			"--health-timeout=30s",
			"--metrics-address=",
		)
		if err != nil {
			return err
		}
		c.procs = append(c.procs, sp)
	}
	return nil
}
