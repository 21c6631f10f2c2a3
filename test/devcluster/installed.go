// SPDX-License-Identifier: Apache-2.0

package devcluster

// The installed form (Config.Installed) is a cluster as users run one, with dkc installed the way docs/install.md's
// "Production install" says: a control plane with kube-controller-manager and kube-scheduler, and nodes that
// are whole machines — each a systemd-nspawn container (its own PID, mount and network namespace) running
// systemd, containerd, the kubelet and kube-proxy as units, with CNI pod networking and cluster DNS (CoreDNS).
// dkc's images are imported into every node's containerd and dkc is applied with `kubectl apply -k` from a
// copy of deploy/, so dkc-server runs as a Deployment and dkc-sidecar as a DaemonSet pod that reaches its
// node's systemd through the hostPath D-Bus socket, exactly as on a production node. The first node (node-1)
// is registered as kubeadm registers a control-plane node (role label, NoSchedule taint), the others are
// plain workers: dkc-server's required placement puts both replicas on node-1, and what a worker may reach
// is what it may reach in production.
//
//	host netns: bridge 198.18.<k>.1/24, kube-apiserver, etcd, controller-manager, scheduler; routes to each
//	            node's pod subnet via the node
//	node i:     eth0 198.18.<k>.<10+i>, cni0 + pods in 198.19.<k>.<32i>/27, kube-proxy (iptables)

import (
	"context"
	_ "embed"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/dkc-dev/dkc/hack/images/ociimage"
)

const (
	// ImageRepo and ImageTag name the images `make images` builds by default and deploy/overlays/dev installs.
	ImageRepo = "dkc.local"
	ImageTag  = "dev"
	// clusterDNSIP is the kube-dns Service address, in --service-cluster-ip-range, given to every kubelet.
	clusterDNSIP = "10.0.0.10"
	// nodeKubeletConfig is where the kubelet's local config lives on a node (kubeadm's path), the file
	// deploy/base/sidecar.yaml mounts.
	nodeKubeletConfig = "/var/lib/kubelet/config.yaml"
	// maxInstalledNodes: each node's pod subnet is a /27 of the cluster's /24.
	maxInstalledNodes = 8
)

// dkcImages are the images of dkc that `make images` writes and every node imports; the dev cluster adds
// its own pause (sandbox) and CoreDNS images.
var dkcImages = []string{"dkc-server", "dkc-sidecar", "pause"}

//go:embed addons/coredns.yaml
var corednsManifest string

// installedPackages are what a node of the installed form needs beyond nodePackages: ctr (from containerd)
// to import images, the CNI plugins, and openssl for deploy/overlays/self-signed/gen-certs.sh.
var installedPackages = map[string]string{"/usr/lib/cni/bridge": "containernetworking-plugins", "openssl": "openssl"}

// podSubnets returns the cluster's pod range and node i's part of it.
func podSubnets(k, i int) (cluster, node string) {
	return fmt.Sprintf("198.19.%d.0/24", k), fmt.Sprintf("198.19.%d.%d/27", k, 32*i)
}

// imageRef is the reference an image of name has in the dev cluster.
func imageRef(name string) string { return ImageRepo + "/" + name + ":" + ImageTag }

// nodeCgroupRoot is the kubelet's --cgroup-root on node n: pods of different nodes never share a cgroup, and
// Stop removes the whole subtree.
func nodeCgroupRoot(n NodeState) string { return "/" + nodeCgroup(n) }

