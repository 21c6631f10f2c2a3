// SPDX-License-Identifier: Apache-2.0

package controller

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/dkc-dev/dkc/internal/nodeconfig"
	"github.com/dkc-dev/dkc/services/internal/assignment"
	"github.com/dkc-dev/dkc/services/internal/configmaps"
	"github.com/dkc-dev/dkc/services/internal/resolve"
)

// configMaps is the ConfigMap tracker as the controller sees it, over a map.
type configMaps struct {
	cms    map[string]*corev1.ConfigMap
	byNode map[string]string
}

func (f *configMaps) Track(node, key string) {
	if key == "" {
		delete(f.byNode, node)
		return
	}
	f.byNode[node] = key
}

func (f *configMaps) Get(key string) (*corev1.ConfigMap, bool, error) { return f.cms[key], true, nil }

func (f *configMaps) Nodes(key string) []string {
	var nodes []string
	for n, k := range f.byNode {
		if k == key {
			nodes = append(nodes, n)
		}
	}
	slices.Sort(nodes)
	return nodes
}

func (f *configMaps) Run(ctx context.Context) error { <-ctx.Done(); return nil }
func (f *configMaps) Watched() int                  { return len(f.cms) }

// fixture drives a controller by hand: the Node cache is an informer's store filled directly (the informer
// never runs), and every change is followed by the syncs its events would queue.
type fixture struct {
	t         *testing.T
	c         *Controller
	store     cache.Store
	cms       *configMaps
	table     *assignment.Table
	forgotten []string
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	// Never contacted: the informer is not started.
	client, err := kubernetes.NewForConfig(&rest.Config{Host: "http://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	nodeInformer := informers.NewSharedInformerFactory(client, 0).Core().V1().Nodes()
	f := &fixture{t: t, store: nodeInformer.Informer().GetStore(), table: assignment.NewTable(nil),
		cms: &configMaps{cms: map[string]*corev1.ConfigMap{}, byNode: map[string]string{}}}
	f.c = New(Config{Log: zap.NewNop(), Nodes: nodeInformer, Table: f.table, Namespaces: resolve.NewNamespaces("kube-system"),
		ConfigMaps: func(func(string)) ConfigMaps { return f.cms },
		Forget:     func(node string) { f.forgotten = append(f.forgotten, node) }})
	return f
}

func (f *fixture) sync(node string) {
	f.t.Helper()
	if err := f.c.sync(context.Background(), node); err != nil {
		f.t.Fatalf("sync %s: %v", node, err)
	}
}

// assign sets the node's source annotation (creating the Node): a ConfigMap name in kube-system with
// key "kubelet", "name/key" for another key, "" for local config, or a raw value starting with "{".
func (f *fixture) assign(node, source string) {
	f.t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, Annotations: map[string]string{}}}
	switch {
	case source == "":
	case source[0] == '{':
		n.Annotations[nodeconfig.SourceAnnotation] = source
	default:
		name, key := source, "kubelet"
		if i := len(source) - len("/other"); i > 0 && source[i:] == "/other" {
			name, key = source[:i], "other"
		}
		n.Annotations[nodeconfig.SourceAnnotation] = fmt.Sprintf(`{"configMap":{"namespace":"kube-system","name":%q,"kubeletConfigKey":%q}}`, name, key)
	}
	if err := f.store.Update(n); err != nil {
		f.t.Fatal(err)
	}
	f.sync(node)
}

func (f *fixture) deleteNode(node string) {
	f.t.Helper()
	if err := f.store.Delete(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}); err != nil {
		f.t.Fatal(err)
	}
	f.sync(node)
}

// putConfigMap creates or updates a ConfigMap in kube-system at resourceVersion rv, then re-resolves its nodes.
func (f *fixture) putConfigMap(name, rv string) {
	f.t.Helper()
	key := configmaps.Key("kube-system", name)
	f.cms.cms[key] = &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: name, UID: types.UID("uid-" + name), ResourceVersion: rv},
		Data:       map[string]string{"kubelet": "rv " + rv, "other": "other " + rv},
	}
	f.configMapChanged(key)
}

