// SPDX-License-Identifier: Apache-2.0

// Package bench is dkc's scale benchmark (`make bench`). On a real local etcd and kube-apiserver with the
// real dkc-server binary it creates thousands of Node objects and runs as many simulated nodes in this
// process — each the real sidecar client, agent and checkpoint store with its own directory, token and gRPC
// connection, beside a stand-in kubelet — and measures what the scale issues ask:
//
//   - propagation: a Node's source changed → that node's checkpoint durable, against a bare client-go watch
//     seeing the same change; three repetitions in one run, the goal held on the worst;
//   - fan-out: one ConfigMap shared by thousands of nodes updated in place → all checkpointed;
//   - apiserver cost: watches, memory kept live and CPU under dkc and under the original per-node-watch
//     design (emulated: a Node and a ConfigMap informer, field-selected, per node), with one shared
//     ConfigMap and with a ConfigMap per node;
//   - dkc-server memory per connected node (baseline and sample from one process, after forced collections,
//     heap and stacks apart) and the control plane's in total; Node writes per node per assignment; one
//     real sidecar's idle RSS as deployed (metrics on, a config assigned and active);
//   - the most nodes on one replica (10,000): its memory against the Deployment's limit, propagation and
//     fan-out at that size;
//   - a KubeletConfigPool (issue 27) rolled out to 2,000 nodes with maxUnavailable 10% by dkc-server's pool
//     controller: how long it takes, and the most nodes in progress at once, by the pool's status and by
//     the Nodes, against maxUnavailable;
//   - two replicas behind a load balancer with up to 10,000 nodes split between them (as many as the open-file
//     limit allows: 3 descriptors a node), one killed in the middle of a fan-out (issue 42): how long until
//     every node is served again, what the reconnect storm costs the apiserver, the survivor's peak memory
//     against the Deployment's limit;
//   - what a Node object costs the apiserver and dkc-server (setup), with more Node objects than connected
//     nodes if asked (Config.NodeObjects).
//
// The simulated nodes' fsyncs cost what this machine's disk costs one node (see DiskSimulated). Figures are
// printed as a table and written to results.json with the git revision; goals are reported, never asserted.
package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/dkc-dev/dkc/internal/configcheck"
	"github.com/dkc-dev/dkc/internal/durable"
	"github.com/dkc-dev/dkc/internal/nodeconfig"
	"github.com/dkc-dev/dkc/sidecar/app"
	"github.com/dkc-dev/dkc/test/devcluster"
)

// Config of a benchmark run. Zero values take the sizes.
type Config struct {
	// Dir receives results.json, the cluster (Dir/cluster) and the simulated nodes (Dir/nodes).
	Dir string
	// NodesDir holds the simulated nodes' directories; default Dir/nodes.
	NodesDir string
	// Bin holds dkc-server, dkc-sidecar, dkc-kubelet-check and fake-kubelet.
	Bin string
	// PropagationNodes (1000), FanoutNodes (2000), ScaleNodes (5000) and MaxNodes (10,000): connected
	// nodes in each phase.
	PropagationNodes, FanoutNodes, ScaleNodes, MaxNodes int
	// PoolNodes (2000, at most MaxNodes): the nodes the pool phase's KubeletConfigPool selects.
	PoolNodes int
	// ReplicaNodes (MaxNodes, at most MaxNodes): the nodes the replicas phase connects, split between two
	// replicas. Left 0 it is lowered to what the open-file limit allows (replicaFiles); set, it must fit.
	ReplicaNodes int
	// NodeObjects (MaxNodes, at least MaxNodes): the Node objects setup creates. MaxNodes of them are the
	// simulated nodes'; the rest carry no config source and never connect, as Nodes dkc does not configure
	// (yet): they cost the apiserver and dkc-server's Node cache what any Node does.
	NodeObjects int
	// PoolGatesOff rolls the pool phase's KubeletConfigPool out with its workload gates off (drain Never,
	// podReadinessTimeout 0s) instead of on (drain Allowed, the default podReadinessTimeout): run the phase
	// both ways to see what the gates cost the controller per batch.
	PoolGatesOff bool
	// Repetitions of the propagation measurement in one run (3); the goal is held on the worst.
	Repetitions int
	// Disk is where the simulated nodes' durable writes go: DiskSimulated (default) or DiskShared.
	Disk string
	// PropagationRate is how many Node sources are changed per second in the propagation phase (25: a
	// rollout over 1,000 nodes in 40s; at 100/s this 2-core machine saturates and both latencies measure
	// its run queue).
	PropagationRate int
	// Trial is the simulated nodes' trial duration before last-known-good (5s).
	Trial time.Duration
	// Deployment is the shipped dkc-server manifest (deploy/base/server.yaml): dkc-server runs with its
	// flags (deployment.serviceArgs) throughout and with its GOMEMLIMIT from the scale phase on; its memory
	// limit bounds the goal of the replica's peak.
	Deployment string
	// APF is the shipped FlowSchema and PriorityLevelConfiguration (deploy/base/server-apf.yaml), installed
	// so that dkc-server's requests are classified as in a cluster.
	APF string
	// DiskWriters bounds concurrent durable writes of all simulated nodes together: 0 is 64 with DiskShared
	// and unbounded with DiskSimulated (each node has its own disk); negative is unbounded.
	DiskWriters int
	// Phases to run, by short name: idle, propagation, fanout, watches, scale, max, pool, replicas (default
	// all); setup always runs.
	Phases   []string
	Progress io.Writer
}

func (c *Config) defaults() {
	if c.PropagationNodes == 0 {
		c.PropagationNodes = 1000
	}
	if c.FanoutNodes == 0 {
		c.FanoutNodes = 2000
	}
	if c.ScaleNodes == 0 {
		c.ScaleNodes = 5000
	}
	if c.MaxNodes == 0 {
		c.MaxNodes = 10000
	}
	if c.PoolNodes == 0 {
		c.PoolNodes = 2000
	}
	if c.ReplicaNodes == 0 {
		c.ReplicaNodes = c.MaxNodes
	}
	if c.NodeObjects == 0 {
		c.NodeObjects = c.MaxNodes
	}
	if c.Repetitions == 0 {
		c.Repetitions = 3
	}
	if c.Disk == "" {
		c.Disk = DiskSimulated
	}
	if c.DiskWriters == 0 && c.Disk == DiskShared {
		c.DiskWriters = 64
	}
	if c.PropagationRate == 0 {
		c.PropagationRate = 25
	}
	if c.Trial == 0 {
		c.Trial = 5 * time.Second
	}
	if c.Deployment == "" {
		c.Deployment = filepath.Join("deploy", "base", "server.yaml")
	}
	if c.APF == "" {
		c.APF = filepath.FromSlash(apfFile)
	}
	if c.Progress == nil {
		c.Progress = io.Discard
	}
	if c.NodesDir == "" {
		c.NodesDir = filepath.Join(c.Dir, "nodes")
		if c.Disk == DiskSimulated {
			c.NodesDir = filepath.Join(defaultTmpfs, "dkc-bench-nodes")
		}
	}
}

const (
	namespace = "kube-system"
	cmA       = "bench-a"
	cmB       = "bench-b"
	cmShared  = "bench-shared"
	// fleetProfile is how long dkc-server's CPU profile of the fleet update runs (dkc-server-fleet.cpu.pprof):
	// about as long as the update takes to show on every Node here.
	fleetProfile = 45 * time.Second
)

type run struct {
	cfg        Config
	nodeLogs   *nodeLogs       // each simulated node's last log lines, for a diagnosis
	sleeper    *syscallSleeper // the simulated disk's fsync charge; nil with -disk=shared
	cluster    *devcluster.Cluster
	rc         *rest.Config
	client     kubernetes.Interface
	rec        *recorder
	checker    *sharedChecker
	log        *zap.Logger
	nodes      []string
	sims       map[string]*simNode
	simsMu     sync.Mutex
	res        *Results
	cmRV       map[string]string
	deployment deployment
	// patchRetries counts Node PATCHes retried after a transient error.
	patchRetries atomic.Int64
	// idle is the real dkc-sidecar measured idle.
	idle *realSidecar
	// onOwn: the first FanoutNodes nodes each reference a ConfigMap of their own (the watches' worst case).
	onOwn bool
	// Per node, for the control-plane total: the apiserver's live memory growth under dkc and under the
	// per-kubelet-watch design (shared ConfigMap), dkc-server's live memory growth.
	apiserverLivePerNodeDKC, apiserverLivePerNodeDesign, serverLivePerNode float64
}

