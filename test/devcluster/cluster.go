// SPDX-License-Identifier: Apache-2.0

// Package devcluster runs a real local Kubernetes cluster for dkc's tests, `make up` and `make demo`: etcd,
// kube-apiserver with authentication and Node,RBAC authorization, and real nodes (containerd + kubelet)
// registered through their own client certificates. Every process is started here, recorded by PID and start
// time under <dir>/run, logs to <dir>/logs, and is stopped by Stop, which also unmounts what the kubelet
// mounted. Binaries come from pinned Go modules (see EnsureBinaries).
package devcluster

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/component-helpers/node/util/sysctl"
)

// Config says what cluster to run. Zero values take the defaults documented on each field.
type Config struct {
	// Dir holds everything of the cluster that a user or test reads: kubeconfig, env, logs, pki, state.
	Dir string
	// RepoRoot is the dkc checkout (for the pinned wrapper modules); found from the working directory if empty.
	RepoRoot string
	// KubeVersion selects the control plane's pinned Kubernetes minor (ControlPlaneVersions), which every
	// real node's kubelet runs too unless KubeletVersions says otherwise; default DefaultKubeVersion.
	KubeVersion string
	// KubeletVersions gives real nodes (by name) a kubelet minor of their own (KubeVersions), at most three
	// minors older than KubeVersion and never newer, as the version skew policy allows: a skew cluster.
	// Only the kubelet of such a minor is built (EnsureKubelet). The installed form's nodes keep the
	// control plane's kube-proxy, which the policy allows beside an older kubelet.
	KubeletVersions map[string]string
	// KubeBinDir, if set, supplies kube-apiserver and kubelet (and optionally etcd) instead of building them;
	// kubelets of KubeletVersions other than KubeVersion are still built.
	KubeBinDir string
	// RealNodes are the names of nodes that run a real containerd and kubelet; nil means ["node-1"], an
	// empty slice none.
	RealNodes []string
	// ServiceBinary, if set, is the dkc-server binary to run as the cluster's config service.
	ServiceBinary string
	// ServiceArgs are extra dkc-server flags (the benchmark raises its apiserver QPS).
	ServiceArgs []string
	// SidecarBinary, if set (with ServiceBinary), runs each real node's kubelet as a unit of a real systemd
	// (systemd-nspawn) with the dkc sidecar beside it, and SimNodes simulated nodes. Its helpers, one
	// dkc-kubelet-check-<minor> per kubelet minor (internal/kubeletcheck/build.sh), must be in the same
	// directory (KubeletCheckDir).
	SidecarBinary string
	// SimNodes is the number of simulated nodes: a Node object, a stand-in kubelet and the real sidecar code
	// in signal mode, each with its own directory. Needs SidecarBinary and FakeKubeletBinary.
	SimNodes          int
	FakeKubeletBinary string
	// TrialDuration is the sidecars' --trial-duration (DKC_TRIAL_DURATION); default 10m.
	TrialDuration time.Duration
	// SimTrialDuration is the simulated nodes' --trial-duration; default TrialDuration. Rollouts over many
	// simulated nodes wait out a trial per batch.
	SimTrialDuration time.Duration
	// HealthTimeout is the sidecars' --health-timeout; default 60s.
	HealthTimeout time.Duration
	// NoKubeletStartLimit gives the real nodes' kubelet.service kubeadm's StartLimitIntervalSec=0 (no start
	// limit); by default the unit keeps systemd's (5 starts in 10 s), as many distributions' units do.
	NoKubeletStartLimit bool
	// KubeletDropIns, if not empty, are the files (name → content) of the real nodes' kubelet --config-dir,
	// a directory of its own per node (KubeletConfigDir), which the kubelet merges over its --config; not in
	// the Installed form. Kubelet v1.34 loses the local config's empty enforceNodeAllocatable when it merges
	// drop-ins, so one of them must set it again (see test/integration/dropin_test.go).
	KubeletDropIns map[string]string
	// Installed runs the cluster as users run one and dkc as users install it (installed.go): a control
	// plane with kube-controller-manager and kube-scheduler; every real node a whole machine under its own
	// systemd with containerd, the kubelet, kube-proxy, CNI pod networking; cluster DNS; dkc's images imported
	// into every node and deploy/ applied with `kubectl apply -k`. ServiceBinary, SidecarBinary and SimNodes
	// are ignored. RealNodes nil means ["node-1", "node-2"].
	Installed bool
	// ImagesDir holds the image tarballs of `make images` (<name>.tar for dkc-server, dkc-sidecar, pause);
	// Installed only.
	ImagesDir string
	// DevBinary is the dkc-dev program (hack/dkc-dev). Installed only: its `forward` command serves
	// DKC_SERVER in the env file, an address on the host's loopback that reaches a ready dkc-server pod
	// (Forward). Empty: the env file has no DKC_SERVER.
	DevBinary string
	// Progress receives one line per step; nil discards.
	Progress io.Writer
}

