// SPDX-License-Identifier: Apache-2.0

// Command dkc-dev starts and stops the local dev cluster (docs/design.md, "Local cluster"): `dkc-dev up` returns once
// etcd, kube-apiserver and the real nodes are ready and leaves them running in the background; `dkc-dev down`
// stops exactly what `up` recorded. The Makefile's `up` and `down` targets call it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/dkc-dev/dkc/test/devcluster"
)

type options struct {
	command     string
	dir         string
	kubeVersion string
	// kubeletVersions: real node → kubelet minor (a skew cluster); nodes not named run kubeVersion's.
	kubeletVersions map[string]string
	kubeBinDir      string
	nodes           []string
	serviceBin      string
	sidecarBin      string
	fakeKubelet     string
	simNodes        int
	trial           time.Duration
	installed       bool
	imagesDir       string
}

func parse(fs *flag.FlagSet, args []string) (options, error) {
	o := options{}
	fs.StringVar(&o.dir, "dir", "_output/dev", "directory for the cluster's kubeconfig, env, logs, pki and state")
	fs.StringVar(&o.kubeVersion, "kube-version", envOr("KUBE_VERSION", devcluster.DefaultKubeVersion), fmt.Sprintf(
		"Kubernetes minor version of the control plane and, unless -kubelet-versions says otherwise, of the "+
			"kubelets: %s ($KUBE_VERSION)%s",
		strings.Join(devcluster.ControlPlaneVersions(), ", "), endOfLifeNote()))
	kubeletVersions := fs.String("kubelet-versions", os.Getenv("KUBELET_VERSIONS"), fmt.Sprintf(
		"real nodes running an older kubelet than the control plane, node=minor comma-separated, e.g. "+
			"node-1=1.34,node-2=1.36; at most 3 minors older, never newer; kubelets: %s ($KUBELET_VERSIONS)",
		strings.Join(devcluster.KubeVersions(), ", ")))
	fs.StringVar(&o.kubeBinDir, "kube-bin-dir", os.Getenv("KUBE_BIN_DIR"),
		"take kube-apiserver and kubelet from this directory instead of building them ($KUBE_BIN_DIR)")
	nodes := fs.String("nodes", "", "comma-separated names of the real nodes (containerd + kubelet); default node-1, "+
		"or node-1,node-2 with -installed")
	installedDefault, _ := strconv.ParseBool(os.Getenv("INSTALLED"))
	fs.BoolVar(&o.installed, "installed", installedDefault,
		"the installed form: kube-controller-manager, kube-scheduler, kube-proxy, CNI, CoreDNS, and dkc installed from "+
			"deploy/ with kubectl apply -k as a Deployment and a DaemonSet from the images of `make images` ($INSTALLED)")
	fs.StringVar(&o.imagesDir, "images-dir", "_output/images", "with -installed: the image tarballs of `make images`")
	fs.StringVar(&o.serviceBin, "service-bin", "_output/bin/dkc-server",
		"dkc-server binary to run as the cluster's config service; empty runs none")
	fs.StringVar(&o.sidecarBin, "sidecar-bin", "_output/bin/dkc-sidecar",
		"dkc-sidecar binary; with it real nodes run their kubelet under systemd (nspawn) beside a sidecar; empty runs none")
	fs.StringVar(&o.fakeKubelet, "fake-kubelet-bin", "_output/bin/fake-kubelet", "stand-in kubelet of the simulated nodes")
	simDefault, _ := strconv.Atoi(envOr("SIM_NODES", "2"))
	fs.IntVar(&o.simNodes, "sim-nodes", simDefault, "simulated nodes ($SIM_NODES)")
	trialDefault, _ := time.ParseDuration(os.Getenv("DKC_TRIAL_DURATION"))
	fs.DurationVar(&o.trial, "trial-duration", trialDefault,
		"sidecars' --trial-duration ($DKC_TRIAL_DURATION); 0 keeps the sidecar's default (10m)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: dkc-dev [flags] up|down\n\n"+
			"  up    start etcd, kube-apiserver and the real nodes in the background; returns when ready\n"+
			"  down  stop everything up started, unmount and clean up\n\n"+
			"flags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() != 1 || (fs.Arg(0) != "up" && fs.Arg(0) != "down") {
		fs.Usage()
		return o, errors.New("expected exactly one command: up or down")
	}
	o.command = fs.Arg(0)
	if *nodes != "" {
		o.nodes = strings.Split(*nodes, ",")
	}
	var err error
	// Only up reads them: a stale $KUBELET_VERSIONS must not stop a down.
	if o.command == "up" {
		o.kubeletVersions, err = devcluster.ParseKubeletVersions(*kubeletVersions)
	}
	if err != nil {
		fmt.Fprintln(fs.Output(), err)
		return o, err
	}
	return o, nil
}

