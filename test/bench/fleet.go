// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/dkc-dev/dkc/internal/nodeconfig"
	"github.com/dkc-dev/dkc/sidecar/app"
	"github.com/dkc-dev/dkc/test/devcluster"
)

// Status at fleet speed: after a fan-out to every node, how long until every Node's status shows the new
// config active, against how long a bare client takes to make the same writes (a status patch and an Event
// per node) at full speed on the same apiserver — the apiserver's own limit on this machine.

// apfFile holds dkc-server's FlowSchema and PriorityLevelConfiguration.
const apfFile = "deploy/base/server-apf.yaml"

// applyAPF installs apfFile, its subjects naming the dev cluster's dkc-server user (it authenticates with a
// client certificate as devcluster.ServiceUser, not as the ServiceAccount), as the dev cluster does with
// the RBAC of deploy/.
func (r *run) applyAPF(ctx context.Context) error {
	data, err := os.ReadFile(r.cfg.APF)
	if err != nil {
		return fmt.Errorf("read the API Priority and Fairness objects: %w", err)
	}
	for _, doc := range strings.Split(string(data), "\n---\n") {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			return fmt.Errorf("%s: %w", r.cfg.APF, err)
		}
		switch meta.Kind {
		case "PriorityLevelConfiguration":
			var pl flowcontrolv1.PriorityLevelConfiguration
			if err := yaml.UnmarshalStrict([]byte(doc), &pl); err != nil {
				return fmt.Errorf("%s: %w", r.cfg.APF, err)
			}
			if _, err := r.client.FlowcontrolV1().PriorityLevelConfigurations().Create(ctx, &pl,
				metav1.CreateOptions{}); err != nil {
				return fmt.Errorf("create prioritylevelconfiguration %s: %w", pl.Name, err)
			}
		case "FlowSchema":
			var fs flowcontrolv1.FlowSchema
			if err := yaml.UnmarshalStrict([]byte(doc), &fs); err != nil {
				return fmt.Errorf("%s: %w", r.cfg.APF, err)
			}
			for i := range fs.Spec.Rules {
				for j, s := range fs.Spec.Rules[i].Subjects {
					if s.Kind == flowcontrolv1.SubjectKindServiceAccount && s.ServiceAccount.Name == "dkc-server" {
						fs.Spec.Rules[i].Subjects[j] = flowcontrolv1.Subject{Kind: flowcontrolv1.SubjectKindUser,
							User: &flowcontrolv1.UserSubject{Name: devcluster.ServiceUser}}
					}
				}
			}
			if _, err := r.client.FlowcontrolV1().FlowSchemas().Create(ctx, &fs, metav1.CreateOptions{}); err != nil {
				return fmt.Errorf("create flowschema %s: %w", fs.Name, err)
			}
		case "":
		default:
			return fmt.Errorf("%s: unexpected kind %s", r.cfg.APF, meta.Kind)
		}
	}
	return nil
}

// activeWatcher records when each Node's status annotation first shows a ConfigMap version active.
type activeWatcher struct {
	cm, rv string
	want   map[string]bool

	mu    sync.Mutex
	at    map[string]time.Time
	err   error
	all   chan struct{} // closed when every wanted node is active
	stopc chan struct{}
	done  chan struct{}
}