// State is what a running cluster recorded about itself in <Dir>/state.json; Open reads it back.
type State struct {
	KubeVersion   string         `json:"kubeVersion"`
	APIServerPort int            `json:"apiServerPort"`
	EtcdPort      int            `json:"etcdPort"`
	RuntimeDir    string         `json:"runtimeDir"`
	Network       Network        `json:"network"`
	Nodes         []NodeState    `json:"nodes"`
	Service       *ServiceState  `json:"service,omitempty"`
	SimNodes      []SimNodeState `json:"simNodes,omitempty"`
	// Installed is the installed form (Config.Installed); PodCIDR its pod range, split between the nodes.
	Installed bool   `json:"installed,omitempty"`
	PodCIDR   string `json:"podCIDR,omitempty"`
	// KubeletCheckDir holds the dkc-kubelet-check-<minor> helpers the nodes' sidecars run (see
	// Cluster.KubeletCheckDir).
	KubeletCheckDir string `json:"kubeletCheckDir,omitempty"`
	// PortBlock is the first port of the block the cluster leased (ports.go); PortNext the next one to
	// hand out. 0 in a state.json from before blocks.
	PortBlock int `json:"portBlock,omitempty"`
	PortNext  int `json:"portNext,omitempty"`
}

// NodeState describes one real node.
type NodeState struct {
	Name string `json:"name"`
	// IP is the node's address on the cluster bridge (its --node-ip); Netns its network namespace.
	IP       string `json:"ip"`
	Netns    string `json:"netns"`
	HostVeth string `json:"hostVeth"`
	// KubeletVersion is the minor of the node's kubelet ("1.34"): the control plane's unless
	// Config.KubeletVersions gave it another. Empty in a state.json from before version skew: KubeVersion.
	KubeletVersion string `json:"kubeletVersion,omitempty"`
	// Systemd: the kubelet runs as a unit of the node's own systemd (nspawn), with the sidecar beside it.
	Systemd            bool `json:"systemd,omitempty"`
	SidecarMetricsPort int  `json:"sidecarMetricsPort,omitempty"`
	KubeletPort        int  `json:"kubeletPort"`
	HealthzPort        int  `json:"healthzPort"`
	// RootDir is the kubelet's --root-dir; ContainerdDir holds containerd's root, state and socket. Both sit
	// under the short RuntimeDir because unix socket paths are limited to 108 bytes.
	RootDir       string `json:"rootDir"`
	ContainerdDir string `json:"containerdDir"`
	// PodCIDR is the node's pod subnet (installed form).
	PodCIDR string `json:"podCIDR,omitempty"`
}

// Cluster is a started (or opened) dev cluster.
type Cluster struct {
	cfg   Config
	state State
	pki   *pki
	procs []*process // in start order
	// portMu guards the state's PortNext (freePorts).
	portMu sync.Mutex
}

const processGrace = 15 * time.Second

