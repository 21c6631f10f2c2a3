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

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// nodePackages are the Debian packages a real node needs; installed on first use when missing so that a
// fresh machine runs the cluster without manual steps.
var nodePackages = map[string]string{"containerd": "containerd", "runc": "runc"}

func ensureNodePackages(ctx context.Context, progress io.Writer) error {
	var missing []string
	for bin, pkg := range nodePackages {
		if _, err := exec.LookPath(bin); err != nil {
			missing = append(missing, pkg)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	sort.Strings(missing)
	fmt.Fprintf(progress, "installing Debian packages %v\n", missing)
	for _, args := range [][]string{{"update", "-qq"}, append([]string{"install", "-y", "-qq", "--no-install-recommends"}, missing...)} {
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
	return filepath.Join(c.NodeDir(node), "kubelet-config.yaml")
}

// NodeKubeconfigPath is the kubelet's kubeconfig (identity system:node:<name>).
func (c *Cluster) NodeKubeconfigPath(node string) string {
	return filepath.Join(c.NodeDir(node), "kubelet.kubeconfig")
}

func (c *Cluster) startNode(ctx context.Context, n NodeState, kubeletBin string) error {
	fmt.Fprintf(c.cfg.Progress, "starting node %s: containerd and kubelet (port %d, healthz %d)\n", n.Name, n.KubeletPort, n.HealthzPort)
	for _, d := range []string{c.NodeDir(n.Name), n.RootDir, n.ContainerdDir, filepath.Join(n.ContainerdDir, "cni")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("create %s: %w", d, err)
		}
	}
	sock := filepath.Join(n.ContainerdDir, "containerd.sock")
	ctrdConf := filepath.Join(n.ContainerdDir, "config.toml")
	if err := os.WriteFile(ctrdConf, []byte(containerdConfig(n.ContainerdDir, sock)), 0o644); err != nil {
		return fmt.Errorf("write containerd config: %w", err)
	}
	ctrd, err := startProcess("containerd-"+n.Name, c.runDir(), c.logFile("containerd-"+n.Name), nil, "containerd", "--config", ctrdConf)
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

	if err := writeKubeconfig(c.NodeKubeconfigPath(n.Name), c.apiServerURL(), c.pki.CAFile(), c.pki.path("node-"+n.Name+".crt"), c.pki.path("node-"+n.Name+".key")); err != nil {
		return err
	}
	if err := os.WriteFile(c.KubeletConfigPath(n.Name), []byte(kubeletConfig(n, c.pki.CAFile(), sock)), 0o644); err != nil {
		return fmt.Errorf("write kubelet config: %w", err)
	}
	kl, err := startProcess("kubelet-"+n.Name, c.runDir(), c.logFile("kubelet-"+n.Name), nil, append([]string{kubeletBin}, c.KubeletArgs(n)...)...)
	if err != nil {
		return err
	}
	c.procs = append(c.procs, kl)
	client, err := c.Client()
	if err != nil {
		return err
	}
	wctx, cancel = context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	return kl.waitFor(wctx, "registered and healthy", func(ctx context.Context) error {
		if err := httpOK(ctx, http.DefaultClient, fmt.Sprintf("http://127.0.0.1:%d/healthz", n.HealthzPort)); err != nil {
			return err
		}
		return initializeNode(ctx, client, n.Name)
	})
}

// uninitializedTaint is what a kubelet with --cloud-provider=external puts on its Node until the cloud
// controller manager has initialised it.
const uninitializedTaint = "node.cloudprovider.kubernetes.io/uninitialized"

// initializeNode does the cloud controller manager's part for a dev node: it sets the node's addresses to
// loopback (so the apiserver's node proxy, and with it `kubectl get --raw .../proxy/configz`, reaches the
// kubelet) and removes the uninitialized taint. It fails while the Node is not registered yet.
func initializeNode(ctx context.Context, client kubernetes.Interface, name string) error {
	node, err := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("node %s not registered yet", name)
	}
	if err != nil {
		return err
	}
	patch := fmt.Sprintf(`{"status":{"addresses":[{"type":"InternalIP","address":"127.0.0.1"},{"type":"Hostname","address":%q}]}}`, name)
	if _, err := client.CoreV1().Nodes().PatchStatus(ctx, name, []byte(patch)); err != nil {
		return fmt.Errorf("set addresses of node %s: %w", name, err)
	}
	var taints []corev1.Taint
	for _, t := range node.Spec.Taints {
		if t.Key != uninitializedTaint {
			taints = append(taints, t)
		}
	}
	if len(taints) == len(node.Spec.Taints) {
		return nil
	}
	node = node.DeepCopy()
	node.Spec.Taints = taints
	if _, err := client.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("remove %s taint from node %s: %w", uninitializedTaint, name, err)
	}
	return nil
}

// KubeletArgs are the kubelet's command-line flags on node n. Flags override the config file (and, later,
// dkc's dynamic config), exactly as on a production node.
func (c *Cluster) KubeletArgs(n NodeState) []string {
	return []string{
		"--config=" + c.KubeletConfigPath(n.Name),
		"--kubeconfig=" + c.NodeKubeconfigPath(n.Name),
		"--root-dir=" + n.RootDir,
		"--cert-dir=" + filepath.Join(n.RootDir, "pki"),
		"--hostname-override=" + n.Name,
		// The kubelet refuses a loopback --node-ip, so the dev cluster plays the cloud controller manager
		// for its nodes (initializeNode): the kubelet waits for it to set the node's addresses.
		"--cloud-provider=external",
		"--v=1",
	}
}

// kubeletConfig is the node's local config. cgroupsPerQOS is off so that the kubelet creates no cgroup
// hierarchy that would outlive it (the dev nodes run no pods); the rest is a production-like kubelet serving
// authenticated configz on loopback.
func kubeletConfig(n NodeState, caFile, containerdSock string) string {
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: %d
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
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
rotateCertificates: false
registerNode: true
`, n.KubeletPort, n.HealthzPort, caFile, containerdSock)
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
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), sock, sock+".ttrpc", filepath.Join(dir, "opt"), filepath.Join(dir, "cni"))
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
