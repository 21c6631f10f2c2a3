// SPDX-License-Identifier: Apache-2.0

package sbom

import (
	"encoding/json"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// standin builds hack/images/testdata/standin (a main package of this module linking grpc) for the host.
func standin(t *testing.T) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "standin")
	cmd := exec.Command("go", "build", "-trimpath", "-buildvcs=false", "-o", out, "../testdata/standin")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the stand-in: %v\n%s", err, b)
	}
	return out
}

// goModVersion is the version of module mod that the repository's go.mod requires.
func goModVersion(t *testing.T, mod string) string {
	t.Helper()
	b, err := os.ReadFile("../../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*` + regexp.QuoteMeta(mod) + ` (v\S+)`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("go.mod requires no %s", mod)
	}
	return string(m[1])
}

var idPattern = regexp.MustCompile(`^SPDXRef-[A-Za-z0-9.-]+$`)

// validate checks the fields SPDX 2.3 requires of a document and of each package (cardinality 1..1,
// spdx.github.io/spdx-spec/v2.3), on the JSON as written rather than on the Go structs, so that a wrong
// JSON name fails too; and that every relationship names elements the document has.
func validate(t *testing.T, js []byte) map[string]any {
	t.Helper()
	var doc map[string]any
	if err := json.Unmarshal(js, &doc); err != nil {
		t.Fatal(err)
	}
	str := func(m map[string]any, key string) string {
		s, _ := m[key].(string)
		if s == "" {
			t.Errorf("%s: missing or empty in %v", key, m["SPDXID"])
		}
		return s
	}
	if v := str(doc, "spdxVersion"); v != "SPDX-2.3" {
		t.Errorf("spdxVersion %q", v)
	}
	if v := str(doc, "dataLicense"); v != "CC0-1.0" {
		t.Errorf("dataLicense %q", v)
	}
	if v := str(doc, "SPDXID"); v != "SPDXRef-DOCUMENT" {
		t.Errorf("SPDXID %q", v)
	}
	str(doc, "name")
	if u, err := url.Parse(str(doc, "documentNamespace")); err != nil || !u.IsAbs() || u.Fragment != "" {
		t.Errorf("documentNamespace %v: want an absolute URI without #", doc["documentNamespace"])
	}
	ci, _ := doc["creationInfo"].(map[string]any)
	if ci == nil {
		t.Fatal("creationInfo missing")
	}
	if c, err := time.Parse(time.RFC3339, str(ci, "created")); err != nil || !strings.HasSuffix(ci["created"].(string), "Z") || c.Nanosecond() != 0 {
		t.Errorf("created %v: want YYYY-MM-DDThh:mm:ssZ", ci["created"])
	}
	creators, _ := ci["creators"].([]any)
	if len(creators) == 0 {
		t.Error("creationInfo.creators empty")
	}
	for _, c := range creators {
		if s, _ := c.(string); !regexp.MustCompile(`^(Tool|Organization|Person): \S`).MatchString(s) {
			t.Errorf("creator %q", s)
		}
	}
	ids := map[string]bool{"SPDXRef-DOCUMENT": true}
	pkgs, _ := doc["packages"].([]any)
	for _, p := range pkgs {
		pkg := p.(map[string]any)
		id := str(pkg, "SPDXID")
		if !idPattern.MatchString(id) || ids[id] {
			t.Errorf("package SPDXID %q: malformed or not unique", id)
		}
		ids[id] = true
		str(pkg, "name")
		str(pkg, "downloadLocation")
		// filesAnalyzed true would require packageVerificationCode and files.
		if fa, ok := pkg["filesAnalyzed"].(bool); !ok || fa {
			t.Errorf("package %s: filesAnalyzed %v, want false", id, pkg["filesAnalyzed"])
		}
	}
	describes := 0
	rels, _ := doc["relationships"].([]any)
	for _, r := range rels {
		rel := r.(map[string]any)
		from, typ, to := str(rel, "spdxElementId"), str(rel, "relationshipType"), str(rel, "relatedSpdxElement")
		if !ids[from] || !ids[to] {
			t.Errorf("relationship %s %s %s names an element the document lacks", from, typ, to)
		}
		if from == "SPDXRef-DOCUMENT" && typ == "DESCRIBES" {
			describes++
		}
	}
	if describes != 1 {
		t.Errorf("%d DESCRIBES relationships, want 1", describes)
	}
	return doc
}

