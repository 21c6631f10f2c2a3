// SPDX-License-Identifier: Apache-2.0

package controller

import (
	"encoding/json"
	"fmt"
	"testing"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dkc-dev/dkc/api/v1alpha1"
	"github.com/dkc-dev/dkc/internal/nodeconfig"
	"github.com/dkc-dev/dkc/services/internal/configmaps"
	"github.com/dkc-dev/dkc/services/internal/pacing"
)

// pacedFixture is a fixture whose controller paces direct changes at limit; woken collects the nodes the
// pacer wakes (the controller's queue is not run: the test syncs them).
type pacedFixture struct {
	*fixture
	woken []string
}

func newPacedFixture(t *testing.T, limit int) *pacedFixture {
	f := &pacedFixture{fixture: newFixture(t)}
	p := pacing.New(pacing.Config{Log: zap.NewNop(), Limit: limit, Wake: func(n string) { f.woken = append(f.woken, n) }})
	f.c.pacer = p // as Config.Pacer sets it
	return f
}

// put stores a Ready (or not) node on ConfigMap cm (kube-system, key kubelet) whose status reports it runs
// version rv of it ("" for no status at all), then syncs it.
func (f *pacedFixture) put(node, cm string, ready bool, rv string) {
	f.t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, Annotations: map[string]string{
		nodeconfig.SourceAnnotation: fmt.Sprintf(`{"configMap":{"namespace":"kube-system","name":%q,"kubeletConfigKey":"kubelet"}}`, cm),
	}}}
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: status}}
	if rv != "" {
		src := &corev1.NodeConfigSource{ConfigMap: &corev1.ConfigMapNodeConfigSource{Namespace: "kube-system", Name: cm,
			UID: types.UID("uid-" + cm), ResourceVersion: rv, KubeletConfigKey: "kubelet"}}
		st, _ := json.Marshal(corev1.NodeConfigStatus{Assigned: src, Active: src, LastKnownGood: src})
		n.Annotations[nodeconfig.StatusAnnotation] = string(st)
	}
	if err := f.store.Update(n); err != nil {
		f.t.Fatal(err)
	}
	f.sync(node)
}

// given is the ResourceVersion of the ConfigMap the table gives node, "" for none.
func (f *pacedFixture) given(node string) string {
	st, _, _ := f.table.Get(node)
	return st.Assignment.GetSource().GetConfigMap().GetResourceVersion()
}

// wake syncs the nodes the pacer woke.
func (f *pacedFixture) wake() {
	woken := f.woken
	f.woken = nil
	for _, n := range woken {
		f.sync(n)
	}
}

// TestDirectChangesArePaced: an in-place edit of a ConfigMap five Ready nodes name is given to two at a
// time (the limit); each reported outcome lets the next one in, first come first served; a node not Ready
// is given it at once. (Without pacing all five got it at once.)
func TestDirectChangesArePaced(t *testing.T) {
	f := newPacedFixture(t, 2)
	f.putConfigMap("shared", "1")
	nodes := []string{"a", "b", "c", "d", "e"}
	for _, n := range nodes {
		f.put(n, "shared", true, "1")
	}
	f.put("down", "shared", false, "1")
	for _, n := range nodes {
		if got := f.given(n); got != "1" {
			t.Fatalf("node %s given version %q at start, want 1: a node that runs a version is not paced", n, got)
		}
	}

	f.putConfigMap("shared", "2")
	count := func() (changed []string) {
		for _, n := range nodes {
			if f.given(n) == "2" {
				changed = append(changed, n)
			}
		}
		return changed
	}
	if got := count(); len(got) != 2 || got[0] != "a" || got[1] != "b" {
		t.Fatalf("after the edit %v were given version 2, want [a b]", got)
	}
	if got := f.given("down"); got != "2" {
		t.Errorf("the node not Ready was given %q, want 2 at once", got)
	}
	// Each outcome frees one slot, for the next node in line.
	for i, n := range nodes {
		f.put(n, "shared", true, "2")
		f.wake()
		want := min(i+3, len(nodes))
		if got := count(); len(got) != want {
			t.Fatalf("after %s reported: %v given version 2, want %d", n, got, want)
		}
	}
}

// TestPacingExemptions: a pool's snapshot and a return to the local config are never held back.
func TestPacingExemptions(t *testing.T) {
	f := newPacedFixture(t, 1)
	f.putConfigMap("shared", "1")
	f.put("a", "shared", true, "1")
	f.put("b", "shared", true, "1")
	f.putConfigMap("shared", "2")
	if f.given("a") != "2" || f.given("b") != "1" {
		t.Fatalf("given a %q, b %q; want a on 2, b held on 1", f.given("a"), f.given("b"))
	}
	// A pool's snapshot, recorded by its pool and whose data hash to its revision, as the serving side checks.
	data := map[string]string{"kubelet": "pool"}
	rev := v1alpha1.RevisionName("kube-system", "kubelet", data)
	name := v1alpha1.SnapshotName("blue", rev)
	key := configmaps.Key("kube-system", name)
	yes := true
	f.cms.cms[key] = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: name, UID: "uid-blue",
		ResourceVersion: "9", Labels: map[string]string{v1alpha1.LabelPool: "blue", v1alpha1.LabelRevision: rev}},
		Immutable: &yes, Data: data}
	f.c.snapshots = &records{pools: map[string]*v1alpha1.RevisionSnapshots{"blue": {Items: []v1alpha1.RevisionSnapshot{
		{Revision: rev, Namespace: "kube-system", Name: name, UID: "uid-blue", KubeletConfigKey: "kubelet"}}}}}
	f.put("c", name, true, "")
	if got := f.given("c"); got != "9" {
		t.Errorf("pool node given %q, want the snapshot (9) at once", got)
	}
	// Back to the local config: b's place in line goes, and a's slot once a is reset.
	f.assign("a", "")
	if st, _, _ := f.table.Get("a"); st.Assignment == nil || st.Assignment.GetSource().GetConfigMap() != nil {
		t.Errorf("node a reset: table has %v, want the local config", st.Assignment)
	}
	f.wake()
	if got := f.given("b"); got != "2" {
		t.Errorf("after a went local, b given %q, want 2 (a's slot freed)", got)
	}
}

// TestPacingAtStartWithoutStatus: a node that never reported (new, or its sidecar not yet connected) is
// paced like any change, and given nothing while it waits.
func TestPacingAtStartWithoutStatus(t *testing.T) {
	f := newPacedFixture(t, 1)
	f.putConfigMap("shared", "1")
	f.put("a", "shared", true, "")
	f.put("b", "shared", true, "")
	if f.given("a") != "1" {
		t.Errorf("a given %q, want 1", f.given("a"))
	}
	if st, ok, _ := f.table.Get("b"); !ok || st.Assignment != nil {
		t.Errorf("b: table %v (entry %v), want an entry without an assignment: b keeps what it runs", st.Assignment, ok)
	}
}
