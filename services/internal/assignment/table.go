// SPDX-License-Identifier: Apache-2.0

// Package assignment holds each node's desired state — the config it should use and the sync error it
// should report — and tells whoever waits on a node when that changes. The controller writes it; WatchConfig
// streams and the status writer read it. A change closes a channel instead of sending on one, so a slow
// reader (a node on a bad link) never blocks the controller or other nodes, and a reader that wakes up late
// sees only the latest state.
package assignment

import (
	"hash/fnv"
	"maps"
	"sync"
	"time"

	"github.com/dkc-dev/dkc/internal/nodeconfig"
	"github.com/dkc-dev/dkc/internal/nodeconfig/wire"
	"github.com/dkc-dev/dkc/internal/payload"
	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
)

// tooLargeError is the sync error of a node whose resolved config exceeds what a node accepts
// (payload.MaxFiles, payload.MaxBytes). A ConfigMap the apiserver accepts can have more keys than a node
// takes; sending it anyway would only have every node refuse it, after each had received it.
var tooLargeError = string(nodeconfig.TooLargeError(payload.MaxFiles, payload.MaxBytes>>20))

// State is a node's desired state.
type State struct {
	// Assignment is the config the node should use; nil while the service has no good resolution for the node
	// (its ConfigMap has been missing since the service started, say): the node then keeps what it has.
	// Assignments of nodes sharing a ConfigMap version are the same pointer; treat them as immutable.
	Assignment *dkcv1.Assignment
	// SyncError is the status error while the node's source cannot be synced, e.g.
	// "failed to sync: failed to download config, see Kubelet log for details"; empty otherwise.
	SyncError string
	// NodeUID is the UID of the Node object the state was resolved from. A Node deleted and registered again
	// under the same name is another object: its node is told (WatchConfigResponse.node_uid), so that its
	// reports about the old object are not written onto the new one.
	NodeUID string
	// KubeletVersion is the node's kubelet version (status.nodeInfo.kubeletVersion): the sidecar validates
	// configs with the code of its minor, so a node upgraded in place is told.
	KubeletVersion string
	// Drained: the Node is cordoned and drained for exactly Assignment's ConfigMap version
	// (nodeconfig.IsDrainedFor), so the sidecar may remove the kubelet state the change invalidates.
	Drained bool
	// NodeCapacity is the Node's status.capacity (resource name to quantity): the sidecar tells from it which
	// running pods a restart into a config that shrinks allocatable would fail, before restarting.
	NodeCapacity map[string]string
	// Preview is the pool's preview the node is asked for (the first pool by name whose standing preview
	// selects the node), its snapshot resolved as an assignment; nil when none stands, or the node's own
	// source is that snapshot already. Nodes sharing one preview share the pointer; treat it as immutable.
	Preview *dkcv1.Preview
	// DriftRepair is a pool's request that the node repair its drift (nodeconfig.DriftRepairAnnotation),
	// only when it names Assignment's ConfigMap version; nil otherwise.
	DriftRepair *dkcv1.DriftRepair
	// Changed is when this state was set.
	Changed time.Time
}

// Same reports whether two states tell a node the same thing (Changed aside).
func (s State) Same(o State) bool {
	return s.SyncError == o.SyncError && s.NodeUID == o.NodeUID && s.KubeletVersion == o.KubeletVersion &&
		s.Drained == o.Drained && maps.Equal(s.NodeCapacity, o.NodeCapacity) &&
		SameAssignment(s.Assignment, o.Assignment) && SamePreview(s.Preview, o.Preview) &&
		s.DriftRepair.GetId() == o.DriftRepair.GetId() && s.DriftRepair.GetCause() == o.DriftRepair.GetCause()
}

// SamePreview compares two previews by pool, revision, request time and assignment (SameAssignment).
func SamePreview(a, b *dkcv1.Preview) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.GetPool() == b.GetPool() && a.GetRevision() == b.GetRevision() &&
		a.GetRequestTime().AsTime().Equal(b.GetRequestTime().AsTime()) &&
		SameAssignment(a.GetAssignment(), b.GetAssignment())
}

// SameAssignment compares by source and content hash, never by payload: cheap for thousands of nodes.
func SameAssignment(a, b *dkcv1.Assignment) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.GetContentHash() == b.GetContentHash() && wire.SameSource(a.GetSource(), b.GetSource())
}

type entry struct {
	state   State
	changed chan struct{} // closed and replaced on every change
}

// unknownStripes is how many channels wake the waiters of nodes without a state.
const unknownStripes = 64

