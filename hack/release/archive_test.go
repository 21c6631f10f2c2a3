// SPDX-License-Identifier: Apache-2.0

package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// writeFiles writes name → content into dir with the given permission and returns the paths.
func writeFiles(t *testing.T, dir string, perm fs.FileMode, files map[string]string) map[string]string {
	t.Helper()
	paths := map[string]string{}
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), perm); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, perm); err != nil { // past the umask
			t.Fatal(err)
		}
		paths[name] = p
	}
	return paths
}

var fixture = map[string]string{
	"kubectl-dkc":            "\x7fELF kubectl-dkc",
	"dkc-kubelet-check-1.37": "\x7fELF helper 1.37",
	"dkc-kubelet-check-1.34": "\x7fELF helper 1.34",
	"LICENSE":                "Apache License\n",
}

func fixtureEntries(paths map[string]string) []entry {
	// Deliberately not sorted: the archive must not depend on the order the entries come in.
	return []entry{
		{name: "LICENSE", mode: 0o644, source: paths["LICENSE"]},
		{name: "kubectl-dkc", mode: 0o755, source: paths["kubectl-dkc"]},
		{name: "dkc-kubelet-check-1.37", mode: 0o755, source: paths["dkc-kubelet-check-1.37"]},
		{name: "dkc-kubelet-check-1.34", mode: 0o755, source: paths["dkc-kubelet-check-1.34"]},
	}
}

