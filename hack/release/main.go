// SPDX-License-Identifier: Apache-2.0

// Command release builds what a dkc release attaches for people who install `kubectl dkc`: one
// kubectl-dkc archive per platform (on linux with the dkc-kubelet-check-<minor> helpers `kubectl dkc diff`
// runs), their SHA-256 checksums and the krew plugin manifest dkc.yaml generated from the archives.
// `make release` runs it; see its --help.
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
	fs := flag.NewFlagSet("release", flag.ContinueOnError)
	cfg, err := parse(fs, os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err = run(ctx, cfg, os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
}
