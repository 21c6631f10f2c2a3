// SPDX-License-Identifier: Apache-2.0

package devclustertest

import (
	"slices"
	"testing"
)

// CheckShardList holds a sharded suite's bySlowest to the suite's tests in the working directory (its unit
// test runs it: the suite's own files need -tags integration and a cluster): each test is listed once, each
// listed name is a test, and however many shards `make test-integration` runs, every test lands in exactly
// one of them.
func CheckShardList(t *testing.T, bySlowest []string) {
	t.Helper()
	tests, err := PackageTests(".", "integration")
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
		for _, shard := range Deal(tests, bySlowest, n) {
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