func (f *fixture) deleteConfigMap(name string) {
	f.t.Helper()
	key := configmaps.Key("kube-system", name)
	delete(f.cms.cms, key)
	f.configMapChanged(key)
}

func (f *fixture) configMapChanged(key string) {
	f.t.Helper()
	for _, n := range f.cms.Nodes(key) {
		f.sync(n)
	}
}

func nodeNames(n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("node-%d", i)
	}
	return names
}

// TestResolvedConfigsFollowNodes: the controller holds a ConfigMap version resolved only while a Node's
// source names it, and only its latest version; deleted Nodes are forgotten everywhere.
func TestResolvedConfigsFollowNodes(t *testing.T) {
	nodes := nodeNames(10)
	for _, tc := range []struct {
		name          string
		steps         func(f *fixture)
		wantResolved  int
		wantTable     int
		wantForgotten []string
	}{
		{"nodes on one configmap", func(f *fixture) {
			f.putConfigMap("a-1", "1")
			for _, n := range nodes {
				f.assign(n, "a-1")
			}
		}, 1, 10, nil},
		{"hashed configmaps: nodes move on", func(f *fixture) {
			for i := range 20 {
				f.putConfigMap(fmt.Sprintf("a-%d", i), "1")
				for _, n := range nodes {
					f.assign(n, fmt.Sprintf("a-%d", i))
				}
			}
		}, 1, 10, nil},
		{"half moved on", func(f *fixture) {
			f.putConfigMap("a-1", "1")
			f.putConfigMap("a-2", "1")
			for _, n := range nodes {
				f.assign(n, "a-1")
			}
			for _, n := range nodes[:5] {
				f.assign(n, "a-2")
			}
		}, 2, 10, nil},
		{"reset to local config", func(f *fixture) {
			f.putConfigMap("a-1", "1")
			for _, n := range nodes {
				f.assign(n, "a-1")
				f.assign(n, "")
			}
		}, 0, 10, nil},
		{"invalid source", func(f *fixture) {
			f.putConfigMap("a-1", "1")
			for _, n := range nodes {
				f.assign(n, "a-1")
				f.assign(n, `{}`)
			}
		}, 0, 10, nil},
		{"nodes deleted", func(f *fixture) {
			f.putConfigMap("a-1", "1")
			f.putConfigMap("a-2", "1")
			for i, n := range nodes {
				f.assign(n, fmt.Sprintf("a-%d", 1+i%2))
			}
			for _, n := range nodes {
				f.deleteNode(n)
			}
		}, 0, 0, nodes},
		{"updated in place: only the latest version", func(f *fixture) {
			f.putConfigMap("a", "1")
			for _, n := range nodes {
				f.assign(n, "a")
			}
			f.putConfigMap("a", "2")
			f.putConfigMap("a", "3")
		}, 1, 10, nil},
		{"configmap deleted", func(f *fixture) {
			f.putConfigMap("a-1", "1")
			for _, n := range nodes {
				f.assign(n, "a-1")
			}
			f.deleteConfigMap("a-1")
		}, 0, 10, nil},
		{"configmap deleted and recreated", func(f *fixture) {
			f.putConfigMap("a-1", "1")
			for _, n := range nodes {
				f.assign(n, "a-1")
			}
			f.deleteConfigMap("a-1")
			f.putConfigMap("a-1", "5")
		}, 1, 10, nil},
		{"two keys of one configmap", func(f *fixture) {
			f.putConfigMap("a-1", "1")
			for i, n := range nodes {
				if i%2 == 0 {
					f.assign(n, "a-1")
				} else {
					f.assign(n, "a-1/other")
				}
			}
		}, 2, 10, nil},
		{"node pointed at a missing configmap, then deleted", func(f *fixture) {
			f.assign(nodes[0], "never-created")
			f.deleteNode(nodes[0])
		}, 0, 0, nodes[:1]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			tc.steps(f)
			if got := f.c.ResolvedConfigs(); got != tc.wantResolved {
				t.Errorf("ResolvedConfigs = %d, want %d", got, tc.wantResolved)
			}
			if got := f.table.Len(); got != tc.wantTable {
				t.Errorf("table holds %d nodes, want %d", got, tc.wantTable)
			}
			if !slices.Equal(f.forgotten, tc.wantForgotten) {
				t.Errorf("forgotten %v, want %v", f.forgotten, tc.wantForgotten)
			}
			// Whatever is held, every node on a ConfigMap version is on its latest one, shared.
			var first = map[string]any{}
			for _, n := range nodes {
				st, ok, _ := f.table.Get(n)
				cm := st.Assignment.GetSource().GetConfigMap()
				if !ok || cm == nil || st.SyncError != "" {
					continue
				}
				if want := f.cms.cms[configmaps.Key(cm.GetNamespace(), cm.GetName())]; want != nil && cm.GetResourceVersion() != want.ResourceVersion {
					t.Errorf("%s on resourceVersion %s, want %s", n, cm.GetResourceVersion(), want.ResourceVersion)
				}
				k := cm.GetName() + "/" + cm.GetKubeletConfigKey()
				if p, ok := first[k]; ok && p != any(st.Assignment) {
					t.Errorf("%s holds its own copy of %s", n, k)
				}
				first[k] = st.Assignment
			}
		})
	}
}

