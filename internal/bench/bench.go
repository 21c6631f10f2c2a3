// Package bench is dkc's scale benchmark (`make bench`). On a real local etcd and kube-apiserver with the
// real dkc-server binary it creates thousands of Node objects and runs as many simulated nodes in this
// process — each the real sidecar client, agent and checkpoint store with its own directory, token and gRPC
// connection, beside a stand-in kubelet — and measures what the scale issue asks:
//
//   - propagation: a Node's source changed → that node's checkpoint durable, against a bare client-go watch
//     seeing the same change;
//   - fan-out: one ConfigMap shared by thousands of nodes updated in place → all checkpointed;
//   - apiserver cost: watches and apiserver RSS under dkc and under the original per-node-watch design
//     (emulated: a Node and a ConfigMap informer, field-selected, per node);
//   - dkc-server RSS per connected node; Node writes per node per assignment; one real sidecar's idle RSS.
//
// Figures are printed as a table and written to results.json; goals are reported, never asserted.
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
	"strings"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/dkc-dev/dkc/internal/devcluster"
	"github.com/dkc-dev/dkc/services/nodestatus"
	"github.com/dkc-dev/dkc/services/resolve"
	"github.com/dkc-dev/dkc/sidecar/agent"
	"github.com/dkc-dev/dkc/sidecar/configcheck"
	"github.com/dkc-dev/dkc/sidecar/durable"
)

// Config of a benchmark run. Zero values take the sizes.
type Config struct {
	// Dir receives results.json, the cluster (Dir/cluster) and the simulated nodes (Dir/nodes).
	Dir string
	// NodesDir holds the simulated nodes' directories; default Dir/nodes.
	NodesDir string
	// Bin holds dkc-server, dkc-sidecar, dkc-kubelet-check and fake-kubelet.
	Bin string
	// PropagationNodes (1000), FanoutNodes (2000) and ScaleNodes (5000): connected nodes in each phase.
	PropagationNodes, FanoutNodes, ScaleNodes int
	// PropagationRate is how many Node sources are changed per second in the propagation phase (25: a
	// rollout over 1,000 nodes in 40s; at 100/s this 2-core machine saturates and both latencies measure
	// its run queue).
	PropagationRate int
	// Trial is the simulated nodes' trial duration before last-known-good (5s).
	Trial time.Duration
	// DiskWriters bounds concurrent durable writes of all simulated nodes together (0: unbounded).
	DiskWriters int
	// Phases to run, by name (default all); setup always runs.
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
	if c.PropagationRate == 0 {
		c.PropagationRate = 25
	}
	if c.Trial == 0 {
		c.Trial = 5 * time.Second
	}
	if c.Progress == nil {
		c.Progress = io.Discard
	}
	if c.NodesDir == "" {
		c.NodesDir = filepath.Join(c.Dir, "nodes")
	}
}

const (
	namespace = "kube-system"
	cmA       = "bench-a"
	cmB       = "bench-b"
	cmShared  = "bench-shared"
)

type run struct {
	cfg     Config
	cluster *devcluster.Cluster
	rc      *rest.Config
	client  kubernetes.Interface
	rec     *recorder
	checker *sharedChecker
	log     *zap.Logger
	nodes   []string
	sims    map[string]*simNode
	simsMu  sync.Mutex
	res     *Results
	cmRV    map[string]string
	// serviceRSSBase is dkc-server's RSS with every Node cached and no node connected.
	serviceRSSBase int64
}

