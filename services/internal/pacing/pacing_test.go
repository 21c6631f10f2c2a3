// SPDX-License-Identifier: Apache-2.0

package pacing

import (
	"slices"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

type harness struct {
	p     *Pacer
	clock *clocktesting.FakeClock
	woken []string
}

func newHarness(limit int) *harness {
	h := &harness{clock: clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))}
	h.p = New(Config{Limit: limit, Clock: h.clock, Wake: func(n string) { h.woken = append(h.woken, n) }})
	return h
}

// admit asks for each node in turn, a second apart, and returns the nodes admitted.
func (h *harness) admit(version string, nodes ...string) []string {
	var out []string
	for _, n := range nodes {
		if h.p.Admit(n, version) {
			out = append(out, n)
		}
		h.clock.Step(time.Second)
	}
	return out
}

func TestAdmitBoundsTheNodesChanging(t *testing.T) {
	h := newHarness(2)
	if got := h.admit("v2", "a", "b", "c", "d"); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("admitted %v, want [a b]", got)
	}
	// Asking again changes nothing for those waiting, and keeps the slot of those changing.
	if got := h.admit("v2", "d", "c", "a"); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("admitted %v on asking again, want [a]", got)
	}
	// A newer version for a node changing keeps its slot; nobody else gets in.
	if !h.p.Admit("b", "v3") {
		t.Error("b refused a newer version while changing")
	}
	if v, ok := h.p.Changing("b"); !ok || v != "v3" {
		t.Errorf("b changing %q %v, want v3", v, ok)
	}
	h.p.Done("a")
	if !slices.Equal(h.woken, []string{"c"}) {
		t.Fatalf("woken %v, want [c]: first in line", h.woken)
	}
	if got := h.admit("v2", "d", "c"); !slices.Equal(got, []string{"c"}) {
		t.Fatalf("admitted %v, want [c]: d waits behind c", got)
	}
}

// TestNoStarvation: a node that waits is admitted before any node that asked after it, whatever its
// name, and a waiting node asking again keeps its place.
func TestNoStarvation(t *testing.T) {
	h := newHarness(1)
	h.admit("v2", "m", "z")
	for range 3 {
		h.admit("v3", "a", "b") // new changes keep arriving for nodes named before z
	}
	h.p.Done("m")
	if !slices.Equal(h.woken, []string{"z"}) {
		t.Fatalf("woken %v, want [z]", h.woken)
	}
	if got := h.admit("v3", "a", "b", "z"); !slices.Equal(got, []string{"z"}) {
		t.Fatalf("admitted %v, want [z]", got)
	}
}

// TestDoneLeavesTheLine: a waiting node that needs no pacing any more leaves the line without a slot.
func TestDoneLeavesTheLine(t *testing.T) {
	h := newHarness(1)
	h.admit("v2", "a", "b", "c")
	h.p.Done("b")
	if len(h.woken) != 0 {
		t.Errorf("woken %v, want none: no slot freed", h.woken)
	}
	h.p.Done("a")
	if !slices.Equal(h.woken, []string{"c"}) {
		t.Errorf("woken %v, want [c]", h.woken)
	}
}

// TestSlotTimeout: a node that never reports frees its slot after SlotTimeout, and the next node is woken.
func TestSlotTimeout(t *testing.T) {
	h := newHarness(1)
	h.admit("v2", "dead", "b")
	h.clock.Step(DefaultSlotTimeout - 3*time.Second)
	h.p.expire()
	if len(h.woken) != 0 {
		t.Fatalf("woken %v before the timeout", h.woken)
	}
	h.clock.Step(3 * time.Second)
	h.p.expire()
	if !slices.Equal(h.woken, []string{"b"}) {
		t.Fatalf("woken %v, want [b]", h.woken)
	}
	if _, ok := h.p.Changing("dead"); ok {
		t.Error("dead still holds a slot")
	}
}

func TestUnbounded(t *testing.T) {
	h := newHarness(0)
	var nodes []string
	for i := range 100 {
		nodes = append(nodes, string(rune('a'+i%26))+string(rune('a'+i/26)))
	}
	if got := h.admit("v2", nodes...); len(got) != 100 {
		t.Errorf("admitted %d of 100, want all with no bound", len(got))
	}
}
