// SPDX-License-Identifier: Apache-2.0

// Package version is the release a dkc binary was built as. The release and image builds stamp it
// (hack/release, hack/images: LinkerFlag); a plain `go build` reports "devel" with the commit Go recorded.
package version

import (
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
)

// version is set at link time: -ldflags "-X github.com/dkc-dev/dkc/internal/version.version=v0.2.0".
var version string

// LinkerFlag is the -X flag that stamps v into a binary; the builds add it to their -ldflags.
func LinkerFlag(v string) string { return "-X github.com/dkc-dev/dkc/internal/version.version=" + v }

// Get returns the stamped version, else "devel" with the VCS revision the go command recorded (a plain
// `go build` in a checkout; dkc's own builds use -buildvcs=false and stamp), e.g. "devel+3f2a1c9e0b7d-dirty".
func Get() string {
	if version != "" {
		return version
	}
	return develVersion(debug.ReadBuildInfo())
}

func develVersion(info *debug.BuildInfo, ok bool) string {
	if !ok {
		return "devel"
	}
	var rev, modified string
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			modified = s.Value
		}
	}
	if rev == "" {
		return "devel"
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if modified == "true" {
		rev += "-dirty"
	}
	return "devel+" + rev
}

// String is the version with the Go release and platform, as `--version` prints it.
func String() string {
	return Get() + " (" + runtime.Version() + ", " + runtime.GOOS + "/" + runtime.GOARCH + ")"
}

// NewCollector exports dkc_build_info{version, go_version} = 1, so that dashboards and alerts can tell
// which release each pod runs during an upgrade.
func NewCollector() prometheus.Collector {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "dkc_build_info",
		Help: "Always 1; its labels say which dkc release this process runs and the Go release it was built with.",
	}, []string{"version", "go_version"})
	g.WithLabelValues(Get(), runtime.Version()).Set(1)
	return g
}