// endOfLifeNote tells why some minors of -kubelet-versions are not offered for the control plane.
func endOfLifeNote() string {
	eol := devcluster.EndOfLifeKubeVersions()
	if len(eol) == 0 {
		return ""
	}
	return fmt.Sprintf("; %s end of life: kubelets only (-kubelet-versions)", strings.Join(eol, ", "))
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func run(ctx context.Context, o options, out io.Writer) error {
	switch o.command {
	case "up":
		self, err := os.Executable()
		if err != nil {
			return err
		}
		_, err = devcluster.Start(ctx, devcluster.Config{DevBinary: self,
			Dir: o.dir, KubeVersion: o.kubeVersion, KubeletVersions: o.kubeletVersions,
			KubeBinDir: o.kubeBinDir, RealNodes: o.nodes,
			ServiceBinary: o.serviceBin, SidecarBinary: o.sidecarBin, FakeKubeletBinary: o.fakeKubelet, SimNodes: o.simNodes,
			TrialDuration: o.trial, Installed: o.installed, ImagesDir: o.imagesDir, Progress: out,
		})
		return err
	default:
		c, err := devcluster.Open(o.dir)
		if errors.Is(err, os.ErrNotExist) {
			fmt.Fprintf(out, "no dev cluster recorded in %s; nothing to stop\n", o.dir)
			return nil
		}
		if err != nil {
			return err
		}
		if err := c.Stop(ctx); err != nil {
			return err
		}
		fmt.Fprintf(out, "dev cluster in %s stopped\n", o.dir)
		return nil
	}
}

// forward is the `dkc-dev forward` command a cluster of the installed form runs in the background for
// DKC_SERVER (devcluster.Forward); not for users, so not in the usage.
func forward(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("dkc-dev forward", flag.ContinueOnError)
	var cfg devcluster.ForwardConfig
	fs.StringVar(&cfg.Kubeconfig, "kubeconfig", "", "admin kubeconfig of the cluster")
	fs.StringVar(&cfg.Namespace, "namespace", "kube-system", "namespace of the Service")
	fs.StringVar(&cfg.Service, "service", "dkc-server", "Service whose ready endpoints receive the connections")
	fs.StringVar(&cfg.PortName, "port-name", "grpc", "name of the Service's port")
	fs.StringVar(&cfg.Listen, "listen", "127.0.0.1:0", "address to listen on")
	fs.StringVar(&cfg.AddrFile, "addr-file", "", "file to write the address listened on to")
	if err := fs.Parse(args); err != nil {
		return err
	}
	return devcluster.Forward(ctx, cfg)
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "forward" {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		err := forward(ctx, os.Args[2:])
		stop()
		if err != nil {
			fmt.Fprintf(os.Stderr, "dkc-dev forward: %v\n", err)
			os.Exit(1)
		}
		return
	}
	o, err := parse(flag.NewFlagSet("dkc-dev", flag.ContinueOnError), os.Args[1:])
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err = run(ctx, o, os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "dkc-dev %s: %v\n", o.command, err)
		os.Exit(1)
	}
}
