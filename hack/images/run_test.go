// SPDX-License-Identifier: Apache-2.0

package main

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/dkc-dev/dkc/hack/images/ociimage"
	"github.com/dkc-dev/dkc/hack/images/sbom"
	"github.com/dkc-dev/dkc/internal/configcheck"
)

var testSource = ociimage.Source{Repository: sourceRepository, Revision: "0123abc", Version: "v0.2.0-test",
	Created: time.Unix(1700000000, 0)}

var machines = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}

// standins compiles testdata/standin for every platform of c with compile, as run compiles dkc's binaries
// (so GOARCH reaches the compiler the same way), and puts a copy under every name assemble looks for: the
// images' binaries and two helpers. Seconds, against minutes for the real helpers of another arch.
func standins(t *testing.T, c config) {
	t.Helper()
	for _, p := range c.platforms {
		dir := binDir(c.out, p)
		if err := compile(context.Background(), dir, p, "v0.0.0-test", []string{"./testdata/standin"}); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(dir, "standin"))
		if err != nil {
			t.Fatal(err)
		}
		names := []string{configcheck.HelperPrefix + "1.98", configcheck.HelperPrefix + "1.99"}
		for _, im := range images() {
			for _, bn := range im.bins {
				names = append(names, filepath.Base(bn.pkg))
			}
		}
		for _, n := range names {
			if err := os.WriteFile(filepath.Join(dir, n), b, 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func testConfig(t *testing.T) config {
	return config{repo: "registry.example/dkc", tag: "v0.2.0", out: t.TempDir(), images: imageNames(),
		platforms: []platform{{"linux", "amd64"}, {"linux", "arm64"}}}
}

// files lists the regular files of an image's layers, by layer.
func files(t *testing.T, img v1.Image) []map[string][]byte {
	t.Helper()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string][]byte
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		m := map[string][]byte{}
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if h.Typeflag == tar.TypeReg {
				b, _ := io.ReadAll(tr)
				m["/"+h.Name] = b
			}
		}
		rc.Close()
		out = append(out, m)
	}
	return out
}

// TestAssemble builds every image for amd64 and arm64 from stand-in binaries and checks what a pull of
// each platform gets: the binaries of its architecture, the helpers' layer shared by dkc-server and
// dkc-sidecar, the SBOM inside, and an index naming both platforms.
func TestAssemble(t *testing.T) {
	c := testConfig(t)
	standins(t, c)
	a, err := assemble(selectImages(c.images), c, testSource)
	if err != nil {
		t.Fatal(err)
	}
	if len(a.built) != 3 {
		t.Fatalf("built %d images, want 3", len(a.built))
	}
	for _, b := range a.built {
		t.Run(b.Name, func(t *testing.T) {
			if b.Ref.String() != "registry.example/dkc/"+b.Name+":v0.2.0" {
				t.Errorf("ref %s", b.Ref)
			}
			im, err := b.Index.IndexManifest()
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, m := range im.Manifests {
				got = append(got, m.Platform.OS+"/"+m.Platform.Architecture)
			}
			if !slices.Equal(got, []string{"linux/amd64", "linux/arm64"}) {
				t.Errorf("index platforms %v", got)
			}
			if hd, _ := b.Local.Digest(); hd != im.Manifests[slices.Index(got, hostPlatform().String())].Digest {
				t.Errorf("local image %s is not the host platform's", hd)
			}
			for i, m := range im.Manifests {
				img, err := b.Index.Image(m.Digest)
				if err != nil {
					t.Fatal(err)
				}
				cf, _ := img.ConfigFile()
				arch := m.Platform.Architecture
				if cf.OS != "linux" || cf.Architecture != arch {
					t.Errorf("entry %d %s: config says %s/%s", i, arch, cf.OS, cf.Architecture)
				}
				all := map[string][]byte{}
				for _, l := range files(t, img) {
					for k, v := range l {
						all[k] = v
					}
				}
				bins := 0
				for p, data := range all {
					if strings.HasPrefix(p, "/etc/") || strings.HasSuffix(p, ".json") {
						continue
					}
					bins++
					f, err := elf.NewFile(bytes.NewReader(data))
					if err != nil {
						t.Errorf("%s %s: %v", arch, p, err)
						continue
					}
					if f.Machine != machines[arch] || f.Class != elf.ELFCLASS64 {
						t.Errorf("%s image: %s is %v %v, want %v", arch, p, f.Class, f.Machine, machines[arch])
					}
				}
				wantBins := map[string]int{"dkc-server": 3, "dkc-sidecar": 3, "pause": 1}[b.Name]
				if bins != wantBins {
					t.Errorf("%s image: %d binaries, want %d", arch, bins, wantBins)
				}
				checkSBOM(t, all["/usr/share/sbom/"+b.Name+".spdx.json"], b.Name, arch, wantBins)
			}
		})
	}
}

