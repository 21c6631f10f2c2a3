// SPDX-License-Identifier: Apache-2.0

// Command bench is `make bench`: dkc's scale benchmark on a real local cluster (see test/bench). It
// prints a table and writes <dir>/results.json. It must run as root (the dev cluster does).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime/debug"
	"runtime/pprof"
	"strings"
	"syscall"

	"github.com/dkc-dev/dkc/test/bench"
)

func main() {
	var cfg bench.Config
	fs := flag.NewFlagSet("bench", flag.ExitOnError)
	fs.StringVar(&cfg.Dir, "dir", "_output/bench",
		"where results.json, the cluster and the simulated nodes' directories go")
	fs.StringVar(&cfg.NodesDir, "nodes-dir", "",
		"where the simulated nodes' directories go (default: "+bench.DiskSimulated+": /dev/shm/dkc-bench-nodes; "+
			bench.DiskShared+": <dir>/nodes)")
	fs.StringVar(&cfg.Disk, "disk", bench.DiskSimulated,
		"the simulated nodes' disk: "+bench.DiskSimulated+" (their directories on tmpfs, each fsync costing one of this "+
			"disk's fsync latencies, measured at start: every node its own disk) or "+bench.DiskShared+" (all on this one "+
			"disk, with etcd)")
	fs.IntVar(&cfg.DiskWriters, "disk-writers", 0,
		"concurrent durable writes of all simulated nodes together; 0: 64 with -disk="+bench.DiskShared+", unbounded with "+
			"-disk="+bench.DiskSimulated+"; negative: unbounded")
	fs.StringVar(&cfg.Deployment, "deployment", "deploy/base/server.yaml",
		"the shipped dkc-server manifest: dkc-server runs with its flags (less its ports and files) throughout and its "+
			"GOMEMLIMIT in the scale phases; its memory limit, if under 1 GiB, is the goal of the peak")
	fs.StringVar(&cfg.APF, "apf", "deploy/base/server-apf.yaml",
		"the shipped FlowSchema and PriorityLevelConfiguration, installed with their subject "+
			"the dev cluster's dkc-server user")
	fs.StringVar(&cfg.Bin, "bin", "_output/bin",
		"directory with dkc-server, dkc-sidecar, the dkc-kubelet-check-<minor> helpers and fake-kubelet")
	fs.IntVar(&cfg.PropagationNodes, "propagation-nodes", 1000, "connected nodes when measuring propagation")
	fs.IntVar(&cfg.FanoutNodes, "fanout-nodes", 2000,
		"nodes sharing one ConfigMap in the fan-out and the watch comparison")
	fs.IntVar(&cfg.ScaleNodes, "scale-nodes", 5000, "connected nodes when measuring dkc-server's memory per node")
	fs.IntVar(&cfg.MaxNodes, "max-nodes", 10000, "simulated nodes created (Node, token, directory), and connected "+
		"to one replica in the max phase")
	fs.IntVar(&cfg.NodeObjects, "node-objects", 0, "Node objects created in setup (default and at least -max-nodes): "+
		"those beyond -max-nodes carry no config source and never connect; setup reports what a Node object costs the "+
		"apiserver and dkc-server (apiserver_rss_growth_bytes_per_node_object): raise it where a bigger machine holds "+
		"more, e.g. 65000")
	fs.IntVar(&cfg.ReplicaNodes, "replica-nodes", 0, "nodes the replicas phase connects through a load balancer to "+
		"two replicas, one killed mid-fan-out (at most -max-nodes; default -max-nodes, or the most this process's "+
		"open-file limit allows at 3 descriptors a node; raise both on a bigger machine, with ulimit -Hn)")
	fs.IntVar(&cfg.Repetitions, "repetitions", 3,
		"repetitions of the propagation measurement (the goal is held on the worst)")
	fs.IntVar(&cfg.PropagationRate, "propagation-rate", 25, "Node source changes per second in the propagation phase")
	fs.DurationVar(&cfg.Trial, "trial", 0, "simulated nodes' trial duration before last-known-good (default 5s)")
	cpuProfile := fs.String("cpuprofile", "",
		"write the benchmark process's own CPU profile (the simulated nodes) to this file")
	fs.IntVar(&cfg.PoolNodes, "pool-nodes", 2000, "nodes the pool phase's KubeletConfigPool selects (at most -max-nodes)")
	fs.BoolVar(&cfg.PoolGatesOff, "pool-gates-off", false, "roll the pool phase's pool out with its workload gates "+
		"off (drain Never, podReadinessTimeout 0s) instead of on (drain Allowed, podReadinessTimeout 5m): run both to "+
		"compare pool_seconds_per_batch")
	phases := fs.String("phases", "", "comma-separated phases to run: idle, propagation, fanout, watches, scale, max, "+
		"pool, replicas (default all, in that order; setup always runs)")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: bench [flags]\n\n"+
			"Runs dkc's scale benchmark against a real local etcd, kube-apiserver and dkc-server,\n"+
			"with thousands of simulated nodes in this process, and prints the figures with their goals.")
		fs.PrintDefaults()
	}
	bareWatch := fs.String(bench.BareWatchFlag, "",
		"internal: run only the propagation baseline's bare watch with this kubeconfig")
	_ = fs.Parse(os.Args[1:])
	if *bareWatch != "" {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		err := bench.BareWatch(ctx, *bareWatch, os.Stdout)
		stop()
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench: bare watch:", err)
			os.Exit(1)
		}
		return
	}
	if *phases != "" {
		cfg.Phases = strings.Split(*phases, ",")
	}
	if os.Getenv("GOGC") == "" {
		// Thousands of simulated nodes share this process's heap; each real sidecar has its own. Collecting
		// less often keeps the collector's share of 2 cores from delaying the nodes (memory is plentiful).
		debug.SetGCPercent(400)
	}
	cfg.Progress = os.Stderr
	os.Exit(run(cfg, *cpuProfile))
}

// run runs the benchmark and returns the exit code, once its deferred calls have run.
func run(cfg bench.Config, cpuProfile string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	if cpuProfile != "" {
		f, err := os.Create(cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			return 1
		}
		defer pprof.StopCPUProfile()
	}
	res, err := bench.Run(ctx, cfg)
	if res != nil {
		res.Table(os.Stdout)
		if path, werr := res.WriteJSON(cfg.Dir); werr == nil {
			fmt.Println("results:", path)
		} else {
			fmt.Fprintln(os.Stderr, "bench: write results:", werr)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	return 0
}