// Start brings the cluster up and returns when the apiserver is ready and every real node is registered and
// healthy. On error everything already started is stopped again.
func Start(ctx context.Context, cfg Config) (c *Cluster, err error) {
	if cfg.Dir == "" {
		return nil, errors.New("devcluster: Config.Dir is required")
	}
	if cfg.Dir, err = filepath.Abs(cfg.Dir); err != nil {
		return nil, err
	}
	if cfg.KubeVersion == "" {
		cfg.KubeVersion = DefaultKubeVersion
	}
	if err := checkControlPlaneVersion(cfg.KubeVersion); err != nil {
		return nil, err
	}
	if cfg.RealNodes == nil {
		cfg.RealNodes = []string{"node-1"}
		if cfg.Installed {
			cfg.RealNodes = []string{"node-1", "node-2"}
		}
	}
	if cfg.Installed {
		if len(cfg.RealNodes) == 0 || len(cfg.RealNodes) > maxInstalledNodes {
			return nil, fmt.Errorf("the installed form runs 1 to %d real nodes, not %d", maxInstalledNodes, len(cfg.RealNodes))
		}
		cfg.ServiceBinary, cfg.SidecarBinary, cfg.SimNodes = "", "", 0
	}
	if err := checkKubeletVersions(cfg.KubeVersion, cfg.RealNodes, cfg.KubeletVersions); err != nil {
		return nil, err
	}
	if cfg.Progress == nil {
		cfg.Progress = io.Discard
	}
	if cfg.RepoRoot == "" {
		wd, _ := os.Getwd()
		if cfg.RepoRoot, err = RepoRoot(wd); err != nil {
			return nil, err
		}
	}
	if _, err := os.Stat(filepath.Join(cfg.Dir, "state.json")); err == nil {
		return nil, fmt.Errorf("a dev cluster already runs in %s (stop it first: make down)", cfg.Dir)
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("the dev cluster runs a real kubelet and containerd and must run as root")
	}
	bins, err := EnsureBinaries(ctx, cfg.RepoRoot, cfg.KubeVersion, cfg.KubeBinDir, cfg.Progress)
	if err != nil {
		return nil, err
	}
	kubelets, err := ensureKubelets(ctx, cfg, bins.Kubelet)
	if err != nil {
		return nil, err
	}
	if err := ensurePackages(ctx, nodePackages, cfg.Progress); err != nil {
		return nil, err
	}
	var images map[string]string
	if cfg.Installed {
		if err := ensurePackages(ctx, installedPackages, cfg.Progress); err != nil {
			return nil, err
		}
		if images, err = ensureImages(ctx, cfg, cfg.Progress); err != nil {
			return nil, err
		}
	}
	if len(cfg.RealNodes) > 0 {
		if _, err := ProvisionKernel(sysctl.New(), cfg.Progress); err != nil {
			return nil, err
		}
		if _, err := ProvisionInotify(sysctl.New(), cfg.Progress); err != nil {
			return nil, err
		}
	}
	var rootfs string
	if (cfg.SidecarBinary != "" || cfg.Installed) && len(cfg.RealNodes) > 0 {
		if rootfs, err = EnsureRootfs(ctx, cfg.Progress); err != nil {
			return nil, err
		}
	}

	c = &Cluster{cfg: cfg}
	defer func() {
		if err != nil {
			if stopErr := c.Stop(context.Background()); stopErr != nil {
				err = fmt.Errorf("%w (and stopping what had started: %w)", err, stopErr)
			}
		}
	}()
	if err := c.allocate(); err != nil {
		return c, err
	}
	if c.pki, err = loadOrCreatePKI(filepath.Join(cfg.Dir, "pki")); err != nil {
		return c, err
	}
	if err := c.issueCertificates(); err != nil {
		return c, err
	}
	// Recorded before anything is created, so that Stop (or a later `make down`) can undo a partial start.
	if err := c.writeState(); err != nil {
		return c, err
	}
	if err := createBridge(ctx, c.state.Network); err != nil {
		return c, err
	}
	for _, n := range c.state.Nodes {
		if err := createNodeNetns(ctx, c.state.Network, n.Netns, n.HostVeth, n.IP); err != nil {
			return c, err
		}
	}
	// A fresh cluster each time: objects of an earlier run (Nodes, ConfigMaps) would confuse tests and demos,
	// and so would a node's checkpoints and kubelet.env, which name configs of the old cluster (and its ports).
	for _, d := range []string{"etcd", "nodes", "logs"} {
		if err := os.RemoveAll(filepath.Join(cfg.Dir, d)); err != nil {
			return c, err
		}
	}
	if err := c.startEtcd(ctx, bins.Etcd); err != nil {
		return c, err
	}
	if err := c.startAPIServer(ctx, bins.APIServer); err != nil {
		return c, err
	}
	if cfg.Installed {
		return c, c.startInstalled(ctx, bins, kubelets, rootfs, images)
	}
	for _, n := range c.state.Nodes {
		if err := c.startNode(ctx, n, kubelets[n.KubeletVersion], rootfs); err != nil {
			return c, err
		}
	}
	env := map[string]string{}
	if cfg.ServiceBinary != "" {
		if err := c.startService(ctx, cfg.ServiceBinary); err != nil {
			return c, err
		}
		env["DKC_SERVER"] = c.ServiceAddress()
		env["DKC_SERVER_CA"] = c.CAFile()
		env["DKC_METRICS"] = c.MetricsAddress()
		if cfg.SidecarBinary != "" {
			if err := c.startSidecars(ctx); err != nil {
				return c, err
			}
		}
	}
	if err := c.writeEnv(env); err != nil {
		return c, err
	}
	fmt.Fprintf(cfg.Progress, "cluster ready: . %s (KUBECONFIG=%s)\n", c.EnvPath(), c.KubeconfigPath())
	return c, nil
}