// watchActive starts watching the benchmark's Nodes for cm active on each of nodes, at the version
// setVersion names (once the ConfigMap is updated: no node can show it before). Like writeCounter, it
// resumes a watch the apiserver ends from the last resourceVersion seen.
func (r *run) watchActive(ctx context.Context, nodes []string, cm string) (*activeWatcher, error) {
	list, err := r.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{Limit: 1})
	if err != nil {
		return nil, err
	}
	a := &activeWatcher{cm: cm, want: map[string]bool{}, at: map[string]time.Time{}, all: make(chan struct{}),
		stopc: make(chan struct{}), done: make(chan struct{})}
	for _, n := range nodes {
		a.want[n] = true
	}
	wctx, cancel := context.WithCancel(ctx)
	go func() { <-a.stopc; cancel() }()
	go func() {
		defer close(a.done)
		last := list.ResourceVersion
		for wctx.Err() == nil {
			w, err := r.client.CoreV1().Nodes().Watch(wctx,
				metav1.ListOptions{LabelSelector: "dkc.dev/bench=true", ResourceVersion: last})
			if err != nil {
				if wctx.Err() == nil {
					a.fail(fmt.Errorf("the active-status watch could not resume from %s: %w", last, err))
				}
				return
			}
			for ev := range w.ResultChan() {
				if ev.Type == watch.Error {
					a.fail(fmt.Errorf("the active-status watch failed: %w", apierrors.FromObject(ev.Object)))
					w.Stop()
					return
				}
				n, ok := ev.Object.(*corev1.Node)
				if !ok {
					continue
				}
				last = n.ResourceVersion
				a.saw(n, time.Now())
			}
		}
	}()
	return a, nil
}

func (a *activeWatcher) fail(err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.err == nil {
		a.err = err
	}
}

// setVersion names the ConfigMap version to wait for.
func (a *activeWatcher) setVersion(rv string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.rv = rv
}

func (a *activeWatcher) saw(n *corev1.Node, t time.Time) {
	if !a.want[n.Name] {
		return
	}
	var st corev1.NodeConfigStatus
	if json.Unmarshal([]byte(n.Annotations[nodeconfig.StatusAnnotation]), &st) != nil || st.Active == nil ||
		st.Active.ConfigMap == nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.rv == "" || st.Active.ConfigMap.Name != a.cm || st.Active.ConfigMap.ResourceVersion != a.rv {
		return
	}
	if _, seen := a.at[n.Name]; seen {
		return
	}
	a.at[n.Name] = t
	if len(a.at) == len(a.want) {
		close(a.all)
	}
}

// seen is how many nodes were seen active so far.
func (a *activeWatcher) seen() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.at)
}

// watchFleet prints, every 15 s until the returned func is called, how many of n Nodes show the new config
// active and where dkc-server's status writes stand: its status queue's depth and the writes and Events
// so far by result (the figures that say whether the apiserver or dkc-server's own workers are the limit).
func (r *run) watchFleet(ctx context.Context, a *activeWatcher, n int) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(15 * time.Second)
		defer t.Stop()
		start := time.Now()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
			fams, err := serverMetrics(ctx, r.cluster.MetricsAddress())
			if err != nil {
				r.progress("max: %d/%d Nodes active after %.0f s (dkc-server metrics: %v)", a.seen(), n,
					time.Since(start).Seconds(), err)
				continue
			}
			w := func(result string) float64 {
				return metricSum(fams, "dkc_server_node_status_writes_total", map[string]string{"result": result})
			}
			r.progress("max: %d/%d Nodes active after %.0f s; status queue depth %.0f, writes written %.0f queued %.0f held "+
				"%.0f error %.0f, events created %.0f",
				a.seen(), n, time.Since(start).Seconds(),
				metricSum(fams, "workqueue_depth", map[string]string{"name": "nodestatus"}),
				w("written"), w("queued"), w("held"), w("error"),
				metricSum(fams, "dkc_server_restart_events_total", map[string]string{"result": "created"}))
		}
	}()
	return func() { close(done); wg.Wait() }
}

