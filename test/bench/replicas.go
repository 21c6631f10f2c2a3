// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/dkc-dev/dkc/test/devcluster"
)

// replicaName names the second replica the replicas phase starts (process dkc-server-replica-b).
const replicaName = "replica-b"

// replicas measures dkc-server as deployed with more than one replica (issue 42): two replicas with the
// Deployment's flags, GOMEMLIMIT and GOGC behind a load balancer in this process (balancer: as a Service's
// virtual IP), ReplicaNodes nodes split between them round-robin. Replica a is the cluster's dkc-server,
// restarted so that its peak RSS is this phase's; replica b is started here and is the one killed (the
// cluster's teardown never needs to know it). Then the shared ConfigMap is updated and, as soon as half the
// nodes have checkpointed the new version (the fan-out in full flow: the killed replica's nodes are caught
// both before and after receiving it), b is killed with SIGKILL, as an OOM kill or a lost machine would end
// it: no goodbye, its nodes find their connections reset and reconnect through the balancer, which skips
// b's refusing port.
//
// A node is served again when the survivor holds its stream (dkc_server_connected_nodes counts every node)
// and its Node shows the new version as last-known-good (waitLastKnownGood, as every phase's wait): its
// checkpoint made, its trial passed and its report written by the survivor. The time is from the kill until
// every node is served. The apiserver's window ("replicas-failover": requests, TokenReviews) starts right
// before the update, so that nothing slow stands between the half-way mark and the kill: the fan-out's
// first half is in it, while its CPU figure is the kill's onwards. The survivor's RSS peak is VmHWM since
// its restart (reset at the update where the kernel lets us, the earlier peak kept).
func (r *run) replicas(ctx context.Context) (err error) {
	started := time.Now()
	nodes := r.nodes[:r.cfg.ReplicaNodes]
	r.stopSims()
	if err := r.allOnShared(ctx); err != nil {
		return err
	}
	if err := r.restartServer(ctx); err != nil {
		return err
	}
	var b *devcluster.ServiceReplica
	if err := r.withDeploymentEnv(func() (err error) {
		b, err = r.cluster.StartServiceReplica(ctx, replicaName)
		return err
	}); err != nil {
		return fmt.Errorf("start replica b: %w", err) // one that did not get ready is stopped already
	}
	defer func() {
		if stopErr := b.Stop(); stopErr != nil && err == nil {
			err = fmt.Errorf("stop replica b: %w", stopErr)
		}
	}()
	pidA, err := r.cluster.PID("dkc-server")
	if err != nil || pidA == 0 {
		return fmt.Errorf("dkc-server not running (%w)", err)
	}
	metricsA, metricsB := r.cluster.MetricsAddress(), b.MetricsAddress()
	// The cluster's own sidecar (sim-1) connects to a directly: a's streams beyond the phase's nodes.
	ownA, err := serverMetric(ctx, metricsA, "dkc_server_connected_nodes", nil)
	if err != nil {
		return err
	}
	r.progress("replicas: a is the cluster's dkc-server (pid %d, %s), b pid %d on %s", pidA, r.cluster.ServiceAddress(),
		b.PID(), b.Address())

	time.Sleep(10 * time.Second)
	baseA, err := sampleServer(ctx, metricsA, pidA)
	if err != nil {
		return fmt.Errorf("replica a with no node connected: %w", err)
	}
	if _, err := sampleServer(ctx, metricsB, b.PID()); err != nil {
		return fmt.Errorf("replica b with no node connected: %w", err)
	}

	lb, err := newBalancer("127.0.0.1:0", r.cluster.ServiceAddress(), b.Address())
	if err != nil {
		return fmt.Errorf("start the balancer: %w", err)
	}
	defer lb.Close()
	// The nodes depend on the balancer: they go first (deferred calls run last first).
	defer r.stopSims()
	if err := r.connectTo(ctx, nodes, lb.Addr()); err != nil {
		return err
	}
	if err := r.rec.wait(ctx, nodes, cmShared, r.cmRV[cmShared], 5*time.Minute); err != nil {
		return err
	}
	if err := r.waitConnectedOn(ctx, len(nodes)+int(ownA), metricsA, metricsB); err != nil {
		return err
	}
	if err := r.waitLastKnownGood(ctx, nodes, cmShared, r.cmRV[cmShared]); err != nil {
		return err
	}
	time.Sleep(10 * time.Second)
	n := float64(len(nodes))
	r.res.set("replicas_nodes", n)
	for _, rep := range []struct {
		name, metrics string
		pid           int
		lb            int
		own           float64
	}{{"a", metricsA, pidA, 0, ownA}, {"b", metricsB, b.PID(), 1, 0}} {
		m, err := sampleServer(ctx, rep.metrics, rep.pid)
		if err != nil {
			return fmt.Errorf("replica %s settled: %w", rep.name, err)
		}
		connected, err := serverMetric(ctx, rep.metrics, "dkc_server_connected_nodes", nil)
		if err != nil {
			return fmt.Errorf("replica %s: %w", rep.name, err)
		}
		r.res.set("replicas_settled_rss_bytes_"+rep.name, float64(m.rss))
		r.res.note("replicas_settled_heap_bytes_"+rep.name, float64(m.heap))
		r.res.note("replicas_settled_stack_bytes_"+rep.name, float64(m.stack))
		r.res.set("replicas_nodes_"+rep.name, connected-rep.own)
		total, _ := lb.Forwarded(rep.lb)
		r.res.note("replicas_balancer_connections_"+rep.name, float64(total))
	}

	// The fan-out, and b's death in its middle.
	onB, err := serverMetric(ctx, metricsB, "dkc_server_connected_nodes", nil)
	if err != nil {
		return err
	}
	peakBefore, err := peakRSS(pidA)
	if err != nil {
		return err
	}
	apiPID, err := r.cluster.PID("kube-apiserver")
	if err != nil || apiPID == 0 {
		return fmt.Errorf("kube-apiserver not running (%w)", err)
	}
	win, err := r.startWindow(ctx, apiPID, "replicas-failover")
	if err != nil {
		return err
	}
	// VmHWM from here on is the fan-out's and the failover's, where the kernel resets it (see startWindow).
	reset := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pidA), []byte("5"), 0) == nil
	rv, _, updated, err := r.bumpShared(ctx)
	if err != nil {
		return err
	}
	if err := r.waitCheckpointed(ctx, nodes, rv, len(nodes)/2, 2*time.Minute); err != nil {
		return err
	}
	atKill := r.checkpointed(nodes, rv)
	lbBefore, _ := lb.Forwarded(0)
	stallsBefore := readRuntimeStalls()
	apiCPUBefore, err := procCPU(apiPID)
	if err != nil {
		return err
	}
	killed := time.Now()
	if err := syscall.Kill(b.PID(), syscall.SIGKILL); err != nil {
		return fmt.Errorf("kill replica b (pid %d): %w", b.PID(), err)
	}
	r.progress("replicas: killed b (%d nodes on it) %.1f s after the update, %d of %d nodes checkpointed",
		int(onB), killed.Sub(updated).Seconds(), atKill, len(nodes))
	r.res.note("replicas_kill_after_update_seconds", killed.Sub(updated).Seconds())
	r.res.note("replicas_checkpointed_at_kill", float64(atKill))
	r.res.note("replicas_nodes_on_killed_replica", onB)

	// Reconnected: every node's stream on a, polled; served: that and every Node's status.
	reconnected := make(chan error, 1)
	var reconnectedAt time.Time
	go func() {
		err := r.waitConnectedOn(ctx, len(nodes)+int(ownA), metricsA)
		reconnectedAt = time.Now()
		reconnected <- err
	}()
	if err := r.rec.wait(ctx, nodes, cmShared, rv, 5*time.Minute); err != nil {
		return errors.Join(err, <-reconnected)
	}
	checkpointedAt := time.Now()
	lkgErr := r.waitLastKnownGood(ctx, nodes, cmShared, rv)
	lkgAt := time.Now()
	if err := errors.Join(<-reconnected, lkgErr); err != nil {
		return fmt.Errorf("after replica b was killed: %w", err)
	}
	served := max(reconnectedAt.Sub(killed), lkgAt.Sub(killed))
	apiCPUAfter, err := procCPU(apiPID)
	if err != nil {
		return err
	}
	// The reconnect storm: connections the balancer gave a (every attempt, failed handshakes included) per
	// node b had; and how long this process, which runs the balancer beside every node, kept a runnable
	// goroutine waiting meanwhile (a handshake through the balancer waits for it at each hop).
	lbAfter, _ := lb.Forwarded(0)
	r.res.note("replicas_failover_connections_per_reconnected_node", float64(lbAfter-lbBefore)/max(onB, 1))
	r.res.note("replicas_failover_bench_sched_latency_max_seconds_ge",
		longestSince(stallsBefore.sched, readRuntimeStalls().sched))
	r.res.set("replicas_failover_reconnected_seconds", reconnectedAt.Sub(killed).Seconds())
	r.res.note("replicas_failover_all_checkpointed_seconds", checkpointedAt.Sub(killed).Seconds())
	r.res.note("replicas_failover_last_known_good_seconds", lkgAt.Sub(killed).Seconds())
	r.res.set("replicas_failover_all_served_seconds", served.Seconds())
	r.progress("replicas: every node served again %.1f s after the kill (streams back on a after %.1f s)",
		served.Seconds(), reconnectedAt.Sub(killed).Seconds())

	bd, err := win.end(ctx, r)
	if err != nil {
		return err
	}
	var reviews, requests float64
	for _, row := range bd.Requests {
		requests += row.Requests
		if row.Resource == "tokenreviews" {
			reviews += row.Requests
		}
	}
	r.res.set("replicas_failover_apiserver_cpu_seconds", (apiCPUAfter - apiCPUBefore).Seconds())
	r.res.note("replicas_window_apiserver_cpu_seconds", bd.CPUSeconds)
	r.res.set("replicas_failover_tokenreviews", reviews)
	r.res.note("replicas_failover_apiserver_requests", requests)
	r.res.note("replicas_failover_window_seconds", bd.WindowSeconds)
	r.res.Windows = append(r.res.Windows, apiserverWindowResult{Name: fmt.Sprintf(
		"replicas-failover: %d nodes on two replicas, from the fan-out's update (b killed %.1f s later) until every "+
			"node is served again", len(nodes), killed.Sub(updated).Seconds()),
		Breakdown: bd})

	peakFailover, err := peakRSS(pidA)
	if err != nil {
		return err
	}
	r.res.set("replicas_survivor_peak_rss_bytes", float64(max(peakBefore, peakFailover)))
	r.res.note("replicas_survivor_peak_rss_bytes_before_kill", float64(peakBefore))
	if reset {
		r.res.note("replicas_survivor_peak_rss_bytes_fanout_and_failover", float64(peakFailover))
	}
	r.res.note("deployment_memory_limit_bytes", float64(r.deployment.limit))
	time.Sleep(10 * time.Second)
	after, err := sampleServer(ctx, metricsA, pidA)
	if err != nil {
		return fmt.Errorf("the survivor settled: %w", err)
	}
	r.res.set("replicas_survivor_settled_rss_bytes", float64(after.rss))
	r.res.set("replicas_service_rss_bytes_per_connected_node", float64(after.rss-baseA.rss)/n)
	r.res.note("replicas_service_live_bytes_per_connected_node", float64(after.live()-baseA.live())/n)
	r.res.note("replicas_service_rss_bytes_no_nodes_connected", float64(baseA.rss))
	if v, err := serverMetric(ctx, metricsA, "go_goroutines", nil); err == nil {
		r.res.note("replicas_survivor_goroutines", v)
	}
	r.res.note("replicas_phase_seconds", time.Since(started).Seconds())
	return nil
}