// ensureKubelets returns minor → kubelet binary for every minor the real nodes run: the control plane's
// (cpKubelet, already built with it) and each other one of cfg.KubeletVersions (built alone).
func ensureKubelets(ctx context.Context, cfg Config, cpKubelet string) (map[string]string, error) {
	kubelets := map[string]string{cfg.KubeVersion: cpKubelet}
	for _, minor := range cfg.KubeletVersions {
		if _, ok := kubelets[minor]; ok {
			continue
		}
		bin, err := EnsureKubelet(ctx, cfg.RepoRoot, minor, cfg.Progress)
		if err != nil {
			return nil, err
		}
		kubelets[minor] = bin
	}
	return kubelets, nil
}

// Open returns the cluster recorded in dir, for stopping it or talking to it from another process.
func Open(dir string) (*Cluster, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile(filepath.Join(dir, "state.json"))
	if err != nil {
		return nil, fmt.Errorf("open dev cluster in %s: %w", dir, err)
	}
	c := &Cluster{cfg: Config{Dir: dir, Progress: io.Discard}, pki: &pki{dir: filepath.Join(dir, "pki")}}
	if err := json.Unmarshal(data, &c.state); err != nil {
		return nil, fmt.Errorf("decode %s/state.json: %w", dir, err)
	}
	return c, nil
}

// Stop stops every process of the cluster by recorded PID, newest first, unmounts what kubelets mounted,
// and removes the runtime directories and the state file. It is safe to call on a partly started cluster
// and twice.
func (c *Cluster) Stop(ctx context.Context) error {
	var errs []error
	names := c.processNames()
	for i := len(names) - 1; i >= 0; i-- {
		p, err := loadProcess(names[i], c.runDir())
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if p == nil {
			continue
		}
		// The apiserver has been seen ignoring SIGTERM for 15s+; stop it with a shorter grace.
		if err := p.stop(processGrace); err != nil {
			errs = append(errs, err)
		}
	}
	for _, n := range c.state.Nodes {
		if n.Systemd || c.state.Installed {
			if err := removeNodeCgroups(n); err != nil {
				errs = append(errs, err)
			}
		}
		if err := unmountUnder(n.RootDir); err != nil {
			errs = append(errs, err)
		}
		if err := unmountUnder(n.ContainerdDir); err != nil {
			errs = append(errs, err)
		}
	}
	for _, n := range c.state.Nodes {
		if err := deleteNetns(ctx, n.Netns); err != nil {
			errs = append(errs, err)
		}
	}
	if err := deleteBridge(ctx, c.state.Network.Bridge); err != nil {
		errs = append(errs, err)
	}
	if c.state.RuntimeDir != "" {
		if err := os.RemoveAll(c.state.RuntimeDir); err != nil {
			errs = append(errs, fmt.Errorf("remove runtime dir %s: %w", c.state.RuntimeDir, err))
		}
	}
	if len(errs) == 0 {
		_ = os.Remove(filepath.Join(c.cfg.Dir, "state.json"))
		releasePortBlock(c.cfg.Dir, c.state.PortBlock)
	}
	return errors.Join(errs...)
}