// Run runs the benchmark and returns its results; the cluster and every simulated node are stopped before it
// returns.
func Run(ctx context.Context, cfg Config) (res *Results, err error) {
	cfg.defaults()
	if cfg.ScaleNodes < cfg.FanoutNodes || cfg.FanoutNodes < cfg.PropagationNodes {
		return nil, errors.New("want PropagationNodes <= FanoutNodes <= ScaleNodes")
	}
	if err := raiseFileLimit(); err != nil {
		return nil, err
	}
	// Thousands of nodes' stores share this machine's one disk: see durable.SetMaxConcurrent.
	durable.SetMaxConcurrent(cfg.DiskWriters)
	defer durable.SetMaxConcurrent(0)
	started := time.Now()
	r := &run{cfg: cfg, rec: newRecorder(), checker: &sharedChecker{cache: map[[32]byte]*configcheck.Checked{}}, sims: map[string]*simNode{},
		res: newResults(), cmRV: map[string]string{}}
	if err := os.RemoveAll(cfg.NodesDir); err != nil {
		return nil, err
	}
	if r.log, err = simLogger(filepath.Join(cfg.Dir, "simnodes.log")); err != nil {
		return nil, err
	}
	defer func() { _ = r.log.Sync() }()

	r.progress("starting the cluster: etcd, kube-apiserver, dkc-server and one real dkc-sidecar (simulated node sim-1)")
	r.cluster, err = devcluster.Start(ctx, devcluster.Config{
		Dir: filepath.Join(cfg.Dir, "cluster"), RealNodes: []string{},
		ServiceBinary: filepath.Join(cfg.Bin, "dkc-server"), SidecarBinary: filepath.Join(cfg.Bin, "dkc-sidecar"),
		FakeKubeletBinary: filepath.Join(cfg.Bin, "fake-kubelet"), SimNodes: 1, TrialDuration: 10 * time.Minute,
		// One replica for 5,000 nodes: TokenReviews at connect and status writes need more than the
		// default 50 QPS (deploy/ documents the flag).
		ServiceArgs: []string{"--kube-api-qps=1000", "--kube-api-burst=2000", "--profiling",
			// Every simulated node connects from one address: no per-address TokenReview limit.
			"--token-review-qps=1000", "--token-review-burst=2000", "--token-review-per-peer-qps=0"},
		Progress: cfg.Progress,
	})
	if err != nil {
		return nil, err
	}
	defer func() {
		r.stopSims()
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
	for _, phase := range []struct {
		name, short string
		run         func(context.Context) error
	}{
		{"idle sidecar", "idle", r.idleSidecar},
		{"setup", "setup", r.setup},
		{"propagation", "propagation", r.propagation},
		{"fan-out", "fanout", r.fanout},
		{"watches and apiserver memory: dkc, then the per-node-watch design", "watches", r.watches},
		{"scale", "scale", r.scale},
	} {
		if phase.name != "setup" && phase.name != "idle sidecar" && len(cfg.Phases) > 0 && !slices.Contains(cfg.Phases, phase.short) {
			continue
		}
		r.progress("phase: %s", phase.name)
		if err := phase.run(ctx); err != nil {
			return r.res, fmt.Errorf("%s: %w", phase.name, err)
		}
	}
	r.res.Took = time.Since(started).Round(time.Second).String()
	return r.res, nil
}

func (r *run) progress(format string, args ...any) {
	fmt.Fprintf(r.cfg.Progress, "bench: "+format+"\n", args...)
}

// idleSidecar measures one real dkc-sidecar process after it connected, reported and went quiet.
func (r *run) idleSidecar(ctx context.Context) error {
	if err := r.cluster.WaitStatus(ctx, "sim-1", func(map[string]any) bool { return true }); err != nil {
		return err
	}
	pid, err := r.cluster.PID("dkc-sidecar-sim-1")
	if err != nil || pid == 0 {
		return fmt.Errorf("dkc-sidecar of sim-1 not running (%v)", err)
	}
	v, err := settledRSS(ctx, pid, 10*time.Second)
	if err != nil {
		return err
	}
	r.res.set("sidecar_idle_rss_bytes", float64(v))
	return nil
}

// setup creates the ConfigMaps, ScaleNodes Node objects and their tokens, and measures the baselines: no
// simulated node is connected yet.
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
	r.nodes = make([]string, r.cfg.ScaleNodes)
	for i := range r.nodes {
		r.nodes[i] = fmt.Sprintf("bench-%05d", i)
	}
	start := time.Now()
	err := parallel(ctx, r.nodes, 32, func(ctx context.Context, i int, name string) error {
		cm := cmShared
		if i < r.cfg.PropagationNodes {
			cm = []string{cmA, cmB}[i%2]
		}
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name,
			Labels:      map[string]string{"dkc.dev/simulated": "true", "dkc.dev/bench": "true"},
			Annotations: map[string]string{resolve.SourceAnnotation: sourceAnnotation(cm)}}}
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
	r.serviceRSSBase, err = r.processRSS(ctx, "dkc-server", 10*time.Second)
	return err
}

