// SPDX-License-Identifier: Apache-2.0

package devcluster

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// nodePackages are the Debian packages a real node needs; installed on first use when missing so that a
// fresh machine runs the cluster without manual steps.
var nodePackages = map[string]string{"containerd": "containerd", "runc": "runc", "ip": "iproute2",
	"nsenter": "util-linux"}

// ensurePackages installs the Debian packages (binary or absolute path → package) whose files are missing.
func ensurePackages(ctx context.Context, packages map[string]string, progress io.Writer) error {
	var missing []string
	for bin, pkg := range packages {
		var err error
		if filepath.IsAbs(bin) {
			_, err = os.Stat(bin) // a file the package installs outside $PATH
		} else {
			_, err = exec.LookPath(bin)
		}
		if err != nil {
			missing = append(missing, pkg)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	sort.Strings(missing)
	fmt.Fprintf(progress, "installing Debian packages %v\n", missing)
	for _, args := range [][]string{{"update", "-qq"},
		append([]string{"install", "-y", "-qq", "--no-install-recommends"}, missing...)} {
		cmd := exec.CommandContext(ctx, "apt-get", args...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("apt-get %s: %w\n%s", strings.Join(args, " "), err, out)
		}
	}
	return nil
}

// KubeletConfigPath is the node's local kubelet config file (its --config); dkc never modifies it.
func (c *Cluster) KubeletConfigPath(node string) string {
	if c.state.Installed {
		for _, n := range c.state.Nodes {
			if n.Name == node {
				return filepath.Join(n.RootDir, "config.yaml") // the node's /var/lib/kubelet/config.yaml
			}
		}
	}
	return filepath.Join(c.NodeDir(node), "kubelet-config.yaml")
}

// KubeletConfigDir is the node's kubelet --config-dir, holding Config.KubeletDropIns; the node sees it at
// the same path.
func (c *Cluster) KubeletConfigDir(node string) string {
	return filepath.Join(c.NodeDir(node), "kubelet-config.d")
}

// NodeKubeconfigPath is the kubelet's kubeconfig (identity system:node:<name>).
func (c *Cluster) NodeKubeconfigPath(node string) string {
	return filepath.Join(c.NodeDir(node), "kubelet.kubeconfig")
}

func (c *Cluster) startNode(ctx context.Context, n NodeState, kubeletBin, rootfs string) error {
	fmt.Fprintf(c.cfg.Progress, "starting node %s: containerd and kubelet v%s (port %d, healthz %d)\n", n.Name,
		n.KubeletVersion, n.KubeletPort, n.HealthzPort)
	for _, d := range []string{c.NodeDir(n.Name), n.RootDir, n.ContainerdDir, filepath.Join(n.ContainerdDir, "cni"),
		filepath.Join(c.NodeDir(n.Name), "bus"), c.DynamicConfigDir(n.Name), c.NodeLogDir(n.Name)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("create %s: %w", d, err)
		}
	}
	sock := filepath.Join(n.ContainerdDir, "containerd.sock")
	ctrdConf := filepath.Join(n.ContainerdDir, "config.toml")
	if err := os.WriteFile(ctrdConf, []byte(containerdConfig(n.ContainerdDir, sock)), 0o644); err != nil {
		return fmt.Errorf("write containerd config: %w", err)
	}
	ctrd, err := startProcess("containerd-"+n.Name, c.runDir(), c.logFile("containerd-"+n.Name), nil,
		inNetns(n, "containerd", "--config", ctrdConf)...)
	if err != nil {
		return err
	}
	c.procs = append(c.procs, ctrd)
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := ctrd.waitFor(wctx, "serving", func(context.Context) error {
		_, err := os.Stat(sock)
		return err
	}); err != nil {
		return err
	}

	if err := writeKubeconfig(c.NodeKubeconfigPath(n.Name), c.apiServerURL(), c.pki.CAFile(),
		c.pki.path("node-"+n.Name+".crt"), c.pki.path("node-"+n.Name+".key")); err != nil {
		return err
	}
	if err := os.WriteFile(c.KubeletConfigPath(n.Name), []byte(kubeletConfig(n, c.pki.CAFile(), sock)),
		0o644); err != nil {
		return fmt.Errorf("write kubelet config: %w", err)
	}
	if len(c.cfg.KubeletDropIns) > 0 {
		if err := os.MkdirAll(c.KubeletConfigDir(n.Name), 0o755); err != nil {
			return fmt.Errorf("create kubelet config dir: %w", err)
		}
		if _, err := writeFiles(c.KubeletConfigDir(n.Name), c.cfg.KubeletDropIns); err != nil {
			return fmt.Errorf("write kubelet drop-ins: %w", err)
		}
	}
	var kl *process
	if n.Systemd {
		units, err := c.nodeUnits(n, c.sidecarArgs(n))
		if err != nil {
			return err
		}
		argv, err := c.nspawnArgs(n, rootfs, kubeletBin, c.cfg.SidecarBinary, units)
		if err != nil {
			return err
		}
		if kl, err = startProcess("node-"+n.Name, c.runDir(), c.logFile("node-"+n.Name), nil, argv...); err != nil {
			return err
		}
		bctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		if err := waitBus(bctx, filepath.Join(c.NodeDir(n.Name), "bus", "system_bus_socket")); err != nil {
			return fmt.Errorf("node %s: %w; see %s", n.Name, err, c.logFile("node-"+n.Name))
		}
		if err := c.startUnit(bctx, n.Name, "kubelet.service"); err != nil {
			return err
		}
	} else {
		kl, err = startProcess("kubelet-"+n.Name, c.runDir(), c.logFile("kubelet-"+n.Name), nil,
			inNetns(n, kubeletBin, c.KubeletArgs(n)...)...)
		if err != nil {
			return err
		}
	}
	c.procs = append(c.procs, kl)
	client, err := c.Client()
	if err != nil {
		return err
	}
	wctx, cancel = context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	return kl.waitFor(wctx, "registered and healthy", func(ctx context.Context) error {
		if err := httpOK(ctx, http.DefaultClient, fmt.Sprintf("http://%s:%d/healthz", n.IP, n.HealthzPort)); err != nil {
			return err
		}
		node, err := client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("node %s not registered yet", n.Name)
		}
		if err != nil {
			return err
		}
		if len(node.Status.Addresses) == 0 {
			return fmt.Errorf("node %s has no addresses yet", n.Name)
		}
		return nil
	})
}