// setupPodNetwork lets node i forward pod traffic and routes every node's pod subnet, from the host (so the
// apiserver reaches webhook pods) and from every other node.
func setupPodNetwork(ctx context.Context, network Network, nodes []NodeState) error {
	// kube-proxy needs bridged traffic to pass iptables (br_netfilter, as kubeadm's preflight requires); a
	// kernel with the module built in, like these machines', already has the setting.
	if _, err := os.Stat("/proc/sys/net/bridge/bridge-nf-call-iptables"); err != nil {
		if out, err := exec.CommandContext(ctx, "modprobe", "br_netfilter").CombinedOutput(); err != nil {
			return fmt.Errorf("the pod network needs the br_netfilter kernel module: modprobe br_netfilter: %w: %s", err, out)
		}
	}
	for _, n := range nodes {
		for _, s := range [][]string{
			{"sysctl", "-qw", "net.ipv4.ip_forward=1"},
			// kube-proxy's Service NAT must see traffic between pods on the node's own bridge.
			{"sysctl", "-qw", "net.bridge.bridge-nf-call-iptables=1"},
		} {
			if out, err := exec.CommandContext(ctx, "nsenter",
				append([]string{"--net=/run/netns/" + n.Netns, "--"}, s...)...).CombinedOutput(); err != nil {
				return fmt.Errorf("node %s: %s: %w: %s", n.Name, strings.Join(s, " "), err, out)
			}
		}
		if err := ipCmd(ctx, "route", "replace", n.PodCIDR, "via", n.IP); err != nil {
			return err
		}
		// A machine has a default route; without one, connecting to a Service IP fails before kube-proxy's
		// NAT can apply ("network is unreachable"). The host drops what would leave the cluster.
		if err := ipCmd(ctx, "-n", n.Netns, "route", "replace", "default", "via", network.GatewayIP); err != nil {
			return err
		}
		for _, m := range nodes {
			if m.Name != n.Name {
				if err := ipCmd(ctx, "-n", n.Netns, "route", "replace", m.PodCIDR, "via", m.IP); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// cniConfig is node n's pod network: a bridge with host-local addresses from the node's pod subnet, the
// node as the pods' gateway. Debian's containernetworking-plugins provide the plugins.
func cniConfig(n NodeState) string {
	return fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "dkc-dev",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "hairpinMode": true,
      "ipam": {"type": "host-local", "ranges": [[{"subnet": %q}]], "routes": [{"dst": "0.0.0.0/0"}]}
    }
  ]
}
`, n.PodCIDR)
}

// installedContainerdConfig is the node's containerd: the paths of a standard install, the CRI sandbox
// image the dev cluster builds (no registry is reachable), CNI from /opt/cni/bin and /etc/cni/net.d.
func installedContainerdConfig() string {
	return fmt.Sprintf(`version = 2

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  # These machines withhold CAP_SYS_RESOURCE even from root, so nothing may lower an oom_score_adj below 0;
  # runc would fail to start every pod sandbox at the kubelet's -998. Clamp instead, as rootless setups do.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/opt/cni/bin"
    conf_dir = "/etc/cni/net.d"
`, imageRef("pause"))
}

// installedKubeletConfig is the local kubelet config of every node of the installed form: the same file on
// each node (the kubelet's default ports and addresses in the node's own network namespace, the node's
// identity and cgroup root in flags), so one ConfigMap can reconfigure them all as on a real cluster. Cluster
// DNS; no image garbage collection or disk eviction (the images were imported, no registry could give them
// back). The webhook authentication cache is 30s instead of the default 2m, so that a test can outlast it
// during an apiserver outage without waiting minutes. failCgroupV1 is off because these machines are cgroup
// v1 (cgroupV1Config; production nodes should run cgroup v2).
func (c *Cluster) installedKubeletConfig() string {
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
readOnlyPort: 0
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
    cacheTTL: 30s
  x509:
    clientCAFile: %[1]s
authorization:
  mode: Webhook
cgroupDriver: cgroupfs
failSwapOn: false
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
clusterDNS: [%[2]s]
clusterDomain: cluster.local
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 1Mi
  nodefs.available: 1%%
  imagefs.available: 1%%
rotateCertificates: false
registerNode: true
`, c.pki.CAFile(), clusterDNSIP) + cgroupV1Config
}

