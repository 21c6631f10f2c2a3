// Command bench is `make bench`: dkc's scale benchmark on a real local cluster (see internal/bench). It
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

	"github.com/dkc-dev/dkc/internal/bench"
)

func main() {
	var cfg bench.Config
	fs := flag.NewFlagSet("bench", flag.ExitOnError)
	fs.StringVar(&cfg.Dir, "dir", "_output/bench", "where results.json, the cluster and the simulated nodes' directories go")
	fs.StringVar(&cfg.NodesDir, "nodes-dir", "", "where the simulated nodes' directories go (default <dir>/nodes)")
	fs.IntVar(&cfg.DiskWriters, "disk-writers", 64, "concurrent durable writes of all simulated nodes together (they share one disk); 0 is unbounded")
	fs.StringVar(&cfg.Bin, "bin", "_output/bin", "directory with dkc-server, dkc-sidecar, dkc-kubelet-check and fake-kubelet")
	fs.IntVar(&cfg.PropagationNodes, "propagation-nodes", 1000, "connected nodes when measuring propagation")
	fs.IntVar(&cfg.FanoutNodes, "fanout-nodes", 2000, "nodes sharing one ConfigMap in the fan-out and the watch comparison")
	fs.IntVar(&cfg.ScaleNodes, "scale-nodes", 5000, "connected nodes when measuring dkc-server's memory per node")
	fs.IntVar(&cfg.PropagationRate, "propagation-rate", 25, "Node source changes per second in the propagation phase")
	fs.DurationVar(&cfg.Trial, "trial", 0, "simulated nodes' trial duration before last-known-good (default 5s)")
	cpuProfile := fs.String("cpuprofile", "", "write the benchmark process's own CPU profile (the simulated nodes) to this file")
	phases := fs.String("phases", "", "comma-separated phases to run: propagation, fanout, watches, scale (default all; setup and the idle sidecar always run)")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: bench [flags]\n\nRuns dkc's scale benchmark against a real local etcd, kube-apiserver and dkc-server,\nwith thousands of simulated nodes in this process, and prints the figures with their goals.")
		fs.PrintDefaults()
	}
	bareWatch := fs.String(bench.BareWatchFlag, "", "internal: run only the propagation baseline's bare watch with this kubeconfig")
	_ = fs.Parse(os.Args[1:])
	if *bareWatch != "" {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		if err := bench.BareWatch(ctx, *bareWatch, os.Stdout); err != nil {
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
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
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
		pprof.StopCPUProfile()
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}
