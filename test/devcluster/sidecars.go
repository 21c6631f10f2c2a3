// SPDX-License-Identifier: Apache-2.0

package devcluster

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/dkc-dev/dkc/internal/nodeconfig"
)

// APIAudience is the dev apiserver's token audience, which kubelets accept in their webhook authentication.
const APIAudience = "https://kubernetes.default.svc.cluster.local"

// KubeletTokenPath holds the token the node's sidecar presents to its kubelet for /configz.
func (c *Cluster) KubeletTokenPath(node string) string { return c.NodeDir(node) + "/kubelet-token" }

func (c *Cluster) trialDuration() string {
	if c.cfg.TrialDuration > 0 {
		return c.cfg.TrialDuration.String()
	}
	return "10m0s"
}

func (c *Cluster) simTrialDuration() string {
	if c.cfg.SimTrialDuration > 0 {
		return c.cfg.SimTrialDuration.String()
	}
	return c.trialDuration()
}

func (c *Cluster) healthTimeout() string {
	if c.cfg.HealthTimeout > 0 {
		return c.cfg.HealthTimeout.String()
	}
	return "1m0s"
}

// sidecarArgs are a real node's dkc-sidecar flags inside its container.
func (c *Cluster) sidecarArgs(n NodeState) []string {
	return []string{
		"--node-name=" + n.Name,
		"--server=" + c.ServiceAddress(),
		"--server-ca-file=" + c.CAFile(),
		"--token-file=" + c.NodeTokenPath(n.Name),
		"--kubelet-token-file=" + c.KubeletTokenPath(n.Name),
		"--kubelet-config=" + c.KubeletConfigPath(n.Name),
		"--dynamic-config-dir=" + DynamicConfigDirInNode,
		"--trial-duration=" + c.trialDuration(),
		"--health-timeout=" + c.healthTimeout(),
		"--metrics-address=" + n.IP + ":" + strconv.Itoa(n.SidecarMetricsPort),
		// Plain HTTP, scraped by the tests without a token: this sidecar runs outside a pod, with no
		// ServiceAccount to review tokens as. The installed form's sidecars serve as deploy/ says.
		"--metrics-auth=false",
	}
}

// sidecarRBAC lets the sidecars read their kubelet's /configz (fine-grained kubelet authorization), and its
// /stats/summary and /pods (what new eviction thresholds would evict), as deploy/base/sidecar-rbac.yaml does.
func sidecarRBAC() (*rbacv1.ClusterRole, *rbacv1.ClusterRoleBinding) {
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "dkc-sidecar"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""},
			Resources: []string{"nodes/configz", "nodes/healthz", "nodes/stats", "nodes/pods"},
			Verbs:     []string{"get"}}},
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "dkc-sidecar"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: SidecarServiceAccount, Namespace: SidecarNamespace}},
	}
	return role, binding
}

// startSidecars starts the sidecar unit on every real node and the simulated nodes, then waits until each
// node's sidecar has reported its status onto its Node.
func (c *Cluster) startSidecars(ctx context.Context) error {
	client, err := c.Client()
	if err != nil {
		return err
	}
	if err := ensureRBAC(ctx, client, sidecarRBAC); err != nil {
		return err
	}
	var names []string
	for _, n := range c.state.Nodes {
		if !n.Systemd {
			continue
		}
		if _, err := MintToken(ctx, client, SidecarNamespace, SidecarServiceAccount, APIAudience, n.Name,
			c.KubeletTokenPath(n.Name)); err != nil {
			return err
		}
		fmt.Fprintf(c.cfg.Progress, "starting dkc-sidecar on node %s (systemd unit, restarts the kubelet over D-Bus)\n",
			n.Name)
		if err := c.startUnit(ctx, n.Name, "dkc-sidecar.service"); err != nil {
			return err
		}
		names = append(names, n.Name)
	}
	if err := c.startSimNodes(ctx); err != nil {
		return err
	}
	for _, s := range c.state.SimNodes {
		names = append(names, s.Name)
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for _, name := range names {
		if err := c.WaitStatus(wctx, name, func(map[string]any) bool { return true }); err != nil {
			return fmt.Errorf("sidecar of node %s never reported: %w (logs in %s)", name, err, c.LogDir())
		}
	}
	return nil
}

// WaitStatus waits until node's dkc.dev/config-status annotation satisfies ok.
func (c *Cluster) WaitStatus(ctx context.Context, node string, ok func(map[string]any) bool) error {
	client, err := c.Client()
	if err != nil {
		return err
	}
	var last string
	if err := wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		last = n.Annotations[nodeconfig.StatusAnnotation]
		var st map[string]any
		return last != "" && json.Unmarshal([]byte(last), &st) == nil && ok(st), nil
	}); err != nil {
		return fmt.Errorf("%w (last status %q)", err, last)
	}
	return nil
}

// startUnit is `systemctl start UNIT` on the node's own systemd. The bus may refuse connections for a moment
// after its socket appears, so connecting is retried.
func (c *Cluster) startUnit(ctx context.Context, node, unit string) error {
	return c.withSystemctl(ctx, node, func(s *systemctl) error { return s.Start(ctx, unit) })
}

