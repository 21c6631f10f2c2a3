// SPDX-License-Identifier: Apache-2.0

package main

import (
	"flag"
	"fmt"
	"net/url"
	"os"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/version"
)

// releaseURLBase is where a release's assets live unless -release-url says otherwise; the version follows.
const releaseURLBase = "https://github.com/dkc-dev/dkc/releases/download/"

type config struct {
	out        string
	version    string // empty: from git describe (releaseVersion)
	releaseURL string // empty: releaseURLBase + version
	platforms  []platform
}

// platform is one GOOS/GOARCH pair a release ships.
type platform struct{ os, arch string }

func (p platform) String() string { return p.os + "/" + p.arch }

// supportedPlatforms are the ones a release may ship: tar.gz suits both systems (krew unpacks it on either),
// and these four are what operators' machines run. Windows would need a zip and has no kubelet to check.
var supportedPlatforms = []platform{{"linux", "amd64"}, {"linux", "arm64"}, {"darwin", "amd64"}, {"darwin", "arm64"}}

func parse(fs *flag.FlagSet, args []string) (config, error) {
	c := config{}
	var list []string
	for _, p := range supportedPlatforms {
		list = append(list, p.String())
	}
	fs.StringVar(&c.out, "out", "_output/release", "output directory: the archives, their checksums and dkc.yaml")
	fs.StringVar(&c.version, "version", os.Getenv("VERSION"),
		"release version, v-prefixed semver as krew requires ($VERSION); default: git describe --tags --always --dirty, or "+
			"v0.0.0-g<describe> when that is no semver")
	fs.StringVar(&c.releaseURL, "release-url", os.Getenv("RELEASE_URL"),
		"URL the archives are downloaded from, <url>/<archive> in dkc.yaml ($RELEASE_URL); default: "+releaseURLBase+
			"<version>")
	platforms := fs.String("platforms", strings.Join(list, ","),
		"comma-separated os/arch pairs to build, of "+strings.Join(list, ", "))
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `usage: release [flags]

Cross-compiles kubectl-dkc (static: CGO_ENABLED=0, -trimpath, -s -w) for each platform and, for linux, the
dkc-kubelet-check-<minor> helpers (internal/kubeletcheck/build.sh) that kubectl dkc diff runs: the helpers run
the kubelet's own Linux code paths, so none is built for darwin (docs/development.md, "Releasing"). Writes
into -out:

  kubectl-dkc_<version>_<os>_<arch>.tar.gz   kubectl-dkc (+ helpers on linux, + LICENSE if the repo has one)
  kubectl-dkc_<version>_checksums.txt        SHA-256 of each archive, as sha256sum writes it (sha256sum -c)
  dkc.yaml                                   krew plugin manifest: per platform the URI, sha256 and files

Archives are byte-for-byte reproducible: entries sorted, owner 0, every time $SOURCE_DATE_EPOCH, else the
HEAD commit's time, and no time or name in the gzip header.

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
	var err error
	if c.platforms, err = parsePlatforms(*platforms); err != nil {
		return c, err
	}
	return c, c.validate()
}

func parsePlatforms(s string) ([]platform, error) {
	var out []platform
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		goos, arch, _ := strings.Cut(f, "/")
		p := platform{goos, arch}
		if !slices.Contains(supportedPlatforms, p) {
			return nil, fmt.Errorf("-platforms: %q is not one a release ships (os/arch, e.g. linux/amd64)", f)
		}
		if slices.Contains(out, p) {
			return nil, fmt.Errorf("-platforms: %s listed twice", p)
		}
		out = append(out, p)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("-platforms: no platform to build")
	}
	return out, nil
}

func (c config) validate() error {
	if c.out == "" {
		return fmt.Errorf("-out must not be empty")
	}
	if c.version != "" {
		if err := checkVersion(c.version); err != nil {
			return fmt.Errorf("-version: %w", err)
		}
	}
	if c.releaseURL != "" {
		u, err := url.Parse(c.releaseURL)
		if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			return fmt.Errorf("-release-url %q: want an http(s) URL the archives are downloaded from", c.releaseURL)
		}
	}
	return nil
}

// checkVersion accepts what krew accepts as a plugin version (internal/installation/semver.Parse in krew
// v0.4.3): a "v" and a semantic version.
func checkVersion(v string) error {
	if !strings.HasPrefix(v, "v") {
		return fmt.Errorf("version %q does not start with v (krew requires v<semver>)", v)
	}
	if _, err := version.ParseSemantic(v); err != nil {
		return fmt.Errorf("version %q: %w", v, err)
	}
	return nil
}

// releaseVersion turns git describe's output into a version krew accepts: a tag that is one (v0.2.0, or
// v0.2.0-3-gabc1234-dirty past it) stays as it is; a bare commit (no tag yet) becomes v0.0.0-g<commit>,
// sorting below every real release.
func releaseVersion(describe string) string {
	if checkVersion(describe) == nil {
		return describe
	}
	return "v0.0.0-g" + describe
}
