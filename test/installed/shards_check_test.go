// SPDX-License-Identifier: Apache-2.0

//go:build !integration

package installed

import (
	"slices"
	"testing"

	"github.com/dkc-dev/dkc/test/devcluster/devclustertest"
)

// TestShardsDealEveryTest holds bySlowest to the suite's tests (it runs with the unit tests: the suite's own
// files need -tags integration and a cluster): each test is listed once, each listed name is a test, and
// however many shards `make test-integration` runs, every test lands in exactly one of them.
func TestShardsDealEveryTest(t *testing.T) {
	tests, err := devclustertest.PackageTests(".", "integration")
	if err != nil {
		t.Fatal(err)
	}
	if len(tests) == 0 {
		t.Fatal("no tests found in the suite's files")
	}
	seen := map[string]bool{}
	for _, name := range bySlowest {
		if seen[name] {
			t.Errorf("bySlowest lists %s twice", name)
		}
		seen[name] = true
		if !slices.Contains(tests, name) {
			t.Errorf("bySlowest lists %s, which is not a test of the suite: remove it", name)
		}
	}
	for _, name := range tests {
		if !seen[name] {
			t.Errorf("%s is missing from bySlowest: list it where its time in the last run puts it", name)
		}
	}
	for n := 1; n <= 6; n++ {
		count := map[string]int{}
		for _, shard := range devclustertest.Deal(tests, bySlowest, n) {
			for _, name := range shard {
				count[name]++
			}
		}
		for _, name := range tests {
			if count[name] != 1 {
				t.Errorf("%d shards: %s is dealt to %d shards, want 1", n, name, count[name])
			}
		}
	}
}