// processNames lists every process the cluster may run, in start order.
func (c *Cluster) processNames() []string {
	names := []string{"etcd", "kube-apiserver"}
	if c.state.Installed {
		names = append(names, "kube-controller-manager", "kube-scheduler")
	}
	for _, n := range c.state.Nodes {
		names = append(names, "containerd-"+n.Name, "kubelet-"+n.Name, "node-"+n.Name)
	}
	names = append(names, "dkc-server", "dkc-server-forward")
	for _, s := range c.state.SimNodes {
		names = append(names, "kubelet-"+s.Name, "dkc-sidecar-"+s.Name)
	}
	return names
}

// Dir is the cluster's directory.
func (c *Cluster) Dir() string { return c.cfg.Dir }

// State returns what the cluster recorded about itself.
func (c *Cluster) State() State { return c.state }

// KubeVersion is the control plane's minor ("1.37").
func (c *Cluster) KubeVersion() string { return c.state.KubeVersion }

// KubeletVersion is the minor of node's kubelet ("1.34"): a real node's, or for a simulated node the
// kubelet code its stand-in runs; "" for a node the cluster does not have.
func (c *Cluster) KubeletVersion(node string) string {
	for _, n := range c.state.Nodes {
		if n.Name == node {
			if n.KubeletVersion == "" {
				return c.state.KubeVersion
			}
			return n.KubeletVersion
		}
	}
	for _, s := range c.state.SimNodes {
		if s.Name == node {
			return s.KubeletVersion
		}
	}
	return ""
}

// KubeletVersions maps every real node to its kubelet's minor.
func (c *Cluster) KubeletVersions() map[string]string {
	versions := make(map[string]string, len(c.state.Nodes))
	for _, n := range c.state.Nodes {
		versions[n.Name] = c.KubeletVersion(n.Name)
	}
	return versions
}

// KubeconfigPath is the admin kubeconfig (docs/design.md, "Local cluster": _output/dev/kubeconfig for `make up`).
func (c *Cluster) KubeconfigPath() string { return filepath.Join(c.cfg.Dir, "kubeconfig") }

// LogDir holds one log file per process.
func (c *Cluster) LogDir() string { return filepath.Join(c.cfg.Dir, "logs") }

// NodeDir is where node-specific files live: _output/dev/nodes/<name>.
func (c *Cluster) NodeDir(name string) string { return filepath.Join(c.cfg.Dir, "nodes", name) }

// CAFile is the cluster CA certificate.
func (c *Cluster) CAFile() string { return c.pki.CAFile() }

// RESTConfig is an admin client configuration.
func (c *Cluster) RESTConfig() (*rest.Config, error) {
	return clientcmd.BuildConfigFromFlags("", c.KubeconfigPath())
}

// Client is an admin clientset.
func (c *Cluster) Client() (kubernetes.Interface, error) {
	cfg, err := c.RESTConfig()
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(cfg)
}

func (c *Cluster) runDir() string { return filepath.Join(c.cfg.Dir, "run") }

func (c *Cluster) logFile(name string) string { return filepath.Join(c.LogDir(), name+".log") }

