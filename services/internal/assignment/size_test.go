// SPDX-License-Identifier: Apache-2.0

package assignment

import (
	"fmt"
	"strings"
	"testing"

	"github.com/dkc-dev/dkc/internal/payload"
)

// TestOversizeAssignmentIsRefused: an assignment larger than a node accepts never becomes a node's state:
// the node keeps what it had and gets tooLargeError, until a version that fits clears it.
func TestOversizeAssignmentIsRefused(t *testing.T) {
	big := func(rv string) State {
		a := cmAssignment(rv, "h"+rv)
		a.Files = map[string]string{"kubelet": strings.Repeat("x", payload.MaxBytes)}
		return State{Assignment: a}
	}
	manyFiles := cmAssignment("m", "hm")
	manyFiles.Files = map[string]string{}
	for i := range payload.MaxFiles + 1 {
		manyFiles.Files[fmt.Sprintf("f%d", i)] = "x"
	}

	tab := NewTable(nil)
	// A node whose first resolution is too large has no assignment, only the error.
	if !tab.Set("new", big("1")) {
		t.Fatal("oversize first Set did not change the state")
	}
	if st, ok, _ := tab.Get("new"); !ok || st.Assignment != nil || st.SyncError != tooLargeError {
		t.Fatalf("node first assigned an oversize config: %q, %q; want no assignment and %q", st.Assignment.GetContentHash(), st.SyncError, tooLargeError)
	}

	good := cmAssignment("1", "h1")
	tab.Set("a", State{Assignment: good})
	for name, s := range map[string]State{"bytes": big("2"), "files": {Assignment: manyFiles}} {
		tab.Set("a", State{Assignment: good})
		if !tab.Set("a", s) {
			t.Fatalf("%s: oversize Set did not change the state", name)
		}
		st, _, ch := tab.Get("a")
		if st.Assignment != good || st.SyncError != tooLargeError {
			t.Fatalf("%s: after an oversize assignment the node has %q, %q; want the previous one (h1) and %q", name, st.Assignment.GetContentHash(), st.SyncError, tooLargeError)
		}
		// The same oversize assignment again is no change.
		if tab.Set("a", s) || closed(ch) {
			t.Fatalf("%s: repeated oversize Set changed the state", name)
		}
	}
	// A version that fits replaces the previous one and clears the error.
	next := cmAssignment("3", "h3")
	tab.Set("a", State{Assignment: next})
	if st, _, _ := tab.Get("a"); st.Assignment != next || st.SyncError != "" {
		t.Fatalf("after a fitting assignment: %q, %q", st.Assignment.GetContentHash(), st.SyncError)
	}
}