// Run runs the benchmark and returns its results; the cluster and every simulated node are stopped before it
// returns.
func Run(ctx context.Context, cfg Config) (res *Results, err error) {
	chosenReplicaNodes := cfg.ReplicaNodes != 0
	cfg.defaults()
	// The kubelet's env file names checkpoint paths, which must be absolute.
	if cfg.NodesDir, err = filepath.Abs(cfg.NodesDir); err != nil {
		return nil, err
	}
	if cfg.MaxNodes < cfg.ScaleNodes || cfg.ScaleNodes < cfg.FanoutNodes || cfg.FanoutNodes < cfg.PropagationNodes {
		return nil, errors.New("want PropagationNodes <= FanoutNodes <= ScaleNodes <= MaxNodes")
	}
	if cfg.PoolNodes > cfg.MaxNodes {
		return nil, errors.New("want PoolNodes <= MaxNodes")
	}
	if cfg.ReplicaNodes > cfg.MaxNodes || cfg.NodeObjects < cfg.MaxNodes {
		return nil, errors.New("want ReplicaNodes <= MaxNodes <= NodeObjects")
	}
	if cfg.Disk != DiskSimulated && cfg.Disk != DiskShared {
		return nil, fmt.Errorf("disk %q: want %s or %s", cfg.Disk, DiskSimulated, DiskShared)
	}
	if err := raiseFileLimit(); err != nil {
		return nil, err
	}
	if len(cfg.Phases) == 0 || slices.Contains(cfg.Phases, "replicas") {
		if err := replicaFiles(cfg.ReplicaNodes); err != nil && chosenReplicaNodes {
			return nil, err
		} else if err != nil {
			// The default (MaxNodes) does not fit this machine's open-file limit: the most that does.
			cfg.ReplicaNodes = fittingReplicaNodes()
			fmt.Fprintf(cfg.Progress, "bench: %v; the replicas phase runs %d\n", err, cfg.ReplicaNodes)
		}
	}
	started := time.Now()
	r := &run{cfg: cfg, rec: newRecorder(), checker: &sharedChecker{cache: map[[32]byte]*configcheck.Checked{}},
		sims: map[string]*simNode{}, res: newResults(), cmRV: map[string]string{}}
	r.res.Revision, r.res.TreeClean, r.res.Modified = gitState()
	if r.deployment, err = readDeployment(cfg.Deployment); err != nil {
		return nil, err
	}
	// The peak is held to 1 GiB (the goal) and to the shipped limit, whichever is lower.
	r.res.setGoal("service_rss_peak_bytes_at_10000", goal{Op: "<=", Value: float64(min(r.deployment.limit, peakGoal))})
	// The survivor of two replicas holds every node after the other's death: within the limit, or the
	// kubelet kills it too.
	r.res.setGoal("replicas_survivor_peak_rss_bytes", goal{Op: "<=", Value: float64(r.deployment.limit)})
	r.res.ServiceArgs = r.deployment.serviceArgs()
	if err := os.RemoveAll(cfg.NodesDir); err != nil {
		return nil, err
	}
	defer os.RemoveAll(cfg.NodesDir)
	// The nodes' durable writes: see DiskSimulated and durable.SetMaxConcurrent.
	durable.SetMaxConcurrent(max(cfg.DiskWriters, 0))
	defer durable.SetMaxConcurrent(0)
	r.res.Disk = cfg.Disk
	if cfg.Disk == DiskSimulated {
		// Measured before the cluster starts, so that etcd's writes are not in it.
		samples, err := fsyncLatencies(cfg.Dir, 100)
		if err != nil {
			return nil, fmt.Errorf("measure this disk's fsync latency: %w", err)
		}
		r.res.note("disk_fsync_p50_seconds", percentile(slices.Clone(samples), 0.5).Seconds())
		r.res.note("disk_fsync_p99_seconds", percentile(slices.Clone(samples), 0.99).Seconds())
		r.sleeper = newSyscallSleeper(simulatedFsyncThreads)
		r.sleeper.setPrecise(true)
		charged := sleepAccuracy(r.sleeper.sleep, samples)
		r.sleeper.setPrecise(false)
		r.res.note("disk_fsync_charged_p50_seconds", percentile(slices.Clone(charged), 0.5).Seconds())
		r.res.note("disk_fsync_charged_p99_seconds", percentile(slices.Clone(charged), 0.99).Seconds())
		durable.SetFault(fsyncCost(samples, r.sleeper.sleep))
		defer durable.SetFault(nil)
	}
	if r.log, err = simLogger(filepath.Join(cfg.Dir, "simnodes.log")); err != nil {
		return nil, err
	}
	r.nodeLogs = newNodeLogs()
	r.log = withNodeLogs(r.log, r.nodeLogs)
	defer func() { _ = r.log.Sync() }()

	r.progress("starting the cluster: etcd, kube-apiserver, dkc-server and one real dkc-sidecar (simulated node sim-1)")
	r.cluster, err = devcluster.Start(ctx, devcluster.Config{
		Dir: filepath.Join(cfg.Dir, "cluster"), RealNodes: []string{},
		ServiceBinary: filepath.Join(cfg.Bin, "dkc-server"), SidecarBinary: filepath.Join(cfg.Bin, "dkc-sidecar"),
		FakeKubeletBinary: filepath.Join(cfg.Bin, "fake-kubelet"), SimNodes: 1, TrialDuration: 10 * time.Minute,
		// The Deployment's flags (read from it), with its ports and files the dev cluster's.
		ServiceArgs: r.res.ServiceArgs,
		Progress:    cfg.Progress,
	})
	if err != nil {
		return nil, err
	}
	defer func() {
		r.stopSims()
		if r.idle != nil {
			r.idle.stop()
		}
		if stopErr := r.cluster.Stop(context.Background()); stopErr != nil && err == nil {
			err = stopErr
		}
	}()
	if r.rc, err = r.cluster.RESTConfig(); err != nil {
		return nil, err
	}
	r.rc.QPS, r.rc.Burst = -1, 0 // the benchmark is the load; client-side throttling would measure itself
	// The same encoding as dkc-server's informers, so that the bare watch is the same watch with nothing
	// behind it.
	r.rc.ContentType = "application/vnd.kubernetes.protobuf"
	r.rc.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	if r.client, err = kubernetes.NewForConfig(r.rc); err != nil {
		return nil, err
	}
	if err := r.applyAPF(ctx); err != nil {
		return nil, err
	}
	for _, phase := range []struct {
		name, short string
		run         func(context.Context) error
	}{
		{"setup", "setup", r.setup},
		{"idle sidecar", "idle", r.idleSidecar},
		{"propagation", "propagation", r.propagation},
		{"fan-out", "fanout", r.fanout},
		{"watches and apiserver cost: dkc, then the per-node-watch design; one shared ConfigMap, then one per node",
			"watches", r.watches},
		{"scale: dkc-server's memory per node", "scale", r.scale},
		{"max: the most nodes on one replica", "max", r.maxNodes},
		{"pool: a KubeletConfigPool rolled out by dkc-server's controller", "pool", r.pool},
		{"replicas: two replicas behind a balancer, one killed mid-fan-out", "replicas", r.replicas},
	} {
		if phase.short != "setup" && len(cfg.Phases) > 0 && !slices.Contains(cfg.Phases, phase.short) {
			continue
		}
		r.progress("phase: %s", phase.name)
		if err := phase.run(ctx); err != nil {
			r.controlPlaneTotals() // what was measured before the failure still counts
			r.res.note("patch_retries", float64(r.patchRetries.Load()))
			return r.res, fmt.Errorf("%s: %w", phase.name, err)
		}
	}
	r.controlPlaneTotals()
	r.res.note("patch_retries", float64(r.patchRetries.Load()))
	r.res.Took = time.Since(started).Round(time.Second).String()
	return r.res, nil
}

// controlPlaneTotals adds what one node costs the control plane in memory kept live (heap and stacks after
// a forced collection): the apiserver's growth plus dkc-server's, against the apiserver's growth under the
// per-kubelet-watch design, whose control plane is the apiserver alone.
func (r *run) controlPlaneTotals() {
	if r.serverLivePerNode == 0 || r.apiserverLivePerNodeDesign == 0 {
		return
	}
	dkc := r.apiserverLivePerNodeDKC + r.serverLivePerNode
	r.res.set("control_plane_live_bytes_per_node_dkc", dkc)
	r.res.set("control_plane_live_bytes_per_node_design", r.apiserverLivePerNodeDesign)
	r.res.set("control_plane_memory_ratio_dkc_over_design", dkc/r.apiserverLivePerNodeDesign)
}

func (r *run) progress(format string, args ...any) {
	fmt.Fprintf(r.cfg.Progress, "bench: "+format+"\n", args...)
}