func (c *Cluster) writeState() error {
	data, err := json.MarshalIndent(c.state, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(c.cfg.Dir, 0o755); err != nil {
		return fmt.Errorf("create cluster dir %s: %w", c.cfg.Dir, err)
	}
	return os.WriteFile(filepath.Join(c.cfg.Dir, "state.json"), data, 0o644)
}

// allocate picks free loopback ports and the runtime directories.
func (c *Cluster) allocate() error {
	// A short, per-cluster runtime dir: two clusters (make up and a test run) never share kubelet or
	// containerd state, and socket paths stay far below the 108-byte limit.
	id := shortHash(c.cfg.Dir)
	block, err := leasePortBlock(c.cfg.Dir)
	if err != nil {
		return err
	}
	k, err := pickSubnet(block)
	if err != nil {
		return err
	}
	c.state = State{PortBlock: block}
	ports, err := c.freePorts(2 + 3*len(c.cfg.RealNodes))
	if err != nil {
		return err
	}
	c.state = State{
		PortBlock:     block,
		PortNext:      c.state.PortNext,
		KubeVersion:   c.cfg.KubeVersion,
		EtcdPort:      ports[0],
		APIServerPort: ports[1],
		RuntimeDir:    filepath.Join(runtimeRoot, id),
		// Interface names are limited to 15 bytes.
		Network:   Network{Bridge: "dkcbr" + id[:8], GatewayIP: fmt.Sprintf("198.18.%d.1", k), PrefixLen: 24},
		Installed: c.cfg.Installed,
	}
	if c.cfg.Installed {
		c.state.PodCIDR, _ = podSubnets(k, 0)
		if c.state.KubeletCheckDir, err =
			filepath.Abs(filepath.Join(imagesDir(c.cfg), "bin", "linux_"+runtime.GOARCH)); err != nil {
			return err
		}
	} else if c.cfg.SidecarBinary != "" {
		if c.state.KubeletCheckDir, err = filepath.Abs(filepath.Dir(c.cfg.SidecarBinary)); err != nil {
			return err
		}
	}
	if c.cfg.ServiceBinary != "" {
		sp, err := c.freePorts(3)
		if err != nil {
			return err
		}
		c.state.Service = &ServiceState{Port: sp[0], MetricsPort: sp[1], WebhookPort: sp[2]}
	}
	for i, name := range c.cfg.RealNodes {
		kubelet := c.cfg.KubeVersion
		if v, ok := c.cfg.KubeletVersions[name]; ok {
			kubelet = v
		}
		c.state.Nodes = append(c.state.Nodes, NodeState{
			Name:               name,
			IP:                 fmt.Sprintf("198.18.%d.%d", k, 10+i),
			Netns:              fmt.Sprintf("dkc-%s-%s", id[:8], name),
			HostVeth:           fmt.Sprintf("dkc%s%d", id[:8], i),
			KubeletPort:        ports[2+3*i],
			HealthzPort:        ports[3+3*i],
			SidecarMetricsPort: ports[4+3*i],
			KubeletVersion:     kubelet,
			Systemd:            c.cfg.SidecarBinary != "" || c.cfg.Installed,
			RootDir:            filepath.Join(c.state.RuntimeDir, name, "kubelet"),
			ContainerdDir:      filepath.Join(c.state.RuntimeDir, name, "containerd"),
		})
		if c.cfg.Installed {
			// A whole machine in its own network namespace: the kubelet's default ports.
			nd := &c.state.Nodes[i]
			_, nd.PodCIDR = podSubnets(k, i)
			nd.KubeletPort, nd.HealthzPort = 10250, 10248
		}
	}
	return nil
}

func (c *Cluster) issueCertificates() error {
	loopback := []net.IP{net.ParseIP(c.state.Network.GatewayIP), net.IPv4(127, 0, 0, 1), net.IPv6loopback,
		net.IPv4(10, 0, 0, 1)}
	dns := []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
		"kubernetes.default.svc.cluster.local"}
	// The serving certificate names the bridge address, which may differ between runs: issue it anew.
	if err := c.pki.remove("apiserver"); err != nil {
		return err
	}
	if err := c.pki.issue("apiserver", "kube-apiserver", nil, x509.ExtKeyUsageServerAuth, loopback, dns); err != nil {
		return err
	}
	if err := c.pki.issue("admin", "dkc-admin", []string{"system:masters"}, x509.ExtKeyUsageClientAuth, nil,
		nil); err != nil {
		return err
	}
	if err := c.pki.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client", nil, x509.ExtKeyUsageClientAuth,
		nil, nil); err != nil {
		return err
	}
	for _, n := range c.state.Nodes {
		// The Node authorizer and NodeRestriction recognise a kubelet by exactly this identity.
		if err := c.pki.issue("node-"+n.Name, "system:node:"+n.Name, []string{"system:nodes"}, x509.ExtKeyUsageClientAuth,
			nil, nil); err != nil {
			return err
		}
	}
	if _, err := c.pki.serviceAccountKey(); err != nil {
		return err
	}
	if c.cfg.Installed {
		if err := c.issueControlPlaneCertificates(); err != nil {
			return err
		}
	}
	return writeKubeconfig(c.KubeconfigPath(), c.apiServerURL(), c.pki.CAFile(), c.pki.path("admin.crt"),
		c.pki.path("admin.key"))
}

