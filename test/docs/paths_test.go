// SPDX-License-Identifier: Apache-2.0

// Package docs checks the repository's own paths that README.md, docs/ and the READMEs under deploy/ name,
// without a cluster: a doc that names a file or package after it moved or went sends a reader to nothing.
package docs

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/dkc-dev/dkc/test/reporoot"
)

// TestDocsNameExistingPaths: every repository path a doc names in an inline code span or as a link target
// exists in the tree.
func TestDocsNameExistingPaths(t *testing.T) {
	root := repoRoot(t)
	top, err := topLevelDirs(root)
	if err != nil {
		t.Fatal(err)
	}
	docs, err := docFiles(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(docs) < 2 {
		t.Fatalf("found only %v: the docs moved?", docs)
	}
	for _, doc := range docs {
		data, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(doc)))
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range refs(doc, string(data), top) {
			if err := exists(root, r.path); err != nil {
				t.Errorf("%s:%d names %s: %v", doc, r.line, r.path, err)
			}
		}
	}
}

// docFiles are the docs checked, relative to root with forward slashes: README.md, every .md under docs/,
// and every README under deploy/.
func docFiles(root string) ([]string, error) {
	docs := []string{"README.md"}
	for _, dir := range []string{"docs", "deploy"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(p string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			rel, err := filepath.Rel(root, p)
			if err != nil {
				return err
			}
			rel = filepath.ToSlash(rel)
			if (dir == "docs" && strings.HasSuffix(rel, ".md")) || (dir == "deploy" && strings.HasPrefix(d.Name(), "README")) {
				docs = append(docs, rel)
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("walk %s: %w", dir, err)
		}
	}
	return docs, nil
}

// topLevelDirs are the directories at the repository's root that a code span's path may start with: those
// Go itself would look into (not "." or "_" ones such as .git and the build output _output).
func topLevelDirs(root string) (map[string]bool, error) {
	entries, err := os.ReadDir(root)
	if err != nil {
		return nil, err
	}
	top := map[string]bool{}
	for _, e := range entries {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") && !strings.HasPrefix(e.Name(), "_") {
			top[e.Name()] = true
		}
	}
	return top, nil
}

// ref is a repository path a doc names, relative to the root, with forward slashes.
type ref struct {
	line int
	path string
}

var (
	// codeSpan is an inline code span: a run of backticks, the code, the next run.
	codeSpan = regexp.MustCompile("`+([^`]+)`+")
	// linkTarget is the target of an inline link or image, [text](target) or [text](target "title").
	linkTarget = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	// lineSuffix is a location in a file after its name: check.go:74, check.go:74-80.
	lineSuffix = regexp.MustCompile(`:\d+(-\d+)?$`)
)

// modulePath is the main module's path: a code span may name a package by its import path.
const modulePath = "github.com/dkc-dev/dkc/"

// refs returns the repository paths the markdown text of doc (its path relative to the root) names, outside
// fenced code blocks:
//   - in an inline code span, each word (a command's argument, the value of NAME=value) that is a path under
//     one of the top-level directories top, or an import path of the main module; a leading ./ and a trailing
//     ... (go's package patterns) are dropped, and so is a :line suffix;
//   - as a link target that is not a URL or an anchor of the same page, relative to doc's directory as a
//     markdown renderer resolves it, without its #anchor.
func refs(doc, text string, top map[string]bool) []ref {
	var out []ref
	fenced := false
	for i, line := range strings.Split(text, "\n") {
		if t := strings.TrimSpace(line); strings.HasPrefix(t, "```") || strings.HasPrefix(t, "~~~") {
			fenced = !fenced
			continue
		}
		if fenced {
			continue
		}
		for _, m := range codeSpan.FindAllStringSubmatch(line, -1) {
			for _, word := range strings.Fields(m[1]) {
				if p, ok := spanPath(word, top); ok {
					out = append(out, ref{line: i + 1, path: p})
				}
			}
		}
		for _, m := range linkTarget.FindAllStringSubmatch(line, -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "#") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			target, _, _ = strings.Cut(target, "#")
			out = append(out, ref{line: i + 1, path: path.Clean(path.Join(path.Dir(doc), target))})
		}
	}
	return out
}

// spanPath is the repository path word names, if it names one.
func spanPath(word string, top map[string]bool) (string, bool) {
	if _, v, ok := strings.Cut(word, "="); ok { // NAME=value: the value
		word = v
	}
	word = strings.Trim(word, `"'(),;`)
	if strings.Contains(word, "://") {
		return "", false
	}
	word = strings.TrimPrefix(word, modulePath)
	word = strings.TrimPrefix(word, "./")
	word = strings.TrimSuffix(word, "...")
	word = lineSuffix.ReplaceAllString(word, "")
	first, _, ok := strings.Cut(word, "/")
	if !ok || !top[first] {
		return "", false
	}
	return word, true
}

// placeholder is a part of a path that stands for any value: hack/kube/v1.<minor>.
var placeholder = regexp.MustCompile(`<[^>]+>`)