// checkSBOM: the image's own SBOM describes its platform and lists each binary and the modules in them.
func checkSBOM(t *testing.T, js []byte, image, arch string, bins int) {
	t.Helper()
	var d sbom.Document
	if err := json.Unmarshal(js, &d); err != nil {
		t.Fatalf("%s %s: SBOM in the image: %v", image, arch, err)
	}
	if d.SPDXVersion != sbom.Version || d.Name != image+" linux/"+arch {
		t.Errorf("SBOM %q %s", d.Name, d.SPDXVersion)
	}
	names := map[string]int{}
	for _, p := range d.Packages {
		names[p.Name]++
		if p.PrimaryPackagePurpose == "APPLICATION" && !strings.Contains(p.Comment, "GOARCH="+arch) {
			t.Errorf("%s %s: SBOM binary %s: %s", image, arch, p.Name, p.Comment)
		}
	}
	apps := 0
	for _, p := range d.Packages {
		if p.PrimaryPackagePurpose == "APPLICATION" {
			apps++
		}
	}
	if apps != bins || names["github.com/dkc-dev/dkc"] != 1 || names["google.golang.org/grpc"] != 1 {
		t.Errorf("%s %s: SBOM lists %d binaries (want %d), packages %v", image, arch, apps, bins, names)
	}
}

// TestHelpersLayerShared: dkc-server and dkc-sidecar of one platform carry the helpers in the same layer
// (same digest, hence the same tar bytes and timestamps), right above the same base, so a node that runs
// both stores it once; it holds the helpers and nothing else, and the images' own layers differ.
func TestHelpersLayerShared(t *testing.T) {
	c := testConfig(t)
	standins(t, c)
	a, err := assemble(selectImages(c.images), c, testSource)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range c.platforms {
		want, err := a.helpers[p].layer.Digest()
		if err != nil {
			t.Fatal(err)
		}
		var layers [][]v1.Hash
		for _, name := range []string{"dkc-server", "dkc-sidecar"} {
			var img v1.Image
			for _, pi := range a.platforms[name] {
				if pi.platform == p {
					img = pi.image
				}
			}
			ls, err := img.Layers()
			if err != nil {
				t.Fatal(err)
			}
			if len(ls) != 3 {
				t.Fatalf("%s %s: %d layers, want base, helpers, its own", name, p, len(ls))
			}
			var ds []v1.Hash
			for _, l := range ls {
				d, _ := l.Digest()
				ds = append(ds, d)
			}
			layers = append(layers, ds)
			fs := files(t, img)
			if len(fs[1]) != 2 || fs[1]["/usr/local/bin/dkc-kubelet-check-1.99"] == nil {
				t.Errorf("%s %s: helpers layer holds %d files, want the 2 helpers", name, p, len(fs[1]))
			}
		}
		if layers[0][1] != want || layers[1][1] != want || layers[0][0] != layers[1][0] {
			t.Errorf("%s: layers %v and %v, want the same base and %s second", p, layers[0], layers[1], want)
		}
		if layers[0][2] == layers[1][2] {
			t.Errorf("%s: the images' own layers are the same", p)
		}
	}
	if a.helpers[platform{"linux", "amd64"}].layer == a.helpers[platform{"linux", "arm64"}].layer {
		t.Error("one helpers layer for both platforms")
	}
}

// TestRunWritesHostOnly is what a local cluster runs (`go run ./hack/images -out ...`, no -platforms):
// the host's platform alone, its <image>.tar, the index in the OCI layout, the SBOMs, and the report
// naming them. The real compile of dkc's binaries would take too long here, so run's compile steps are what
// this does not cover: TestAssemble does the rest with stand-ins.
func TestRunWritesHostOnly(t *testing.T) {
	fs := newFlagSet()
	c, err := parse(fs, []string{"-out", t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.platforms, []platform{hostPlatform()}) {
		t.Fatalf("default platforms %v, want the host's alone", c.platforms)
	}
	standins(t, c)
	a, err := assemble(selectImages(c.images), c, testSource)
	if err != nil {
		t.Fatal(err)
	}
	written, err := ociimage.Write(c.out, a.built)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.writeSBOMs(c.out); err != nil {
		t.Fatal(err)
	}
	for _, w := range written {
		if w.Tarball != filepath.Join(c.out, w.Name+".tar") {
			t.Errorf("%s: tarball %q", w.Name, w.Tarball)
		}
		if _, err := os.Stat(sbomFile(c.out, w.Name, hostPlatform())); err != nil {
			t.Error(err)
		}
	}
	var out bytes.Buffer
	if err := a.report(&out, c, testSource, written, time.Second); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"dkc-server   " + hostPlatform().String(), "dkc-server   index", "# helpers layer " + hostPlatform().String()} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
	t.Log("\n" + out.String())
}
