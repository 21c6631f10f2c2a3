// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/dkc-dev/dkc/hack/images/ociimage"
	"github.com/dkc-dev/dkc/hack/images/overlay"
	"github.com/dkc-dev/dkc/hack/images/sbom"
	"github.com/dkc-dev/dkc/hack/internal/gitsource"
	"github.com/dkc-dev/dkc/internal/configcheck"
	dkcversion "github.com/dkc-dev/dkc/internal/version"
)

const sourceRepository = "https://github.com/dkc-dev/dkc"

// helpersDir is where the dkc-kubelet-check-<minor> helpers sit in every image that carries them: one
// directory for all, as the images share the helpers' layer byte for byte.
const helpersDir = "/usr/local/bin"

// sbomDir is where each image holds its own SBOM.
const sbomDir = "/usr/share/sbom"

// image is one image of the build: its spec without files, and which binaries go where.
type image struct {
	spec ociimage.Spec
	// bins maps a main package to its path in the image.
	bins []bin
	// helpers: the image carries the dkc-kubelet-check-<minor> helpers in helpersDir, in the layer it
	// shares with every other image that does.
	helpers bool
}

type bin struct{ pkg, path string }

func images() []image {
	return []image{{
		// The helpers, because dkc-server runs them to validate a pool's config before any node gets it.
		spec: ociimage.Spec{Name: "dkc-server", Entrypoint: []string{"/usr/local/bin/dkc-server"},
			User: "65532:65532", Base: true},
		bins:    []bin{{"./services/cmd/dkc-server", "/usr/local/bin/dkc-server"}},
		helpers: true,
	}, {
		// Root, not nonroot: the sidecar owns root's files on the host (kubelet checkpoints, the kubelet
		// drop-in) and systemd only lets uid 0 restart kubelet.service over D-Bus (deploy/base/sidecar.yaml).
		// The dkc-kubelet-check-<minor> helpers, one per supported kubelet minor, sit in the same directory
		// because the sidecar looks for them next to its own executable (sidecar/app, --kubelet-check-dir).
		spec: ociimage.Spec{Name: "dkc-sidecar", Entrypoint: []string{"/usr/local/bin/dkc-sidecar"},
			User: "0:0", Base: true},
		bins:    []bin{{"./sidecar/cmd/dkc-sidecar", "/usr/local/bin/dkc-sidecar"}},
		helpers: true,
	}, {
		// Like registry.k8s.io/pause: one static binary, no base; 65535 is the user upstream runs it as.
		spec: ociimage.Spec{Name: "pause", Entrypoint: []string{"/pause"}, User: "65535:65535"},
		bins: []bin{{"./hack/pause", "/pause"}},
	}}
}

func imageNames() []string {
	var names []string
	for _, im := range images() {
		names = append(names, im.spec.Name)
	}
	return names
}

func selectImages(names []string) []image {
	var out []image
	for _, im := range images() {
		if slices.Contains(names, im.spec.Name) {
			out = append(out, im)
		}
	}
	return out
}

// binDir is where the binaries of a platform are compiled: <out>/bin/linux_<arch> (test/devcluster reads
// the host's helpers from there).
func binDir(out string, p platform) string { return filepath.Join(out, "bin", p.dir()) }

func run(ctx context.Context, c config, out io.Writer) error {
	start := time.Now()
	src, err := source(ctx, c.version)
	if err != nil {
		return err
	}
	selected := selectImages(c.images)
	var pkgs []string
	helpers := false
	for _, im := range selected {
		for _, b := range im.bins {
			pkgs = append(pkgs, b.pkg)
		}
		helpers = helpers || im.helpers
	}
	for _, p := range c.platforms {
		if err := compile(ctx, binDir(c.out, p), p, src.Version, pkgs); err != nil {
			return err
		}
		if helpers {
			if err := compileKubeletChecks(ctx, binDir(c.out, p), p); err != nil {
				return err
			}
		}
	}
	a, err := assemble(selected, c, src)
	if err != nil {
		return err
	}
	written, err := ociimage.Write(c.out, a.built)
	if err != nil {
		return err
	}
	if err := a.writeSBOMs(c.out); err != nil {
		return err
	}
	if c.overlay != "" {
		var pins []overlay.Image
		for _, w := range written {
			if w.Name == "dkc-server" || w.Name == "dkc-sidecar" {
				pins = append(pins, overlay.Image{Name: w.Name, Repo: c.repo, Digest: w.Digest.String()})
			}
		}
		if err := overlay.Write(c.overlay, c.overlayBase, pins); err != nil {
			return err
		}
	}
	return a.report(out, c, src, written, time.Since(start))
}

// assembly is every image of a build, before anything is written.
type assembly struct {
	built []ociimage.Built
	// platforms holds, per image name, its image of each platform in the build's order.
	platforms map[string][]platformImage
	// helpers is the helpers' layer per platform, absent when no selected image carries them.
	helpers map[platform]helpersLayer
}