// setup creates the ConfigMaps, MaxNodes Node objects and their tokens, and NodeObjects-MaxNodes Node objects
// more that never connect; and measures what the Node objects cost the apiserver and dkc-server in memory.
func (r *run) setup(ctx context.Context) error {
	for _, name := range []string{cmA, cmB, cmShared} {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
			Data: map[string]string{"kubelet": kubeletConfig(name, 0)}}
		created, err := r.client.CoreV1().ConfigMaps(namespace).Create(ctx, cm, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("create configmap %s: %w", name, err)
		}
		r.cmRV[name] = created.ResourceVersion
	}
	r.nodes = make([]string, r.cfg.MaxNodes)
	for i := range r.nodes {
		r.nodes[i] = fmt.Sprintf("bench-%05d", i)
	}
	before, err := r.nodeObjectCost(ctx)
	if err != nil {
		return err
	}
	start := time.Now()
	err = parallel(ctx, r.nodes, 32, func(ctx context.Context, i int, name string) error {
		cm := cmShared
		if i < r.cfg.PropagationNodes {
			cm = []string{cmA, cmB}[i%2]
		}
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name,
			Labels:      map[string]string{"dkc.dev/simulated": "true", "dkc.dev/bench": "true"},
			Annotations: map[string]string{nodeconfig.SourceAnnotation: sourceAnnotation(cm)}}}
		if _, err := r.client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create node %s: %w", name, err)
		}
		_, err := devcluster.MintToken(ctx, r.client, devcluster.SidecarNamespace, devcluster.SidecarServiceAccount,
			devcluster.TokenAudience, name, filepath.Join(r.nodeDir(name), "token"))
		return err
	})
	if err != nil {
		return err
	}
	r.progress("created %d Nodes with their tokens in %v", len(r.nodes), time.Since(start).Round(time.Millisecond))
	if err := r.createNodeObjects(ctx); err != nil {
		return err
	}
	// dkc-server's Node informer and the apiserver's watch cache take the last ones in.
	time.Sleep(5 * time.Second)
	after, err := r.nodeObjectCost(ctx)
	if err != nil {
		return err
	}
	after.report(r.res, before, r.cfg.NodeObjects)
	return nil
}

// createNodeObjects creates the Node objects beyond the simulated nodes' (NodeObjects-MaxNodes): the
// simulated label but not the benchmark's (no phase lists or waits for them), no config source, no token.
func (r *run) createNodeObjects(ctx context.Context) error {
	extra := make([]string, r.cfg.NodeObjects-r.cfg.MaxNodes)
	if len(extra) == 0 {
		return nil
	}
	for i := range extra {
		extra[i] = fmt.Sprintf("bench-object-%06d", i)
	}
	start := time.Now()
	err := parallel(ctx, extra, 32, func(ctx context.Context, _ int, name string) error {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name,
			Labels: map[string]string{"dkc.dev/simulated": "true", "dkc.dev/bench-object": "true"}}}
		if _, err := r.client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create node %s: %w", name, err)
		}
		return nil
	})
	r.progress("created %d Nodes that never connect in %v", len(extra), time.Since(start).Round(time.Millisecond))
	return err
}

// nodeObjectCost is the apiserver's and dkc-server's memory (after forced collections, median of three),
// measured before and after setup creates the Node objects.
type nodeObjectCost struct{ apiserver, server goMemory }

func (r *run) nodeObjectCost(ctx context.Context) (nodeObjectCost, error) {
	var c nodeObjectCost
	pid, err := r.cluster.PID("kube-apiserver")
	if err != nil || pid == 0 {
		return c, fmt.Errorf("kube-apiserver not running (%w)", err)
	}
	if c.apiserver, err = sampleMemory(ctx, 3, 2*time.Second, func(ctx context.Context) (goMemory, error) {
		return apiserverMemory(ctx, r.rc, pid)
	}); err != nil {
		return c, err
	}
	c.server, err = r.serverMemory(ctx)
	return c, err
}

// report records the growth from before per Node object: the tokens minted meanwhile are not kept by
// either process, so what grew is the Nodes (the apiserver's watch cache, dkc-server's Node cache).
func (c nodeObjectCost) report(res *Results, before nodeObjectCost, n int) {
	per := func(a, b int64) float64 { return float64(b-a) / float64(n) }
	res.note("node_objects", float64(n))
	res.set("apiserver_rss_growth_bytes_per_node_object", per(before.apiserver.rss, c.apiserver.rss))
	res.note("apiserver_live_growth_bytes_per_node_object", per(before.apiserver.live(), c.apiserver.live()))
	res.set("service_rss_growth_bytes_per_node_object", per(before.server.rss, c.server.rss))
	res.note("service_live_growth_bytes_per_node_object", per(before.server.live(), c.server.live()))
}

// propagation connects PropagationNodes nodes, then changes each one's source once, at PropagationRate per
// second, timing a bare watch and dkc's checkpoint for each change; Repetitions times, each to ConfigMaps
// new to every node (so that every change is a new checkpoint and a new annotation value for the watch).
// The goal is held on the worst repetition.
func (r *run) propagation(ctx context.Context) error {
	nodes := r.nodes[:r.cfg.PropagationNodes]
	if err := r.connect(ctx, nodes); err != nil {
		return err
	}
	current := make([]string, len(nodes))
	for i := range nodes {
		current[i] = []string{cmA, cmB}[i%2]
	}
	worst := -1.0
	for rep := 1; rep <= r.cfg.Repetitions; rep++ {
		// Measure a quiet cluster: every node has its current config as last-known-good and reported it.
		if err := r.waitQuiet(ctx, nodes, current); err != nil {
			return err
		}
		next := make([]string, len(nodes))
		for i := range nodes {
			next[i] = []string{fmt.Sprintf("bench-p%d-a", rep), fmt.Sprintf("bench-p%d-b", rep)}[(i+rep)%2]
		}
		if err := r.createConfigMaps(ctx, slices.Compact(slices.Sorted(slices.Values(next))), kubeletConfig); err != nil {
			return err
		}
		m, err := r.propagate(ctx, nodes, next, fmt.Sprintf("rep%d", rep), rep == 1)
		if err != nil {
			return fmt.Errorf("repetition %d: %w", rep, err)
		}
		current = next
		for _, k := range []string{"bare_watch_p50", "bare_watch_p99", "dkc_p50", "dkc_p99", "dkc_received_p50",
			"dkc_received_p99"} {
			r.res.note(fmt.Sprintf("propagation_rep%d_%s_seconds", rep, k), m[k])
		}
		ratio := m["dkc_p99"] / m["bare_watch_p99"]
		r.res.note(fmt.Sprintf("propagation_rep%d_p99_ratio", rep), ratio)
		r.progress("propagation repetition %d: bare watch p99 %.0f ms, dkc checkpointed p99 %.0f ms, ratio %.2f", rep,
			m["bare_watch_p99"]*1000, m["dkc_p99"]*1000, ratio)
		if ratio > worst {
			worst = ratio
			for _, k := range []string{"bare_watch_p50", "bare_watch_p99", "dkc_p50", "dkc_p99"} {
				r.res.set("propagation_"+k+"_seconds", m[k])
			}
			r.res.set("propagation_p99_ratio_to_bare_watch", ratio)
			r.res.note("propagation_worst_repetition", float64(rep))
			for _, k := range []string{"dkc_received_p50", "dkc_received_p99"} {
				r.res.note("propagation_"+k+"_seconds", m[k])
			}
		}
	}
	r.res.note("propagation_changes", float64(len(nodes)))
	r.res.note("propagation_repetitions", float64(r.cfg.Repetitions))
	r.res.note("propagation_changes_per_second", float64(r.cfg.PropagationRate))
	return nil
}

// waitQuiet waits until each of nodes has checkpointed cms[i] and reports it as last-known-good, then a
// little longer for the last status writes.
func (r *run) waitQuiet(ctx context.Context, nodes, cms []string) error {
	byCM := map[string][]string{}
	for i, n := range nodes {
		byCM[cms[i]] = append(byCM[cms[i]], n)
	}
	want, rvs := make(map[string]string, len(nodes)), map[string]string{}
	for cm, these := range byCM {
		if err := r.rec.wait(ctx, these, cm, r.cmRV[cm], 3*time.Minute); err != nil {
			return err
		}
		for _, n := range these {
			want[n] = cm
		}
		rvs[cm] = r.cmRV[cm]
	}
	if err := r.waitLastKnownGoodOf(ctx, want, rvs); err != nil {
		return err
	}
	time.Sleep(3 * time.Second)
	return nil
}

// createConfigMaps creates the named ConfigMaps in the config namespace with content(name, 0).
func (r *run) createConfigMaps(ctx context.Context, names []string, content func(string, int) string) error {
	var mu sync.Mutex
	return parallel(ctx, names, 32, func(ctx context.Context, _ int, name string) error {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
			Data: map[string]string{"kubelet": content(name, 0)}}
		created, err := r.client.CoreV1().ConfigMaps(namespace).Create(ctx, cm, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("create configmap %s: %w", name, err)
		}
		mu.Lock()
		r.cmRV[name] = created.ResourceVersion
		mu.Unlock()
		return nil
	})
}

