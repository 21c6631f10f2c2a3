// SPDX-License-Identifier: Apache-2.0

package devclustertest

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

func TestParseShard(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Shard
		err  bool
	}{
		{in: "", want: Shard{1, 1}},
		{in: "1/1", want: Shard{1, 1}},
		{in: "2/3", want: Shard{2, 3}},
		{in: "0/3", err: true},
		{in: "4/3", err: true},
		{in: "3", err: true},
		{in: "a/b", err: true},
	} {
		got, err := ParseShard(tc.in)
		if (err != nil) != tc.err || (!tc.err && got != tc.want) {
			t.Errorf("ParseShard(%q) = %v, %v; want %v, error %v", tc.in, got, err, tc.want, tc.err)
		}
	}
}

func TestDeal(t *testing.T) {
	tests := []string{"TestA", "TestB", "TestC", "TestD", "TestE", "TestF", "TestNew"}
	slowest := []string{"TestF", "TestE", "TestD", "TestC", "TestB", "TestA", "TestGone"}
	for _, tc := range []struct {
		n    int
		want [][]string
	}{
		{n: 1, want: [][]string{{"TestF", "TestE", "TestD", "TestC", "TestB", "TestA", "TestNew"}}},
		// Back and forth: the slowest and the fourth slowest share a shard, the second and the third.
		{n: 2, want: [][]string{{"TestF", "TestC", "TestB"}, {"TestE", "TestD", "TestA", "TestNew"}}},
		{n: 3, want: [][]string{{"TestF", "TestA", "TestNew"}, {"TestE", "TestB"}, {"TestD", "TestC"}}},
		{n: 9, want: [][]string{{"TestF"}, {"TestE"}, {"TestD"}, {"TestC"}, {"TestB"}, {"TestA"}, {"TestNew"}, nil, nil}},
	} {
		if got := Deal(tests, slowest, tc.n); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("Deal over %d shards = %v; want %v", tc.n, got, tc.want)
		}
	}
}

func TestPackageTests(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		"a_test.go": "//go:build integration\n\npackage p\n\n" +
			"func TestMain(m *testing.M) {}\nfunc TestOne(t *testing.T) {}\n" +
			"func Testlower(t *testing.T) {}\nfunc helper() {}\n",
		"b_test.go":  "package p\n\nfunc TestTwo(t *testing.T) {}\nfunc (s x) TestMethod(t *testing.T) {}\n",
		"c_test.go":  "//go:build !integration\n\npackage p\n\nfunc TestUnitOnly(t *testing.T) {}\n",
		"product.go": "package p\n\nfunc TestInProduct() {}\n",
	}
	for name, src := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := PackageTests(dir, "integration")
	if want := []string{"TestOne", "TestTwo"}; err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("PackageTests = %v, %v; want %v", got, err, want)
	}
}