// Table is the desired state of every known node. The zero value is not usable; use NewTable.
type Table struct {
	mu    sync.Mutex
	nodes map[string]*entry // only nodes with a state: the table follows the live Nodes
	// unknown[stripe(node)] is closed and replaced when a node of that stripe gets its first state. Waiters on
	// a node without a state get it instead of an entry of their own: an entry per name asked about would stay
	// forever for every Node deleted while its sidecar watched (Delete wakes the stream, which asks again).
	// The price is a spurious wake-up of the other stateless waiters of the stripe, who ask again and find
	// nothing new; there are few of them (nodes the service has not resolved yet, or no longer has).
	unknown  [unknownStripes]chan struct{}
	onChange func(node string)
	now      func() time.Time
}

// NewTable returns an empty table. onChange, if not nil, is called (outside the lock) after a node's state
// changed or the node was deleted. (The status writer takes it: a sync error to write, or, for a node
// another replica serves, a report to let go of.)
func NewTable(onChange func(node string)) *Table {
	t := &Table{nodes: map[string]*entry{}, onChange: onChange, now: time.Now}
	for i := range t.unknown {
		t.unknown[i] = make(chan struct{})
	}
	return t
}

func stripe(node string) int {
	h := fnv.New32a()
	h.Write([]byte(node))
	return int(h.Sum32() % unknownStripes)
}

// Get returns the node's state, whether it has one, and a channel closed at the next change (or deletion).
// For a node without a state the channel may also close spuriously; ask again.
func (t *Table) Get(node string) (State, bool, <-chan struct{}) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e, ok := t.nodes[node]; ok {
		return e.state, true, e.changed
	}
	return State{}, false, t.unknown[stripe(node)]
}

// Set replaces the node's state unless it is the Same; it reports whether it changed. An assignment larger
// than a node accepts is not taken: the node keeps its previous assignment (none if it had none) with
// tooLargeError, so that no stream ever sends what the node would refuse. Checking here, where every
// desired state enters, rather than in each stream, puts the error on the Node (package nodestatus reads
// it from here) and costs one check per node and change, not one per send. A preview larger than a node
// accepts is dropped: the node would refuse it as it would the assignment, and the pool, getting no
// answer, names the node as not answering.
func (t *Table) Set(node string, s State) bool {
	tooLarge := payload.CheckSize(s.Assignment.GetFiles()) != nil
	if s.Preview != nil && payload.CheckSize(s.Preview.GetAssignment().GetFiles()) != nil {
		s.Preview = nil
	}
	t.mu.Lock()
	e, ok := t.nodes[node]
	if tooLarge {
		s.Assignment, s.SyncError = nil, tooLargeError
		if ok {
			s.Assignment = e.state.Assignment
		}
	}
	if ok && e.state.Same(s) {
		t.mu.Unlock()
		return false
	}
	s.Changed = t.now()
	if ok {
		e.state = s
		close(e.changed)
		e.changed = make(chan struct{})
	} else {
		t.nodes[node] = &entry{state: s, changed: make(chan struct{})}
		i := stripe(node)
		close(t.unknown[i])
		t.unknown[i] = make(chan struct{})
	}
	t.mu.Unlock()
	if t.onChange != nil {
		t.onChange(node)
	}
	return true
}

// Facts are what a node's state says of its Node object whatever its source: State's NodeUID,
// KubeletVersion, NodeCapacity and Preview (the pools that select the Node by its labels).
type Facts struct {
	NodeUID        string
	KubeletVersion string
	NodeCapacity   map[string]string
	Preview        *dkcv1.Preview
}

// SetSyncError keeps the node's assignment and sets its sync error ("" clears it; one longer than
// nodeconfig.MaxDetailBytes is truncated) and the facts of the Node object it was found on.
func (t *Table) SetSyncError(node string, f Facts, syncError nodeconfig.StatusError) bool {
	syncError = nodeconfig.TruncateStatusError(syncError)
	t.mu.Lock()
	var s State
	if e, ok := t.nodes[node]; ok {
		s = e.state
	}
	t.mu.Unlock()
	// The node keeps the assignment it has, but no drain is vouched for while its source does not resolve.
	s.SyncError, s.NodeUID, s.KubeletVersion, s.Drained = string(syncError), f.NodeUID, f.KubeletVersion, false
	s.NodeCapacity, s.Preview, s.DriftRepair = f.NodeCapacity, f.Preview, nil
	return t.Set(node, s) // a concurrent Set in between is fine: the controller is the only writer per node
}

// Delete forgets a node (its Node object is gone) and wakes its waiters.
func (t *Table) Delete(node string) {
	t.mu.Lock()
	e, ok := t.nodes[node]
	if ok {
		delete(t.nodes, node)
		close(e.changed)
	}
	t.mu.Unlock()
	if ok && t.onChange != nil {
		t.onChange(node)
	}
}

// Len is the number of nodes the table holds.
func (t *Table) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.nodes)
}