func (c *Cluster) apiServerURL() string {
	return fmt.Sprintf("https://%s:%d", c.state.Network.GatewayIP, c.state.APIServerPort)
}

func (c *Cluster) startEtcd(ctx context.Context, bin string) error {
	fmt.Fprintf(c.cfg.Progress, "starting etcd on 127.0.0.1:%d\n", c.state.EtcdPort)
	peer, err := c.freePorts(1)
	if err != nil {
		return err
	}
	client := fmt.Sprintf("http://127.0.0.1:%d", c.state.EtcdPort)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", peer[0])
	p, err := startProcess("etcd", c.runDir(), c.logFile("etcd"), nil, bin,
		"--name=dkc-dev",
		"--data-dir="+filepath.Join(c.cfg.Dir, "etcd"),
		"--listen-client-urls="+client, "--advertise-client-urls="+client,
		"--listen-peer-urls="+peerURL, "--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=dkc-dev="+peerURL,
		"--log-level=warn",
	)
	if err != nil {
		return err
	}
	c.procs = append(c.procs, p)
	return c.waitReady(ctx, p)
}

// waitReady waits until a control-plane process serves: etcd healthy, kube-apiserver ready, dkc-server
// SERVING (its caches synced). Other processes only need to be running. Used at start and by Restart.
func (c *Cluster) waitReady(ctx context.Context, p *process) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	switch p.name {
	case "etcd":
		url := fmt.Sprintf("http://127.0.0.1:%d/health", c.state.EtcdPort)
		return p.waitFor(ctx, "healthy", func(ctx context.Context) error { return httpOK(ctx, http.DefaultClient, url) })
	case "kube-apiserver":
		client, err := c.Client()
		if err != nil {
			return err
		}
		return p.waitFor(ctx, "ready", func(ctx context.Context) error {
			_, err := client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
			return err
		})
	case "dkc-server":
		conn, err := c.DialService()
		if err != nil {
			return err
		}
		defer conn.Close()
		hc := healthpb.NewHealthClient(conn)
		return p.waitFor(ctx, "serving", func(ctx context.Context) error {
			resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
			if err != nil {
				return err
			}
			if resp.Status != healthpb.HealthCheckResponse_SERVING {
				return fmt.Errorf("health %s", resp.Status)
			}
			return nil
		})
	}
	return nil
}