// replicaFiles checks that this process may open the descriptors the replicas phase needs for nodes: three
// per node (the node's connection, both of the balancer's) and filesReserve besides. The hard limit can
// only be raised with CAP_SYS_RESOURCE (raiseFileLimit tries), so failing at once beats nodes failing to
// connect for minutes.
func replicaFiles(nodes int) error {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return err
	}
	if need := uint64(3*nodes + filesReserve); need > l.Cur {
		return fmt.Errorf("the replicas phase needs about %d open files for %d nodes (3 a node: its connection and "+
			"both ends in the balancer) and this process may open %d: lower -replica-nodes to %d or raise the hard "+
			"limit (ulimit -Hn, which needs CAP_SYS_RESOURCE)", need, nodes, l.Cur, fittingReplicaNodes())
	}
	return nil
}

// fittingReplicaNodes is the most nodes replicaFiles lets the phase run.
func fittingReplicaNodes() int {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return 0
	}
	return max(0, (int(l.Cur)-filesReserve)/3)
}

// filesReserve is the descriptors the benchmark holds besides the nodes' connections: its clients, the
// bare watch, logs, the nodes' files while they write them.
const filesReserve = 1000

// sampleServer is a dkc-server's memory (serverMemory, median of three) by its metrics address and PID.
func sampleServer(ctx context.Context, metrics string, pid int) (goMemory, error) {
	if pid == 0 {
		return goMemory{}, errors.New("not running")
	}
	return sampleMemory(ctx, 3, 2*time.Second, func(ctx context.Context) (goMemory, error) {
		return serverMemory(ctx, metrics, pid)
	})
}

