// SPDX-License-Identifier: Apache-2.0

package devcluster

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

func TestPortBlockLeases(t *testing.T) {
	portLeaseDir = t.TempDir()
	t.Cleanup(func() { portLeaseDir = runtimeRoot + "/ports" })
	if portBlocks() < 2 {
		t.Skipf("the ephemeral range leaves %d blocks", portBlocks())
	}
	a, b := filepath.Join(t.TempDir(), "a"), filepath.Join(t.TempDir(), "b")
	for _, d := range []string{a, b} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	pa, err := leasePortBlock(a)
	if err != nil {
		t.Fatal(err)
	}
	// a has not written its state yet: within the grace its lease holds.
	pb, err := leasePortBlock(b)
	if err != nil {
		t.Fatal(err)
	}
	if pa == pb {
		t.Fatalf("two clusters leased the same block %d", pa)
	}
	if pa < portBlockFirst || pa+portBlockSize > portBlockFirst+portBlocks()*portBlockSize {
		t.Fatalf("block %d outside the range below the ephemeral ports", pa)
	}
	// A state.json naming another block makes a's lease stale: b may take it over.
	writeState := func(dir string, block int) {
		data, _ := json.Marshal(State{PortBlock: block})
		if err := os.WriteFile(filepath.Join(dir, "state.json"), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	writeState(a, pa)
	if again, err := leasePortBlock(a); err != nil || again != pa {
		t.Fatalf("a leased again: %d, %v; want its own block %d", again, err, pa)
	}
	releasePortBlock(a, pa)
	if _, err := os.Stat(filepath.Join(portLeaseDir, "0")); err == nil && pa == portBlockFirst {
		t.Fatal("released lease still there")
	}
	// Ports handed out come from the block, once each.
	c := &Cluster{state: State{PortBlock: pb}}
	p1, err := c.freePorts(3)
	if err != nil {
		t.Fatal(err)
	}
	p2, err := c.freePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range append(p1, p2...) {
		if p < pb || p >= pb+portBlockSize || seen[p] {
			t.Fatalf("ports %v %v: %d outside block %d or handed out twice", p1, p2, p, pb)
		}
		seen[p] = true
	}
}
