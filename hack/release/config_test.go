// SPDX-License-Identifier: Apache-2.0

package main

import (
	"flag"
	"io"
	"slices"
	"testing"
)

func TestParse(t *testing.T) {
	// The defaults come from the environment as in make; keep the test's own out of it.
	t.Setenv("VERSION", "")
	t.Setenv("RELEASE_URL", "")
	for _, tc := range []struct {
		name          string
		args          []string
		wantErr       bool
		wantPlatforms []platform
		wantVersion   string
	}{
		{name: "defaults", wantPlatforms: supportedPlatforms},
		{name: "some platforms", args: []string{"-platforms", "darwin/arm64, linux/arm64", "-version", "v0.2.0-rc.1"},
			wantPlatforms: []platform{{"darwin", "arm64"}, {"linux", "arm64"}}, wantVersion: "v0.2.0-rc.1"},
		{name: "release url", args: []string{"-release-url", "https://dl.example.com/dkc/v0.2.0"}, wantPlatforms: supportedPlatforms},
		{name: "unsupported platform", args: []string{"-platforms", "windows/amd64"}, wantErr: true},
		{name: "not os/arch", args: []string{"-platforms", "linux"}, wantErr: true},
		{name: "twice", args: []string{"-platforms", "linux/amd64,linux/amd64"}, wantErr: true},
		{name: "no platform", args: []string{"-platforms", ","}, wantErr: true},
		{name: "version without v", args: []string{"-version", "0.2.0"}, wantErr: true},
		{name: "version no semver", args: []string{"-version", "v0.2"}, wantErr: true},
		{name: "url no http", args: []string{"-release-url", "ftp://example.com/x"}, wantErr: true},
		{name: "url relative", args: []string{"-release-url", "releases/v0.2.0"}, wantErr: true},
		{name: "empty out", args: []string{"-out", ""}, wantErr: true},
		{name: "stray argument", args: []string{"build"}, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := flag.NewFlagSet("release", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			c, err := parse(fs, tc.args)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if tc.wantErr {
				return
			}
			if !slices.Equal(c.platforms, tc.wantPlatforms) || c.version != tc.wantVersion {
				t.Errorf("platforms %v version %q, want %v %q", c.platforms, c.version, tc.wantPlatforms, tc.wantVersion)
			}
		})
	}
}

func TestReleaseVersion(t *testing.T) {
	for _, tc := range []struct{ describe, want string }{
		{"v0.2.0", "v0.2.0"},
		{"v0.2.0-3-gabc1234-dirty", "v0.2.0-3-gabc1234-dirty"},
		{"d4d6d35", "v0.0.0-gd4d6d35"},
		{"d4d6d35-dirty", "v0.0.0-gd4d6d35-dirty"},
		{"0123456", "v0.0.0-g0123456"}, // a numeric identifier may not start with 0; with the g it is none
		{"0.2.0", "v0.0.0-g0.2.0"},
	} {
		got := releaseVersion(tc.describe)
		if got != tc.want {
			t.Errorf("releaseVersion(%q) = %q, want %q", tc.describe, got, tc.want)
		}
		if err := checkVersion(got); err != nil {
			t.Errorf("releaseVersion(%q) = %q, which krew refuses: %v", tc.describe, got, err)
		}
	}
}