// inNetns wraps a command so that it runs in the node's network namespace. nsenter enters only the network
// namespace (unlike `ip netns exec`, which also unshares mounts): the kubelet's mounts stay visible to Stop.
// nsenter execs the command, so the recorded PID is the program's own.
func inNetns(n NodeState, argv0 string, args ...string) []string {
	return append([]string{"nsenter", "--net=/run/netns/" + n.Netns, "--", argv0}, args...)
}

// KubeletArgs are the kubelet's command-line flags on node n. Flags override the config file (and, later,
// dkc's dynamic config), exactly as on a production node.
func (c *Cluster) KubeletArgs(n NodeState) []string {
	args := []string{
		"--config=" + c.KubeletConfigPath(n.Name),
		"--kubeconfig=" + c.NodeKubeconfigPath(n.Name),
		"--root-dir=" + n.RootDir,
		"--cert-dir=" + filepath.Join(n.RootDir, "pki"),
		"--hostname-override=" + n.Name,
		"--node-ip=" + n.IP,
		cgroupV1Flag,
		"--v=1",
	}
	if len(c.cfg.KubeletDropIns) > 0 {
		args = append(args, "--config-dir="+c.KubeletConfigDir(n.Name))
	}
	return args
}

// cgroupV1Flag lets every dev kubelet run on these cgroup v1 (hybrid) machines, whatever config it runs.
// Since 1.35 the kubelet refuses cgroup v1 unless failCgroupV1 is false (its validation fails, so do
// dkc-kubelet-check's); the local configs say so (cgroupV1Config), but an assigned config replaces the local
// one wholesale and a test's ConfigMap should not have to know the machine. The flag, which the kubelet keeps
// undeprecated for this purpose, overrides every config as node flags do, and the sidecar's checker sees it
// on the kubelet's command line. Production nodes should run cgroup v2 instead of either.
const cgroupV1Flag = "--fail-cgroupv1=false"

