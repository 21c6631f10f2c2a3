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

	"github.com/dkc-dev/dkc/hack/internal/gitsource"

	"github.com/google/go-containerregistry/pkg/name"

	"github.com/dkc-dev/dkc/hack/images/ociimage"
	"github.com/dkc-dev/dkc/internal/configcheck"
)

const sourceRepository = "https://github.com/dkc-dev/dkc"

// image is one image of the build: its spec without files, and which binaries go where.
type image struct {
	spec ociimage.Spec
	// bins maps a main package to its path in the image.
	bins []bin
	// kubeletChecks: the dkc-kubelet-check-<minor> helpers go into this directory of the image.
	kubeletChecks string
}

type bin struct{ pkg, path string }

func images(arch string) []image {
	return []image{{
		spec: ociimage.Spec{Name: "dkc-server", Entrypoint: []string{"/usr/local/bin/dkc-server"},
			User: "65532:65532", Base: true, Arch: arch},
		bins: []bin{{"./services/cmd/dkc-server", "/usr/local/bin/dkc-server"}},
	}, {
		// Root, not nonroot: the sidecar owns root's files on the host (kubelet checkpoints, the kubelet
		// drop-in) and systemd only lets uid 0 restart kubelet.service over D-Bus (deploy/base/sidecar.yaml).
		// The dkc-kubelet-check-<minor> helpers, one per supported kubelet minor, sit in the same directory
		// because the sidecar looks for them next to its own executable (sidecar/app, --kubelet-check-dir).
		spec: ociimage.Spec{Name: "dkc-sidecar", Entrypoint: []string{"/usr/local/bin/dkc-sidecar"},
			User: "0:0", Base: true, Arch: arch},
		bins:          []bin{{"./sidecar/cmd/dkc-sidecar", "/usr/local/bin/dkc-sidecar"}},
		kubeletChecks: "/usr/local/bin",
	}, {
		// Like registry.k8s.io/pause: one static binary, no base; 65535 is the user upstream runs it as.
		spec: ociimage.Spec{Name: "pause", Entrypoint: []string{"/pause"}, User: "65535:65535", Arch: arch},
		bins: []bin{{"./hack/pause", "/pause"}},
	}}
}

func imageNames() []string {
	var names []string
	for _, im := range images("") {
		names = append(names, im.spec.Name)
	}
	return names
}

func run(ctx context.Context, c config, out io.Writer) error {
	start := time.Now()
	src, err := source(ctx, c.version)
	if err != nil {
		return err
	}
	var selected []image
	var pkgs []string
	kubeletChecks := false
	for _, im := range images(c.arch) {
		if !slices.Contains(c.images, im.spec.Name) {
			continue
		}
		selected = append(selected, im)
		for _, b := range im.bins {
			pkgs = append(pkgs, b.pkg)
		}
		kubeletChecks = kubeletChecks || im.kubeletChecks != ""
	}
	binDir := filepath.Join(c.out, "bin", "linux_"+c.arch)
	if err := compile(ctx, binDir, c.arch, pkgs); err != nil {
		return err
	}
	var checks []string
	if kubeletChecks {
		if checks, err = compileKubeletChecks(ctx, binDir, c.arch); err != nil {
			return err
		}
	}
	var built []ociimage.Built
	for _, im := range selected {
		for _, b := range im.bins {
			im.spec.Files = append(im.spec.Files, ociimage.File{
				Path: b.path, Mode: 0o755, Source: filepath.Join(binDir, filepath.Base(b.pkg)),
			})
		}
		if im.kubeletChecks != "" {
			for _, name := range checks {
				im.spec.Files = append(im.spec.Files, ociimage.File{
					Path: path.Join(im.kubeletChecks, name), Mode: 0o755, Source: filepath.Join(binDir, name),
				})
			}
		}
		img, err := ociimage.Build(im.spec, src)
		if err != nil {
			return err
		}
		ref, err := name.NewTag(c.repo + "/" + im.spec.Name + ":" + c.tag)
		if err != nil {
			return fmt.Errorf("image %s: reference from -repo %q -tag %q: %w", im.spec.Name, c.repo, c.tag, err)
		}
		built = append(built, ociimage.Built{Name: im.spec.Name, Ref: ref, Image: img})
	}
	written, err := ociimage.Write(c.out, built)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	for _, w := range written {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.1f MiB\n", w.Name, w.Ref, w.Digest, float64(w.Size)/(1<<20))
	}
	fmt.Fprintf(tw, "# %s, revision %s, version %s, created %s; OCI layout %s; %s\n",
		filepath.Clean(c.out), src.Revision, src.Version, src.Created.UTC().Format(time.RFC3339),
		filepath.Join(c.out, ociimage.LayoutDir), time.Since(start).Round(100*time.Millisecond))
	return tw.Flush()
}

// compile cross-builds static binaries into dir. -trimpath and -buildvcs=false keep the build directory and
// the work tree's state out of the binary, so the same commit compiles to the same bytes anywhere; -s -w
// drop the symbol table and DWARF, which stack traces do not need. dkc has no version variable to stamp.
func compile(ctx context.Context, dir, arch string, pkgs []string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create binary directory: %w", err)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	args := append([]string{"build", "-trimpath", "-buildvcs=false", "-ldflags=-s -w", "-o", abs + "/"}, pkgs...)
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build %s for linux/%s: %w", strings.Join(pkgs, " "), arch, err)
	}
	return nil
}

// compileKubeletChecks cross-builds the dkc-kubelet-check-<minor> helpers into dir as compile builds the
// rest (sidecar/kubeletcheck/build.sh: one per pinned kubelet minor) and returns their names.
func compileKubeletChecks(ctx context.Context, dir, arch string) ([]string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, "sidecar/kubeletcheck/build.sh", abs, "-ldflags=-s -w")
	cmd.Env = append(os.Environ(), "GOOS=linux", "GOARCH="+arch)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("build the kubelet config checkers for linux/%s: %w", arch, err)
	}
	built, err := filepath.Glob(filepath.Join(abs, configcheck.HelperPrefix+"*"))
	if err != nil || len(built) == 0 {
		return nil, fmt.Errorf("build the kubelet config checkers: none in %s", abs)
	}
	var names []string
	for _, f := range built {
		names = append(names, filepath.Base(f))
	}
	return names, nil
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
