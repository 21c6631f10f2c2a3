// SPDX-License-Identifier: Apache-2.0

package devclustertest

import (
	"flag"
	"fmt"
	"go/ast"
	"go/build"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// ShardEnv names the environment variable that makes a suite's test binary run one shard of its tests,
// "<i>/<n>" (1 ≤ i ≤ n), on a cluster of its own: the installed suite's tests mostly wait on kubelet
// restarts and trials, so n shards side by side finish in about 1/n of the time on the same cores.
const ShardEnv = "DKC_TEST_SHARD"

// ImagesDirEnv names the environment variable that points the installed suite at images already built
// from this checkout (hack/images, as BuildImages builds them), so that its shards share one build instead
// of each building its own.
const ImagesDirEnv = "DKC_TEST_IMAGES_DIR"

// Shard is one shard of a suite: the i-th (1-based) of n.
type Shard struct{ I, N int }

// ParseShard parses "<i>/<n>"; "" is the whole suite, 1/1.
func ParseShard(s string) (Shard, error) {
	if s == "" {
		return Shard{1, 1}, nil
	}
	a, b, ok := strings.Cut(s, "/")
	i, erri := strconv.Atoi(a)
	n, errn := strconv.Atoi(b)
	if !ok || erri != nil || errn != nil || n < 1 || i < 1 || i > n {
		return Shard{}, fmt.Errorf("%s=%q: want <i>/<n> with 1 ≤ i ≤ n", ShardEnv, s)
	}
	return Shard{i, n}, nil
}

// Deal deals tests to n shards and returns each shard's tests. The tests named in bySlowest come first, in
// that order, then the others by name; they are dealt in rounds of n, back and forth (shard 1 to n, then n
// to 1), so that each shard gets one of the n slowest, one of the next n, and so on. A test bySlowest does
// not name still lands in exactly one shard; names in bySlowest that are not tests are ignored.
func Deal(tests, bySlowest []string, n int) [][]string {
	known := map[string]bool{}
	for _, t := range tests {
		known[t] = true
	}
	var order []string
	for _, t := range bySlowest {
		if known[t] {
			order = append(order, t)
			delete(known, t) // a name listed twice is dealt once
		}
	}
	rest := make([]string, 0, len(known))
	for t := range known {
		rest = append(rest, t)
	}
	slices.Sort(rest)
	order = append(order, rest...)
	shards := make([][]string, n)
	for k, t := range order {
		round, pos := k/n, k%n
		if round%2 == 1 {
			pos = n - 1 - pos
		}
		shards[pos] = append(shards[pos], t)
	}
	return shards
}

// PackageTests returns the top-level tests (TestXxx, not TestMain) that the _test.go files in dir declare,
// in the files the build tags select.
func PackageTests(dir string, tags ...string) ([]string, error) {
	ctxt := build.Default
	ctxt.BuildTags = tags
	files, err := filepath.Glob(filepath.Join(dir, "*_test.go"))
	if err != nil {
		return nil, err
	}
	fset := token.NewFileSet()
	var tests []string
	for _, path := range files {
		if ok, err := ctxt.MatchFile(dir, filepath.Base(path)); err != nil || !ok {
			if err != nil {
				return nil, fmt.Errorf("match %s: %w", path, err)
			}
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, fmt.Errorf("parse %s: %w", path, err)
		}
		for _, d := range f.Decls {
			if fn, ok := d.(*ast.FuncDecl); ok && fn.Recv == nil && isTestName(fn.Name.Name) {
				tests = append(tests, fn.Name.Name)
			}
		}
	}
	slices.Sort(tests)
	return tests, nil
}

// isTestName tells whether name is one `go test` runs as a test (TestXxx; Xxx not starting lowercase).
func isTestName(name string) bool {
	rest, ok := strings.CutPrefix(name, "Test")
	if !ok || name == "TestMain" {
		return false
	}
	return rest == "" || !('a' <= rest[0] && rest[0] <= 'z')
}

// selectShard applies $DKC_TEST_SHARD to the test binary in the working directory (the package's, as `go
// test` runs it), whose tests are dealt by Deal over bySlowest and the build tag integration: it skips the
// other shards' tests (-test.skip, so a test nothing deals still runs rather than nowhere) and returns the
// shard and whether any of its tests matches -test.run (none: no cluster is worth starting).
func selectShard(bySlowest []string) (Shard, bool, error) {
	s, err := ParseShard(os.Getenv(ShardEnv))
	if err != nil || s.N == 1 {
		return s, true, err
	}
	if !flag.Parsed() {
		flag.Parse()
	}
	skip, run := flag.Lookup("test.skip"), flag.Lookup("test.run")
	if skip == nil || run == nil {
		return s, false, fmt.Errorf("%s: the test binary has no -test.skip or -test.run flag", ShardEnv)
	}
	if skip.Value.String() != "" {
		return s, false, fmt.Errorf("%s with -skip %q: choose tests with -run instead", ShardEnv, skip.Value.String())
	}
	wd, err := os.Getwd()
	if err != nil {
		return s, false, err
	}
	tests, err := PackageTests(wd, "integration")
	if err != nil {
		return s, false, err
	}
	shards := Deal(tests, bySlowest, s.N)
	var others []string
	for k, sh := range shards {
		if k != s.I-1 {
			others = append(others, sh...)
		}
	}
	if len(others) > 0 {
		if err := skip.Value.Set("^(" + strings.Join(others, "|") + ")$"); err != nil {
			return s, false, err
		}
	}
	mine := shards[s.I-1]
	matches := len(mine) > 0
	if pattern := run.Value.String(); pattern != "" && matches {
		// -run's first element selects top-level tests (package testing splits it at slashes outside
		// brackets; a top-level pattern with a slash of its own is rare enough to take whole).
		top, _, _ := strings.Cut(pattern, "/")
		if re, err := regexp.Compile(top); err == nil {
			matches = slices.ContainsFunc(mine, re.MatchString)
		}
	}
	fmt.Fprintf(os.Stderr, "shard %d/%d (%s): %s\n", s.I, s.N, ShardEnv, strings.Join(mine, " "))
	return s, matches, nil
}