// installedUnits writes node n's systemd units for the installed form: cgroups-rw (see below), containerd,
// the kubelet (kubeadm-style; dkc-sidecar installs its own drop-in) and kube-proxy.
func (c *Cluster) installedUnits(n NodeState) (map[string]string, error) {
	dir := filepath.Join(c.NodeDir(n.Name), "systemd")
	if err := os.MkdirAll(filepath.Join(dir, "kubelet.service.d"), 0o755); err != nil {
		return nil, err
	}
	files := map[string]string{
		// systemd-nspawn mounts the cgroup v1 controllers read-only; on a real machine the kubelet and runc
		// write them. Remounting needs no more than the capabilities the node already has.
		"cgroups-rw.service": `[Unit]
Description=make the cgroup v1 controllers writable as on a real machine
DefaultDependencies=no
Before=containerd.service kubelet.service
[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/sh /usr/local/bin/cgroups-rw.sh
StandardOutput=append:/var/log/dkc/cgroups-rw.log
StandardError=inherit
`,
		// systemd-nspawn mounts the cgroup v1 controllers read-only; on a real machine the kubelet and runc
		// write them. Remounting needs no more than the capabilities the node already has. The kubelet then
		// requires its --cgroup-root to exist in every hierarchy as the node sees it.
		"cgroups-rw.sh": fmt.Sprintf(`set -eu
root=%s
for d in /sys/fs/cgroup/*; do
  [ -L "$d" ] && continue
  case "$d" in */systemd|*/unified) ;; *)
    if ! mount -o remount,rw "$d" 2>/dev/null; then
      c=$(basename "$d"); umount "$d"; mount -t cgroup -o "$c" cgroup "$d"
    fi;;
  esac
  case "$d" in */unified) continue;; esac
  mkdir -p "$d$root"
  if [ "$(basename "$d")" = cpuset ]; then
    cat "$d/cpuset.cpus" > "$d$root/cpuset.cpus"; cat "$d/cpuset.mems" > "$d$root/cpuset.mems"
  fi
done
grep cgroup /proc/self/mountinfo
`, nodeCgroupRoot(n)),
		"containerd.service": `[Unit]
Description=containerd
Requires=cgroups-rw.service
After=cgroups-rw.service
[Service]
ExecStart=/usr/local/bin/containerd --config /etc/containerd/config.toml
Delegate=yes
KillMode=process
Restart=always
RestartSec=1
LimitNOFILE=infinity
StandardOutput=append:/var/log/dkc/containerd.log
StandardError=inherit
`,
		"kubelet.service": kubeletUnit(n.Name, "containerd.service", nodeKubeletConfig, c.installedKubeletArgs(n),
			c.cfg.NoKubeletStartLimit),
		//nolint:lll // the unit file's lines as kube-proxy's unit has them
		"kube-proxy.service": fmt.Sprintf(`[Unit]
Description=kube-proxy of dkc dev node %[1]s
After=network.target
[Service]
ExecStart=/usr/local/bin/kube-proxy --kubeconfig=%[2]s --hostname-override=%[1]s --cluster-cidr=%[3]s --proxy-mode=iptables --conntrack-max-per-core=0 --v=1
Restart=always
RestartSec=1
StandardOutput=append:/var/log/dkc/kube-proxy.log
StandardError=inherit
`, n.Name, c.componentKubeconfig("kube-proxy"), c.state.PodCIDR),
	}
	paths, err := writeFiles(dir, files)
	if err != nil {
		return nil, err
	}
	paths["kubelet.service.d"] = filepath.Join(dir, "kubelet.service.d")
	return paths, nil
}

// installedKubeletArgs are the kubelet's flags beside $KUBELET_CONFIG_ARGS (default root and cert dirs).
func (c *Cluster) installedKubeletArgs(n NodeState) []string {
	args := []string{
		"--kubeconfig=" + c.NodeKubeconfigPath(n.Name),
		"--hostname-override=" + n.Name,
		"--node-ip=" + n.IP,
		// Pods of different nodes must never share a cgroup on this one machine; Stop removes the subtree.
		"--cgroup-root=" + nodeCgroupRoot(n),
		cgroupV1Flag,
		"--v=1",
	}
	if c.isControlPlaneNode(n.Name) {
		// As kubeadm registers a control-plane node: only pods that tolerate the taint run there.
		args = append(args, "--register-with-taints="+controlPlaneRole+":NoSchedule")
	}
	return args
}

// controlPlaneRole is the label and taint key of a control-plane node, as kubeadm sets them.
const controlPlaneRole = "node-role.kubernetes.io/control-plane"

// isControlPlaneNode reports whether node is the installed form's control-plane node: the first real node
// (node-1) is registered as kubeadm registers one, so that dkc-server's required placement puts it there and
// every other node is a plain worker, as in production.
func (c *Cluster) isControlPlaneNode(node string) bool {
	return len(c.state.Nodes) > 0 && c.state.Nodes[0].Name == node
}

