// Command images builds dkc's container images from source without a container daemon or registry:
// dkc-server, dkc-sidecar (with the dkc-kubelet-check-<minor> helpers beside it) and the pause image a local cluster uses as
// its sandbox image. `make images` runs it; see its --help.
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
	defer stop()
	if err := run(ctx, cfg, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "images:", err)
		os.Exit(1)
	}
}