// propagate changes node i's source to target[i], one change every 1/PropagationRate s, and returns the
// percentiles (seconds) of the bare watch seeing each change and of dkc receiving and checkpointing it.
// label names its CSV and notes; profile takes dkc-server's CPU profile meanwhile.
func (r *run) propagate(ctx context.Context, nodes, target []string, label string,
	profile bool) (map[string]float64, error) {
	bare, err := startBareWatch(ctx, r.cluster.KubeconfigPath())
	if err != nil {
		return nil, err
	}
	defer bare.stop()

	serverBefore, err := readServerDelays(ctx, r.cluster.MetricsAddress())
	if err != nil {
		return nil, err
	}
	stallsBefore := readRuntimeStalls()
	profiled := func() {}
	if profile {
		profiled = r.profile(ctx, "propagation", time.Duration(len(nodes)/r.cfg.PropagationRate)*time.Second)
	}
	defer profiled()
	// Latency, a few checkpoints at a time: fsyncs charged exactly (syscallSleeper).
	r.sleeper.setPrecise(true)
	defer r.sleeper.setPrecise(false)
	start := make([]time.Time, len(nodes))
	interval := time.Second / time.Duration(r.cfg.PropagationRate)
	tick := time.NewTicker(interval)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(64)
	for i, n := range nodes {
		<-tick.C
		g.Go(func() error {
			// A change that had to be retried is timed from its last attempt.
			return r.pointAtTimed(gctx, n, target[i], &start[i])
		})
	}
	tick.Stop()
	if err := g.Wait(); err != nil {
		return nil, err
	}
	byCM := map[string][]string{}
	for i, n := range nodes {
		byCM[target[i]] = append(byCM[target[i]], n)
	}
	for cm, want := range byCM {
		if err := r.rec.wait(ctx, want, cm, r.cmRV[cm], 2*time.Minute); err != nil {
			return nil, err
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	var watched, dkc, received []time.Duration
	for i, n := range nodes {
		var at time.Time
		for {
			var ok bool
			if at, ok = bare.at(n, sourceAnnotation(target[i])); ok || time.Now().After(deadline) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if at.IsZero() {
			return nil, fmt.Errorf("the bare watch never saw %s change to %s", n, target[i])
		}
		cp, _ := r.rec.get(n, target[i], r.cmRV[target[i]])
		recv, _ := r.rec.getEvent(app.TraceReceived, n, target[i], r.cmRV[target[i]])
		watched = append(watched, at.Sub(start[i]))
		dkc = append(dkc, cp.Sub(start[i]))
		received = append(received, recv.Sub(start[i]))
	}
	if serverAfter, err := readServerDelays(ctx, r.cluster.MetricsAddress()); err == nil {
		serverAfter.note(r.res, "propagation_"+label+"_server_", serverBefore)
	}
	// The benchmark process's own delays over the repetition (see runtimeStalls).
	stallsAfter := readRuntimeStalls()
	r.res.note("propagation_"+label+"_bench_sched_latency_max_seconds_ge",
		longestSince(stallsBefore.sched, stallsAfter.sched))
	r.res.note("propagation_"+label+"_bench_gc_pause_max_seconds_ge", longestSince(stallsBefore.gc, stallsAfter.gc))
	if err := writeCSV(filepath.Join(r.cfg.Dir, "propagation-"+label+".csv"), nodes, start, watched, received,
		dkc); err != nil {
		return nil, err
	}
	return map[string]float64{
		"bare_watch_p50": percentile(watched, 0.5).Seconds(), "bare_watch_p99": percentile(watched, 0.99).Seconds(),
		"dkc_p50": percentile(dkc, 0.5).Seconds(), "dkc_p99": percentile(dkc, 0.99).Seconds(),
		"dkc_received_p50": percentile(received, 0.5).Seconds(), "dkc_received_p99": percentile(received, 0.99).Seconds(),
	}, nil
}

// fanout moves every propagation node to the shared ConfigMap, connects FanoutNodes nodes in all, updates
// the shared ConfigMap in place and times all checkpoints; then counts Node writes until every node
// reports the new version as last-known-good.
func (r *run) fanout(ctx context.Context) error {
	if err := r.allOnShared(ctx); err != nil {
		return err
	}
	nodes := r.nodes[:r.cfg.FanoutNodes]
	if err := r.connect(ctx, nodes); err != nil {
		return err
	}
	if err := r.rec.wait(ctx, nodes, cmShared, r.cmRV[cmShared], 3*time.Minute); err != nil {
		return err
	}
	if err := r.waitLastKnownGood(ctx, nodes, cmShared, r.cmRV[cmShared]); err != nil {
		return err
	}
	// Count every write to these Nodes from now on, whoever makes it.
	counter, err := r.countNodeWrites(ctx)
	if err != nil {
		return err
	}
	defer counter.stop()
	writesBefore, err := serverMetric(ctx, r.cluster.MetricsAddress(), "dkc_server_node_status_writes_total",
		map[string]string{"result": "written"})
	if err != nil {
		return err
	}
	f, err := r.updateShared(ctx, nodes, "fanout", nil)
	if err != nil {
		return err
	}
	r.res.note("fanout_all_received_seconds", f.allReceived.Seconds())
	r.res.note("fanout_p50_received_seconds", f.p50Received.Seconds())
	r.res.set("fanout_2000_all_checkpointed_seconds", f.all.Seconds())
	r.res.set("fanout_p50_checkpointed_seconds", f.p50.Seconds())
	r.res.note("fanout_nodes", float64(len(nodes)))

	if err := r.waitLastKnownGood(ctx, nodes, cmShared, r.cmRV[cmShared]); err != nil {
		return err
	}
	time.Sleep(3 * time.Second) // late writes would count
	writes, err := counter.count()
	if err != nil {
		return err
	}
	r.res.set("node_writes_per_node_per_assignment", float64(writes)/float64(len(nodes)))
	counter.mu.Lock()
	r.res.note("node_write_counter_watch_resumes", float64(counter.resumed))
	counter.mu.Unlock()
	writesAfter, err := serverMetric(ctx, r.cluster.MetricsAddress(), "dkc_server_node_status_writes_total",
		map[string]string{"result": "written"})
	if err != nil {
		return err
	}
	r.res.note("dkc_status_patches_per_node_per_assignment", (writesAfter-writesBefore)/float64(len(nodes)))
	return nil
}

type fanoutTimes struct {
	all, p50, allReceived, p50Received time.Duration
	// start is when the ConfigMap update was sent; gen the generation it carries.
	start time.Time
	gen   int
}

// updateShared updates the shared ConfigMap in place and times how long nodes take to receive and checkpoint
// the new version (a CPU profile of dkc-server named profile is taken meanwhile). active, if not nil, is
// told the new version.
func (r *run) updateShared(ctx context.Context, nodes []string, profile string,
	active *activeWatcher) (fanoutTimes, error) {
	var f fanoutTimes
	profiled := r.profile(ctx, profile, 5*time.Second)
	defer profiled()
	rv, gen, start, err := r.bumpShared(ctx)
	if err != nil {
		return f, err
	}
	if active != nil {
		active.setVersion(rv)
	}
	if err := r.rec.wait(ctx, nodes, cmShared, rv, 5*time.Minute); err != nil {
		return f, err
	}
	var all, received []time.Duration
	for _, n := range nodes {
		t, _ := r.rec.get(n, cmShared, rv)
		all = append(all, t.Sub(start))
		t, _ = r.rec.getEvent(app.TraceReceived, n, cmShared, rv)
		received = append(received, t.Sub(start))
	}
	return fanoutTimes{all: percentile(all, 1), p50: percentile(all, 0.5),
		allReceived: percentile(received, 1), p50Received: percentile(received, 0.5), start: start, gen: gen}, nil
}

// bumpShared updates the shared ConfigMap in place to its next generation and returns its new
// resourceVersion, the generation, and when the update was sent.
func (r *run) bumpShared(ctx context.Context) (rv string, gen int, start time.Time, err error) {
	cm, err := r.client.CoreV1().ConfigMaps(namespace).Get(ctx, cmShared, metav1.GetOptions{})
	if err != nil {
		return "", 0, start, err
	}
	gen = 1
	if g, err := strconv.Atoi(cm.Labels["dkc.dev/bench-generation"]); err == nil {
		gen = g + 1
	}
	cm.Data["kubelet"] = kubeletConfig(cmShared, gen)
	if cm.Labels == nil {
		cm.Labels = map[string]string{}
	}
	cm.Labels["dkc.dev/bench-generation"] = strconv.Itoa(gen)
	start = time.Now()
	updated, err := r.client.CoreV1().ConfigMaps(namespace).Update(ctx, cm, metav1.UpdateOptions{})
	if err != nil {
		return "", 0, start, err
	}
	r.cmRV[cmShared] = updated.ResourceVersion
	return updated.ResourceVersion, gen, start, nil
}

// watches measures what serving FanoutNodes nodes costs the apiserver — open watches, memory kept live,
// CPU — under dkc and under the original design, first with every node on one shared ConfigMap (the
// recommended use), then with every node on a ConfigMap of its own (dkc's worst case: one informer per
// referenced ConfigMap).
func (r *run) watches(ctx context.Context) error {
	nodes := r.nodes[:r.cfg.FanoutNodes]
	if err := r.allOnShared(ctx); err != nil {
		return err
	}
	if err := r.connect(ctx, nodes); err != nil {
		return err
	}
	shared := make([]string, len(nodes))
	for i := range nodes {
		shared[i] = cmShared
	}
	if err := r.waitQuiet(ctx, nodes, shared); err != nil {
		return err
	}
	c, err := r.compareWatches(ctx, nodes, shared, "")
	if err != nil {
		return err
	}
	c.requests.Name = fmt.Sprintf("%d nodes on one shared ConfigMap", len(nodes))
	c.report(r.res, "", len(nodes))
	r.apiserverLivePerNodeDKC = c.livePerNodeDKC(len(nodes))
	r.apiserverLivePerNodeDesign = c.livePerNodeDesign(len(nodes))

	r.progress("watches: every node on a ConfigMap of its own")
	own := make([]string, len(nodes))
	for i, n := range nodes {
		own[i] = "bench-own-" + n
	}
	// The same content in each: the kubelet's code validates it once here (sharedChecker), which is all a
	// watch comparison needs.
	if err := r.createConfigMaps(ctx, own, func(string, int) string { return kubeletConfig("bench-own", 0) }); err != nil {
		return err
	}
	r.onOwn = true
	if err := parallel(ctx, nodes, 32, func(ctx context.Context, i int, n string) error {
		return r.pointAt(ctx, n, own[i])
	}); err != nil {
		return err
	}
	if err := r.waitQuiet(ctx, nodes, own); err != nil {
		return err
	}
	c, err = r.compareWatches(ctx, nodes, own, "_own_configmaps")
	if err != nil {
		return err
	}
	c.requests.Name = fmt.Sprintf("%d nodes, each on a ConfigMap of its own", len(nodes))
	c.report(r.res, "_own_configmaps", len(nodes))
	r.res.note("watch_comparison_nodes", float64(len(nodes)))
	return nil
}

// pointAt sets node's config source to the ConfigMap cm.
func (r *run) pointAt(ctx context.Context, node, cm string) error {
	var start time.Time
	return r.pointAtTimed(ctx, node, cm, &start)
}

// pointAtTimed is pointAt, noting in start when its last attempt began. The PATCH passes dkc-server's
// validating webhook; an error of the apiserver's call to it (a reused connection found closed: "broken
// pipe") is retried up to 4 times, and counted (note patch_retries), rather than failing a 10-minute run.
func (r *run) pointAtTimed(ctx context.Context, node, cm string, start *time.Time) error {
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{
		nodeconfig.SourceAnnotation: sourceAnnotation(cm)}}})
	var err error
	for attempt := range 5 {
		if attempt > 0 {
			r.patchRetries.Add(1)
			time.Sleep(100 * time.Millisecond)
		}
		*start = time.Now()
		_, err = r.client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{})
		if err == nil || !(apierrors.IsInternalError(err) || apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) ||
			apierrors.IsServiceUnavailable(err) || apierrors.IsTooManyRequests(err)) {
			break
		}
		r.progress("patch %s (attempt %d): %v", node, attempt+1, err)
	}
	return err
}