// checkpointed is how many of nodes have checkpointed the shared ConfigMap at rv.
func (r *run) checkpointed(nodes []string, rv string) int {
	n := 0
	for _, node := range nodes {
		if _, ok := r.rec.get(node, cmShared, rv); ok {
			n++
		}
	}
	return n
}

// waitCheckpointed waits until at least want of nodes have checkpointed the shared ConfigMap at rv.
func (r *run) waitCheckpointed(ctx context.Context, nodes []string, rv string, want int,
	timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		got := r.checkpointed(nodes, rv)
		if got >= want {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d of %d nodes checkpointed %s@%s, want %d%s", got, len(nodes), cmShared, rv, want,
				r.rec.failure())
		case <-tick.C:
		}
	}
}

// apiserverWindowResult is one measured window of the apiserver outside the watches phase's comparisons.
type apiserverWindowResult struct {
	Name      string             `json:"name"`
	Breakdown apiserverBreakdown `json:"breakdown"`
}

// print writes the window's costliest requests (by handling time), the rest summed in one row.
func (w apiserverWindowResult) print(out io.Writer) {
	b := w.Breakdown
	fmt.Fprintf(out, "\napiserver by request, %s: window %.1f s, apiserver CPU %.2f s, RSS %s at the start, peak %s\n",
		w.Name, b.WindowSeconds, b.CPUSeconds, mib(b.RSSStartBytes), mib(b.RSSPeakBytes))
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "REQUEST\tN\tERRORS\tSECONDS\tRESPONSE\t")
	var rest, all requestRow
	line := func(name string, row requestRow) {
		var codes []string
		for _, code := range slices.Sorted(maps.Keys(row.Errors)) {
			codes = append(codes, fmt.Sprintf("%.0f×%s", row.Errors[code], code))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.2f\t%s\t\n", name, count(row.Requests), strings.Join(codes, " "), row.Seconds,
			size(row.ResponseBytes))
	}
	for i, row := range b.Requests {
		all.Requests, all.Seconds, all.ResponseBytes = all.Requests+row.Requests, all.Seconds+row.Seconds,
			all.ResponseBytes+row.ResponseBytes
		if i < breakdownRows {
			line(row.name(), row)
			continue
		}
		rest.Requests, rest.Seconds, rest.ResponseBytes = rest.Requests+row.Requests, rest.Seconds+row.Seconds,
			rest.ResponseBytes+row.ResponseBytes
	}
	if len(b.Requests) > breakdownRows {
		line(fmt.Sprintf("%d more", len(b.Requests)-breakdownRows), rest)
	}
	line("all", all)
	tw.Flush()
}