// ControlPlaneNode is the name of the installed form's control-plane node (isControlPlaneNode).
func (c *Cluster) ControlPlaneNode() string {
	if len(c.state.Nodes) == 0 {
		return ""
	}
	return c.state.Nodes[0].Name
}

// labelControlPlane gives node the control-plane role label with admin credentials, as kubeadm does after
// the kubelet registers it: the NodeRestriction admission plugin forbids a kubelet to set node-role labels
// on itself, so --node-labels cannot.
func labelControlPlane(ctx context.Context, client kubernetes.Interface, node string) error {
	patch := []byte(`{"metadata":{"labels":{"` + controlPlaneRole + `":""}}}`)
	if _, err := client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("label node %s %s: %w", node, controlPlaneRole, err)
	}
	return nil
}

// installedNspawnArgs boots node n as a whole machine: containerd, runc and the CNI plugins from the host's
// Debian packages, the Kubernetes binaries (bins.Kubelet of the node's minor), containerd's and the kubelet's state on
// the host's disk (overlayfs snapshots cannot live on the container's overlay root), containerd's socket where the
// host's ctr reaches it.
func (c *Cluster) installedNspawnArgs(n NodeState, rootfs string, bins Binaries, units map[string]string) []string {
	nd := c.NodeDir(n.Name)
	nspawn := []string{"systemd-nspawn", "--boot", "--directory=" + rootfs, "--volatile=overlay", "--machine=" + n.Netns,
		"--register=no", "--keep-unit", "--console=pipe", "--capability=all",
		// nspawn's seccomp filter refuses the keyring calls, which runc makes for every container (a session
		// keyring of its own); a real machine allows them.
		"--system-call-filter=@keyring",
		"--network-namespace-path=/run/netns/" + n.Netns,
		"--bind=/dev/kmsg",
		"--bind=" + filepath.Join(nd, "bus") + ":/run/dbus",
		"--bind-ro=/usr/bin/containerd:/usr/local/bin/containerd",
		"--bind-ro=/usr/bin/containerd-shim-runc-v2:/usr/local/bin/containerd-shim-runc-v2",
		"--bind-ro=/usr/bin/runc:/usr/local/bin/runc",
		"--bind-ro=/usr/bin/ctr:/usr/local/bin/ctr",
		"--bind-ro=/usr/lib/cni:/opt/cni/bin",
		"--bind-ro=" + bins.Kubelet + ":/usr/local/bin/kubelet",
		"--bind-ro=" + bins.Proxy + ":/usr/local/bin/kube-proxy",
		"--bind-ro=" + filepath.Join(nd, "containerd.toml") + ":/etc/containerd/config.toml",
		"--bind-ro=" + filepath.Join(nd, "cni") + ":/etc/cni/net.d",
		"--bind=" + filepath.Join(n.ContainerdDir, "root") + ":/var/lib/containerd",
		"--bind=" + filepath.Join(n.ContainerdDir, "run") + ":/run/containerd",
		"--bind=" + n.RootDir + ":/var/lib/kubelet",
		"--bind=" + c.DynamicConfigDir(n.Name) + ":" + DynamicConfigDirInNode,
		"--bind-ro=" + c.cfg.Dir, // kubeconfigs and the cluster CA, at the paths the units name
		"--bind=" + c.NodeLogDir(n.Name) + ":/var/log/dkc",
		"--bind=" + filepath.Join(c.NodeLogDir(n.Name), "pods") + ":/var/log/pods", // container logs outlive the node
		"--bind-ro=" + units["kubelet.service"] + ":/etc/systemd/system/kubelet.service",
		"--bind=" + units["kubelet.service.d"] + ":/etc/systemd/system/kubelet.service.d",
		"--bind-ro=" + units["containerd.service"] + ":/etc/systemd/system/containerd.service",
		"--bind-ro=" + units["kube-proxy.service"] + ":/etc/systemd/system/kube-proxy.service",
		"--bind-ro=" + units["cgroups-rw.service"] + ":/etc/systemd/system/cgroups-rw.service",
		"--bind-ro=" + units["cgroups-rw.sh"] + ":/usr/local/bin/cgroups-rw.sh",
	}
	return inNodeCgroup(n, nspawn)
}