// watchComparison is the apiserver measured with neither design, with dkc, and with both.
type watchComparison struct {
	base, withDKC, withDesign apiserverCost
	// The apiserver's requests in the dkc window and in the design's (both as the CPU figures').
	requests breakdownComparison
	// CPU the apiserver spent from the start of each design until it served every node, plus idleWindow;
	// and in idleWindow alone.
	cpuDKC, cpuDesign, idleDKC, idleDesign time.Duration
}

// idleWindow is how long the apiserver's CPU is sampled once a design serves every node.
const idleWindow = 15 * time.Second

func (c watchComparison) livePerNodeDKC(n int) float64 {
	return float64(c.withDKC.mem.live()-c.base.mem.live()) / float64(n)
}

func (c watchComparison) livePerNodeDesign(n int) float64 {
	return float64(c.withDesign.mem.live()-c.withDKC.mem.live()) / float64(n)
}

func (c watchComparison) report(res *Results, suffix string, n int) {
	perNode := func(a, b int64) float64 { return float64(b-a) / float64(n) }
	dkc, design := c.withDKC.watches-c.base.watches, c.withDesign.watches-c.withDKC.watches
	res.set("apiserver_watches_dkc"+suffix, float64(dkc))
	res.set("apiserver_watches_design"+suffix, float64(design))
	res.set("apiserver_watch_ratio_per_node_design_over_dkc"+suffix, float64(design)/float64(max(dkc, 1)))
	res.set("apiserver_live_bytes_per_node_dkc"+suffix, c.livePerNodeDKC(n))
	res.set("apiserver_live_bytes_per_node_design"+suffix, c.livePerNodeDesign(n))
	res.note("apiserver_rss_growth_bytes_per_node_dkc"+suffix, perNode(c.base.mem.rss, c.withDKC.mem.rss))
	res.note("apiserver_rss_growth_bytes_per_node_design"+suffix, perNode(c.withDKC.mem.rss, c.withDesign.mem.rss))
	res.note("apiserver_heap_growth_bytes_per_node_dkc"+suffix, perNode(c.base.mem.heap, c.withDKC.mem.heap))
	res.note("apiserver_heap_growth_bytes_per_node_design"+suffix, perNode(c.withDKC.mem.heap, c.withDesign.mem.heap))
	res.note("apiserver_stack_growth_bytes_per_node_dkc"+suffix, perNode(c.base.mem.stack, c.withDKC.mem.stack))
	res.note("apiserver_stack_growth_bytes_per_node_design"+suffix, perNode(c.withDKC.mem.stack, c.withDesign.mem.stack))
	res.set("apiserver_cpu_seconds_dkc"+suffix, c.cpuDKC.Seconds())
	res.set("apiserver_cpu_seconds_design"+suffix, c.cpuDesign.Seconds())
	if c.cpuDesign > 0 {
		res.set("apiserver_start_cpu_ratio_dkc_over_design"+suffix, c.cpuDKC.Seconds()/c.cpuDesign.Seconds())
	}
	res.note("apiserver_idle_cpu_seconds_per_minute_dkc"+suffix,
		c.idleDKC.Seconds()*float64(time.Minute)/float64(idleWindow))
	res.note("apiserver_idle_cpu_seconds_per_minute_design"+suffix,
		c.idleDesign.Seconds()*float64(time.Minute)/float64(idleWindow))
	for design, b := range map[string]apiserverBreakdown{"dkc": c.requests.DKC, "design": c.requests.Design} {
		var requests, seconds, reviews float64
		for _, row := range b.Requests {
			requests += row.Requests
			seconds += row.Seconds
			if row.Resource == "tokenreviews" || row.Resource == "subjectaccessreviews" {
				reviews += row.Requests
			}
		}
		res.note("apiserver_requests_"+design+suffix, requests)
		res.note("apiserver_request_handling_seconds_"+design+suffix, seconds)
		res.note("apiserver_reviews_"+design+suffix, reviews)
		if b.RSSPeakBytes > 0 {
			// The apiserver's memory spike in the window: a start of dkc-server against the design's.
			res.set("apiserver_rss_peak_growth_bytes_"+design+suffix, float64(b.RSSPeakBytes-b.RSSStartBytes))
		}
	}
	res.Breakdowns = append(res.Breakdowns, c.requests)
}

// compareWatches measures the apiserver serving nodes (node i on ConfigMap cms[i]). dkc: dkc-server is
// stopped, the apiserver measured, dkc-server started again and measured once every node is back. The
// design, emulated on top from this process: each kubelet had a Node informer and a ConfigMap informer, both
// selecting one object by name; they are stopped before returning. suffix names the windows' apiserver
// profiles.
func (r *run) compareWatches(ctx context.Context, nodes, cms []string, suffix string) (watchComparison, error) {
	var c watchComparison
	pid, err := r.cluster.PID("kube-apiserver")
	if err != nil || pid == 0 {
		return c, fmt.Errorf("kube-apiserver not running (%w)", err)
	}
	cpu := func() time.Duration { v, _ := procCPU(pid); return v }
	if err := r.cluster.StopProcess("dkc-server"); err != nil {
		return c, err
	}
	time.Sleep(3 * time.Second)
	if c.base, err = r.apiserverCost(ctx, pid); err != nil {
		return c, err
	}
	win, err := r.startWindow(ctx, pid, "watches-dkc"+suffix)
	if err != nil {
		return c, err
	}
	cpu0 := win.cpu
	if err := r.cluster.Restart(ctx, "dkc-server"); err != nil {
		return c, err
	}
	if err := r.waitConnected(ctx); err != nil {
		return c, err
	}
	// Connected is not yet served: every node has its assignment once dkc-server watches its ConfigMap
	// (alone, or with its whole namespace past services/internal/configmaps.NamespaceThreshold).
	if err := r.waitWatchesSettled(ctx, c.base.watches+2); err != nil {
		return c, err
	}
	cpu1 := cpu()
	time.Sleep(idleWindow)
	cpu2 := cpu()
	c.cpuDKC, c.idleDKC = cpu2-cpu0, cpu2-cpu1
	if c.requests.DKC, err = win.end(ctx, r); err != nil {
		return c, err
	}
	if c.withDKC, err = r.apiserverCost(ctx, pid); err != nil {
		return c, err
	}

	ictx, cancel := context.WithCancel(ctx)
	defer cancel()
	if win, err = r.startWindow(ctx, pid, "watches-design"+suffix); err != nil {
		return c, err
	}
	cpu0 = win.cpu
	var synced []cache.InformerSynced
	for i, n := range nodes {
		for _, w := range []struct {
			lw  *cache.ListWatch
			obj runtime.Object
		}{
			{cache.NewListWatchFromClient(r.client.CoreV1().RESTClient(), "nodes", metav1.NamespaceAll,
				fields.OneTermEqualSelector("metadata.name", n)), &corev1.Node{}},
			{cache.NewListWatchFromClient(r.client.CoreV1().RESTClient(), "configmaps", namespace,
				fields.OneTermEqualSelector("metadata.name", cms[i])), &corev1.ConfigMap{}},
		} {
			inf := cache.NewSharedIndexInformer(w.lw, w.obj, 0, cache.Indexers{})
			go inf.Run(ictx.Done())
			synced = append(synced, inf.HasSynced)
		}
	}
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return c, errors.New("the design's informers did not sync")
	}
	if err := r.waitWatches(ctx, c.withDKC.watches+2*len(nodes)); err != nil {
		return c, err
	}
	cpu1 = cpu()
	time.Sleep(idleWindow)
	cpu2 = cpu()
	c.cpuDesign, c.idleDesign = cpu2-cpu0, cpu2-cpu1
	if c.requests.Design, err = win.end(ctx, r); err != nil {
		return c, err
	}
	if c.withDesign, err = r.apiserverCost(ctx, pid); err != nil {
		return c, err
	}
	return c, nil
}