// wait returns when every node was seen active, or after timeout: the last one's time and how many were
// never seen active.
func (a *activeWatcher) wait(ctx context.Context, timeout time.Duration) (time.Time, int, error) {
	defer func() { close(a.stopc); <-a.done }()
	select {
	case <-a.all:
	case <-ctx.Done():
		return time.Time{}, 0, ctx.Err()
	case <-a.done:
	case <-time.After(timeout):
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.err != nil {
		return time.Time{}, 0, a.err
	}
	var last time.Time
	for _, t := range a.at {
		if t.After(last) {
			last = t
		}
	}
	return last, len(a.want) - len(a.at), nil
}

// explainTail prints when the nodes became active after the update at start, in 10-second buckets, and for
// the latest few when their sidecar received and checkpointed the version and what it logged last: whether
// a slow tail waited for delivery (before the checkpoint) or for the status path (after it).
func (r *run) explainTail(a *activeWatcher, nodes []string, start time.Time) {
	a.mu.Lock()
	at := maps.Clone(a.at)
	rv := a.rv
	a.mu.Unlock()
	buckets := map[int]int{}
	var order []string
	for _, n := range nodes {
		t, ok := at[n]
		if !ok {
			buckets[-1]++
			continue
		}
		buckets[int(t.Sub(start)/(10*time.Second))]++
		order = append(order, n)
	}
	keys := slices.Sorted(maps.Keys(buckets))
	var b strings.Builder
	for _, k := range keys {
		if k < 0 {
			fmt.Fprintf(&b, " never:%d", buckets[k])
			continue
		}
		fmt.Fprintf(&b, " %d-%ds:%d", 10*k, 10*k+10, buckets[k])
	}
	r.progress("max: Nodes by when they showed the new config active:%s", b.String())
	slices.SortFunc(order, func(x, y string) int { return at[y].Compare(at[x]) })
	for i, n := range order[:min(5, len(order))] {
		since := func(event string) string {
			if t, ok := r.rec.getEvent(event, n, a.cm, rv); ok {
				return fmt.Sprintf("%.1fs", t.Sub(start).Seconds())
			}
			return "never"
		}
		r.progress("max: late node %s: received %s, checkpointed %s, active on the Node %.1fs", n,
			since(app.TraceReceived), since(app.TraceCheckpointed), at[n].Sub(start).Seconds())
		if i == 0 {
			fmt.Fprint(os.Stdout, r.describeNode(n))
		}
	}
}

// apiserverLoad is what the apiserver's /metrics say about a window: its request rate, and the rate and
// latency of the two writes a node's status costs.
type apiserverLoad struct {
	requests, statusPatches, events float64 // per second
	patchMean, patchP99             float64 // seconds; p99 is a bucket's upper bound
	eventMean, eventP99             float64
	// apfDispatched and apfRejected are the requests of dkc's priority level (server-apf.yaml).
	apfDispatched, apfRejected float64
}

func (r *run) apiserverMetrics(ctx context.Context) (map[string]*dto.MetricFamily, error) {
	data, err := apiserverGet(ctx, r.rc, "/metrics")
	if err != nil {
		return nil, err
	}
	return metricFamilies(strings.NewReader(string(data)))
}

var (
	statusPatch = map[string]string{"verb": "PATCH", "resource": "nodes", "subresource": "status"}
	eventCreate = map[string]string{"verb": "POST", "resource": "events"}
)

// load computes the window's figures from scrapes before and after it.
func load(before, after map[string]*dto.MetricFamily, d time.Duration) apiserverLoad {
	delta := func(name string, match map[string]string) float64 {
		return metricSum(after, name, match) - metricSum(before, name, match)
	}
	latency := func(match map[string]string) (mean, p99 float64) {
		var sum, count float64
		for _, fam := range []struct {
			f    map[string]*dto.MetricFamily
			sign float64
		}{{after, 1}, {before, -1}} {
			for _, m := range matching(fam.f, "apiserver_request_duration_seconds", match) {
				sum += fam.sign * m.GetHistogram().GetSampleSum()
				count += fam.sign * float64(m.GetHistogram().GetSampleCount())
			}
		}
		if count > 0 {
			mean = sum / count
		}
		p99, _ = histogramOf(after, "apiserver_request_duration_seconds", match).quantile(
			histogramOf(before, "apiserver_request_duration_seconds", match), 0.99)
		return mean, p99
	}
	s := d.Seconds()
	l := apiserverLoad{
		requests:      delta("apiserver_request_total", nil) / s,
		statusPatches: delta("apiserver_request_total", statusPatch) / s,
		events:        delta("apiserver_request_total", eventCreate) / s,
		apfDispatched: delta("apiserver_flowcontrol_dispatched_requests_total",
			map[string]string{"priority_level": "dkc-node-status"}),
		apfRejected: delta("apiserver_flowcontrol_rejected_requests_total",
			map[string]string{"priority_level": "dkc-node-status"}),
	}
	l.patchMean, l.patchP99 = latency(statusPatch)
	l.eventMean, l.eventP99 = latency(eventCreate)
	return l
}

// record puts the window's figures in the results under prefix.
func (l apiserverLoad) record(res *Results, prefix string) {
	res.set(prefix+"_apiserver_requests_per_second", l.requests)
	res.note(prefix+"_apiserver_status_patches_per_second", l.statusPatches)
	res.note(prefix+"_apiserver_events_per_second", l.events)
	res.set(prefix+"_apiserver_status_patch_mean_seconds", l.patchMean)
	res.set(prefix+"_apiserver_status_patch_p99_le_seconds", l.patchP99)
	res.note(prefix+"_apiserver_event_mean_seconds", l.eventMean)
	res.note(prefix+"_apiserver_event_p99_le_seconds", l.eventP99)
	res.note(prefix+"_apf_dkc_node_status_dispatched", l.apfDispatched)
	res.note(prefix+"_apf_dkc_node_status_rejected", l.apfRejected)
}

// fleetWrites counts dkc-server's Node status patches and kubelet-restart Events.
type fleetWrites struct{ patches, events int }

func (w fleetWrites) minus(o fleetWrites) fleetWrites {
	return fleetWrites{patches: w.patches - o.patches, events: w.events - o.events}
}

// serverWrites reads dkc-server's counts of status patches written and restart Events created.
func (r *run) serverWrites(ctx context.Context) (fleetWrites, error) {
	fams, err := serverMetrics(ctx, r.cluster.MetricsAddress())
	if err != nil {
		return fleetWrites{}, fmt.Errorf("dkc-server's write counts: %w", err)
	}
	return fleetWrites{
		patches: int(metricSum(fams, "dkc_server_node_status_writes_total", map[string]string{"result": "written"})),
		events:  int(metricSum(fams, "dkc_server_restart_events_total", map[string]string{"result": "created"})),
	}, nil
}

// bareWorkers is how many writes the bare client keeps in flight: more than dkc-server's bound
// (--max-inline-status-writes + --status-workers), so that the apiserver, not the client, is the limit.
const bareWorkers = 384

// bareClient makes the writes dkc made (want: at least one of each per node): Events and strategic-merge
// patches of the Nodes' status of the same shape as dkc's (an annotation holding a status JSON, a
// condition, status.config), going round the nodes, each round's patch another content; per node an Event,
// then its patch, as dkc writes them. At full speed: no client-side limit, bareWorkers at a time. It runs
// as dkc-server does (its kubeconfig: the same identity, so the same FlowSchema, and protobuf), and returns
// how long the writes took.
func (r *run) bareClient(ctx context.Context, nodes []string, gen int, want fleetWrites) (time.Duration, error) {
	// The dev cluster writes dkc-server's kubeconfig beside its admin one (devcluster's startService).
	rc, err := clientcmd.BuildConfigFromFlags("",
		filepath.Join(filepath.Dir(r.cluster.KubeconfigPath()), "dkc-server.kubeconfig"))
	if err != nil {
		return 0, err
	}
	rc.QPS, rc.Burst = -1, 0
	rc.UserAgent = "dkc-bench-bare-client"
	rc.ContentType = "application/vnd.kubernetes.protobuf"
	rc.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return 0, err
	}
	restClient, ok := client.CoreV1().RESTClient().(*rest.RESTClient)
	if !ok {
		return 0, errors.New("no REST client")
	}
	// Round k of the nodes writes the k-th patch (and Event) of each: a node's next write comes a whole
	// round of the nodes later, as dkc's next write of a node comes with its next report.
	n := max(want.patches, want.events, len(nodes))
	writes := make([]string, n)
	for i := range writes {
		writes[i] = nodes[i%len(nodes)]
	}
	start := time.Now()
	err = parallel(ctx, writes, bareWorkers, func(ctx context.Context, i int, node string) error {
		round := gen*1000 + i/len(nodes)
		status := fmt.Sprintf(`{"assigned":{"configMap":{"namespace":"kube-system","name":"bench-bare",`+
			`"uid":"00000000-0000-0000-0000-%012d","resourceVersion":"%d","kubeletConfigKey":"kubelet"}},`+
			`"active":{"configMap":{"namespace":"kube-system","name":"bench-bare",`+
			`"uid":"00000000-0000-0000-0000-%012d","resourceVersion":"%d","kubeletConfigKey":"kubelet"}}}`,
			round, round, round, round)
		now := metav1.NewTime(time.Now())
		if i >= max(want.events, len(nodes)) {
			return r.barePatch(ctx, restClient, node, status, round, now)
		}
		ev := &corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{Name: fmt.Sprintf("%s.bare%d", node, round), Namespace: metav1.NamespaceDefault},
			InvolvedObject: corev1.ObjectReference{Kind: "Node", Name: node, UID: types.UID(node)},
			Reason:         "BenchBareClient",
			Message: "Kubelet restarting to use /api/v1/namespaces/kube-system/configmaps/bench-bare, UID: 0, " +
				"ResourceVersion: 0, KubeletConfigKey: kubelet",
			Type: corev1.EventTypeNormal, Source: corev1.EventSource{Component: "dkc-bench", Host: node},
			FirstTimestamp: now, LastTimestamp: now, Count: 1,
		}
		if _, err := client.CoreV1().Events(metav1.NamespaceDefault).Create(ctx, ev, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("bare client: create event for node %s: %w", node, err)
		}
		if i >= max(want.patches, len(nodes)) {
			return nil
		}
		return r.barePatch(ctx, restClient, node, status, round, now)
	})
	return time.Since(start), err
}