// startInstalledNode boots node n of the installed form, imports the images into its containerd, and starts
// the kubelet and kube-proxy; it returns when the Node is registered and Ready.
func (c *Cluster) startInstalledNode(ctx context.Context, n NodeState, bins Binaries, rootfs string,
	images map[string]string) error {
	fmt.Fprintf(c.cfg.Progress, "starting node %s (%s, pods %s): systemd, containerd, kubelet v%s, kube-proxy v%s\n",
		n.Name, n.IP, n.PodCIDR, n.KubeletVersion, c.state.KubeVersion)
	nd := c.NodeDir(n.Name)
	for _, d := range []string{nd, n.RootDir, filepath.Join(n.ContainerdDir, "root"),
		filepath.Join(n.ContainerdDir, "run"),
		filepath.Join(nd, "cni"), filepath.Join(nd, "bus"), c.DynamicConfigDir(n.Name),
		filepath.Join(c.NodeLogDir(n.Name), "pods")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("create %s: %w", d, err)
		}
	}
	if err := writeKubeconfig(c.NodeKubeconfigPath(n.Name), c.apiServerURL(), c.pki.CAFile(),
		c.pki.path("node-"+n.Name+".crt"), c.pki.path("node-"+n.Name+".key")); err != nil {
		return err
	}
	for path, content := range map[string]string{
		c.KubeletConfigPath(n.Name):                 c.installedKubeletConfig(),
		filepath.Join(nd, "containerd.toml"):        installedContainerdConfig(),
		filepath.Join(nd, "cni", "10-dkc.conflist"): cniConfig(n),
	} {
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			return fmt.Errorf("write %s: %w", path, err)
		}
	}
	units, err := c.installedUnits(n)
	if err != nil {
		return err
	}
	// nspawn mounts /proc/sys read-only; a node's kube-proxy and CNI plugins write its network sysctls (they
	// are per network namespace, so the node's own).
	env := []string{"SYSTEMD_NSPAWN_API_VFS_WRITABLE=network"}
	p, err := startProcess("node-"+n.Name, c.runDir(), c.logFile("node-"+n.Name), env,
		c.installedNspawnArgs(n, rootfs, bins, units)...)
	if err != nil {
		return err
	}
	c.procs = append(c.procs, p)
	bctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := waitBus(bctx, filepath.Join(nd, "bus", "system_bus_socket")); err != nil {
		return fmt.Errorf("node %s: %w; see %s", n.Name, err, c.logFile("node-"+n.Name))
	}
	if err := c.startUnit(bctx, n.Name, "containerd.service"); err != nil {
		return err
	}
	if err := waitPath(bctx, c.ContainerdAddress(n.Name)); err != nil {
		return fmt.Errorf("node %s: containerd socket: %w; see %s", n.Name, err,
			filepath.Join(c.NodeLogDir(n.Name), "containerd.log"))
	}
	names := make([]string, 0, len(images))
	for name := range images {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if err := c.ImportImage(bctx, n.Name, images[name]); err != nil {
			return err
		}
	}
	for _, u := range []string{"kube-proxy.service", "kubelet.service"} {
		if err := c.startUnit(bctx, n.Name, u); err != nil {
			return err
		}
	}
	client, err := c.Client()
	if err != nil {
		return err
	}
	if err := p.waitFor(bctx, "registered and Ready", func(ctx context.Context) error {
		node, err := client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, cond := range node.Status.Conditions {
			if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
				return nil
			}
		}
		return fmt.Errorf("node %s not Ready yet", n.Name)
	}); err != nil {
		return err
	}
	if c.isControlPlaneNode(n.Name) {
		fmt.Fprintf(c.cfg.Progress, "node %s is the control-plane node: label and taint %s\n", n.Name, controlPlaneRole)
		return labelControlPlane(bctx, client, n.Name)
	}
	return nil
}

// ContainerdAddress is node's containerd socket as the host sees it (for ctr).
func (c *Cluster) ContainerdAddress(node string) string {
	for _, n := range c.state.Nodes {
		if n.Name == node {
			return filepath.Join(n.ContainerdDir, "run", "containerd.sock")
		}
	}
	return ""
}

