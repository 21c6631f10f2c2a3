package main

import (
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
)

type config struct {
	repo    string
	tag     string
	out     string
	arch    string
	version string // empty: git describe
	images  []string
}

func parse(fs *flag.FlagSet, args []string) (config, error) {
	c := config{}
	fs.StringVar(&c.repo, "repo", "dkc.local", "registry and path the images are named under: <repo>/<image>:<tag> ($IMAGE_REPO in make)")
	fs.StringVar(&c.tag, "tag", "dev", "image tag ($IMAGE_TAG in make)")
	fs.StringVar(&c.out, "out", "_output/images", "output directory: <image>.tar per image and the OCI layout oci/")
	fs.StringVar(&c.arch, "arch", "amd64", "GOARCH of the binaries and the images (the OS is linux)")
	fs.StringVar(&c.version, "version", os.Getenv("VERSION"), "org.opencontainers.image.version ($VERSION); default: git describe --tags --always --dirty")
	list := fs.String("images", strings.Join(imageNames(), ","), "comma-separated images to build")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `usage: images [flags]

Cross-compiles static linux binaries (CGO_ENABLED=0, -trimpath) and assembles OCI images from them on a
minimal base built here (passwd/group with root and nonroot 65532, /tmp, nsswitch.conf; no shell):

  dkc-server   /usr/local/bin/dkc-server, user 65532
  dkc-sidecar  /usr/local/bin/dkc-sidecar and dkc-kubelet-check-<minor> beside it (one per kubelet minor), user 0
  pause        /pause (hack/pause), user 65535: the sandbox image of a local cluster

Timestamps come from $SOURCE_DATE_EPOCH, else the HEAD commit's time, so rebuilding a commit gives the
same digests. Writes <out>/<image>.tar (docker-archive: ctr -n k8s.io images import, crane push) and the
OCI layout <out>/oci, and prints one line per image: name, reference, digest, tarball size.

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
	return c, c.validate()
}

func (c config) validate() error {
	switch {
	case c.repo == "" || c.tag == "":
		return fmt.Errorf("-repo and -tag must not be empty")
	case len(c.images) == 0:
		return fmt.Errorf("-images: no image to build")
	case c.out == "":
		return fmt.Errorf("-out must not be empty")
	}
	return nil
}