// barePatch patches node's status as dkc does, with status as its annotation. It writes dkc's own status
// annotation: the admission policy lets dkc-server's identity change no other annotation through
// nodes/status (deploy/base/config-source-policy.yaml), and nothing reads the Nodes' status after this,
// the benchmark's last window (dkc-server writes a node's status on its reports, never on a Node update).
func (r *run) barePatch(ctx context.Context, restClient *rest.RESTClient, node, status string, round int,
	now metav1.Time) error {
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"annotations": map[string]string{nodeconfig.StatusAnnotation: status}},
		"status": map[string]any{
			"config": map[string]any{"error": nil},
			"conditions": []corev1.NodeCondition{{Type: "BenchBareClient", Status: corev1.ConditionTrue, Reason: "UsingCurrent",
				Message: fmt.Sprintf("using current (UID: 00000000-0000-0000-0000-%012d)", round), LastHeartbeatTime: now,
				LastTransitionTime: now}},
		},
	})
	if err != nil {
		return err
	}
	opts := metav1.PatchOptions{FieldManager: "dkc-bench-bare-client"}
	if err := restClient.Patch(types.StrategicMergePatchType).Resource("nodes").Name(node).SubResource("status").
		VersionedParams(&opts, scheme.ParameterCodec).Body(patch).Do(ctx).Error(); err != nil {
		return fmt.Errorf("bare client: patch status of node %s: %w", node, err)
	}
	return nil
}