// propagation connects PropagationNodes nodes, then changes each one's source once, at PropagationRate per
// second, timing a bare watch and dkc's checkpoint for each change.
func (r *run) propagation(ctx context.Context) error {
	nodes := r.nodes[:r.cfg.PropagationNodes]
	if err := r.connect(ctx, nodes); err != nil {
		return err
	}
	// Measure a quiet cluster: every node has its first config as last-known-good and reported it.
	for i, cm := range []string{cmA, cmB} {
		var these []string
		for j := i; j < len(nodes); j += 2 {
			these = append(these, nodes[j])
		}
		if err := r.rec.wait(ctx, these, cm, r.cmRV[cm], 2*time.Minute); err != nil {
			return err
		}
		if err := r.waitLastKnownGood(ctx, these, cm, r.cmRV[cm]); err != nil {
			return err
		}
	}
	time.Sleep(3 * time.Second)
	bare, err := startBareWatch(ctx, r.cluster.KubeconfigPath())
	if err != nil {
		return err
	}
	defer bare.stop()

	pushBefore, err := serverHistogram(ctx, r.cluster.MetricsAddress(), "dkc_server_push_latency_seconds")
	if err != nil {
		return err
	}
	profiled := r.profile(ctx, "propagation", time.Duration(len(nodes)/r.cfg.PropagationRate)*time.Second)
	defer profiled()
	start := make([]time.Time, len(nodes))
	target := make([]string, len(nodes))
	interval := time.Second / time.Duration(r.cfg.PropagationRate)
	tick := time.NewTicker(interval)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(64)
	for i, n := range nodes {
		<-tick.C
		target[i] = []string{cmB, cmA}[i%2]
		g.Go(func() error {
			patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{
				resolve.SourceAnnotation: sourceAnnotation(target[i])}}})
			start[i] = time.Now()
			_, err := r.client.CoreV1().Nodes().Patch(gctx, n, types.MergePatchType, patch, metav1.PatchOptions{})
			return err
		})
	}
	tick.Stop()
	if err := g.Wait(); err != nil {
		return err
	}
	for _, cm := range []string{cmA, cmB} {
		var want []string
		for i, n := range nodes {
			if target[i] == cm {
				want = append(want, n)
			}
		}
		if err := r.rec.wait(ctx, want, cm, r.cmRV[cm], 2*time.Minute); err != nil {
			return err
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
			return fmt.Errorf("the bare watch never saw %s change to %s", n, target[i])
		}
		cp, _ := r.rec.get(n, target[i], r.cmRV[target[i]])
		recv, _ := r.rec.getEvent(agent.TraceReceived, n, target[i], r.cmRV[target[i]])
		watched = append(watched, at.Sub(start[i]))
		dkc = append(dkc, cp.Sub(start[i]))
		received = append(received, recv.Sub(start[i]))
	}
	r.res.note("propagation_dkc_received_p50_seconds", percentile(received, 0.5).Seconds())
	r.res.note("propagation_dkc_received_p99_seconds", percentile(received, 0.99).Seconds())
	r.res.note("propagation_changes", float64(len(nodes)))
	if pushAfter, err := serverHistogram(ctx, r.cluster.MetricsAddress(), "dkc_server_push_latency_seconds"); err == nil {
		// Inside dkc-server, from a node's new state to its push (histogram bucket bounds).
		r.res.note("propagation_server_resolved_to_pushed_p50_seconds_le", pushAfter.quantile(pushBefore, 0.5))
		r.res.note("propagation_server_resolved_to_pushed_p99_seconds_le", pushAfter.quantile(pushBefore, 0.99))
	}
	r.res.note("propagation_changes_per_second", float64(r.cfg.PropagationRate))
	if err := writeCSV(filepath.Join(r.cfg.Dir, "propagation.csv"), nodes, start, watched, received, dkc); err != nil {
		return err
	}
	bp50, bp99 := percentile(watched, 0.5), percentile(watched, 0.99)
	dp50, dp99 := percentile(dkc, 0.5), percentile(dkc, 0.99)
	r.res.set("propagation_bare_watch_p50_seconds", bp50.Seconds())
	r.res.set("propagation_bare_watch_p99_seconds", bp99.Seconds())
	r.res.set("propagation_dkc_p50_seconds", dp50.Seconds())
	r.res.set("propagation_dkc_p99_seconds", dp99.Seconds())
	r.res.set("propagation_p99_ratio_to_bare_watch", dp99.Seconds()/bp99.Seconds())
	return nil
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
	writesBefore, err := serverMetric(ctx, r.cluster.MetricsAddress(), "dkc_server_node_status_writes_total", map[string]string{"result": "written"})
	if err != nil {
		return err
	}
	cm, err := r.client.CoreV1().ConfigMaps(namespace).Get(ctx, cmShared, metav1.GetOptions{})
	if err != nil {
		return err
	}
	cm.Data["kubelet"] = kubeletConfig(cmShared, 1)
	profiled := r.profile(ctx, "fanout", 5*time.Second)
	defer profiled()
	start := time.Now()
	updated, err := r.client.CoreV1().ConfigMaps(namespace).Update(ctx, cm, metav1.UpdateOptions{})
	if err != nil {
		return err
	}
	r.cmRV[cmShared] = updated.ResourceVersion
	if err := r.rec.wait(ctx, nodes, cmShared, updated.ResourceVersion, 3*time.Minute); err != nil {
		return err
	}
	var last time.Duration
	var all, received []time.Duration
	for _, n := range nodes {
		t, _ := r.rec.get(n, cmShared, updated.ResourceVersion)
		all = append(all, t.Sub(start))
		last = max(last, t.Sub(start))
		t, _ = r.rec.getEvent(agent.TraceReceived, n, cmShared, updated.ResourceVersion)
		received = append(received, t.Sub(start))
	}
	r.res.note("fanout_all_received_seconds", percentile(received, 1).Seconds())
	r.res.note("fanout_p50_received_seconds", percentile(received, 0.5).Seconds())
	r.res.set("fanout_2000_all_checkpointed_seconds", last.Seconds())
	r.res.set("fanout_p50_checkpointed_seconds", percentile(all, 0.5).Seconds())
	r.res.note("fanout_nodes", float64(len(nodes)))

	if err := r.waitLastKnownGood(ctx, nodes, cmShared, updated.ResourceVersion); err != nil {
		return err
	}
	time.Sleep(3 * time.Second) // late writes would count
	writes := counter.count()
	r.res.set("node_writes_per_node_per_assignment", float64(writes)/float64(len(nodes)))
	writesAfter, err := serverMetric(ctx, r.cluster.MetricsAddress(), "dkc_server_node_status_writes_total", map[string]string{"result": "written"})
	if err != nil {
		return err
	}
	r.res.note("dkc_status_patches_per_node_per_assignment", (writesAfter-writesBefore)/float64(len(nodes)))
	return nil
}

