// SPDX-License-Identifier: Apache-2.0

//go:build integration

package installed

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/dkc-dev/dkc/test/devcluster"
)

// TestSidecarPodsHoldOnlyWhatTheyNeed reads the running sidecar pods as the apiserver has them (what the
// kubelet ran, after the dev overlay): the host's PID namespace is not shared (the kubelet's command line comes
// from the host's /proc mounted read-only), the long-running container has no unit directory and no
// writable host path but the checkpoint directory, the drop-in was installed by the init container, which
// exited cleanly, and no container is privileged or keeps a capability. Of the kubelet's certificate
// directory the long-running container sees the serving certificate kubelet.crt alone: no key of the
// kubelet's, and not the client key its kubeconfig names, is reachable in it (looked at through the
// running container's root). The assignment in TestInstalledFormRunsAsPods shows the sidecar still reads
// the kubelet's flags and restarts it this way, and probes its /configz.
func TestSidecarPodsHoldOnlyWhatTheyNeed(t *testing.T) {
	diagnoseOnFailure(t)
	pods, err := admin(t).CoreV1().Pods("kube-system").List(ctxFor(t), metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=dkc-sidecar"})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != len(nodes) {
		t.Fatalf("%d dkc-sidecar pods, want one per node (%d)", len(pods.Items), len(nodes))
	}
	for _, p := range pods.Items {
		where := p.Name + " on " + p.Spec.NodeName
		if p.Spec.HostPID || p.Spec.HostIPC {
			t.Errorf("%s shares the host's PID or IPC namespace (hostPID=%v hostIPC=%v)", where, p.Spec.HostPID, p.Spec.HostIPC)
		}
		hostPaths := map[string]string{}
		for _, v := range p.Spec.Volumes {
			if v.HostPath != nil {
				hostPaths[v.Name] = v.HostPath.Path
			}
		}
		if sc := p.Spec.SecurityContext; sc == nil || sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
			t.Errorf("%s: pod seccomp profile %+v, want RuntimeDefault", where, sc)
		}
		if len(p.Spec.InitContainers) != 1 || p.Spec.InitContainers[0].Name != "install-kubelet-dropin" {
			t.Errorf("%s: init containers %v, want install-kubelet-dropin alone", where, names(p.Spec.InitContainers))
		}
		for _, s := range p.Status.InitContainerStatuses {
			if s.State.Terminated == nil || s.State.Terminated.ExitCode != 0 {
				t.Errorf("%s: init container %s did not exit cleanly: %+v", where, s.Name, s.State)
			}
		}
		for _, c := range append(append([]corev1.Container{}, p.Spec.InitContainers...), p.Spec.Containers...) {
			sc := c.SecurityContext
			if sc == nil || (sc.Privileged != nil && *sc.Privileged) || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
				sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.Capabilities == nil ||
				len(sc.Capabilities.Add) != 0 || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" {
				t.Errorf("%s: container %s runs with %+v; want unprivileged, no escalation, read-only root, every capability dropped", where, c.Name, sc)
			}
		}
		for _, c := range p.Spec.Containers {
			for _, m := range c.VolumeMounts {
				host, ok := hostPaths[m.Name]
				if !ok {
					continue
				}
				if strings.HasPrefix(host, "/etc/systemd") || strings.HasPrefix(host, "/run/systemd") || strings.HasPrefix(host, "/usr/lib/systemd") {
					t.Errorf("%s: container %s mounts the unit directory %s (at %s); only the init container may", where, c.Name, host, m.MountPath)
				}
				if !m.ReadOnly && host != "/var/lib/kubelet/dynamic-config" {
					t.Errorf("%s: container %s mounts %s writable at %s", where, c.Name, host, m.MountPath)
				}
				if host == "/proc" && (m.MountPath != "/host/proc" || !m.ReadOnly) {
					t.Errorf("%s: container %s mounts the host's /proc at %s (read-only %v); want /host/proc, read-only", where, c.Name, m.MountPath, m.ReadOnly)
				}
				if rel, err := filepath.Rel(host, kubeletCertDir); err == nil && !strings.HasPrefix(rel, "..") {
					t.Errorf("%s: container %s mounts %s, which holds the kubelet's keys in %s", where, c.Name, host, kubeletCertDir)
				}
			}
		}
		checkNoKubeletKeyInSidecar(t, p.Spec.NodeName)
	}
}

// kubeletCertDir is the kubelet's --cert-dir on the nodes (kubeadm's): its serving certificate kubelet.crt,
// its key, and on kubeadm nodes the client certificate and key kubelet-client-current.pem.
const kubeletCertDir = "/var/lib/kubelet/pki"