// TestSharedUse is the reference counting alone, step by step.
func TestSharedUse(t *testing.T) {
	ref := func(name string) *corev1.ConfigMapNodeConfigSource {
		return &corev1.ConfigMapNodeConfigSource{Namespace: "ns", Name: name, KubeletConfigKey: "kubelet"}
	}
	cm := func(name, rv string) *corev1.ConfigMap {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: "u", ResourceVersion: rv},
			Data: map[string]string{"kubelet": rv}}
	}
	s := newShared()
	resolveAs := func(node, name, rv string) {
		t.Helper()
		s.use(node, sourceKey(ref(name)))
		if _, err := s.resolve(ref(name), cm(name, rv)); err != nil {
			t.Fatal(err)
		}
	}
	for _, step := range []struct {
		name string
		do   func()
		want int // versions held
		keys int // sources named
	}{
		{"n1 on a", func() { resolveAs("n1", "a", "1") }, 1, 1},
		{"n2 on a", func() { resolveAs("n2", "a", "1") }, 1, 1},
		{"n1 to b", func() { resolveAs("n1", "b", "1") }, 2, 2},
		{"a updated", func() { resolveAs("n2", "a", "2") }, 2, 2},
		{"n2 to b", func() { resolveAs("n2", "b", "1") }, 1, 1},
		{"n2 again on b", func() { s.use("n2", sourceKey(ref("b"))) }, 1, 1},
		{"b gone", func() { s.gone(sourceKey(ref("b"))) }, 0, 1},
		{"b back", func() { resolveAs("n1", "b", "7") }, 1, 1},
		{"n1 local", func() { s.use("n1", "") }, 1, 1},
		{"n2 deleted", func() { s.use("n2", "") }, 0, 0},
		{"unknown node released", func() { s.use("n3", "") }, 0, 0},
		{"resolved without use is not kept", func() { _, _ = s.resolve(ref("c"), cm("c", "1")) }, 0, 0},
	} {
		step.do()
		if got := s.size(); got != step.want {
			t.Errorf("after %s: %d versions held, want %d", step.name, got, step.want)
		}
		if len(s.byKey) != step.keys {
			t.Errorf("after %s: %d sources held, want %d", step.name, len(s.byKey), step.keys)
		}
	}
	if len(s.byNode) != 0 {
		t.Errorf("nodes still held: %v", s.byNode)
	}
}