// watches measures what serving FanoutNodes nodes costs the apiserver — watches, RSS and live heap — first
// for dkc, then for the original design. dkc: dkc-server is stopped, the apiserver measured, dkc-server
// started again and measured once every node is back and quiet. The design, emulated on top: each kubelet had
// a Node informer and a ConfigMap informer, both selecting one object by name.
func (r *run) watches(ctx context.Context) error {
	nodes := r.nodes[:r.cfg.FanoutNodes]
	if err := r.allOnShared(ctx); err != nil {
		return err
	}
	if err := r.connect(ctx, nodes); err != nil {
		return err
	}
	if err := r.cluster.StopProcess("dkc-server"); err != nil {
		return err
	}
	time.Sleep(3 * time.Second)
	base, err := r.apiserverCost(ctx, 0)
	if err != nil {
		return err
	}
	if err := r.cluster.Restart(ctx, "dkc-server"); err != nil {
		return err
	}
	if err := r.waitConnected(ctx); err != nil {
		return err
	}
	withDKC, err := r.apiserverCost(ctx, 10*time.Second)
	if err != nil {
		return err
	}

	ictx, cancel := context.WithCancel(ctx)
	defer cancel()
	var synced []cache.InformerSynced
	for _, n := range nodes {
		for _, w := range []struct {
			lw  *cache.ListWatch
			obj runtime.Object
		}{
			{cache.NewListWatchFromClient(r.client.CoreV1().RESTClient(), "nodes", metav1.NamespaceAll, fields.OneTermEqualSelector("metadata.name", n)), &corev1.Node{}},
			{cache.NewListWatchFromClient(r.client.CoreV1().RESTClient(), "configmaps", namespace, fields.OneTermEqualSelector("metadata.name", cmShared)), &corev1.ConfigMap{}},
		} {
			inf := cache.NewSharedIndexInformer(w.lw, w.obj, 0, cache.Indexers{})
			go inf.Run(ictx.Done())
			synced = append(synced, inf.HasSynced)
		}
	}
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return errors.New("the design's informers did not sync")
	}
	withDesign, err := r.apiserverCost(ctx, 10*time.Second)
	if err != nil {
		return err
	}
	perNode := func(a, b int64) float64 { return float64(b-a) / float64(len(nodes)) }
	dkc, design := withDKC.watches-base.watches, withDesign.watches-withDKC.watches
	r.res.set("apiserver_watches_dkc", float64(dkc))
	r.res.set("apiserver_watches_design", float64(design))
	r.res.set("apiserver_watch_ratio_per_node_design_over_dkc", float64(design)/float64(max(dkc, 1)))
	r.res.set("apiserver_rss_growth_bytes_per_node_dkc", perNode(base.rss, withDKC.rss))
	r.res.set("apiserver_rss_growth_bytes_per_node_design", perNode(withDKC.rss, withDesign.rss))
	r.res.note("apiserver_live_heap_growth_bytes_per_node_dkc", perNode(base.heap, withDKC.heap))
	r.res.note("apiserver_live_heap_growth_bytes_per_node_design", perNode(withDKC.heap, withDesign.heap))
	r.res.note("watch_comparison_nodes", float64(len(nodes)))
	return nil
}

