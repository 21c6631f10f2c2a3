// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestClearOutput: an earlier release's archives, checksums and manifest go; the build directory and
// anything not a release's stay; a missing output directory is made.
func TestClearOutput(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files []string // in the output directory before
		want  []string // left after
	}{
		{name: "missing directory is made"},
		{name: "empty"},
		{
			name: "earlier release removed",
			files: []string{cliBin + "_v0.1.0_linux_amd64.tar.gz", cliBin + "_v0.1.0_checksums.txt", manifestFile,
				"bin/linux_amd64/" + cliBin, "notes.txt"},
			want: []string{"bin", "notes.txt"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "out")
			for _, f := range tc.files {
				path := filepath.Join(dir, f)
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, []byte("x"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if err := clearOutput(dir); err != nil {
				t.Fatalf("clearOutput: %v", err)
			}
			des, err := os.ReadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, de := range des {
				got = append(got, de.Name())
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("left %q, want %q", got, tc.want)
			}
		})
	}
}

// TestPrintRelease: one row per archive, then the manifest, the checksums, and a line naming the license.
func TestPrintRelease(t *testing.T) {
	dir := t.TempDir()
	a := publishedArchive{platform: platform{"linux", "amd64"}, name: archiveName("v1.2.3", platform{"linux", "amd64"}),
		sha256: "abc", files: []archivedFile{{name: cliBin}, {name: "LICENSE"}}}
	if err := os.WriteFile(filepath.Join(dir, a.name), make([]byte, 3<<19), 0o644); err != nil {
		t.Fatal(err)
	}
	src := source{version: "v1.2.3", created: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)}
	for _, tc := range []struct{ license, want string }{
		{"", "license none in the repository;"},
		{"/repo/LICENSE", "license LICENSE;"},
	} {
		var out bytes.Buffer
		s := summary{baseURL: "https://example.com/v1.2.3", sums: filepath.Join(dir, checksumsName("v1.2.3")),
			license: tc.license, start: time.Now()}
		if err := printRelease(&out, dir, src, []publishedArchive{a}, s); err != nil {
			t.Fatalf("printRelease: %v", err)
		}
		// Compared with runs of spaces as one (the columns' widths are tabwriter's), without the time taken.
		var got []string
		for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
			got = append(got, strings.Join(strings.Fields(line), " "))
		}
		if n := len(got) - 1; n >= 0 && strings.HasPrefix(got[n], "#") {
			got[n] = got[n][:strings.LastIndex(got[n], " ")]
		}
		want := []string{
			a.name + " 1.5 MiB 2 files sha256:abc",
			manifestFile + " krew manifest, URIs under https://example.com/v1.2.3",
			checksumsName("v1.2.3") + " (sha256sum -c)",
			"# " + dir + ", version v1.2.3, created 2025-01-02T03:04:05Z, " + tc.want,
		}
		if !slices.Equal(got, want) {
			t.Errorf("license %q: printed\n%s\nwant\n%s", tc.license, strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	}
	missing := []publishedArchive{{name: "missing.tar.gz"}}
	if err := printRelease(&bytes.Buffer{}, dir, src, missing, summary{}); err == nil {
		t.Error("printRelease of a missing archive succeeded")
	}
}