// TestWriteArchive reads an archive back with archive/tar and compress/gzip (not readArchive) and checks
// every header field that decides the bytes, and the contents.
func TestWriteArchive(t *testing.T) {
	dir := t.TempDir()
	paths := writeFiles(t, dir, 0o600, fixture)
	mtime := time.Date(2026, 11, 26, 18, 0, 0, 999, time.FixedZone("X", 3600))
	path := filepath.Join(dir, "a.tar.gz")
	if err := writeArchive(path, fixtureEntries(paths), mtime); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o644 {
		t.Errorf("archive mode %v, want 0644", st.Mode().Perm())
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	if !zr.ModTime.IsZero() || zr.Name != "" || zr.Comment != "" || zr.OS != 255 {
		t.Errorf("gzip header %+v: want no time, name or comment, OS unknown (255)", zr.Header)
	}
	tr := tar.NewReader(zr)
	want := []struct {
		name string
		mode int64
	}{{"LICENSE", 0o644}, {"dkc-kubelet-check-1.34", 0o755}, {"dkc-kubelet-check-1.37", 0o755}, {"kubectl-dkc", 0o755}}
	for i := 0; ; i++ {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			if i != len(want) {
				t.Errorf("%d entries, want %d", i, len(want))
			}
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if i >= len(want) {
			t.Fatalf("extra entry %s", hdr.Name)
		}
		if hdr.Name != want[i].name || hdr.Mode != want[i].mode || hdr.Typeflag != tar.TypeReg {
			t.Errorf("entry %d: %s mode %o type %q, want %s mode %o regular", i, hdr.Name, hdr.Mode, hdr.Typeflag, want[i].name, want[i].mode)
		}
		if !hdr.ModTime.Equal(time.Date(2026, 11, 26, 17, 0, 0, 0, time.UTC)) || !hdr.AccessTime.IsZero() || !hdr.ChangeTime.IsZero() {
			t.Errorf("%s: mtime %v atime %v ctime %v, want the given time in whole seconds only", hdr.Name, hdr.ModTime, hdr.AccessTime, hdr.ChangeTime)
		}
		if hdr.Uid != 0 || hdr.Gid != 0 || hdr.Uname != "" || hdr.Gname != "" || hdr.Format != tar.FormatUSTAR {
			t.Errorf("%s: owner %d:%d (%q:%q) format %v, want 0:0 without names, USTAR", hdr.Name, hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname, hdr.Format)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if string(data) != fixture[hdr.Name] {
			t.Errorf("%s holds %q, want %q", hdr.Name, data, fixture[hdr.Name])
		}
	}
	got, err := readArchive(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 4 || got[3] != (archivedFile{name: "kubectl-dkc", mode: 0o755, size: int64(len(fixture["kubectl-dkc"]))}) {
		t.Errorf("readArchive = %+v", got)
	}
}

// TestWriteArchiveIsReproducible: the same contents under the same time give the same bytes, whatever the
// sources' directory, permissions and times on disk and the entries' order; another time or content does not.
func TestWriteArchiveIsReproducible(t *testing.T) {
	mtime := time.Unix(1_790_000_000, 0)
	write := func(perm fs.FileMode, files map[string]string, mtime time.Time, reverse bool) string {
		dir := t.TempDir()
		paths := writeFiles(t, dir, perm, files)
		for _, p := range paths {
			if err := os.Chtimes(p, time.Now(), time.Unix(int64(perm), 0)); err != nil { // differs with perm
				t.Fatal(err)
			}
		}
		entries := fixtureEntries(paths)
		if reverse {
			for i, j := 0, len(entries)-1; i < j; i, j = i+1, j-1 {
				entries[i], entries[j] = entries[j], entries[i]
			}
		}
		path := filepath.Join(dir, "a.tar.gz")
		if err := writeArchive(path, entries, mtime); err != nil {
			t.Fatal(err)
		}
		sum, err := sha256File(path)
		if err != nil {
			t.Fatal(err)
		}
		return sum
	}
	first := write(0o600, fixture, mtime, false)
	if second := write(0o755, fixture, mtime.Add(999*time.Millisecond), true); second != first {
		t.Errorf("two runs of the same contents: sha256 %s and %s", first, second)
	}
	if other := write(0o600, fixture, mtime.Add(time.Second), false); other == first {
		t.Errorf("another time gave the same archive %s", other)
	}
	changed := map[string]string{}
	for k, v := range fixture {
		changed[k] = v
	}
	changed["LICENSE"] += "."
	if other := write(0o600, changed, mtime, false); other == first {
		t.Errorf("another content gave the same archive %s", other)
	}
}

func TestWriteArchiveRefuses(t *testing.T) {
	dir := t.TempDir()
	paths := writeFiles(t, dir, 0o644, map[string]string{"a": "a"})
	for _, tc := range []struct {
		name    string
		entries []entry
	}{
		{"a path", []entry{{name: "bin/a", mode: 0o755, source: paths["a"]}}},
		{"dot dot", []entry{{name: "..", mode: 0o755, source: paths["a"]}}},
		{"no name", []entry{{name: "", mode: 0o755, source: paths["a"]}}},
		{"twice", []entry{{name: "a", mode: 0o755, source: paths["a"]}, {name: "a", mode: 0o644, source: paths["a"]}}},
		{"missing source", []entry{{name: "a", mode: 0o755, source: filepath.Join(dir, "nope")}}},
		{"directory", []entry{{name: "a", mode: 0o755, source: dir}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, "out.tar.gz")
			if err := writeArchive(path, tc.entries, time.Unix(0, 0)); err == nil {
				t.Fatal("no error")
			}
			left, _ := filepath.Glob(filepath.Join(dir, "out.tar.gz*"))
			if len(left) != 0 {
				t.Errorf("left behind %v", left)
			}
		})
	}
}

func TestReadArchiveRefusesATruncatedOne(t *testing.T) {
	dir := t.TempDir()
	paths := writeFiles(t, dir, 0o644, fixture)
	path := filepath.Join(dir, "a.tar.gz")
	if err := writeArchive(path, fixtureEntries(paths), time.Unix(0, 0)); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data[:len(data)-4], 0o644); err != nil { // the gzip trailer's size field
		t.Fatal(err)
	}
	if files, err := readArchive(path); err == nil {
		t.Errorf("truncated archive read as %+v", files)
	}
	if err := os.WriteFile(path, bytes.Repeat([]byte{0}, 64), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := readArchive(path); err == nil {
		t.Error("a file of zeros read as an archive")
	}
}
