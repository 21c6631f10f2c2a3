// SPDX-License-Identifier: Apache-2.0

package plan

import (
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/dkc-dev/dkc/api/v1alpha1"
	"github.com/dkc-dev/dkc/internal/nodeconfig"
)

// Per-node values: the pool's revision r2 made into node revisions r2a (n1, n2) and r2b (n3).
var (
	r2a = NodeTarget{Revision: "r2a", Source: corev1.ConfigMapNodeConfigSource{Namespace: "kube-system",
		Name: "blue-r2a", KubeletConfigKey: "kubelet"}, Values: []string{`systemReserved.memory="1Gi"`}}
	r2b = NodeTarget{Revision: "r2b", Source: corev1.ConfigMapNodeConfigSource{Namespace: "kube-system",
		Name: "blue-r2b", KubeletConfigKey: "kubelet"}, Values: []string{`systemReserved.memory="2Gi"`}}
)

func perNode(nodes map[string]NodeTarget) Target {
	t := r2
	t.PerNode, t.Nodes = true, nodes
	return t
}

// assignedTo is a Ready node the pool assigned nt a minute ago, whose status is st.
func assignedTo(name string, nt NodeTarget, st func(*corev1.NodeConfigSource) corev1.NodeConfigStatus) Node {
	n := assigned(name, st(resolved(nt.Source)))
	n.Revision, n.Source = nt.Revision, nt.Source
	return n
}

func provenOn(s *corev1.NodeConfigSource) corev1.NodeConfigStatus { return status(s, s, s, "") }
func rolledBackOn(s *corev1.NodeConfigSource) corev1.NodeConfigStatus {
	return status(s, r1, r1, nodeconfig.HealthError)
}

