package main

import (
	"flag"
	"io"
	"slices"
	"testing"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name       string
		args       []string
		wantErr    bool
		wantImages []string
		wantRepo   string
	}{
		{name: "defaults", wantImages: []string{"dkc-server", "dkc-sidecar", "pause"}, wantRepo: "dkc.local"},
		{name: "some images", args: []string{"-images", "pause, dkc-server", "-repo", "ghcr.io/x"},
			wantImages: []string{"pause", "dkc-server"}, wantRepo: "ghcr.io/x"},
		{name: "unknown image", args: []string{"-images", "dkc-server,nginx"}, wantErr: true},
		{name: "no image", args: []string{"-images", ","}, wantErr: true},
		{name: "empty tag", args: []string{"-tag", ""}, wantErr: true},
		{name: "stray argument", args: []string{"build"}, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := flag.NewFlagSet("images", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			c, err := parse(fs, tc.args)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if tc.wantErr {
				return
			}
			if !slices.Equal(c.images, tc.wantImages) || c.repo != tc.wantRepo {
				t.Errorf("images %v repo %q, want %v %q", c.images, c.repo, tc.wantImages, tc.wantRepo)
			}
		})
	}
}