// cgroupV1Config is the local config's line for cgroup v1 hosts (see cgroupV1Flag): the field exists since
// kubelet 1.31, so every kubelet the dev cluster runs accepts it. Production nodes should run cgroup v2.
const cgroupV1Config = "failCgroupV1: false\n"

// kubeletConfig is the node's local config. cgroupsPerQOS is off so that the kubelet creates no cgroup
// hierarchy that would outlive it (the dev nodes run no pods but the few a test binds to them); failCgroupV1
// is off because these machines are cgroup v1 (cgroupV1Config); the disk eviction thresholds are 1%, as the
// installed form's, because the disk is the test machine's: at its default 15% a fuller disk would put the
// node under DiskPressure, and the kubelet would refuse those pods. The rest is a production-like kubelet
// serving authenticated configz on the node's address.
func kubeletConfig(n NodeState, caFile, containerdSock string) string {
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: %s
port: %d
readOnlyPort: 0
healthzBindAddress: %s
healthzPort: %d
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: %s
authorization:
  mode: Webhook
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
containerRuntimeEndpoint: unix://%s
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%%
  imagefs.available: 1%%
rotateCertificates: false
registerNode: true
`, n.IP, n.KubeletPort, n.IP, n.HealthzPort, caFile, containerdSock) + cgroupV1Config
}

func containerdConfig(dir, sock string) string {
	return fmt.Sprintf(`version = 2
root = %q
state = %q

[grpc]
  address = %q

[ttrpc]
  address = %q

[plugins."io.containerd.internal.v1.opt"]
  path = %q

[plugins."io.containerd.grpc.v1.cri".cni]
  conf_dir = %q
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), sock, sock+".ttrpc", filepath.Join(dir, "opt"),
		filepath.Join(dir, "cni"))
}

func writeKubeconfig(path, server, caFile, certFile, keyFile string) error {
	ca, err := os.ReadFile(caFile)
	if err != nil {
		return err
	}
	cert, err := os.ReadFile(certFile)
	if err != nil {
		return err
	}
	key, err := os.ReadFile(keyFile)
	if err != nil {
		return err
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["dkc-dev"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: ca}
	cfg.AuthInfos["user"] = &clientcmdapi.AuthInfo{ClientCertificateData: cert, ClientKeyData: key}
	cfg.Contexts["dkc-dev"] = &clientcmdapi.Context{Cluster: "dkc-dev", AuthInfo: "user"}
	cfg.CurrentContext = "dkc-dev"
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return clientcmd.WriteToFile(*cfg, path)
}

// unmountUnder unmounts every mount point at or below dir, deepest first (the kubelet bind-mounts its root
// dir onto itself, and pods leave volume mounts below it).
func unmountUnder(dir string) error {
	if dir == "" {
		return nil
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	defer f.Close()
	var points []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMountPath(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			points = append(points, mp)
		}
	}
	sort.Slice(points, func(i, j int) bool { return len(points[i]) > len(points[j]) })
	var errs []string
	for _, mp := range points {
		if err := syscall.Unmount(mp, 0); err != nil {
			if err2 := syscall.Unmount(mp, syscall.MNT_DETACH); err2 != nil {
				errs = append(errs, fmt.Sprintf("unmount %s: %v", mp, err2))
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return nil
}

// unescapeMountPath undoes mountinfo's octal escapes (\040 for space and so on).
func unescapeMountPath(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var v byte
			if _, err := fmt.Sscanf(s[i+1:i+4], "%03o", &v); err == nil {
				b.WriteByte(v)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func shortHash(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])[:10]
}
