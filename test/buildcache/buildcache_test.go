// SPDX-License-Identifier: Apache-2.0

// Package buildcache tests hack/gobuild.sh, through which the helpers, the suites' binaries and the pinned
// tools are built: a binary is linked once per build configuration on a machine, then copied out, from any
// checkout, and linked again when its code changes.
package buildcache

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/dkc-dev/dkc/test/reporoot"
)

const program = `package main

import "fmt"

func main() { fmt.Println(%q) }
`

// checkout writes a one-program module into a new directory, as a clone of it would be.
func checkout(t *testing.T, says string) string {
	t.Helper()
	dir := t.TempDir()
	write := func(name, content string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module example.com/hello\n\ngo 1.24\n")
	write("main.go", fmtProgram(says))
	return dir
}

func fmtProgram(says string) string {
	return strings.ReplaceAll(program, "%q", strconv.Quote(says))
}

// build runs hack/gobuild.sh in src with cache as DKC_CACHE_DIR and returns the binary it wrote to a new
// directory and whether go build linked it (-x prints each command it runs, the linker's too).
func build(t *testing.T, cache, src string) (string, bool) {
	t.Helper()
	root, err := reporoot.Find(mustWd(t))
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	cmd := exec.Command("bash", filepath.Join(root, "hack", "gobuild.sh"), out, "-x", "-buildvcs=false", ".")
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "DKC_CACHE_DIR="+cache, "CGO_ENABLED=0")
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("gobuild.sh: %v\n%s", err, b)
	}
	return filepath.Join(out, "hello"), regexp.MustCompile(`(?m)/link -o `).Match(b)
}

func mustWd(t *testing.T) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return wd
}

func run(t *testing.T, bin string) string {
	t.Helper()
	b, err := exec.Command(bin).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", bin, err, b)
	}
	return string(bytes.TrimSpace(b))
}

func TestLinkedOncePerConfigurationFromAnyCheckout(t *testing.T) {
	cache := t.TempDir()

	first, linked := build(t, cache, checkout(t, "one"))
	if got := run(t, first); got != "one" || !linked {
		t.Fatalf("first build says %q (linked: %v), want one, linked", got, linked)
	}

	// A second checkout of the same code, elsewhere: the cached binary is current, so it is not linked
	// again, and the copy is the same bytes.
	second, linked := build(t, cache, checkout(t, "one"))
	if linked {
		t.Error("the same code was linked again from another checkout")
	}
	a, _ := os.ReadFile(first)
	b, _ := os.ReadFile(second)
	if !bytes.Equal(a, b) {
		t.Error("the two checkouts' binaries differ")
	}

	// Changed code is linked again, in the same configuration's directory; the earlier copy stays as it was.
	third, linked := build(t, cache, checkout(t, "two"))
	if got := run(t, third); got != "two" || !linked {
		t.Errorf("after the change the binary says %q (linked: %v), want two, linked", got, linked)
	}
	if got := run(t, second); got != "one" {
		t.Errorf("an earlier copy changed with the cache: it says %q, want one", got)
	}
	if dirs, _ := filepath.Glob(filepath.Join(cache, "gobuild", "*", "hello")); len(dirs) != 1 {
		t.Errorf("the cache holds %v, want one configuration", dirs)
	}
}