// ImportImage loads an image tarball into node's containerd, in the namespace the CRI uses, as a node image
// pre-load does; the CRI then never pulls it (imagePullPolicy IfNotPresent for a non-latest tag).
func (c *Cluster) ImportImage(ctx context.Context, node, tarball string) error {
	out, err := exec.CommandContext(ctx, "ctr", "--address", c.ContainerdAddress(node), "-n", "k8s.io", "images", "import",
		tarball).CombinedOutput()
	if err != nil {
		return fmt.Errorf("node %s: import image %s: %w: %s", node, tarball, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// ImportImages loads image tarballs into every node's containerd (ImportImage): images the cluster did not
// start with, such as another release's for an upgrade, which pods on any node may then run.
func (c *Cluster) ImportImages(ctx context.Context, tarballs ...string) error {
	for _, n := range c.state.Nodes {
		for _, tar := range tarballs {
			if err := c.ImportImage(ctx, n.Name, tar); err != nil {
				return err
			}
		}
	}
	return nil
}

func waitPath(ctx context.Context, path string) error {
	if err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(context.Context) (bool, error) {
		_, err := os.Stat(path)
		return err == nil, nil
	}); err != nil {
		return fmt.Errorf("%s did not appear: %w", path, err)
	}
	return nil
}

// kubectl runs kubectl with the admin kubeconfig.
func (c *Cluster) kubectl(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "kubectl", append([]string{"--kubeconfig", c.KubeconfigPath()}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// installCoreDNS applies the cluster DNS add-on and waits until it answers.
func (c *Cluster) installCoreDNS(ctx context.Context) error {
	fmt.Fprintf(c.cfg.Progress, "installing cluster DNS (CoreDNS, kube-dns %s)\n", clusterDNSIP)
	manifest := strings.NewReplacer("COREDNS_IMAGE", imageRef("coredns"), "CLUSTER_DNS_IP",
		clusterDNSIP).Replace(corednsManifest)
	path := filepath.Join(c.cfg.Dir, "coredns.yaml")
	if err := os.WriteFile(path, []byte(manifest), 0o644); err != nil {
		return err
	}
	if _, err := c.kubectl(ctx, "apply", "-f", path); err != nil {
		return err
	}
	return c.waitDeployment(ctx, "kube-system", "coredns")
}

// InstallDir is where the installed form keeps the copy of deploy/ it applied (with gen-certs.sh's output).
func (c *Cluster) InstallDir() string { return filepath.Join(c.cfg.Dir, "install") }

// installDKC installs dkc as docs/install.md says: a copy of deploy/, certificates from
// overlays/self-signed/gen-certs.sh, `kubectl apply -k` of overlays/dev (base + self-signed, with the
// locally built images). The only addition is the sidecars' trial and health timeouts when the cluster's
// Config sets them (the demo shortens the trial to show the fallback).
func (c *Cluster) installDKC(ctx context.Context) error {
	dir := c.InstallDir()
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if out, err := exec.CommandContext(ctx, "cp", "-r", filepath.Join(c.cfg.RepoRoot, "deploy"),
		filepath.Join(dir, "deploy")).CombinedOutput(); err != nil {
		return fmt.Errorf("copy deploy/: %w: %s", err, out)
	}
	if out, err := exec.CommandContext(ctx, "bash",
		filepath.Join(dir, "deploy/overlays/self-signed/gen-certs.sh")).CombinedOutput(); err != nil {
		return fmt.Errorf("gen-certs.sh: %w: %s", err, out)
	}
	var args []string
	if c.cfg.TrialDuration > 0 {
		args = append(args, "--trial-duration="+c.trialDuration())
	}
	if c.cfg.HealthTimeout > 0 {
		args = append(args, "--health-timeout="+c.healthTimeout())
	}
	var patch strings.Builder
	for _, a := range args {
		fmt.Fprintf(&patch, "      - op: add\n        path: /spec/template/spec/containers/0/args/-\n        value: %s\n", a)
	}
	k := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - deploy/overlays/dev\n"
	if patch.Len() > 0 {
		k += "patches:\n  - target:\n      kind: DaemonSet\n      name: dkc-sidecar\n    patch: |-\n" + patch.String()
	}
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(c.cfg.Progress, "installing dkc: kubectl apply -k %s (deploy/overlays/dev)\n", dir)
	if _, err := c.kubectl(ctx, "apply", "-k", dir); err != nil {
		return err
	}
	if err := c.waitDeployment(ctx, "kube-system", "dkc-server"); err != nil {
		return err
	}
	if err := c.waitDaemonSet(ctx, "kube-system", "dkc-sidecar"); err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for _, n := range c.state.Nodes {
		if err := c.WaitStatus(wctx, n.Name, func(map[string]any) bool { return true }); err != nil {
			return fmt.Errorf("sidecar of node %s never reported: %w (logs: kubectl -n kube-system logs ds/dkc-sidecar)", n.Name,
				err)
		}
	}
	return nil
}

// installedContractPaths keeps CONTRACT §6's paths meaningful in the installed form, as in the fast one:
// each real node's sidecar credential in NodeTokenPath (a token like the one its pod is given: the
// dkc-sidecar ServiceAccount, audience dkc, bound to the Node), and DKC_SERVER/DKC_SERVER_CA for the env
// file: the forwarder's loopback address (Config.DevBinary) and the CA of overlays/self-signed, whose
// certificate names 127.0.0.1 for this use (a port-forward).
func (c *Cluster) installedContractPaths(ctx context.Context) (map[string]string, error) {
	for _, n := range c.state.Nodes {
		if _, err := c.NodeToken(ctx, n.Name); err != nil {
			return nil, err
		}
	}
	if c.cfg.DevBinary == "" {
		return nil, nil
	}
	addr, err := c.startForwarder(ctx, c.cfg.DevBinary)
	if err != nil {
		return nil, err
	}
	return map[string]string{
		"DKC_SERVER":    addr,
		"DKC_SERVER_CA": filepath.Join(c.InstallDir(), "deploy/overlays/self-signed/ca.crt"),
	}, nil
}

// waitDeployment waits until every replica of the Deployment is updated and available.
func (c *Cluster) waitDeployment(ctx context.Context, ns, name string) error {
	client, err := c.Client()
	if err != nil {
		return err
	}
	return pollUntil(ctx, 3*time.Minute, fmt.Sprintf("deployment %s/%s available", ns, name),
		func(ctx context.Context) error {
			d, err := client.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			return deploymentDone(d)
		})
}

func deploymentDone(d *appsv1.Deployment) error {
	want := int32(1)
	if d.Spec.Replicas != nil {
		want = *d.Spec.Replicas
	}
	if d.Status.ObservedGeneration < d.Generation || d.Status.UpdatedReplicas != want ||
		d.Status.AvailableReplicas != want || d.Status.Replicas != want {
		return fmt.Errorf("%d/%d updated, %d available, %d total", d.Status.UpdatedReplicas, want, d.Status.AvailableReplicas,
			d.Status.Replicas)
	}
	return nil
}

// waitDaemonSet waits until the DaemonSet runs its current template, ready, on every node it should.
func (c *Cluster) waitDaemonSet(ctx context.Context, ns, name string) error {
	client, err := c.Client()
	if err != nil {
		return err
	}
	return pollUntil(ctx, 3*time.Minute, fmt.Sprintf("daemonset %s/%s ready", ns, name), func(ctx context.Context) error {
		d, err := client.AppsV1().DaemonSets(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		s := d.Status
		if s.ObservedGeneration < d.Generation || s.DesiredNumberScheduled == 0 ||
			s.UpdatedNumberScheduled != s.DesiredNumberScheduled || s.NumberReady != s.DesiredNumberScheduled {
			return fmt.Errorf("%d desired, %d updated, %d ready", s.DesiredNumberScheduled, s.UpdatedNumberScheduled,
				s.NumberReady)
		}
		return nil
	})
}

// pollUntil calls check every half second until it succeeds or timeout passes; the error names what and
// the last reason.
func pollUntil(ctx context.Context, timeout time.Duration, what string, check func(context.Context) error) error {
	var last error
	checked := func(ctx context.Context) (bool, error) {
		last = check(ctx)
		return last == nil, nil
	}
	if err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, timeout, true, checked); err != nil {
		return fmt.Errorf("waiting for %s: %w (last: %w)", what, err, last)
	}
	return nil
}

// imagesDir is where `make images` wrote the images the installed form imports: Config.ImagesDir, else
// _output/images in the repository.
func imagesDir(cfg Config) string {
	if cfg.ImagesDir != "" {
		return cfg.ImagesDir
	}
	return filepath.Join(cfg.RepoRoot, "_output", "images")
}

// ensureImages returns the image tarballs every node imports: dkc's from cfg.ImagesDir (`make images`), and
// the dev cluster's CoreDNS image, built into the cache from the pinned binary on first use.
func ensureImages(ctx context.Context, cfg Config, progress io.Writer) (map[string]string, error) {
	dir := imagesDir(cfg)
	images := map[string]string{}
	for _, name := range dkcImages {
		p := filepath.Join(dir, name+".tar")
		if _, err := os.Stat(p); err != nil {
			return nil, fmt.Errorf("image %s: %w (build the images first: make images)", name, err)
		}
		images[name] = p
	}
	bin, err := EnsureCoreDNS(ctx, cfg.RepoRoot, progress)
	if err != nil {
		return nil, err
	}
	// Named after the binary's build directory, which is keyed by the pinned module.
	tar := filepath.Join(filepath.Dir(bin), "coredns-image.tar")
	if _, err := os.Stat(tar); err != nil {
		version, err := requiredVersion(filepath.Join(cfg.RepoRoot, corednsModule.dir, "go.mod"),
			"github.com/coredns/coredns")
		if err != nil {
			return nil, err
		}
		img, err := ociimage.Build(ociimage.Spec{
			Name: "coredns", Entrypoint: []string{"/coredns"}, User: "0:0", Base: true, Arch: runtime.GOARCH,
			Files: []ociimage.File{{Path: "/coredns", Mode: 0o755, Source: bin}},
		}, ociimage.Source{Repository: "https://github.com/coredns/coredns", Revision: version, Version: version,
			Created: time.Unix(0, 0)})
		if err != nil {
			return nil, err
		}
		ref, err := name.NewTag(imageRef("coredns"))
		if err != nil {
			return nil, err
		}
		// A temporary file of this process's own: clusters starting at once may both write the image.
		tmp := fmt.Sprintf("%s.%d.tmp", tar, os.Getpid())
		if err := tarball.WriteToFile(tmp, ref, img); err != nil {
			return nil, fmt.Errorf("write CoreDNS image: %w", err)
		}
		if err := os.Rename(tmp, tar); err != nil {
			return nil, err
		}
	}
	images["coredns"] = tar
	return images, nil
}

// startInstalled is Start's second half for the installed form, after etcd and kube-apiserver; kubelets maps
// each node's kubelet minor to its binary.
func (c *Cluster) startInstalled(ctx context.Context, bins Binaries, kubelets map[string]string, rootfs string,
	images map[string]string) error {
	for _, p := range []string{bins.ControllerManager, bins.Scheduler, bins.Proxy} {
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("installed form: %w", err)
		}
	}
	if err := c.startControllerManager(ctx, bins.ControllerManager); err != nil {
		return err
	}
	if err := c.startScheduler(ctx, bins.Scheduler); err != nil {
		return err
	}
	if err := setupPodNetwork(ctx, c.state.Network, c.state.Nodes); err != nil {
		return err
	}
	for _, n := range c.state.Nodes {
		nodeBins := bins
		nodeBins.Kubelet = kubelets[n.KubeletVersion]
		if err := c.startInstalledNode(ctx, n, nodeBins, rootfs, images); err != nil {
			return err
		}
	}
	if err := c.installCoreDNS(ctx); err != nil {
		return err
	}
	if err := c.installDKC(ctx); err != nil {
		return err
	}
	env, err := c.installedContractPaths(ctx)
	if err != nil {
		return err
	}
	if err := c.writeEnv(env); err != nil {
		return err
	}
	fmt.Fprintf(c.cfg.Progress, "cluster ready, dkc installed: . %s (KUBECONFIG=%s)\n", c.EnvPath(), c.KubeconfigPath())
	return nil
}