type platformImage struct {
	platform platform
	image    v1.Image
	sbom     []byte
}

type helpersLayer struct {
	layer v1.Layer
	names []string
}

// assemble builds each selected image for each platform from the binaries compile left in binDir, and
// the index of each image over the platforms. The helpers' layer is built once per platform and handed
// to every image that carries it, so it cannot differ between them by a byte.
func assemble(selected []image, c config, src ociimage.Source) (assembly, error) {
	a := assembly{platforms: map[string][]platformImage{}, helpers: map[platform]helpersLayer{}}
	for _, p := range c.platforms {
		dir := binDir(c.out, p)
		var shared []ociimage.SharedLayer
		var helperBins []sbom.Binary
		if slices.ContainsFunc(selected, func(im image) bool { return im.helpers }) {
			h, err := buildHelpersLayer(dir, src)
			if err != nil {
				return a, fmt.Errorf("platform %s: %w", p, err)
			}
			a.helpers[p] = h
			shared = []ociimage.SharedLayer{{Layer: h.layer, What: "the kubelet config checkers " + strings.Join(h.names, ", ")}}
			for _, n := range h.names {
				helperBins = append(helperBins, sbom.Binary{Path: path.Join(helpersDir, n), Source: filepath.Join(dir, n)})
			}
		}
		for _, im := range selected {
			spec := im.spec
			spec.Arch = p.arch
			var bins []sbom.Binary
			for _, b := range im.bins {
				f := ociimage.File{Path: b.path, Mode: 0o755, Source: filepath.Join(dir, path.Base(b.pkg))}
				spec.Files = append(spec.Files, f)
				bins = append(bins, sbom.Binary{Path: f.Path, Source: f.Source})
			}
			if im.helpers {
				spec.Shared = shared
				bins = append(bins, helperBins...)
			}
			doc, err := sbom.New(sbom.Subject{Image: spec.Name, Version: src.Version, OS: p.os, Arch: p.arch,
				Repository: src.Repository, Revision: src.Revision, Created: src.Created}, bins)
			if err != nil {
				return a, err
			}
			js, err := doc.JSON()
			if err != nil {
				return a, err
			}
			spec.Files = append(spec.Files,
				ociimage.File{Path: path.Join(sbomDir, spec.Name+".spdx.json"), Mode: 0o644, Data: js})
			img, err := ociimage.Build(spec, src)
			if err != nil {
				return a, fmt.Errorf("platform %s: %w", p, err)
			}
			a.platforms[spec.Name] = append(a.platforms[spec.Name], platformImage{platform: p, image: img, sbom: js})
		}
	}
	for _, im := range selected {
		n := im.spec.Name
		b := ociimage.Built{Name: n}
		var imgs []v1.Image
		for _, pi := range a.platforms[n] {
			imgs = append(imgs, pi.image)
			if pi.platform == hostPlatform() {
				b.Local = pi.image
			}
		}
		var err error
		if b.Index, err = ociimage.Index(imgs, src); err != nil {
			return a, fmt.Errorf("image %s: %w", n, err)
		}
		if b.Ref, err = name.NewTag(c.repo + "/" + n + ":" + c.tag); err != nil {
			return a, fmt.Errorf("image %s: reference from -repo %q -tag %q: %w", n, c.repo, c.tag, err)
		}
		a.built = append(a.built, b)
	}
	return a, nil
}

// buildHelpersLayer puts every dkc-kubelet-check-<minor> in dir into one layer.
func buildHelpersLayer(dir string, src ociimage.Source) (helpersLayer, error) {
	found, err := filepath.Glob(filepath.Join(dir, configcheck.HelperPrefix+"*"))
	if err != nil || len(found) == 0 {
		return helpersLayer{}, fmt.Errorf("the kubelet config checkers: none in %s", dir)
	}
	var h helpersLayer
	var files []ociimage.File
	for _, f := range found {
		n := filepath.Base(f)
		h.names = append(h.names, n)
		files = append(files, ociimage.File{Path: path.Join(helpersDir, n), Mode: 0o755, Source: f})
	}
	if h.layer, err = ociimage.Layer(files, src.Created); err != nil {
		return h, fmt.Errorf("the kubelet config checkers' layer: %w", err)
	}
	return h, nil
}

// sbomFile is where an image's SBOM of a platform is written: <out>/sbom/<image>_<os>_<arch>.spdx.json.
func sbomFile(out, image string, p platform) string {
	return filepath.Join(out, "sbom", image+"_"+p.dir()+".spdx.json")
}

func (a assembly) writeSBOMs(out string) error {
	dir := filepath.Join(out, "sbom")
	// Rewritten from scratch: SBOMs of platforms this build did not make must not linger beside its own.
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove old SBOMs: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create SBOM directory: %w", err)
	}
	for _, b := range a.built {
		for _, pi := range a.platforms[b.Name] {
			if err := os.WriteFile(sbomFile(out, b.Name, pi.platform), pi.sbom, 0o644); err != nil {
				return fmt.Errorf("write SBOM: %w", err)
			}
		}
	}
	return nil
}