// TestPerNodeTargets: each node is judged against its own revision; pacing, failures and halts count
// across all of them; status.nodeRevisions groups them.
func TestPerNodeTargets(t *testing.T) {
	refused := r2b
	refused.Refused = "the kubelet 1.35 refuses its own revision r2b"
	uncomputed := NodeTarget{Revision: Uncomputed, Refused: "its values of revision r2 cannot be computed"}
	expiring := r2b
	expiring.NextChange = t0.Add(10 * time.Minute)
	for _, tc := range []struct {
		name    string
		target  Target
		nodes   []Node
		pool    []func(*v1alpha1.KubeletConfigPool)
		states  string // name=State/Reason, by name
		assign  string
		halted  bool
		revs    string // revision:nodes/updated
		requeue time.Duration
	}{
		{name: "each node proven on its own revision is updated",
			target: perNode(map[string]NodeTarget{"n1": r2a, "n2": r2a, "n3": r2b}),
			nodes: []Node{assignedTo("n1", r2a, provenOn), assignedTo("n2", r2a, provenOn),
				assignedTo("n3", r2b, provenOn)},
			states: "n1=Updated/Proven n2=Updated/Proven n3=Updated/Proven", revs: "r2a:2/2 r2b:1/1"},
		{name: "a node on another node's revision is pending, within maxUnavailable",
			target: perNode(map[string]NodeTarget{"n1": r2a, "n2": r2a, "n3": r2b}),
			nodes: []Node{assignedTo("n1", r2a, provenOn), waiting("n2"),
				func() Node { n := assignedTo("n3", r2a, provenOn); n.Assigned = false; return n }()},
			states: "n1=Updated/Proven n2=Pending/NotAssigned n3=Pending/NotAssigned", assign: "n2",
			revs: "r2a:2/1 r2b:1/0"},
		{name: "a node refused before it is touched fails and halts the pool",
			target: perNode(map[string]NodeTarget{"n1": r2a, "n3": refused}),
			nodes:  []Node{assignedTo("n1", r2a, provenOn), waiting("n3")},
			states: "n1=Updated/Proven n3=Failed/ConfigRefused", halted: true, revs: "r2a:1/1 r2b:1/0"},
		{name: "a node failing its own revision halts the pool for the others",
			target: perNode(map[string]NodeTarget{"n1": r2a, "n2": r2a, "n3": r2b}),
			pool:   mods(maxUnavailableOf(3)),
			nodes:  []Node{waiting("n1"), waiting("n2"), assignedTo("n3", r2b, rolledBackOn)},
			states: "n1=Pending/NotAssigned n2=Pending/NotAssigned n3=Failed/RolledBack", halted: true,
			revs: "r2a:2/0 r2b:1/0"},
		{name: "a failure of the node's earlier revision is forgotten once its values change",
			target: perNode(map[string]NodeTarget{"n3": r2a}),
			pool:   mods(failedBefore("n3", "r2b", 0)),
			nodes:  []Node{waiting("n3")},
			states: "n3=Pending/NotAssigned", assign: "n3", revs: "r2a:1/0"},
		{name: "a failure of the node's revision stays, whatever the node shows",
			target: perNode(map[string]NodeTarget{"n3": r2b}),
			pool:   mods(failedBefore("n3", "r2b", 0)),
			nodes:  []Node{waiting("n3")},
			states: "n3=Failed/RolledBack", halted: true, revs: "r2b:1/0"},
		{name: "a failure of a node gone stays while its revision is another node's",
			target: perNode(map[string]NodeTarget{"n1": r2b}),
			pool:   mods(failedBefore("gone", "r2b", 0)),
			nodes:  []Node{assignedTo("n1", r2b, provenOn)},
			states: "n1=Updated/Proven", halted: true, revs: "r2b:1/1"},
		{name: "a failure of a node gone stays while its pool revision is the target",
			target: perNode(map[string]NodeTarget{"n1": r2a}),
			pool:   mods(failedOwn("gone", "r2x", "r2")),
			nodes:  []Node{assignedTo("n1", r2a, provenOn)},
			states: "n1=Updated/Proven", halted: true, revs: "r2a:1/1"},
		{name: "a failure of a node gone goes with its pool revision",
			target: perNode(map[string]NodeTarget{"n1": r2a}),
			pool:   mods(failedOwn("gone", "r1x", "r1")),
			nodes:  []Node{assignedTo("n1", r2a, provenOn)},
			states: "n1=Updated/Proven", revs: "r2a:1/1"},
		{name: "a node whose own revision is not known now keeps its failure",
			target: perNode(map[string]NodeTarget{"n1": r2a}),
			pool:   mods(failedOwn("n3", "r2x", "r2")),
			nodes:  []Node{assignedTo("n1", r2a, provenOn), waiting("n3")},
			states: "n1=Updated/Proven n3=Failed/RolledBack", halted: true, revs: "r2a:1/1"},
		{name: "a refusal found after the node was assigned: its status decides, and it takes its slot",
			target: perNode(map[string]NodeTarget{"n1": refused, "n2": r2a}),
			pool:   mods(maxFailures(2)),
			nodes:  []Node{assignedTo("n1", refused, func(s *corev1.NodeConfigSource) corev1.NodeConfigStatus { return status(s, s, r1, "") }), waiting("n2")},
			states: "n1=InProgress/InTrial n2=Pending/NotAssigned", revs: "r2a:1/0 r2b:1/0"},
		{name: "values that cannot be computed fail a node that runs the pool's revision",
			target: perNode(map[string]NodeTarget{"n2": uncomputed}),
			nodes: []Node{func() Node {
				n := updated("n2") // as the controller sees it: the pool assigned it r2, not its (no) own revision
				n.Assigned, n.Revision, n.Source = false, r2.Revision, r2.Source
				return n
			}()},
			states: "n2=Failed/ConfigRefused", halted: true},
		{name: "its failure goes once its values are computed, though they make the pool's revision",
			target: perNode(map[string]NodeTarget{"n2": {Revision: r2.Revision, Source: r2.Source}}),
			pool:   mods(failedOwn("n2", Uncomputed, "r2")),
			nodes:  []Node{updated("n2")},
			states: "n2=Updated/Proven", revs: "r2:1/1"},
		{name: "spec.perNode removed: a failure of the node's own revision goes",
			target: r2,
			pool:   mods(failedOwn("n2", "r2b", "r2"), failedOwn("gone", "r2b", "r2")),
			nodes:  []Node{waiting("n2")},
			states: "n2=Pending/NotAssigned", assign: "n2"},
		{name: "an exception's expiry is when to decide again",
			target: perNode(map[string]NodeTarget{"n3": expiring}),
			nodes:  []Node{assignedTo("n3", expiring, provenOn)},
			states: "n3=Updated/Proven", revs: "r2b:1/1", requeue: 10 * time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := Decide(Input{Pool: pool(tc.pool...), Target: tc.target, Nodes: tc.nodes, Now: t0})
			var states []string
			for _, v := range p.Nodes {
				states = append(states, v.Name+"="+string(v.State)+"/"+v.Reason)
			}
			if got := strings.Join(states, " "); got != tc.states {
				t.Errorf("states %s, want %s", got, tc.states)
			}
			if got := strings.Join(p.Assign, ","); got != tc.assign {
				t.Errorf("assign %q, want %q", got, tc.assign)
			}
			if got := meta.IsStatusConditionTrue(p.Status.Conditions, v1alpha1.ConditionHalted); got != tc.halted {
				t.Errorf("halted %v, want %v", got, tc.halted)
			}
			var revs []string
			for _, r := range p.Status.NodeRevisions {
				revs = append(revs, r.Revision+":"+itoa(r.Nodes)+"/"+itoa(r.Updated))
			}
			if got := strings.Join(revs, " "); got != tc.revs {
				t.Errorf("nodeRevisions %s, want %s", got, tc.revs)
			}
			if tc.requeue != 0 && p.RequeueAfter != tc.requeue {
				t.Errorf("requeue after %v, want %v", p.RequeueAfter, tc.requeue)
			}
			if p.Status.CurrentRevision != "r2" {
				t.Errorf("currentRevision %q, want the pool's revision r2", p.Status.CurrentRevision)
			}
			for _, f := range p.Status.FailedNodes {
				if nt, ok := tc.target.Nodes[f.Name]; ok && f.Revision != nt.Revision {
					t.Errorf("node %s failed revision %s, want its own %s", f.Name, f.Revision, nt.Revision)
				}
				if f.Time.Time.Equal(t0) && f.PoolRevision != "r2" { // recorded now
					t.Errorf("node %s's failure records pool revision %q, want r2", f.Name, f.PoolRevision)
				}
			}
			if i := slices.IndexFunc(p.Status.NodeRevisions, func(r v1alpha1.NodeRevision) bool { return r.Revision == "r2a" }); i >= 0 &&
				!slices.Equal(p.Status.NodeRevisions[i].Values, r2a.Values) {
				t.Errorf("values of r2a %v, want %v", p.Status.NodeRevisions[i].Values, r2a.Values)
			}
		})
	}
}

func maxUnavailableOf(n int) func(*v1alpha1.KubeletConfigPool) {
	return maxUnavailable(intstr.FromInt(n))
}

func itoa(n int32) string { return strconv.Itoa(int(n)) }

// failedOwn records a failure of node for its own revision rev of the pool revision pool.
func failedOwn(node, rev, pool string) func(*v1alpha1.KubeletConfigPool) {
	return func(p *v1alpha1.KubeletConfigPool) {
		failedBefore(node, rev, 0)(p)
		p.Status.FailedNodes[len(p.Status.FailedNodes)-1].PoolRevision = pool
	}
}
