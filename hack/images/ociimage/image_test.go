package ociimage

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

var testSource = Source{
	Repository: "https://github.com/dkc-dev/dkc", Revision: "0123abc", Version: "v0.0.0-test",
	Created: time.Unix(1700000000, 0),
}

// entry is what a test expects of one layer entry.
type entry struct {
	name     string
	mode     int64
	uid, gid int
	typ      byte
}

func testSpec(t *testing.T) Spec {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "tool")
	if err := os.WriteFile(bin, []byte("#!fake binary\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return Spec{
		Name: "tool", Entrypoint: []string{"/usr/local/bin/tool"}, User: "65532:65532", Base: true, Arch: "amd64",
		Files: []File{
			{Path: "/usr/local/bin/tool", Mode: 0o755, Source: bin},
			{Path: "/usr/local/bin/helper", Mode: 0o755, Data: []byte("helper")},
		},
	}
}

func TestBuildConfig(t *testing.T) {
	dirty := testSource
	dirty.Dirty = true
	for _, tc := range []struct {
		name      string
		src       Source
		wantDirty bool
	}{
		{"clean tree", testSource, false},
		{"dirty tree", dirty, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			img, err := Build(testSpec(t), tc.src)
			if err != nil {
				t.Fatal(err)
			}
			cf, err := img.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			c := cf.Config
			if !slices.Equal(c.Entrypoint, []string{"/usr/local/bin/tool"}) || c.User != "65532:65532" ||
				c.WorkingDir != "/" || !slices.Equal(c.Env, []string{DefaultPath}) || len(c.Cmd) != 0 {
				t.Errorf("config = %+v", c)
			}
			if cf.OS != "linux" || cf.Architecture != "amd64" || !cf.Created.Time.Equal(tc.src.Created) {
				t.Errorf("platform/created = %s/%s %v", cf.OS, cf.Architecture, cf.Created)
			}
			want := map[string]string{
				AnnotationSource: "https://github.com/dkc-dev/dkc", AnnotationRevision: "0123abc",
				AnnotationVersion: "v0.0.0-test", AnnotationCreated: "2023-11-14T22:13:20Z",
			}
			if tc.wantDirty {
				want[AnnotationDirty] = "true"
			}
			if fmt.Sprint(c.Labels) != fmt.Sprint(want) {
				t.Errorf("labels = %v, want %v", c.Labels, want)
			}
			m, err := img.Manifest()
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(m.Annotations) != fmt.Sprint(want) {
				t.Errorf("manifest annotations = %v, want %v", m.Annotations, want)
			}
		})
	}
}

func TestBuildLayers(t *testing.T) {
	const dir, reg = tar.TypeDir, tar.TypeReg
	img, err := Build(testSpec(t), testSource)
	if err != nil {
		t.Fatal(err)
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range [][]entry{{
		{"etc/", 0o755, 0, 0, dir},
		{"etc/group", 0o644, 0, 0, reg},
		{"etc/nsswitch.conf", 0o644, 0, 0, reg},
		{"etc/passwd", 0o644, 0, 0, reg},
		{"home/", 0o755, 0, 0, dir},
		{"home/nonroot/", 0o700, 65532, 65532, dir},
		{"root/", 0o700, 0, 0, dir},
		{"tmp/", 0o1777, 0, 0, dir},
	}, {
		{"usr/", 0o755, 0, 0, dir},
		{"usr/local/", 0o755, 0, 0, dir},
		{"usr/local/bin/", 0o755, 0, 0, dir},
		{"usr/local/bin/helper", 0o755, 0, 0, reg},
		{"usr/local/bin/tool", 0o755, 0, 0, reg},
	}} {
		got := readLayer(t, layers[i], testSource.Created)
		if !slices.Equal(got, want) {
			t.Errorf("layer %d:\n got %v\nwant %v", i, got, want)
		}
	}
	if len(layers) != 2 {
		t.Errorf("%d layers, want 2", len(layers))
	}
}

// readLayer lists a layer's entries and fails on anything that would make it depend on the build host.
func readLayer(t *testing.T, l v1.Layer, mtime time.Time) []entry {
	t.Helper()
	rc, err := l.Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	var out []entry
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		if !h.ModTime.Equal(mtime) || h.Uname != "" || h.Gname != "" || len(h.PAXRecords) != 0 {
			t.Errorf("%s: mtime %v uname %q gname %q pax %v", h.Name, h.ModTime, h.Uname, h.Gname, h.PAXRecords)
		}
		out = append(out, entry{h.Name, h.Mode, h.Uid, h.Gid, h.Typeflag})
	}
}

func TestBuildIsReproducible(t *testing.T) {
	spec := testSpec(t)
	later := testSource
	later.Created = later.Created.Add(time.Second)
	first, err := Build(spec, testSource)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		src  Source
		same bool
	}{
		{"same inputs", testSource, true},
		{"another timestamp", later, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			again, err := Build(spec, tc.src)
			if err != nil {
				t.Fatal(err)
			}
			d1, _ := first.Digest()
			d2, _ := again.Digest()
			if (d1 == d2) != tc.same {
				t.Errorf("digests %s and %s; want same=%v", d1, d2, tc.same)
			}
		})
	}
}

func TestLayerRejectsBadPaths(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files []File
	}{
		{"relative", []File{{Path: "etc/passwd"}}},
		{"unclean", []File{{Path: "/etc/../passwd"}}},
		{"root", []File{{Path: "/", Dir: true}}},
		{"duplicate", []File{{Path: "/a"}, {Path: "/a"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := Layer(tc.files, testSource.Created); err == nil {
				t.Error("want an error")
			}
		})
	}
}

func TestWrite(t *testing.T) {
	img, err := Build(testSpec(t), testSource)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	ref := name.MustParseReference("dkc.local/tool:dev").(name.Tag)
	written, err := Write(dir, []Built{{Name: "tool", Ref: ref, Image: img}})
	if err != nil {
		t.Fatal(err)
	}
	want, _ := img.Digest()
	if len(written) != 1 || written[0].Digest != want || written[0].Size == 0 {
		t.Fatalf("written = %+v", written)
	}

	// The docker archive loads back under its reference with the same config (image ID) and layers. Its
	// manifest is re-derived by the reader, without annotations, so only the config digest can match.
	fromTar, err := tarball.ImageFromPath(filepath.Join(dir, "tool.tar"), &ref)
	if err != nil {
		t.Fatal(err)
	}
	gotID, _ := fromTar.ConfigName()
	wantID, _ := img.ConfigName()
	if gotID != wantID {
		t.Errorf("tarball image config %s, want %s", gotID, wantID)
	}

	// Writing twice leaves one image in the layout, named by its reference.
	if _, err := Write(dir, []Built{{Name: "tool", Ref: ref, Image: img}}); err != nil {
		t.Fatal(err)
	}
	idx, err := layout.ImageIndexFromPath(filepath.Join(dir, LayoutDir))
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 || im.Manifests[0].Digest != want ||
		im.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != "dkc.local/tool:dev" {
		t.Errorf("layout index = %+v", im.Manifests)
	}
}