func (c *Cluster) startAPIServer(ctx context.Context, bin string) error {
	fmt.Fprintf(c.cfg.Progress, "starting kube-apiserver v%s on %s:%d\n", c.cfg.KubeVersion, c.state.Network.GatewayIP,
		c.state.APIServerPort)
	sa := c.pki.path("sa.key")
	p, err := startProcess("kube-apiserver", c.runDir(), c.logFile("kube-apiserver"), nil, bin,
		fmt.Sprintf("--etcd-servers=http://127.0.0.1:%d", c.state.EtcdPort),
		"--bind-address="+c.state.Network.GatewayIP,
		"--advertise-address="+c.state.Network.GatewayIP,
		fmt.Sprintf("--secure-port=%d", c.state.APIServerPort),
		"--tls-cert-file="+c.pki.path("apiserver.crt"),
		"--tls-private-key-file="+c.pki.path("apiserver.key"),
		"--client-ca-file="+c.pki.CAFile(),
		"--anonymous-auth=false",
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file="+sa,
		"--service-account-signing-key-file="+sa,
		"--api-audiences=https://kubernetes.default.svc.cluster.local",
		"--service-cluster-ip-range=10.0.0.0/24",
		// Node names do not resolve; the node proxy (configz) reaches kubelets by their InternalIP.
		"--kubelet-preferred-address-types=InternalIP",
		"--kubelet-client-certificate="+c.pki.path("apiserver-kubelet-client.crt"),
		"--kubelet-client-key="+c.pki.path("apiserver-kubelet-client.key"),
		"--allow-privileged=true",
		"--profiling=true",
		// Webhooks and aggregated APIs are reached at their endpoints' pod IPs (routed to the nodes), not
		// through a Service IP, which only kube-proxy on the nodes implements.
		"--enable-aggregator-routing=true",
	)
	if err != nil {
		return err
	}
	c.procs = append(c.procs, p)
	if err := c.waitReady(ctx, p); err != nil {
		return err
	}
	client, err := c.Client()
	if err != nil {
		return err
	}
	// Let the apiserver act on kubelets (logs, exec, the configz proxy) as kubeadm sets it up.
	_, err = client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "dkc-dev:apiserver-kubelet-admin"},
		RoleRef: rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole",
			Name: "system:kubelet-api-admin"},
		Subjects: []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "User",
			Name: "kube-apiserver-kubelet-client"}},
	}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("bind kubelet-api-admin for the apiserver: %w", err)
	}
	return nil
}

func httpOK(ctx context.Context, client *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s: %s", url, resp.Status, strings.TrimSpace(string(body)))
	}
	return nil
}

// EnvPath is the shell-sourceable file of docs/design.md, "Local cluster" (`. _output/dev/env`).
func (c *Cluster) EnvPath() string { return filepath.Join(c.cfg.Dir, "env") }

// writeEnv writes EnvPath with KUBECONFIG plus extra KEY=VALUE pairs from the parts that joined the cluster.
func (c *Cluster) writeEnv(extra map[string]string) error {
	var b strings.Builder
	fmt.Fprintf(&b, "export KUBECONFIG=%s\n", c.KubeconfigPath())
	keys := make([]string, 0, len(extra))
	for k := range extra {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "export %s=%s\n", k, extra[k])
	}
	return os.WriteFile(c.EnvPath(), []byte(b.String()), 0o644)
}

// KubeletCheckDir is the directory of the helpers the nodes' sidecars run, one dkc-kubelet-check-<minor>
// per kubelet minor, for kubectl-dkc diff's --kubelet-check-dir: the sidecar binary's directory, or in the
// installed form the binaries `make images` put into the images (<ImagesDir>/bin/linux_<arch>). "" when the
// cluster runs no sidecars.
func (c *Cluster) KubeletCheckDir() string { return c.state.KubeletCheckDir }

// kubeletCheckPrefix names the helpers in KubeletCheckDir: dkc-kubelet-check-1.34 … (one per kubelet minor).
const kubeletCheckPrefix = "dkc-kubelet-check-"

// kubeletChecks lists the helpers in dir: minor → path.
func kubeletChecks(dir string) (map[string]string, error) {
	paths, err := filepath.Glob(filepath.Join(dir, kubeletCheckPrefix+"*"))
	if err != nil {
		return nil, err
	}
	checks := map[string]string{}
	for _, p := range paths {
		if fi, err := os.Stat(p); err != nil || !fi.Mode().IsRegular() {
			continue
		}
		minor := strings.TrimPrefix(filepath.Base(p), kubeletCheckPrefix)
		if _, _, err := parseMinor(minor); err == nil {
			checks[minor] = p
		}
	}
	return checks, nil
}