// report prints per image its image of each platform (digest, the size a pull transfers: the compressed
// layers) and its index, then the helpers' layer of each platform. Files are named relative to c.out.
func (a assembly) report(out io.Writer, c config, src ociimage.Source, written []ociimage.Written,
	took time.Duration) error {
	rel := func(p string) string {
		if r, err := filepath.Rel(c.out, p); err == nil {
			return r
		}
		return p
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "IMAGE\tPLATFORM\tDIGEST\tSIZE\tFILES (in "+filepath.Clean(c.out)+")")
	for _, w := range written {
		for _, pi := range a.platforms[w.Name] {
			d, err := pi.image.Digest()
			if err != nil {
				return err
			}
			size, err := compressedSize(pi.image)
			if err != nil {
				return err
			}
			files := rel(sbomFile(c.out, w.Name, pi.platform))
			if pi.platform == hostPlatform() && w.Tarball != "" {
				files = rel(w.Tarball) + " " + files
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", w.Name, pi.platform, d, mib(size), files)
		}
		fmt.Fprintf(tw, "%s\tindex\t%s\t\t%s %s\n", w.Name, w.Digest, rel(w.Layout), w.Ref)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	var in []string
	for _, im := range selectImages(c.images) {
		if im.helpers {
			in = append(in, im.spec.Name)
		}
	}
	for _, p := range c.platforms {
		h, ok := a.helpers[p]
		if !ok {
			continue
		}
		d, err := h.layer.Digest()
		if err != nil {
			return err
		}
		size, err := h.layer.Size()
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "# helpers layer %s %s %s, shared by %s: %s\n", p, d, mib(size), strings.Join(in, " and "),
			strings.Join(h.names, " "))
	}
	if c.overlay != "" {
		fmt.Fprintf(out, "# release overlay %s (kubectl apply -k %s after make push-images)\n",
			filepath.Join(c.overlay, overlay.File), c.overlay)
	}
	_, err := fmt.Fprintf(out, "# revision %s, version %s, created %s; %s\n", src.Revision, src.Version,
		src.Created.UTC().Format(time.RFC3339), took.Round(100*time.Millisecond))
	return err
}

func compressedSize(img v1.Image) (int64, error) {
	layers, err := img.Layers()
	if err != nil {
		return 0, err
	}
	var n int64
	for _, l := range layers {
		s, err := l.Size()
		if err != nil {
			return 0, err
		}
		n += s
	}
	return n, nil
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

// compile cross-builds static binaries into dir. -trimpath and -buildvcs=false keep the build directory and
// the work tree's state out of the binary, so the same commit compiles to the same bytes anywhere; -s -w
// drop the symbol table and DWARF, which stack traces do not need. version is stamped into
// internal/version (what --version, kubectl dkc version and dkc_build_info report).
func compile(ctx context.Context, dir string, p platform, version string, pkgs []string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create binary directory: %w", err)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	args := append([]string{"build", "-trimpath", "-buildvcs=false", "-ldflags=-s -w " + dkcversion.LinkerFlag(version),
		"-o", abs + "/"}, pkgs...)
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+p.os, "GOARCH="+p.arch)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build %s for %s: %w", strings.Join(pkgs, " "), p, err)
	}
	return nil
}

// compileKubeletChecks cross-builds the dkc-kubelet-check-<minor> helpers into dir as compile builds the
// rest (internal/kubeletcheck/build.sh: one per pinned kubelet minor, removing those of dropped minors).
func compileKubeletChecks(ctx context.Context, dir string, p platform) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "internal/kubeletcheck/build.sh", abs, "-ldflags=-s -w")
	cmd.Env = append(os.Environ(), "GOOS="+p.os, "GOARCH="+p.arch)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("build the kubelet config checkers for %s: %w", p, err)
	}
	return nil
}

// source reads the build's provenance from git: HEAD, whether the work tree is dirty, the version (unless
// given) and the timestamp (SOURCE_DATE_EPOCH, else HEAD's commit time).
func source(ctx context.Context, version string) (ociimage.Source, error) {
	s := ociimage.Source{Repository: sourceRepository, Version: version}
	var err error
	if s.Revision, err = gitsource.Git(ctx, "rev-parse", "HEAD"); err != nil {
		return s, err
	}
	status, err := gitsource.Git(ctx, "status", "--porcelain", "--untracked-files=normal")
	if err != nil {
		return s, err
	}
	s.Dirty = status != ""
	if s.Version == "" {
		if s.Version, err = gitsource.Git(ctx, "describe", "--tags", "--always", "--dirty"); err != nil {
			return s, err
		}
	}
	if s.Created, err = gitsource.Created(ctx); err != nil {
		return s, err
	}
	return s, nil
}
