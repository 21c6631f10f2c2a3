// SPDX-License-Identifier: Apache-2.0

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
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/google/go-containerregistry/pkg/v1/validate"
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
			if cf.OS != "linux" || cf.Architecture != "amd64" || !cf.Created.Equal(tc.src.Created) {
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

// TestBuildSharedLayer: two images given the same shared layer carry it byte for byte at the same place,
// above the same base, so that their chains of layers agree up to it; their own layers differ.
func TestBuildSharedLayer(t *testing.T) {
	shared, err := Layer([]File{{Path: "/usr/local/bin/helper-1", Mode: 0o755, Data: []byte("helper")}}, testSource.Created)
	if err != nil {
		t.Fatal(err)
	}
	var layers [][]v1.Layer
	for _, name := range []string{"one", "two"} {
		spec := testSpec(t)
		spec.Name = name
		spec.Files = append(spec.Files, File{Path: "/etc/" + name, Mode: 0o644, Data: []byte(name)})
		spec.Shared = []SharedLayer{{Layer: shared, What: "helpers"}}
		img, err := Build(spec, testSource)
		if err != nil {
			t.Fatal(err)
		}
		ls, err := img.Layers()
		if err != nil {
			t.Fatal(err)
		}
		if len(ls) != 3 {
			t.Fatalf("image %s: %d layers, want base, shared, own", name, len(ls))
		}
		layers = append(layers, ls)
	}
	want, _ := shared.Digest()
	for i, same := range []bool{true, true, false} {
		d1, _ := layers[0][i].Digest()
		d2, _ := layers[1][i].Digest()
		if (d1 == d2) != same {
			t.Errorf("layer %d: digests %s and %s, want same=%v", i, d1, d2, same)
		}
		if i == 1 && d1 != want {
			t.Errorf("layer 1 is %s, want the shared layer %s", d1, want)
		}
	}
}

func TestIndex(t *testing.T) {
	var imgs []v1.Image
	for _, arch := range []string{"amd64", "arm64"} {
		spec := testSpec(t)
		spec.Arch = arch
		img, err := Build(spec, testSource)
		if err != nil {
			t.Fatal(err)
		}
		imgs = append(imgs, img)
	}
	idx, err := Index(imgs, testSource)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if im.MediaType != types.OCIImageIndex || im.Annotations[AnnotationRevision] != "0123abc" || len(im.Manifests) != 2 {
		t.Fatalf("index = %+v", im)
	}
	for i, arch := range []string{"amd64", "arm64"} {
		d, _ := imgs[i].Digest()
		m := im.Manifests[i]
		if m.Digest != d || m.MediaType != types.OCIManifestSchema1 || m.Platform == nil ||
			m.Platform.OS != "linux" || m.Platform.Architecture != arch {
			t.Errorf("entry %d = %+v, want linux/%s %s", i, m, arch, d)
		}
	}
}

func TestWrite(t *testing.T) {
	var imgs []v1.Image
	for _, arch := range []string{"amd64", "arm64"} {
		spec := testSpec(t)
		spec.Arch = arch
		img, err := Build(spec, testSource)
		if err != nil {
			t.Fatal(err)
		}
		imgs = append(imgs, img)
	}
	idx, err := Index(imgs, testSource)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	ref := name.MustParseReference("dkc.local/tool:dev").(name.Tag)
	written, err := Write(dir, []Built{{Name: "tool", Ref: ref, Index: idx, Local: imgs[1]}})
	if err != nil {
		t.Fatal(err)
	}
	want, _ := idx.Digest()
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
	wantID, _ := imgs[1].ConfigName()
	if gotID != wantID {
		t.Errorf("tarball image config %s, want %s", gotID, wantID)
	}

	// Writing twice leaves one entry in the image's layout, the index, named by its reference; without a
	// local image, the earlier tarball goes.
	if _, err := Write(dir, []Built{{Name: "tool", Ref: ref, Index: idx}}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "tool.tar")); !os.IsNotExist(err) {
		t.Errorf("tool.tar of the earlier build: %v, want it removed", err)
	}
	lp, err := layout.ImageIndexFromPath(filepath.Join(dir, LayoutDir, "tool"))
	if err != nil {
		t.Fatal(err)
	}
	im, err := lp.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 || im.Manifests[0].Digest != want || !im.Manifests[0].MediaType.IsIndex() ||
		im.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != "dkc.local/tool:dev" {
		t.Errorf("layout index = %+v", im.Manifests)
	}
	// What crane push reads from the layout is the index itself, every platform's image included.
	got, err := lp.ImageIndex(want)
	if err != nil {
		t.Fatal(err)
	}
	for _, img := range imgs {
		d, _ := img.Digest()
		if _, err := got.Image(d); err != nil {
			t.Errorf("image %s not in the layout: %v", d, err)
		}
	}
}

// TestWriteLinksSharedLayers: a layer two images share is one file on disk, hard-linked into the second
// image's layout, and both layouts read back whole.
func TestWriteLinksSharedLayers(t *testing.T) {
	shared, err := Layer([]File{{Path: "/usr/local/bin/helper-1", Mode: 0o755, Data: []byte("helper")}}, testSource.Created)
	if err != nil {
		t.Fatal(err)
	}
	var built []Built
	for _, n := range []string{"one", "two"} {
		var imgs []v1.Image
		for _, arch := range []string{"amd64", "arm64"} {
			spec := testSpec(t)
			spec.Name, spec.Arch = n, arch
			spec.Shared = []SharedLayer{{Layer: shared}}
			img, err := Build(spec, testSource)
			if err != nil {
				t.Fatal(err)
			}
			imgs = append(imgs, img)
		}
		idx, err := Index(imgs, testSource)
		if err != nil {
			t.Fatal(err)
		}
		ref, err := name.NewTag("dkc.local/" + n + ":dev")
		if err != nil {
			t.Fatal(err)
		}
		built = append(built, Built{Name: n, Ref: ref, Index: idx})
	}
	dir := t.TempDir()
	if _, err := Write(dir, built); err != nil {
		t.Fatal(err)
	}
	d, _ := shared.Digest()
	var st []os.FileInfo
	for _, n := range []string{"one", "two"} {
		fi, err := os.Stat(filepath.Join(dir, LayoutDir, n, "blobs", "sha256", d.Hex))
		if err != nil {
			t.Fatal(err)
		}
		st = append(st, fi)
		lp, err := layout.ImageIndexFromPath(filepath.Join(dir, LayoutDir, n))
		if err != nil {
			t.Fatal(err)
		}
		im, _ := lp.IndexManifest()
		idx, err := lp.ImageIndex(im.Manifests[0].Digest)
		if err != nil {
			t.Fatal(err)
		}
		if err := validate.Index(idx); err != nil {
			t.Errorf("layout %s: %v", n, err)
		}
	}
	if !os.SameFile(st[0], st[1]) {
		t.Error("the shared layer is two files")
	}
}
