// SPDX-License-Identifier: Apache-2.0

package main

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
)

type config struct {
	repo      string
	tag       string
	out       string
	platforms []platform
	version   string // empty: git describe
	images    []string
	// overlay is the directory of the digest-pinned release overlay, "" for none; overlayBase the
	// kustomization it installs.
	overlay     string
	overlayBase string
}

// platform is an image platform; the OS is always linux.
type platform struct{ os, arch string }

func (p platform) String() string { return p.os + "/" + p.arch }

// dir names the platform in file names: linux_arm64.
func (p platform) dir() string { return p.os + "_" + p.arch }

// hostPlatform is the build host's: the one a local cluster's nodes run and import as <image>.tar.
func hostPlatform() platform { return platform{"linux", runtime.GOARCH} }

// knownArches are the architectures dkc's images are built for; the kubelet-check helpers link the
// kubelet's code, which Kubernetes releases for these too.
var knownArches = []string{"amd64", "arm64"}

func parse(fs *flag.FlagSet, args []string) (config, error) {
	c := config{}
	fs.StringVar(&c.repo, "repo", "dkc.local",
		"registry and path the images are named under: <repo>/<image>:<tag> ($IMAGE_REPO in make)")
	fs.StringVar(&c.tag, "tag", "dev", "image tag ($IMAGE_TAG in make)")
	fs.StringVar(&c.out, "out", "_output/images",
		"output directory: <image>.tar per image, the OCI layouts oci/<image>, the SBOMs sbom/")
	platforms := fs.String("platforms", hostPlatform().String(),
		"comma-separated os/arch to build each image for ($IMAGE_PLATFORMS in make, which builds linux/amd64,linux/arm64 "+
			"by default); the default, the host's platform alone, is what a local cluster imports")
	fs.StringVar(&c.version, "version", os.Getenv("VERSION"),
		"org.opencontainers.image.version ($VERSION); default: git describe --tags --always --dirty")
	list := fs.String("images", strings.Join(imageNames(), ","), "comma-separated images to build")
	fs.StringVar(&c.overlay, "release-overlay", "",
		"write a kustomize overlay pinning dkc-server and dkc-sidecar by index digest into this directory "+
			"(make: _output/release/deploy)")
	fs.StringVar(&c.overlayBase, "release-base", "deploy/overlays/self-signed",
		"the kustomization the release overlay installs ($RELEASE_BASE in make)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `usage: images [flags]

Cross-compiles static linux binaries (CGO_ENABLED=0, -trimpath) for each platform and assembles OCI images
from them on a minimal base built here (passwd/group with root and nonroot 65532, /tmp, nsswitch.conf; no
shell), one image index per image over the platforms:

  dkc-server   /usr/local/bin/dkc-server and the dkc-kubelet-check-<minor> helpers beside it, user 65532
  dkc-sidecar  /usr/local/bin/dkc-sidecar and the same helpers (one per kubelet minor), user 0
  pause        /pause (hack/pause), user 65535: the sandbox image of a local cluster

The helpers are one layer, byte for byte the same in dkc-server and dkc-sidecar, right above the shared
base, so a registry and a node store it once. Each image holds its SPDX 2.3 SBOM (from the binaries' Go
build info) at /usr/share/sbom/<image>.spdx.json, also written to <out>/sbom/<image>_<os>_<arch>.spdx.json.

Timestamps come from $SOURCE_DATE_EPOCH, else the HEAD commit's time, so rebuilding a commit gives the
same digests. Writes the OCI layout <out>/oci/<image> (the index: crane push), <out>/<image>.tar (docker
archive of the host's platform, when built: ctr -n k8s.io images import) and prints per image its index
digest and per platform its digest and size.

flags:
`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() != 0 {
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	for _, n := range strings.Split(*list, ",") {
		if n = strings.TrimSpace(n); n == "" {
			continue
		}
		if !slices.Contains(imageNames(), n) {
			return c, fmt.Errorf("-images: unknown image %q (known: %s)", n, strings.Join(imageNames(), ", "))
		}
		c.images = append(c.images, n)
	}
	var err error
	if c.platforms, err = parsePlatforms(*platforms); err != nil {
		return c, err
	}
	return c, c.validate()
}

// parsePlatforms reads "linux/amd64,linux/arm64" in order, without duplicates.
func parsePlatforms(s string) ([]platform, error) {
	var out []platform
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		os, arch, ok := strings.Cut(f, "/")
		if !ok || os != "linux" || !slices.Contains(knownArches, arch) {
			return nil, fmt.Errorf("-platforms: %q is not linux/<arch> with arch one of %s", f, strings.Join(knownArches, ", "))
		}
		if p := (platform{os, arch}); !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out, nil
}

func (c config) validate() error {
	switch {
	case c.repo == "" || c.tag == "":
		return fmt.Errorf("-repo and -tag must not be empty")
	case len(c.images) == 0:
		return fmt.Errorf("-images: no image to build")
	case len(c.platforms) == 0:
		return fmt.Errorf("-platforms: no platform to build for")
	case c.out == "":
		return fmt.Errorf("-out must not be empty")
	case c.overlay != "" && c.overlayBase == "":
		return fmt.Errorf("-release-overlay needs -release-base")
	case c.overlay != "" && !(slices.Contains(c.images, "dkc-server") && slices.Contains(c.images, "dkc-sidecar")):
		return fmt.Errorf("-release-overlay pins dkc-server and dkc-sidecar: build both (-images)")
	}
	return nil
}