// TestNodeObjectFollowed: the node's state names the Node object it was resolved from, and a Node registered
// again under the name (another UID) is a change even with the same source, also when the deletion was
// never seen as such (a relist turns it into an update).
func TestNodeObjectFollowed(t *testing.T) {
	f := newFixture(t)
	put := func(uid string) {
		t.Helper()
		if err := f.store.Update(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", UID: types.UID(uid)},
			Status: corev1.NodeStatus{NodeInfo: corev1.NodeSystemInfo{KubeletVersion: "v1.37.2"},
				Capacity: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("110"),
					corev1.ResourceMemory: resource.MustParse("8148240Ki")}}}); err != nil {
			t.Fatal(err)
		}
	}
	put("uid-1")
	f.sync("n1")
	want := map[string]string{"memory": "8148240Ki"} // not pods: the kubelet's maxPods
	if st, _, _ := f.table.Get("n1"); st.NodeUID != "uid-1" || st.KubeletVersion != "v1.37.2" ||
		!maps.Equal(st.NodeCapacity, want) {
		t.Fatalf("state names node %q with kubelet %q and capacity %v, want uid-1 with the Node's v1.37.2 and %v",
			st.NodeUID, st.KubeletVersion, st.NodeCapacity, want)
	}
	_, _, changed := f.table.Get("n1")
	put("uid-2")
	f.sync("n1")
	if st, _, _ := f.table.Get("n1"); st.NodeUID != "uid-2" {
		t.Fatalf("state names node %q after the Node was registered again, want uid-2", st.NodeUID)
	}
	select {
	case <-changed:
	default:
		t.Error("the Node registered again did not wake the node's stream")
	}
	for _, tc := range []struct {
		name string
		o, n *corev1.Node
		want bool
	}{
		{"heartbeat", &corev1.Node{ObjectMeta: metav1.ObjectMeta{UID: "a", ResourceVersion: "1"}}, &corev1.Node{ObjectMeta: metav1.ObjectMeta{UID: "a", ResourceVersion: "2"}}, false},
		{"registered again, same source", &corev1.Node{ObjectMeta: metav1.ObjectMeta{UID: "a"}}, &corev1.Node{ObjectMeta: metav1.ObjectMeta{UID: "b"}}, true},
		{"source changed", &corev1.Node{ObjectMeta: metav1.ObjectMeta{UID: "a"}},
			&corev1.Node{ObjectMeta: metav1.ObjectMeta{UID: "a", Annotations: map[string]string{nodeconfig.SourceAnnotation: "{}"}}}, true},
		{"kubelet upgraded", &corev1.Node{ObjectMeta: metav1.ObjectMeta{UID: "a"}, Status: corev1.NodeStatus{NodeInfo: corev1.NodeSystemInfo{KubeletVersion: "v1.36.3"}}},
			&corev1.Node{ObjectMeta: metav1.ObjectMeta{UID: "a"}, Status: corev1.NodeStatus{NodeInfo: corev1.NodeSystemInfo{KubeletVersion: "v1.37.2"}}}, true},
		{"cordoned", &corev1.Node{ObjectMeta: metav1.ObjectMeta{UID: "a"}},
			&corev1.Node{ObjectMeta: metav1.ObjectMeta{UID: "a"}, Spec: corev1.NodeSpec{Unschedulable: true}}, true},
		{"drain mark removed", &corev1.Node{ObjectMeta: metav1.ObjectMeta{UID: "a", Annotations: map[string]string{nodeconfig.DrainedAnnotation: "{}"}}},
			&corev1.Node{ObjectMeta: metav1.ObjectMeta{UID: "a"}}, true},
		{"capacity rewritten unchanged",
			&corev1.Node{ObjectMeta: metav1.ObjectMeta{UID: "a"}, Status: corev1.NodeStatus{Capacity: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4")}}},
			&corev1.Node{ObjectMeta: metav1.ObjectMeta{UID: "a"}, Status: corev1.NodeStatus{Capacity: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4000m")}}}, false},
		{"only the pods capacity changed (maxPods)",
			&corev1.Node{ObjectMeta: metav1.ObjectMeta{UID: "a"}, Status: corev1.NodeStatus{Capacity: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("110")}}},
			&corev1.Node{ObjectMeta: metav1.ObjectMeta{UID: "a"}, Status: corev1.NodeStatus{Capacity: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("20")}}}, false},
		{"hugepages appeared",
			&corev1.Node{ObjectMeta: metav1.ObjectMeta{UID: "a"}},
			&corev1.Node{ObjectMeta: metav1.ObjectMeta{UID: "a"}, Status: corev1.NodeStatus{Capacity: corev1.ResourceList{"hugepages-2Mi": resource.MustParse("1Gi")}}}, true},
		{"capacity changed",
			&corev1.Node{ObjectMeta: metav1.ObjectMeta{UID: "a"}, Status: corev1.NodeStatus{Capacity: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4")}}},
			&corev1.Node{ObjectMeta: metav1.ObjectMeta{UID: "a"}, Status: corev1.NodeStatus{Capacity: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("8")}}}, true},
	} {
		if got := needsSync(tc.o, tc.n); got != tc.want {
			t.Errorf("%s: needsSync = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestSameExceptVersion(t *testing.T) {
	a := assignment.State{Assignment: resolve.Local(), NodeUID: "a", KubeletVersion: "v1.36.3"}
	for _, tc := range []struct {
		name   string
		change func(*assignment.State)
		want   bool
	}{
		{"only the kubelet version", func(s *assignment.State) { s.KubeletVersion = "v1.37.2" }, true},
		{"nothing", func(*assignment.State) {}, true},
		{"the node's capacity", func(s *assignment.State) { s.NodeCapacity = map[string]string{"pods": "110"} }, true},
		{"the node object", func(s *assignment.State) { s.NodeUID, s.KubeletVersion = "b", "v1.37.2" }, false},
		{"a sync error", func(s *assignment.State) { s.SyncError = string(nodeconfig.DownloadError) }, false},
		{"the assignment", func(s *assignment.State) { s.Assignment = nil }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := a
			tc.change(&b)
			if got := sameExceptVersion(a, b); got != tc.want {
				t.Errorf("sameExceptVersion = %v, want %v", got, tc.want)
			}
		})
	}
}

// A node may reset its kubelet's state only while cordoned and marked drained for exactly the version it
// is given: a mark for an earlier version, or one left behind after the uncordon, allows nothing.
func TestDrainedOnlyForTheMarkedVersion(t *testing.T) {
	f := newFixture(t)
	f.putConfigMap("cm", "1")
	mark := func(unschedulable bool, rv string) {
		t.Helper()
		n, err := f.c.nodes.Get("n1")
		if err != nil {
			t.Fatal(err)
		}
		n = n.DeepCopy()
		n.Spec.Unschedulable = unschedulable
		delete(n.Annotations, nodeconfig.DrainedAnnotation)
		if rv != "" {
			n.Annotations[nodeconfig.DrainedAnnotation] = nodeconfig.MarshalDrained("uid-cm", rv)
		}
		if err := f.store.Update(n); err != nil {
			t.Fatal(err)
		}
		f.sync("n1")
	}
	drained := func() bool { st, _, _ := f.table.Get("n1"); return st.Drained }
	f.assign("n1", "cm")
	for _, step := range []struct {
		name          string
		unschedulable bool
		rv            string
		want          bool
	}{
		{"assigned, not drained", false, "", false},
		{"cordoned and marked for the version", true, "1", true},
		{"uncordoned, mark left behind", false, "1", false},
		{"cordoned, mark of another version", true, "0", false},
	} {
		mark(step.unschedulable, step.rv)
		if got := drained(); got != step.want {
			t.Errorf("%s: Drained = %v, want %v", step.name, got, step.want)
		}
	}
	mark(true, "1")
	f.putConfigMap("cm", "2") // edited after the drain: the mark names the version before
	if drained() {
		t.Error("a ConfigMap changed after the drain is given as drained")
	}
}

// TestCapacityChangeIsNoAssignment: a node whose capacity changed (more memory) is sent its state again with
// the new capacity, and nothing is logged as an assignment; an assignment after it still is.
func TestCapacityChangeIsNoAssignment(t *testing.T) {
	for _, source := range []string{"", "cm"} {
		t.Run("source "+source, func(t *testing.T) {
			f := newFixture(t)
			core, logs := observer.New(zap.InfoLevel)
			f.c.log = zap.New(core)
			f.putConfigMap("cm", "1")
			f.putConfigMap("other", "1")
			withMemory := func(memory string) {
				t.Helper()
				n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Annotations: map[string]string{}},
					Status: corev1.NodeStatus{Capacity: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(memory)}}}
				if source != "" {
					n.Annotations[nodeconfig.SourceAnnotation] =
						`{"configMap":{"namespace":"kube-system","name":"cm","kubeletConfigKey":"kubelet"}}`
				}
				if err := f.store.Update(n); err != nil {
					t.Fatal(err)
				}
				f.sync("n1")
			}
			withMemory("4Gi")
			assigned := logs.FilterMessageSnippet("assigned").Len()
			if assigned != 1 {
				t.Fatalf("%d assignment lines for the first sync, want 1: %v", assigned, logs.All())
			}
			withMemory("8Gi")
			if st, _, _ := f.table.Get("n1"); st.NodeCapacity["memory"] != "8Gi" {
				t.Errorf("state capacity %v, want memory 8Gi", st.NodeCapacity)
			}
			if got := logs.FilterMessageSnippet("assigned").Len(); got != assigned {
				t.Errorf("a capacity change logged as an assignment: %v", logs.All())
			}
			f.assign("n1", "other")
			if got := logs.FilterMessageSnippet("assigned").Len(); got != assigned+1 {
				t.Errorf("the assignment after it logged %d lines, want 1: %v", got-assigned, logs.All())
			}
		})
	}
}

// TestDriftRepairForTheDriftTheNodeShows: a pool's repair request is sent only while it names the version
// the node is given and the drift its Node shows now.
func TestDriftRepairForTheDriftTheNodeShows(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{UID: "u1", ResourceVersion: "7"}}
	req := nodeconfig.DriftRepair{Cause: nodeconfig.DriftWiringRemoved, UID: "u1", ResourceVersion: "7",
		RequestTime: t0.Add(time.Minute + 123*time.Millisecond), DriftSince: t0}
	node := func(r nodeconfig.DriftRepair, status corev1.ConditionStatus, reason string, since time.Time) *corev1.Node {
		return &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{nodeconfig.DriftRepairAnnotation: nodeconfig.MarshalDriftRepair(r)}},
			Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: nodeconfig.DriftConditionType, Status: status,
				Reason: reason, LastTransitionTime: metav1.NewTime(since)}}},
		}
	}
	other := req
	other.ResourceVersion = "6"
	for _, tc := range []struct {
		name string
		node *corev1.Node
		want bool
	}{
		{"the drift asked about stands", node(req, corev1.ConditionTrue, nodeconfig.DriftWiringRemoved, t0), true},
		{"the drift ended", node(req, corev1.ConditionFalse, nodeconfig.DriftNone, t0.Add(time.Hour)), false},
		{"a later drift of the same cause", node(req, corev1.ConditionTrue, nodeconfig.DriftWiringRemoved, t0.Add(time.Hour)), false},
		{"the drift has another cause now", node(req, corev1.ConditionTrue, nodeconfig.DriftWiringReplaced, t0), false},
		{"for another version", node(other, corev1.ConditionTrue, nodeconfig.DriftWiringRemoved, t0), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := driftRepairFor(tc.node, cm)
			if (got != nil) != tc.want {
				t.Fatalf("driftRepairFor = %v, want a request: %v", got, tc.want)
			}
			if got != nil && (got.GetId() != req.ID() || got.GetCause() != req.Cause) {
				t.Errorf("request %v, want id %s cause %s", got, req.ID(), req.Cause)
			}
		})
	}
}
