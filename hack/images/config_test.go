// SPDX-License-Identifier: Apache-2.0

package main

import (
	"flag"
	"io"
	"slices"
	"testing"
)

func newFlagSet() *flag.FlagSet {
	fs := flag.NewFlagSet("images", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs
}

func TestParse(t *testing.T) {
	host := hostPlatform()
	both := []platform{{"linux", "amd64"}, {"linux", "arm64"}}
	for _, tc := range []struct {
		name          string
		args          []string
		wantErr       bool
		wantImages    []string
		wantRepo      string
		wantPlatforms []platform
	}{
		// The default is what a local cluster's callers (test/devcluster, make up/demo) get: the host alone.
		{name: "defaults", wantImages: []string{"dkc-server", "dkc-sidecar", "pause"}, wantRepo: "dkc.local",
			wantPlatforms: []platform{host}},
		{name: "some images", args: []string{"-images", "pause, dkc-server", "-repo", "ghcr.io/x"},
			wantImages: []string{"pause", "dkc-server"}, wantRepo: "ghcr.io/x", wantPlatforms: []platform{host}},
		{name: "two platforms", args: []string{"-platforms", "linux/amd64, linux/arm64,linux/amd64"},
			wantImages: imageNames(), wantRepo: "dkc.local", wantPlatforms: both},
		{name: "release overlay", args: []string{"-release-overlay", "out/deploy"},
			wantImages: imageNames(), wantRepo: "dkc.local", wantPlatforms: []platform{host}},
		{name: "release overlay without the sidecar", args: []string{"-release-overlay", "o", "-images", "dkc-server"}, wantErr: true},
		{name: "unknown image", args: []string{"-images", "dkc-server,nginx"}, wantErr: true},
		{name: "no image", args: []string{"-images", ","}, wantErr: true},
		{name: "darwin", args: []string{"-platforms", "darwin/arm64"}, wantErr: true},
		{name: "unknown arch", args: []string{"-platforms", "linux/mips"}, wantErr: true},
		{name: "no platform", args: []string{"-platforms", ""}, wantErr: true},
		{name: "empty tag", args: []string{"-tag", ""}, wantErr: true},
		{name: "stray argument", args: []string{"build"}, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := parse(newFlagSet(), tc.args)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if tc.wantErr {
				return
			}
			if !slices.Equal(c.images, tc.wantImages) || c.repo != tc.wantRepo || !slices.Equal(c.platforms, tc.wantPlatforms) {
				t.Errorf("images %v repo %q platforms %v, want %v %q %v", c.images, c.repo, c.platforms,
					tc.wantImages, tc.wantRepo, tc.wantPlatforms)
			}
		})
	}
}