// RestartBus is `systemctl restart dbus.socket` on a real node, what an upgrade of the dbus package does:
// dbus.service stops with it (Requires=), every client's connection closes, and the socket is made anew (a
// new inode, so a bind mount of the old socket file would lead nowhere); the next connection starts the new
// daemon. It returns once the bus answers from a new daemon.
func (c *Cluster) RestartBus(ctx context.Context, node string) error {
	var before int
	if err := c.withSystemctl(ctx, node, func(s *systemctl) (err error) {
		before, err = s.MainPID(ctx, "dbus.service")
		return err
	}); err != nil {
		return err
	}
	// busctl, not the Manager: its reply may be lost with the connection, which is expected here.
	out, err := exec.CommandContext(ctx, "busctl", "--address="+c.BusAddress(node), "call", "org.freedesktop.systemd1",
		"/org/freedesktop/systemd1",
		"org.freedesktop.systemd1.Manager", "RestartUnit", "ss", "dbus.socket", "replace").CombinedOutput()
	if err != nil && !strings.Contains(string(out), "onnection") {
		return fmt.Errorf("node %s: restart dbus.socket: %w: %s", node, err, out)
	}
	return pollUntil(ctx, time.Minute, "node "+node+": a new bus daemon", func(ctx context.Context) error {
		return c.withSystemctl(ctx, node, func(s *systemctl) error {
			pid, err := s.MainPID(ctx, "dbus.service")
			if err == nil && (pid == 0 || pid == before) {
				err = fmt.Errorf("dbus.service MainPID %d (was %d)", pid, before)
			}
			return err
		})
	})
}

// SlowKubeletStart makes the kubelet's unit on a real node wait d before each start (a drop-in with
// ExecStartPre=sleep, and daemon-reload), so that a restart job stays queued that long. The returned function
// removes it.
func (c *Cluster) SlowKubeletStart(ctx context.Context, node string,
	d time.Duration) (func(context.Context) error, error) {
	path := filepath.Join(c.NodeDir(node), "systemd", "kubelet.service.d", "30-dev-slow-start.conf")
	reload := func(ctx context.Context) error {
		return c.withSystemctl(ctx, node, func(s *systemctl) error { return s.DaemonReload(ctx) })
	}
	content := fmt.Sprintf("[Service]\nExecStartPre=/bin/sleep %d\n", int(d.Seconds()))
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		return nil, err
	}
	if err := reload(ctx); err != nil {
		return nil, err
	}
	return func(ctx context.Context) error {
		if err := os.Remove(path); err != nil {
			return err
		}
		return reload(ctx)
	}, nil
}

// KubeletMainPID is `systemctl show -p MainPID kubelet` on a real node (0: not running).
func (c *Cluster) KubeletMainPID(ctx context.Context, node string) (pid int, err error) {
	err = c.withSystemctl(ctx, node, func(s *systemctl) (err error) {
		pid, err = s.MainPID(ctx, "kubelet.service")
		return err
	})
	return pid, err
}

// KubeletUnitState is `systemctl show -p ActiveState,Result kubelet` on a real node.
func (c *Cluster) KubeletUnitState(ctx context.Context, node string) (activeState, result string, err error) {
	err = c.withSystemctl(ctx, node, func(s *systemctl) (err error) {
		activeState, result, err = s.State(ctx, "kubelet.service")
		return err
	})
	return activeState, result, err
}

// RestartSidecar is `systemctl restart dkc-sidecar` on a real node.
func (c *Cluster) RestartSidecar(ctx context.Context, node string) error {
	return c.RestartUnit(ctx, node, "dkc-sidecar.service")
}

// Signal sends sig to the cluster process name (e.g. "kube-apiserver", "dkc-server"), by recorded PID.
// SIGSTOP and SIGCONT make a component unreachable and back, as a partition or a hung process would.
func (c *Cluster) Signal(name string, sig syscall.Signal) error {
	p, err := loadProcess(name, c.runDir())
	if err != nil {
		return err
	}
	if p == nil || p.pid() == 0 {
		return fmt.Errorf("process %s is not running", name)
	}
	return syscall.Kill(p.pid(), sig)
}

// PID is the recorded PID of the cluster process name; 0 if it is not running.
func (c *Cluster) PID(name string) (int, error) {
	p, err := loadProcess(name, c.runDir())
	if err != nil || p == nil {
		return 0, err
	}
	return p.pid(), nil
}

// StopProcess stops the cluster process name by PID (TERM, then KILL after a grace period).
func (c *Cluster) StopProcess(name string) error {
	p, err := loadProcess(name, c.runDir())
	if err != nil || p == nil {
		return err
	}
	return p.stop(processGrace)
}

// Restart stops the cluster process name by PID and starts it again with the same command line, then waits
// until it serves again (see waitReady).
func (c *Cluster) Restart(ctx context.Context, name string) error {
	p, err := restartProcess(name, c.runDir(), processGrace)
	if err != nil {
		return err
	}
	return c.waitReady(ctx, p)
}