type apiserverCost struct {
	watches   int
	rss, heap int64
}

// apiserverCost measures the apiserver after settle: open watches on nodes and configmaps, RSS, and the live
// heap right after a forced garbage collection (pprof's heap?gc=1), which RSS alone hides.
func (r *run) apiserverCost(ctx context.Context, settle time.Duration) (apiserverCost, error) {
	var c apiserverCost
	var err error
	if c.rss, err = r.processRSS(ctx, "kube-apiserver", settle); err != nil {
		return c, err
	}
	if c.heap, err = apiserverLiveHeap(ctx, r.rc); err != nil {
		return c, err
	}
	c.watches, err = apiserverWatches(ctx, r.rc)
	return c, err
}

// profile takes a CPU profile of dkc-server for d in the background into <Dir>/dkc-server-<name>.cpu.pprof;
// the returned func waits for it.
func (r *run) profile(ctx context.Context, name string, d time.Duration) func() {
	done := make(chan struct{})
	go func() {
		defer close(done)
		path := filepath.Join(r.cfg.Dir, "dkc-server-"+name+".cpu.pprof")
		if err := fetch(ctx, fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", r.cluster.MetricsAddress(), max(1, int(d.Seconds()))), path); err != nil {
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
	deadline := time.Now().Add(3 * time.Minute)
	for {
		n, err := serverMetric(ctx, r.cluster.MetricsAddress(), "dkc_server_connected_nodes", nil)
		if err == nil && int(n) >= want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("dkc-server reports %d of %d nodes connected (%v)", int(n), want, err)
		}
		time.Sleep(time.Second)
	}
}

// allOnShared points the propagation phase's nodes at the shared ConfigMap, as every other node is.
func (r *run) allOnShared(ctx context.Context) error {
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{
		resolve.SourceAnnotation: sourceAnnotation(cmShared)}}})
	return parallel(ctx, r.nodes[:r.cfg.PropagationNodes], 32, func(ctx context.Context, _ int, n string) error {
		_, err := r.client.CoreV1().Nodes().Patch(ctx, n, types.MergePatchType, patch, metav1.PatchOptions{})
		return err
	})
}

// scale connects ScaleNodes nodes in all and measures dkc-server's RSS per connected node.
func (r *run) scale(ctx context.Context) error {
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
	v, err := r.processRSS(ctx, "dkc-server", 10*time.Second)
	if err != nil {
		return err
	}
	r.res.set("service_rss_bytes_per_node_at_5000", float64(v-r.serviceRSSBase)/float64(len(nodes)))
	r.res.note("service_rss_bytes_at_5000", float64(v))
	r.res.note("service_rss_bytes_no_nodes_connected", float64(r.serviceRSSBase))
	// The peak (connecting, first pushes, status writes) is what a memory limit must allow, not the settled RSS.
	if pid, err := r.cluster.PID("dkc-server"); err == nil && pid != 0 {
		if peak, err := peakRSS(pid); err == nil {
			r.res.note("service_rss_peak_bytes_at_5000", float64(peak))
		}
	}
	if err := fetch(ctx, "http://"+r.cluster.MetricsAddress()+"/debug/pprof/heap", filepath.Join(r.cfg.Dir, "dkc-server-scale.heap.pprof")); err != nil {
		r.progress("heap profile: %v", err)
	}
	for _, m := range []string{"go_memstats_heap_inuse_bytes", "go_memstats_stack_inuse_bytes", "go_goroutines"} {
		if v, err := serverMetric(ctx, r.cluster.MetricsAddress(), m, nil); err == nil {
			r.res.note("service_"+strings.TrimPrefix(m, "go_memstats_")+"_at_5000", v)
		}
	}
	return nil
}