// checkNoKubeletKeyInSidecar looks into node's running dkc-sidecar container (through /proc/<pid>/root on the
// host, which resolves paths in the container's mounts): of the kubelet's certificate directory only
// kubelet.crt is there, and the client key the kubelet's kubeconfig names cannot be reached.
func checkNoKubeletKeyInSidecar(t *testing.T, node string) {
	t.Helper()
	pid := sidecarPID(t, node)
	root := filepath.Join("/proc", strconv.Itoa(pid), "root")
	entries, err := os.ReadDir(filepath.Join(root, kubeletCertDir))
	if err != nil {
		t.Errorf("%s: the sidecar cannot list %s: %v", node, kubeletCertDir, err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if strings.Join(names, " ") != "kubelet.crt" {
		t.Errorf("%s: the sidecar container sees %v in %s; want kubelet.crt alone", node, names, kubeletCertDir)
	}
	// The key the kubelet authenticates to the apiserver with, wherever its kubeconfig keeps it.
	// The unit's MainPID is in the node's PID namespace: find the kubelet's host PID in /proc instead.
	kubelet := hostPID(t, node, "kubelet", "--hostname-override="+node)
	kubeletRoot := filepath.Join("/proc", strconv.Itoa(kubelet), "root")
	raw, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(kubelet), "cmdline"))
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := ""
	for _, a := range strings.Split(string(raw), "\x00") {
		if v, ok := strings.CutPrefix(a, "--kubeconfig="); ok {
			kubeconfig = v
		}
	}
	cfg, err := clientcmd.LoadFromFile(filepath.Join(kubeletRoot, kubeconfig))
	if err != nil {
		t.Fatalf("%s: the kubelet's kubeconfig %q: %v", node, kubeconfig, err)
	}
	// The kubeconfig itself holds the key when it embeds it (client-key-data, as the dev cluster's do).
	keys := []string{filepath.Join(kubeletCertDir, "kubelet-client-current.pem"), filepath.Join(kubeletCertDir, "kubelet.key"), kubeconfig}
	for _, a := range cfg.AuthInfos {
		if a.ClientKey != "" {
			keys = append(keys, a.ClientKey)
		}
		if a.ClientKey == "" && len(a.ClientKeyData) == 0 {
			t.Errorf("%s: the kubelet's kubeconfig %s has user credentials without a client key; the test cannot look for it", node, kubeconfig)
		}
	}
	for _, k := range keys {
		if _, err := os.Stat(filepath.Join(root, k)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: the kubelet's key %s is reachable in the sidecar container (stat: %v)", node, k, err)
		}
	}
}

// sidecarPID is the PID (on the host) of node's long-running dkc-sidecar process.
func sidecarPID(t *testing.T, node string) int {
	t.Helper()
	return hostPID(t, node, "dkc-sidecar", "--node-name="+node)
}

// hostPID is the PID (on the host) of node's process of the program binary run with the argument arg (not
// the sidecar's --install-only init container).
func hostPID(t *testing.T, node, binary, arg string) int {
	t.Helper()
	procs, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range procs {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
		if len(args) > 1 && filepath.Base(args[0]) == binary && slices.Contains(args, arg) && !slices.Contains(args, "--install-only") &&
			onNode(pid, node) {
			return pid
		}
	}
	t.Fatalf("%s: no %s process found in /proc", node, binary)
	return 0
}

// onNode says whether process pid runs on this cluster's node: another dev cluster on the host (the suites
// run side by side) has nodes of the same names. The node's dynamic config directory, bind-mounted into the
// node and from there into the sidecar's pod, is the same file in the process's root as on the host.
func onNode(pid int, node string) bool {
	in, err := os.Stat(filepath.Join("/proc", strconv.Itoa(pid), "root", devcluster.DynamicConfigDirInNode))
	if err != nil {
		return false
	}
	host, err := os.Stat(cluster.DynamicConfigDir(node))
	return err == nil && os.SameFile(in, host)
}

func names(cs []corev1.Container) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.Name)
	}
	return out
}

// TestServerPDBLetsDrainsEvictUnhealthyReplicas: the PodDisruptionBudget as the apiserver kept it lets a
// drain evict a dkc-server replica that is not Ready, so a crash-looping replica never blocks node drains.
func TestServerPDBLetsDrainsEvictUnhealthyReplicas(t *testing.T) {
	pdb, err := admin(t).PolicyV1().PodDisruptionBudgets("kube-system").Get(ctxFor(t), "dkc-server", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p := pdb.Spec.UnhealthyPodEvictionPolicy; p == nil || *p != policyv1.AlwaysAllow {
		t.Errorf("PodDisruptionBudget dkc-server: unhealthyPodEvictionPolicy %v, want AlwaysAllow", p)
	}
}