// waitWatches waits until the apiserver holds at least n watches on nodes and configmaps.
func (r *run) waitWatches(ctx context.Context, n int) error {
	deadline := time.Now().Add(3 * time.Minute)
	for {
		got, err := apiserverWatches(ctx, r.rc)
		if err == nil && got >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the apiserver holds %d watches, want %d (%w)", got, n, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// waitWatchesSettled waits until the apiserver holds at least n watches on nodes and configmaps and their
// number has not changed for 3s.
func (r *run) waitWatchesSettled(ctx context.Context, n int) error {
	deadline := time.Now().Add(3 * time.Minute)
	last, since := -1, time.Now()
	for {
		got, err := apiserverWatches(ctx, r.rc)
		if err == nil && got != last {
			last, since = got, time.Now()
		}
		if last >= n && time.Since(since) >= 3*time.Second {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the apiserver's watches did not settle at %d or more: %d (%w)", n, last, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

type apiserverCost struct {
	watches int
	mem     goMemory
}

// apiserverCost measures the apiserver: open watches on nodes and configmaps, and its memory right after a
// forced garbage collection (median of three), which RSS alone hides.
func (r *run) apiserverCost(ctx context.Context, pid int) (apiserverCost, error) {
	var c apiserverCost
	var err error
	if c.mem, err = sampleMemory(ctx, 3, 2*time.Second, func(ctx context.Context) (goMemory, error) {
		return apiserverMemory(ctx, r.rc, pid)
	}); err != nil {
		return c, err
	}
	c.watches, err = apiserverWatches(ctx, r.rc)
	return c, err
}

// profile takes a CPU profile of dkc-server for d in the background into <Dir>/dkc-server-<name>.cpu.pprof;
// the returned func waits for it. No name: no profile.
func (r *run) profile(ctx context.Context, name string, d time.Duration) func() {
	if name == "" {
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		path := filepath.Join(r.cfg.Dir, "dkc-server-"+name+".cpu.pprof")
		if err := fetch(ctx, fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", r.cluster.MetricsAddress(),
			max(1, int(d.Seconds()))), path); err != nil {
			r.progress("profile %s: %v", name, err)
		}
	}()
	return func() { <-done }
}

// waitConnected waits until dkc-server reports every running simulated node connected.
func (r *run) waitConnected(ctx context.Context) error {
	r.simsMu.Lock()
	want := len(r.sims)
	r.simsMu.Unlock()
	return r.waitConnectedOn(ctx, want, r.cluster.MetricsAddress())
}

// waitConnectedOn waits until the replicas whose metrics are at addrs report want nodes connected between
// them (their open WatchConfig streams).
func (r *run) waitConnectedOn(ctx context.Context, want int, addrs ...string) error {
	deadline := time.Now().Add(3 * time.Minute)
	for {
		var n float64
		var err error
		for _, addr := range addrs {
			v, e := serverMetric(ctx, addr, "dkc_server_connected_nodes", nil)
			n, err = n+v, errors.Join(err, e)
		}
		if err == nil && int(n) >= want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("dkc-server reports %d of %d nodes connected (%w)", int(n), want, err)
		}
		time.Sleep(time.Second)
	}
}

// allOnShared points every node that references another ConfigMap (the propagation phase's, the watches'
// own ones) at the shared ConfigMap, as every other node is.
func (r *run) allOnShared(ctx context.Context) error {
	n := r.cfg.PropagationNodes
	if r.onOwn {
		n = r.cfg.FanoutNodes
	}
	err := parallel(ctx, r.nodes[:n], 32, func(ctx context.Context, _ int, node string) error {
		return r.pointAt(ctx, node, cmShared)
	})
	if err == nil {
		r.onOwn = false
	}
	return err
}

// restartServer restarts dkc-server with the Deployment's GOMEMLIMIT and GOGC, as production runs it. Only
// dkc-server gets it: every process the dev cluster starts inherits this process's environment at that
// moment, and the apiserver's memory must stay measured as it was.
func (r *run) restartServer(ctx context.Context) error {
	return r.withDeploymentEnv(func() error { return r.cluster.Restart(ctx, "dkc-server") })
}

// withDeploymentEnv runs start, which starts a dkc-server, with the Deployment's GOMEMLIMIT and GOGC in this
// process's environment, which the process started inherits (see restartServer).
func (r *run) withDeploymentEnv(start func() error) error {
	env := map[string]string{"GOMEMLIMIT": r.deployment.goMemLimit}
	if r.deployment.goGC != "" {
		env["GOGC"] = r.deployment.goGC
	}
	for k, v := range env {
		old, had := os.LookupEnv(k)
		if err := os.Setenv(k, v); err != nil {
			return err
		}
		defer func() {
			if had {
				_ = os.Setenv(k, old)
			} else {
				_ = os.Unsetenv(k)
			}
		}()
	}
	return start()
}

func (r *run) serverMemory(ctx context.Context) (goMemory, error) {
	pid, err := r.cluster.PID("dkc-server")
	if err != nil || pid == 0 {
		return goMemory{}, fmt.Errorf("dkc-server not running (%w)", err)
	}
	return sampleMemory(ctx, 3, 2*time.Second, func(ctx context.Context) (goMemory, error) {
		return serverMemory(ctx, r.cluster.MetricsAddress(), pid)
	})
}

// scale measures dkc-server's memory per connected node, baseline and sample from one process: every
// simulated node is stopped, dkc-server restarted as the Deployment runs it (GOMEMLIMIT) and measured with
// every Node cached and none connected, then with ScaleNodes connected and quiet. Each figure is the median
// of three samples taken right after a forced collection; heap and goroutine stacks are reported apart.
func (r *run) scale(ctx context.Context) error {
	nodes := r.nodes[:r.cfg.ScaleNodes]
	// The sidecars' debug lines (each report and its acknowledgement) explain a node that does not get
	// there after the restarts below; kept in memory per node, and only while nothing is timed.
	r.nodeLogs.level.SetLevel(zapcore.DebugLevel)
	defer r.nodeLogs.level.SetLevel(zapcore.InfoLevel)
	if err := r.allOnShared(ctx); err != nil {
		return err
	}
	r.stopSims()
	if err := r.restartServer(ctx); err != nil {
		return err
	}
	time.Sleep(10 * time.Second)
	base, err := r.serverMemory(ctx)
	if err != nil {
		return err
	}
	if err := r.connect(ctx, nodes); err != nil {
		return err
	}
	if err := r.rec.wait(ctx, nodes, cmShared, r.cmRV[cmShared], 5*time.Minute); err != nil {
		return err
	}
	if err := r.waitConnected(ctx); err != nil {
		return err
	}
	if err := r.waitLastKnownGood(ctx, nodes, cmShared, r.cmRV[cmShared]); err != nil {
		return err
	}
	time.Sleep(10 * time.Second)
	at, err := r.serverMemory(ctx)
	if err != nil {
		return err
	}
	n := float64(len(nodes))
	r.res.set("service_rss_bytes_per_node_at_5000", float64(at.rss-base.rss)/n)
	r.res.set("service_live_bytes_per_node_at_5000", float64(at.live()-base.live())/n)
	r.res.note("service_heap_bytes_per_node_at_5000", float64(at.heap-base.heap)/n)
	r.res.note("service_heap_objects_bytes_per_node_at_5000", float64(at.objects-base.objects)/n)
	r.res.note("service_stack_bytes_per_node_at_5000", float64(at.stack-base.stack)/n)
	r.serverLivePerNode = float64(at.live()-base.live()) / n
	for k, v := range map[string]int64{"rss": base.rss, "heap": base.heap, "heap_objects": base.objects,
		"stack": base.stack} {
		r.res.note("service_"+k+"_bytes_no_nodes_connected", float64(v))
	}
	for k, v := range map[string]int64{"rss": at.rss, "heap": at.heap, "heap_objects": at.objects, "stack": at.stack} {
		r.res.note("service_"+k+"_bytes_at_5000", float64(v))
	}
	r.res.note("scale_nodes", n)
	if v, err := serverMetric(ctx, r.cluster.MetricsAddress(), "go_goroutines", nil); err == nil {
		r.res.note("service_goroutines_at_5000", v)
	}
	// The heap profile shows what the live objects are; the goroutine profile (debug=1: stacks counted
	// alike) what each connection runs.
	for file, path := range map[string]string{"dkc-server-scale.heap.pprof": "heap",
		"dkc-server-scale.goroutines.txt": "goroutine?debug=1"} {
		if err := fetch(ctx, "http://"+r.cluster.MetricsAddress()+"/debug/pprof/"+path,
			filepath.Join(r.cfg.Dir, file)); err != nil {
			r.progress("%s: %v", file, err)
		}
	}
	return nil
}

// maxNodes connects MaxNodes nodes to the one replica the scale phase started (GOMEMLIMIT as deployed) and
// measures, at that size: propagation (one repetition), fan-out of the shared ConfigMap, and the replica's
// memory, settled and at its peak since it started, against the Deployment's limit.
func (r *run) maxNodes(ctx context.Context) error {
	if r.cfg.Phases != nil && !slices.Contains(r.cfg.Phases, "scale") {
		// Without the scale phase this replica has not run as deployed yet.
		if err := r.allOnShared(ctx); err != nil {
			return err
		}
		r.stopSims()
		if err := r.restartServer(ctx); err != nil {
			return err
		}
	}
	nodes := r.nodes
	if err := r.allOnShared(ctx); err != nil {
		return err
	}
	if err := r.connect(ctx, nodes); err != nil {
		return err
	}
	if err := r.rec.wait(ctx, nodes, cmShared, r.cmRV[cmShared], 5*time.Minute); err != nil {
		return err
	}
	if err := r.waitConnected(ctx); err != nil {
		return err
	}
	if err := r.waitLastKnownGood(ctx, nodes, cmShared, r.cmRV[cmShared]); err != nil {
		return err
	}
	time.Sleep(10 * time.Second)
	settled, err := r.serverMemory(ctx)
	if err != nil {
		return err
	}
	r.res.note("max_nodes", float64(len(nodes)))
	r.res.set("service_rss_bytes_at_10000", float64(settled.rss))
	r.res.note("service_heap_bytes_at_10000", float64(settled.heap))
	r.res.note("service_heap_objects_bytes_at_10000", float64(settled.objects))
	r.res.note("service_stack_bytes_at_10000", float64(settled.stack))

	// Propagation with every node connected: the propagation phase's nodes, to ConfigMaps new to them.
	prop := nodes[:r.cfg.PropagationNodes]
	next := make([]string, len(prop))
	for i := range prop {
		next[i] = []string{"bench-pmax-a", "bench-pmax-b"}[i%2]
	}
	if err := r.createConfigMaps(ctx, []string{"bench-pmax-a", "bench-pmax-b"}, kubeletConfig); err != nil {
		return err
	}
	m, err := r.propagate(ctx, prop, next, "at_10000", false)
	if err != nil {
		return fmt.Errorf("propagation at %d nodes: %w", len(nodes), err)
	}
	r.res.note("propagation_at_10000_bare_watch_p99_seconds", m["bare_watch_p99"])
	r.res.note("propagation_at_10000_dkc_p99_seconds", m["dkc_p99"])
	r.res.set("propagation_p99_ratio_to_bare_watch_at_10000", m["dkc_p99"]/m["bare_watch_p99"])
	if err := r.waitQuiet(ctx, prop, next); err != nil {
		return err
	}
	if err := r.allOnShared(ctx); err != nil {
		return err
	}
	if err := r.waitLastKnownGood(ctx, nodes, cmShared, r.cmRV[cmShared]); err != nil {
		return err
	}
	time.Sleep(3 * time.Second)

	// Status at fleet speed: until every Node shows the new version active, and what the apiserver served
	// meanwhile.
	active, err := r.watchActive(ctx, nodes, cmShared)
	if err != nil {
		return err
	}
	apiBefore, err := r.apiserverMetrics(ctx)
	if err != nil {
		return err
	}
	writesBefore, err := r.serverWrites(ctx)
	if err != nil {
		return err
	}
	unpin, err := r.pinCPUs()
	if err != nil {
		return err
	}
	defer unpin()
	cpuBefore := r.cpuTimes()
	profiled := r.profile(ctx, "fleet", fleetProfile)
	stopSelf := r.profileSelf("fleet")
	// dkc-server's profile of this update is the fleet one (a second CPU profile cannot run beside it).
	f, err := r.updateShared(ctx, nodes, "", active)
	if err != nil {
		return fmt.Errorf("fan-out to %d nodes: %w", len(nodes), err)
	}
	stopWatching := r.watchFleet(ctx, active, len(nodes))
	lastActive, notActive, err := active.wait(ctx, 3*time.Minute)
	stopWatching()
	if err != nil {
		return fmt.Errorf("fan-out to %d nodes: %w", len(nodes), err)
	}
	fleetCPU := r.cpuTimes().minus(cpuBefore)
	stopSelf()
	r.explainTail(active, nodes, f.start)
	dkcTook := lastActive.Sub(f.start)
	r.progress("max: CPU used until every Node showed it active: %s", fleetCPU.record(r.res, "fleet_dkc"))
	profiled()
	apiAfter, err := r.apiserverMetrics(ctx)
	if err != nil {
		return err
	}
	writesAfter, err := r.serverWrites(ctx)
	if err != nil {
		return err
	}
	// What dkc wrote until every Node showed the new config active, which the bare client then makes: with
	// the benchmark's short trial, nodes that went first are promoted to last-known-good (another status
	// write each) while the last ones still wait, writes a node with the shipped 10-minute trial would make
	// long after.
	fleetWrites := writesAfter.minus(writesBefore)
	r.res.note("fleet_dkc_status_patches", float64(fleetWrites.patches))
	r.res.note("fleet_dkc_events", float64(fleetWrites.events))
	r.progress("max: dkc-server wrote %d status patches and %d Events until then", fleetWrites.patches, fleetWrites.events)
	if notActive > 0 {
		// Not every node: the time is the last of the others', and no ratio is claimed.
		r.res.note("fleet_status_nodes_not_active_after_3m", float64(notActive))
		r.res.note("fleet_status_active_seconds_all_but_not_active", dkcTook.Seconds())
		r.progress("max: %d Nodes never showed the new config active", notActive)
	} else {
		r.res.set("fleet_status_active_seconds_at_10000", dkcTook.Seconds())
	}
	load(apiBefore, apiAfter, time.Since(f.start)).record(r.res, "fleet_dkc")
	r.progress("max: every Node shows the new config active %.1f s after the update", dkcTook.Seconds())
	r.res.set("fanout_10000_all_checkpointed_seconds", f.all.Seconds())
	r.res.note("fanout_10000_p50_checkpointed_seconds", f.p50.Seconds())
	r.res.note("fanout_10000_all_received_seconds", f.allReceived.Seconds())
	pid, err := r.cluster.PID("dkc-server")
	if err != nil || pid == 0 {
		return fmt.Errorf("dkc-server not running (%w)", err)
	}
	peak, err := peakRSS(pid)
	if err != nil {
		return err
	}
	r.res.set("service_rss_peak_bytes_at_10000", float64(peak))
	// Every node's status settling is part of serving 10,000 nodes: not reaching it is a figure (1), and
	// the peak is taken again after it.
	lkgStart := time.Now()
	if err := r.waitLastKnownGood(ctx, nodes, cmShared, r.cmRV[cmShared]); err != nil {
		r.progress("max: %v", err)
		r.res.note("max_last_known_good_not_reached", 1)
	} else {
		r.res.note("max_last_known_good_seconds_after_fanout", time.Since(lkgStart).Seconds())
	}
	if peak, err = peakRSS(pid); err != nil {
		return err
	}
	r.res.set("service_rss_peak_bytes_at_10000", float64(peak))
	r.res.note("deployment_memory_limit_bytes", float64(r.deployment.limit))
	if v, err := serverMetric(ctx, r.cluster.MetricsAddress(), "go_goroutines", nil); err == nil {
		r.res.note("service_goroutines_at_10000", v)
	}

	// The yardstick, on the same apiserver with dkc-server and every node connected and quiet: the same
	// writes from a bare client at full speed.
	time.Sleep(3 * time.Second)
	apiBefore, err = r.apiserverMetrics(ctx)
	if err != nil {
		return err
	}
	cpuBefore = r.cpuTimes()
	stopSelf = r.profileSelf("bare")
	bareTook, err := r.bareClient(ctx, nodes, f.gen, fleetWrites)
	stopSelf()
	if err != nil {
		return err
	}
	r.progress("max: CPU used by the bare client's writes: %s", r.cpuTimes().minus(cpuBefore).record(r.res, "fleet_bare"))
	apiAfter, err = r.apiserverMetrics(ctx)
	if err != nil {
		return err
	}
	load(apiBefore, apiAfter, bareTook).record(r.res, "fleet_bare")
	r.res.set("fleet_status_bare_client_seconds_at_10000", bareTook.Seconds())
	if notActive == 0 {
		r.res.set("fleet_status_ratio_dkc_over_bare_client_at_10000", dkcTook.Seconds()/bareTook.Seconds())
	}
	r.progress("max: a bare client made %d status patches and %d Events in %.1f s", fleetWrites.patches,
		fleetWrites.events, bareTook.Seconds())
	return nil
}

// connect starts simulated nodes for those of names not running yet, connecting to the cluster's dkc-server.
func (r *run) connect(ctx context.Context, all []string) error {
	return r.connectTo(ctx, all, r.cluster.ServiceAddress())
}

// connectTo is connect to the dkc-server (or balancer) at server.
func (r *run) connectTo(ctx context.Context, all []string, server string) error {
	start := time.Now()
	var names []string
	r.simsMu.Lock()
	for _, n := range all {
		if r.sims[n] == nil {
			names = append(names, n)
		}
	}
	r.simsMu.Unlock()
	ca := r.cluster.CAFile()
	err := parallel(ctx, names, 16, func(ctx context.Context, _ int, name string) error {
		s, err := startSimNode(context.Background(), name, simConfig{
			server: server, caFile: ca, token: filepath.Join(r.nodeDir(name), "token"),
			dir: r.nodeDir(name), trial: r.cfg.Trial, checker: r.checker, rec: r.rec, log: r.log,
		})
		if err != nil {
			return err
		}
		r.simsMu.Lock()
		r.sims[name] = s
		r.simsMu.Unlock()
		return nil
	})
	r.progress("started %d simulated nodes in %v", len(names), time.Since(start).Round(time.Millisecond))
	return err
}

func (r *run) stopSims() {
	r.simsMu.Lock()
	defer r.simsMu.Unlock()
	var wg sync.WaitGroup
	for _, s := range r.sims {
		wg.Add(1)
		go func() { defer wg.Done(); s.stop() }()
	}
	wg.Wait()
	r.sims = map[string]*simNode{}
}

func (r *run) nodeDir(name string) string { return filepath.Join(r.cfg.NodesDir, name) }

// waitLastKnownGood waits until every node's status (as dkc-server wrote it) has cm@rv as last-known-good.
func (r *run) waitLastKnownGood(ctx context.Context, nodes []string, cm, rv string) error {
	want := make(map[string]string, len(nodes))
	for _, n := range nodes {
		want[n] = cm
	}
	return r.waitLastKnownGoodOf(ctx, want, map[string]string{cm: rv})
}

// waitLastKnownGoodOf waits until every node's status (as dkc-server wrote it) has its own ConfigMap
// (want[node]) at rvs[cm] as last-known-good: one List per second for every node together, as a waiter per
// ConfigMap would list every Node once per ConfigMap (2,000 Lists of 10,000 Nodes for the watches phase).
func (r *run) waitLastKnownGoodOf(ctx context.Context, want, rvs map[string]string) error {
	deadline := time.Now().Add(r.cfg.Trial + 3*time.Minute)
	for {
		list, err := r.client.CoreV1().Nodes().List(ctx,
			metav1.ListOptions{LabelSelector: "dkc.dev/bench=true", ResourceVersion: "0"})
		if err != nil {
			return err
		}
		missing := 0
		var some []string // the first few, with what their Nodes show
		var stuck []string
		for i := range list.Items {
			n := &list.Items[i]
			cm, ok := want[n.Name]
			if !ok {
				continue
			}
			var st corev1.NodeConfigStatus
			if err := json.Unmarshal([]byte(n.Annotations[nodeconfig.StatusAnnotation]), &st); err != nil ||
				st.LastKnownGood == nil || st.LastKnownGood.ConfigMap == nil ||
				st.LastKnownGood.ConfigMap.Name != cm || st.LastKnownGood.ConfigMap.ResourceVersion != rvs[cm] || st.Error != "" {
				missing++
				if len(some) < 5 {
					some = append(some, fmt.Sprintf("%s (want %s@%s): %s", n.Name, cm, rvs[cm],
						n.Annotations[nodeconfig.StatusAnnotation]))
					stuck = append(stuck, n.Name)
				}
			}
		}
		if missing == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			for _, n := range stuck {
				r.progress("%s", r.describeNode(n))
			}
			return fmt.Errorf("%d of %d nodes do not report their config as last-known-good (%s)%s", missing, len(want),
				strings.Join(some, "; "), r.rec.failure())
		}
		time.Sleep(time.Second)
	}
}

// writeCounter counts Node modifications seen by a watch of the benchmark's Nodes. The apiserver ends watches
// by itself (its request timeout; a consumer it finds slow, as this busy process can be): the count resumes
// from the last resourceVersion seen, which loses no event. A watch that cannot resume (that version compacted
// away) or reports an error would undercount: count then fails instead.
type writeCounter struct {
	mu      sync.Mutex
	n       int
	resumed int
	err     error
	stopped bool
	w       watch.Interface
	done    chan struct{}
}

func (w *writeCounter) count() (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n, w.err
}

func (w *writeCounter) stop() {
	w.mu.Lock()
	w.stopped = true
	cur := w.w
	w.mu.Unlock()
	cur.Stop()
	<-w.done
}

func (r *run) countNodeWrites(ctx context.Context) (*writeCounter, error) {
	list, err := r.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{Limit: 1})
	if err != nil {
		return nil, err
	}
	open := func(rv string) (watch.Interface, error) {
		return r.client.CoreV1().Nodes().Watch(ctx,
			metav1.ListOptions{LabelSelector: "dkc.dev/bench=true", ResourceVersion: rv})
	}
	w, err := open(list.ResourceVersion)
	if err != nil {
		return nil, err
	}
	c := &writeCounter{w: w, done: make(chan struct{})}
	go func() {
		defer close(c.done)
		rv := list.ResourceVersion
		for {
			for ev := range w.ResultChan() {
				c.mu.Lock()
				switch ev.Type {
				case watch.Modified:
					c.n++
				case watch.Error:
					if c.err == nil {
						c.err = fmt.Errorf("the Node write counter's watch failed after %d writes: %w", c.n,
							apierrors.FromObject(ev.Object))
					}
				}
				c.mu.Unlock()
				if m, err := meta.Accessor(ev.Object); err == nil && ev.Type != watch.Error {
					rv = m.GetResourceVersion()
				}
			}
			c.mu.Lock()
			if c.stopped || c.err != nil {
				c.mu.Unlock()
				return
			}
			c.mu.Unlock()
			next, err := open(rv)
			c.mu.Lock()
			if err != nil {
				c.err = fmt.Errorf("the Node write counter's watch closed after %d writes and could not resume from %s: %w", c.n,
					rv, err)
				c.mu.Unlock()
				return
			}
			w, c.w = next, next
			c.resumed++
			stopped := c.stopped
			c.mu.Unlock()
			if stopped {
				next.Stop()
			}
		}
	}()
	return c, nil
}

// parallel runs f for each item with at most limit at a time; the first error cancels the rest.
func parallel(ctx context.Context, items []string, limit int, f func(context.Context, int, string) error) error {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(limit)
	for i, it := range items {
		g.Go(func() error { return f(gctx, i, it) })
	}
	return g.Wait()
}

func sourceAnnotation(cm string) string {
	b, _ := json.Marshal(corev1.NodeConfigSource{ConfigMap: &corev1.ConfigMapNodeConfigSource{
		Namespace: namespace, Name: cm, KubeletConfigKey: "kubelet"}})
	return string(b)
}

// kubeletConfig is a small valid config; generation makes in-place updates real changes.
func kubeletConfig(name string, generation int) string {
	return fmt.Sprintf("apiVersion: kubelet.config.k8s.io/v1beta1\n"+
		"kind: KubeletConfiguration\n"+
		"failSwapOn: false\n"+
		"failCgroupV1: false\n"+
		"maxPods: %d\n"+
		"eventRecordQPS: %d\n"+
		"# %s\n", 100+generation, 5+generation, name)
}

func simLogger(path string) (*zap.Logger, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	enc := zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig())
	return zap.New(zapcore.NewCore(enc, zapcore.AddSync(f), zapcore.WarnLevel)), nil
}

