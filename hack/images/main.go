// SPDX-License-Identifier: Apache-2.0

// Command images builds dkc's container images from source without a container daemon or registry:
// dkc-server and dkc-sidecar (both with the dkc-kubelet-check-<minor> helpers, in one shared layer) and the
// pause image a local cluster uses as its sandbox image, one image index per image over the platforms
// asked for, with an SPDX SBOM per image and platform and, on request, the release overlay that pins the
// indexes by digest. `make images` runs it for linux/amd64 and linux/arm64; its own default is the host's
// platform, what a local cluster imports. See its --help.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	fs := flag.NewFlagSet("images", flag.ContinueOnError)
	cfg, err := parse(fs, os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "images:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err = run(ctx, cfg, os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "images:", err)
		os.Exit(1)
	}
}
