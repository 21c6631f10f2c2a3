package assignment

import (
	"testing"

	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
)

func cmAssignment(rv, hash string) *dkcv1.Assignment {
	return &dkcv1.Assignment{
		Source:      &dkcv1.NodeConfigSource{ConfigMap: &dkcv1.ConfigMapNodeConfigSource{Namespace: "ns", Name: "n", Uid: "u", ResourceVersion: rv, KubeletConfigKey: "kubelet"}},
		ContentHash: hash,
	}
}

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func TestTable(t *testing.T) {
	var changes []string
	tab := NewTable(func(n string) { changes = append(changes, n) })

	if _, ok, _ := tab.Get("a"); ok {
		t.Fatal("unknown node has a state")
	}
	_, _, ch := tab.Get("a")
	if !tab.Set("a", State{Assignment: cmAssignment("1", "h1")}) || !closed(ch) {
		t.Fatal("first Set did not change or wake waiters")
	}
	st, ok, ch := tab.Get("a")
	if !ok || st.Assignment.GetContentHash() != "h1" || st.Changed.IsZero() {
		t.Fatalf("Get = %+v, %v", st, ok)
	}
	// The same content again (a resync, a no-op ConfigMap PUT) changes nothing and wakes nobody.
	if tab.Set("a", State{Assignment: cmAssignment("1", "h1")}) || closed(ch) {
		t.Fatal("identical Set changed state")
	}
	// A sync error keeps the assignment.
	if !tab.SetSyncError("a", "failed to sync: x") || !closed(ch) {
		t.Fatal("SetSyncError did not change")
	}
	st, _, ch = tab.Get("a")
	if st.Assignment.GetContentHash() != "h1" || st.SyncError != "failed to sync: x" {
		t.Fatalf("after SetSyncError: %+v", st)
	}
	// A new resourceVersion is a change.
	if !tab.Set("a", State{Assignment: cmAssignment("2", "h2")}) {
		t.Fatal("new resourceVersion not a change")
	}
	tab.Delete("a")
	if !closed(ch) || tab.Len() != 0 {
		t.Fatal("Delete did not wake waiters or forget the node")
	}
	if want := []string{"a", "a", "a", "a"}; len(changes) != len(want) {
		t.Errorf("onChange calls = %v, want %v", changes, want)
	}
}

func TestSameAssignment(t *testing.T) {
	local := &dkcv1.Assignment{}
	for _, tc := range []struct {
		name string
		a, b *dkcv1.Assignment
		want bool
	}{
		{"both unknown", nil, nil, true},
		{"unknown vs local", nil, local, false},
		{"local vs local", local, &dkcv1.Assignment{}, true},
		{"local vs configmap", local, cmAssignment("1", "h"), false},
		{"same", cmAssignment("1", "h"), cmAssignment("1", "h"), true},
		{"other rv", cmAssignment("1", "h"), cmAssignment("2", "h"), false},
		{"other hash", cmAssignment("1", "h"), cmAssignment("1", "g"), false},
	} {
		if got := SameAssignment(tc.a, tc.b); got != tc.want {
			t.Errorf("%s: SameAssignment = %v, want %v", tc.name, got, tc.want)
		}
	}
}