func TestNew(t *testing.T) {
	bin := standin(t)
	s := Subject{Image: "img", Version: "v0.2.0", OS: "linux", Arch: "amd64", Repository: "https://github.com/dkc-dev/dkc",
		Revision: "0123abc", Created: time.Unix(1700000000, 0)}
	doc, err := New(s, []Binary{{Path: "/usr/local/bin/tool", Source: bin}, {Path: "/usr/local/bin/other", Source: bin}})
	if err != nil {
		t.Fatal(err)
	}
	js, err := doc.JSON()
	if err != nil {
		t.Fatal(err)
	}
	validate(t, js)

	grpcVersion := goModVersion(t, "google.golang.org/grpc")
	type want struct {
		version, purl, downloadLocation string
		checksum                        bool
	}
	for name, w := range map[string]want{
		// The main module of a work-tree build is (devel): the build's version names it.
		"github.com/dkc-dev/dkc": {version: "v0.2.0", purl: "pkg:golang/github.com/dkc-dev/dkc@v0.2.0",
			downloadLocation: "git+https://github.com/dkc-dev/dkc.git@0123abc"},
		"google.golang.org/grpc": {version: grpcVersion, purl: "pkg:golang/google.golang.org/grpc@" + grpcVersion,
			downloadLocation: NoAssertion, checksum: true},
		"stdlib": {version: strings.TrimPrefix(goVersion(t), "go"), purl: "pkg:golang/stdlib@" + strings.TrimPrefix(goVersion(t), "go"),
			downloadLocation: NoAssertion},
	} {
		var found []Package
		for _, p := range doc.Packages {
			if p.Name == name {
				found = append(found, p)
			}
		}
		if len(found) != 1 {
			t.Errorf("%s: %d packages, want 1 (two binaries link it)", name, len(found))
			continue
		}
		p := found[0]
		if p.VersionInfo != w.version || len(p.ExternalRefs) != 1 || p.ExternalRefs[0].ReferenceLocator != w.purl ||
			p.DownloadLocation != w.downloadLocation {
			t.Errorf("%s = %+v, want version %s, purl %s, downloadLocation %s", name, p, w.version, w.purl, w.downloadLocation)
		}
		if w.checksum && (len(p.Checksums) != 1 || len(p.Checksums[0].ChecksumValue) != 64 || !strings.Contains(p.Comment, "go.sum h1:")) {
			t.Errorf("%s: checksums %+v comment %q, want the go.sum hash", name, p.Checksums, p.Comment)
		}
	}
	// Both binaries, each with its own SHA-256, in the image, each depending on grpc.
	rels := map[string]int{}
	for _, r := range doc.Relationships {
		rels[r.RelationshipType+" "+r.RelatedSPDXElement]++
	}
	for _, p := range doc.Packages {
		switch p.Name {
		case "tool", "other":
			if p.PrimaryPackagePurpose != "APPLICATION" || len(p.Checksums) != 1 || !strings.Contains(p.Comment, "GOARCH=") {
				t.Errorf("binary %+v", p)
			}
			if rels["CONTAINS "+p.SPDXID] != 1 {
				t.Errorf("binary %s: not contained in the image", p.Name)
			}
		case "google.golang.org/grpc":
			if rels["DEPENDS_ON "+p.SPDXID] != 2 {
				t.Errorf("grpc: %d DEPENDS_ON, want one per binary", rels["DEPENDS_ON "+p.SPDXID])
			}
		}
	}

	// The same inputs give the same bytes (the image's digest depends on them); another build another namespace.
	again, _ := New(s, []Binary{{Path: "/usr/local/bin/tool", Source: bin}, {Path: "/usr/local/bin/other", Source: bin}})
	if js2, _ := again.JSON(); string(js2) != string(js) {
		t.Error("two documents of the same binaries differ")
	}
	s.Arch = "arm64"
	if other, _ := New(s, []Binary{{Path: "/usr/local/bin/tool", Source: bin}}); other.DocumentNamespace == doc.DocumentNamespace {
		t.Error("another platform's document has the same namespace")
	}
}

func TestNewRejectsNonGoBinaries(t *testing.T) {
	f := filepath.Join(t.TempDir(), "script")
	if err := os.WriteFile(f, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Subject{Image: "x"}, []Binary{{Path: "/x", Source: f}}); err == nil {
		t.Error("want an error for a file without Go build info")
	}
}

func goVersion(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOVERSION").Output()
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(out))
}

func TestIDs(t *testing.T) {
	s := newIDs()
	for _, tc := range []struct{ in, want string }{
		{"Module-google.golang.org/grpc@v1.82.1", "SPDXRef-Module-google.golang.org-grpc-v1.82.1"},
		{"Module-google.golang.org/grpc@v1.82.1", "SPDXRef-Module-google.golang.org-grpc-v1.82.1-2"},
		{"Module-a+b@v0.0.0-2020_x", "SPDXRef-Module-a-b-v0.0.0-2020-x"},
	} {
		if got := s.id(tc.in); got != tc.want {
			t.Errorf("id(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