// connect starts simulated nodes for those of names not running yet.
func (r *run) connect(ctx context.Context, all []string) error {
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
			server: r.cluster.ServiceAddress(), caFile: ca, token: filepath.Join(r.nodeDir(name), "token"),
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

func (r *run) processRSS(ctx context.Context, name string, settle time.Duration) (int64, error) {
	pid, err := r.cluster.PID(name)
	if err != nil || pid == 0 {
		return 0, fmt.Errorf("%s not running (%v)", name, err)
	}
	return settledRSS(ctx, pid, settle)
}

// waitLastKnownGood waits until every node's status (as dkc-server wrote it) has cm@rv as last-known-good.
func (r *run) waitLastKnownGood(ctx context.Context, nodes []string, cm, rv string) error {
	want := map[string]bool{}
	for _, n := range nodes {
		want[n] = true
	}
	deadline := time.Now().Add(r.cfg.Trial + 3*time.Minute)
	for {
		list, err := r.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: "dkc.dev/bench=true", ResourceVersion: "0"})
		if err != nil {
			return err
		}
		missing := 0
		for i := range list.Items {
			n := &list.Items[i]
			if !want[n.Name] {
				continue
			}
			var st corev1.NodeConfigStatus
			if err := json.Unmarshal([]byte(n.Annotations[nodestatus.StatusAnnotation]), &st); err != nil ||
				st.LastKnownGood == nil || st.LastKnownGood.ConfigMap == nil ||
				st.LastKnownGood.ConfigMap.Name != cm || st.LastKnownGood.ConfigMap.ResourceVersion != rv || st.Error != "" {
				missing++
			}
		}
		if missing == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d nodes do not report %s@%s as last-known-good", missing, len(nodes), cm, rv)
		}
		time.Sleep(time.Second)
	}
}

// writeCounter counts Node modifications seen by a watch of the benchmark's Nodes.
type writeCounter struct {
	mu   sync.Mutex
	n    int
	stop func()
}

func (w *writeCounter) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n
}

func (r *run) countNodeWrites(ctx context.Context) (*writeCounter, error) {
	list, err := r.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{Limit: 1})
	if err != nil {
		return nil, err
	}
	w, err := r.client.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{LabelSelector: "dkc.dev/bench=true", ResourceVersion: list.ResourceVersion})
	if err != nil {
		return nil, err
	}
	c := &writeCounter{stop: w.Stop}
	go func() {
		for ev := range w.ResultChan() {
			if ev.Type == watch.Modified {
				c.mu.Lock()
				c.n++
				c.mu.Unlock()
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
	return fmt.Sprintf("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nfailSwapOn: false\n"+
		"maxPods: %d\neventRecordQPS: %d\n# %s\n", 100+generation, 5+generation, name)
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

// raiseFileLimit lifts the soft open-file limit to the hard one: every simulated node holds a connection.
func raiseFileLimit() error {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return err
	}
	l.Cur = l.Max
	return syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l)
}

// writeCSV keeps every change of the propagation phase for a closer look (before percentiles sort them).
func writeCSV(path string, nodes []string, start []time.Time, watched, received, checkpointed []time.Duration) error {
	var b strings.Builder
	b.WriteString("node,start_unix_ns,bare_watch_s,dkc_received_s,dkc_checkpointed_s\n")
	for i, n := range nodes {
		fmt.Fprintf(&b, "%s,%d,%.6f,%.6f,%.6f\n", n, start[i].UnixNano(), watched[i].Seconds(), received[i].Seconds(), checkpointed[i].Seconds())
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}