// raiseFileLimit lifts the soft open-file limit to the hard one, and the hard one to fileLimit if it is lower
// and this process may (root): every simulated node holds a connection, and in the replicas phase two
// more in the balancer.
func raiseFileLimit() error {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return err
	}
	if l.Max < fileLimit {
		raised := syscall.Rlimit{Cur: fileLimit, Max: fileLimit}
		if syscall.Setrlimit(syscall.RLIMIT_NOFILE, &raised) == nil {
			return nil
		}
	}
	l.Cur = l.Max
	return syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l)
}

// fileLimit is the open-file limit the benchmark asks for: 3 descriptors per node through the balancer
// (the node's, both of the balancer's) at 65,000 nodes, and room besides. The kernel's ceiling
// (fs.nr_open) is 1,048,576 by default.
const fileLimit = 262144

// writeCSV keeps every change of the propagation phase for a closer look (before percentiles sort them).
func writeCSV(path string, nodes []string, start []time.Time, watched, received, checkpointed []time.Duration) error {
	var b strings.Builder
	b.WriteString("node,start_unix_ns,bare_watch_s,dkc_received_s,dkc_checkpointed_s\n")
	for i, n := range nodes {
		fmt.Fprintf(&b, "%s,%d,%.6f,%.6f,%.6f\n", n, start[i].UnixNano(), watched[i].Seconds(), received[i].Seconds(),
			checkpointed[i].Seconds())
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}