// exists says whether p (relative to root) is in the tree: a file or directory; with a <placeholder> or a
// glob, at least one path it matches; or a package's symbol, internal/outbox.Outbox, where the part before
// the last dot is a directory of Go files.
func exists(root, p string) error {
	full := filepath.Join(root, filepath.FromSlash(p))
	if glob := placeholder.ReplaceAllString(full, "*"); strings.ContainsAny(glob, "*?[") {
		matches, err := filepath.Glob(glob)
		if err != nil {
			return err
		}
		if len(matches) == 0 {
			return fmt.Errorf("matches nothing")
		}
		return nil
	}
	if _, err := os.Stat(full); err == nil {
		return nil
	}
	dir, last := path.Split(p)
	if i := strings.LastIndex(last, "."); i > 0 {
		pkg := filepath.Join(root, filepath.FromSlash(dir+last[:i]))
		if gofiles, _ := filepath.Glob(filepath.Join(pkg, "*.go")); len(gofiles) > 0 {
			return nil
		}
	}
	return fmt.Errorf("no such file, directory or package in the tree")
}

func TestRefs(t *testing.T) {
	top := map[string]bool{"cli": true, "deploy": true, "docs": true, "hack": true, "internal": true, "services": true}
	for _, tc := range []struct {
		name, doc, text string
		want            []ref
	}{
		{"code span", "docs/a.md", "see `deploy/base/server.yaml` and `hack/kube/v1.35`.",
			[]ref{{1, "deploy/base/server.yaml"}, {1, "hack/kube/v1.35"}}},
		{"symbol", "docs/a.md", "`internal/outbox.Outbox`", []ref{{1, "internal/outbox.Outbox"}}},
		{"placeholder", "README.md", "a new `hack/kube/v1.<minor>` directory", []ref{{1, "hack/kube/v1.<minor>"}}},
		{"command", "README.md", "run `make test INTEGRATION_PKGS=./services/x/ && go test ./cli/... internal/y`",
			[]ref{{1, "services/x/"}, {1, "cli/"}, {1, "internal/y"}}},
		{"import path", "README.md", "`github.com/dkc-dev/dkc/internal/kubeletcheck/checkapi`",
			[]ref{{1, "internal/kubeletcheck/checkapi"}}},
		{"line suffix and punctuation", "README.md", "(`services/a/check.go:74`, `(internal/b)`)",
			[]ref{{1, "services/a/check.go"}, {1, "internal/b"}}},
		{"double backticks", "README.md", "``internal/a `x` ``", []ref{{1, "internal/a"}}},
		{"not a repository path", "README.md", "`/etc/kubernetes/kubelet.conf` `_output/bin` `kube-<minor>.mod` `sidecar/x` `a/b` `go.mod` `https://github.com/dkc-dev/dkc/docs/x`",
			nil},
		{"second line", "README.md", "one\n`internal/a`", []ref{{2, "internal/a"}}},
		{"fenced block skipped", "README.md", "```\n`internal/a`\n```\n`internal/b`", []ref{{4, "internal/b"}}},
		{"link relative to the doc", "docs/a.md", "[b](b.md#x), [c](../deploy/c), [d](./d/ \"D\")",
			[]ref{{1, "docs/b.md"}, {1, "deploy/c"}, {1, "docs/d"}}},
		{"link from the root", "README.md", "[design](docs/design.md)", []ref{{1, "docs/design.md"}}},
		{"links not to the tree", "docs/a.md", "[x](https://example.com/a) [y](#section) [z](mailto:a@b)", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := refs(tc.doc, tc.text, top); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("refs(%q) = %v, want %v", tc.text, got, tc.want)
			}
		})
	}
}

func TestExists(t *testing.T) {
	root := t.TempDir()
	for _, f := range []string{"internal/outbox/outbox.go", "hack/kube/v1.35/go.mod", "deploy/base/server.yaml", "docs/empty/README"} {
		if err := os.MkdirAll(filepath.Join(root, filepath.Dir(f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		path string
		ok   bool
	}{
		{"deploy/base/server.yaml", true},
		{"deploy/base", true},
		{"deploy/base/", true},
		{"deploy/base/client.yaml", false},
		{"internal/outbox.Outbox", true},
		{"internal/outbox/outbox.go", true},
		{"internal/inbox.Inbox", false},
		{"docs/empty.README", false}, // docs/empty is a directory without Go files: no package
		{"hack/kube/v1.<minor>", true},
		{"hack/kube/v2.<minor>", false},
		{"hack/kube/v1.3x", false},
		{"hack/kube/v1.38", false},
		{"deploy/*/server.yaml", true},
	} {
		if err := exists(root, tc.path); (err == nil) != tc.ok {
			t.Errorf("exists(%q) = %v, want ok %v", tc.path, err, tc.ok)
		}
	}
}

// repoRoot is the checkout the test runs in: the nearest directory above with the main module's go.mod.
func repoRoot(t *testing.T) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	root, err := reporoot.Find(wd)
	if err != nil {
		t.Fatal(err)
	}
	return root
}
