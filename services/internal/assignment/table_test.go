// SPDX-License-Identifier: Apache-2.0

package assignment

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/dkc-dev/dkc/internal/nodeconfig"
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
	if !tab.SetSyncError("a", Facts{}, "failed to sync: x") || !closed(ch) {
		t.Fatal("SetSyncError did not change")
	}
	st, _, _ = tab.Get("a")
	if st.Assignment.GetContentHash() != "h1" || st.SyncError != "failed to sync: x" {
		t.Fatalf("after SetSyncError: %+v", st)
	}
	// A new resourceVersion is a change.
	if !tab.Set("a", State{Assignment: cmAssignment("2", "h2")}) {
		t.Fatal("new resourceVersion not a change")
	}
	_, _, ch = tab.Get("a")
	// The Node deleted and registered again with the same config: a change, for the node to hear of.
	if !tab.Set("a", State{Assignment: cmAssignment("2", "h2"), NodeUID: "uid-2"}) || !closed(ch) {
		t.Fatal("another Node object with the same config not a change")
	}
	_, _, ch = tab.Get("a")
	tab.Delete("a")
	if !closed(ch) || tab.Len() != 0 {
		t.Fatal("Delete did not wake waiters or forget the node")
	}
	if want := []string{"a", "a", "a", "a", "a"}; len(changes) != len(want) {
		t.Errorf("onChange calls = %v, want %v", changes, want)
	}
}

// TestSyncErrorIsTruncated: a sync error quoting a huge invalid source is kept cut to
// nodeconfig.MaxDetailBytes — the sidecar echoes it in every WatchConfigRequest, which dkc-server reads only
// up to --max-recv-msg-size-kib — with its start, where the reason is.
func TestSyncErrorIsTruncated(t *testing.T) {
	tab := NewTable(nil)
	huge := nodeconfig.StatusError("failed to sync: invalid source: name: " + strings.Repeat("x", 256<<10))
	tab.SetSyncError("a", Facts{NodeUID: "uid", KubeletVersion: "v1.37.2"}, huge)
	s, ok, _ := tab.Get("a")
	if !ok {
		t.Fatal("node unknown after SetSyncError")
	}
	if len(s.SyncError) > nodeconfig.MaxDetailBytes || !strings.HasPrefix(s.SyncError, "failed to sync: invalid source: name: xxx") {
		t.Errorf("sync error of %d bytes starting %.40q, want at most %d starting as set", len(s.SyncError), s.SyncError, nodeconfig.MaxDetailBytes)
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

// TestTableHoldsOnlyLiveNodes: the table holds a node from its first state to its deletion, whatever its
// streams ask. A stream that asks about a node without a state (not resolved yet, or deleted while it
// watched: Delete wakes it and it asks again) leaves nothing behind, and is still woken by the node's first
// state.
func TestTableHoldsOnlyLiveNodes(t *testing.T) {
	for _, tc := range []struct {
		name    string
		steps   func(tab *Table)
		wantLen int
	}{
		{"asked about, never resolved", func(tab *Table) {
			for i := range 100 {
				tab.Get(fmt.Sprintf("n%d", i))
			}
		}, 0},
		{"resolved", func(tab *Table) {
			tab.Set("a", State{Assignment: cmAssignment("1", "h1")})
		}, 1},
		{"deleted while watched, asked again", func(tab *Table) {
			tab.Set("a", State{Assignment: cmAssignment("1", "h1")})
			_, _, ch := tab.Get("a")
			tab.Delete("a")
			<-ch
			tab.Get("a")
		}, 0},
		{"sync error of an unknown node, then deleted", func(tab *Table) {
			tab.SetSyncError("a", Facts{}, "failed to sync: x")
			tab.Delete("a")
			tab.Get("a")
		}, 0},
		{"churn of 100 nodes", func(tab *Table) {
			for i := range 100 {
				n := fmt.Sprintf("n%d", i)
				tab.Set(n, State{Assignment: cmAssignment(fmt.Sprint(i), "h")})
				tab.Get(n)
				tab.Delete(n)
				tab.Get(n)
			}
		}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tab := NewTable(nil)
			tc.steps(tab)
			if got := tab.Len(); got != tc.wantLen {
				t.Errorf("Len = %d, want %d", got, tc.wantLen)
			}
			tab.mu.Lock()
			defer tab.mu.Unlock()
			if got := len(tab.nodes); got != tc.wantLen {
				t.Errorf("%d entries held, want %d", got, tc.wantLen)
			}
		})
	}
}

// TestWaiterOfUnknownNodeWokenByFirstState: a stream waiting on a node without a state is woken when the
// node gets one, including after its deletion (a Node deleted and created again).
func TestWaiterOfUnknownNodeWokenByFirstState(t *testing.T) {
	tab := NewTable(nil)
	_, ok, ch := tab.Get("a")
	if ok {
		t.Fatal("unknown node has a state")
	}
	tab.Set("a", State{Assignment: cmAssignment("1", "h1")})
	if !closed(ch) {
		t.Fatal("first state did not wake the waiter")
	}
	_, _, ch = tab.Get("a")
	tab.Delete("a")
	if !closed(ch) {
		t.Fatal("Delete did not wake the waiter")
	}
	_, ok, ch = tab.Get("a")
	if ok {
		t.Fatal("deleted node has a state")
	}
	tab.SetSyncError("a", Facts{}, "failed to sync: x")
	if !closed(ch) {
		t.Fatal("state after deletion did not wake the waiter")
	}
}

// TestSamePreview: a node's state changes with its preview's pool, revision, request time or content,
// not with another copy of the same preview.
func TestSamePreview(t *testing.T) {
	at := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	p := func(pool, rev string, when time.Time, hash string) *dkcv1.Preview {
		return &dkcv1.Preview{Pool: pool, Revision: rev, RequestTime: timestamppb.New(when),
			Assignment: &dkcv1.Assignment{ContentHash: hash}}
	}
	base := p("blue", "a", at, "h1")
	for _, tc := range []struct {
		name string
		o    *dkcv1.Preview
		same bool
	}{
		{"a copy", p("blue", "a", at, "h1"), true},
		{"none", nil, false},
		{"another pool", p("green", "a", at, "h1"), false},
		{"another revision", p("blue", "b", at, "h1"), false},
		{"requested again", p("blue", "a", at.Add(time.Second), "h1"), false},
		{"other content", p("blue", "a", at, "h2"), false},
	} {
		if got := (State{Preview: base}).Same(State{Preview: tc.o}); got != tc.same {
			t.Errorf("%s: Same = %v, want %v", tc.name, got, tc.same)
		}
	}
	if !(State{}).Same(State{}) {
		t.Error("two states without a preview differ")
	}
}
