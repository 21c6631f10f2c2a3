// SPDX-License-Identifier: Apache-2.0

// Command dkc-sidecar is the node half of dkc (a DaemonSet): it receives the node's kubelet config from the
// dkc config service, checkpoints it, validates it as the kubelet would, switches the kubelet to it and
// restarts it through systemd, rolls back what does not run, keeps a last-known-good config, and reports the
// node's config status. See `dkc-sidecar --help`.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	flag "github.com/spf13/pflag"
	"go.uber.org/zap"

	"github.com/dkc-dev/dkc/internal/version"
	"github.com/dkc-dev/dkc/internal/zaplog"
	"github.com/dkc-dev/dkc/sidecar/app"
)

func parse(fs *flag.FlagSet, args []string) (app.Config, error) {
	cfg := app.DefaultConfig()
	cfg.BindFlags(fs)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `dkc-sidecar applies the kubelet config the dkc config service assigns to this node.

It checkpoints each assignment under --dynamic-config-dir (meta/assigned, meta/last-known-good,
checkpoints/<uid>/<resourceVersion>/), validates it with the kubelet's own code and the kubelet's
flags, points the kubelet at it through <dynamic-config-dir>/kubelet.env (read by the kubelet unit's
drop-in, see --print-kubelet-dropin), restarts the kubelet over D-Bus, waits for /healthz and a
matching /configz, rolls back to last-known-good when that fails, and promotes a config to
last-known-good after --trial-duration of healthy running.

With --uninstall it takes dkc off the node instead (kubectl dkc uninstall sets it): it removes the
drop-in and kubelet.env, restarts a kubelet that runs a checkpoint onto its local config, removes
the checkpoints once that kubelet is healthy, and reports ready.

Usage: dkc-sidecar [flags]

Flags:
`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected arguments %v", fs.Args())
	}
	return cfg, cfg.Validate()
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("dkc-sidecar", flag.ContinueOnError)
	fs.SetOutput(stderr)
	showVersion := fs.Bool("version", false, "print the version and exit")
	cfg, err := parse(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if *showVersion {
		fmt.Fprintf(stdout, "dkc-sidecar %s\n", version.String())
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "dkc-sidecar: %v\n", err)
		return 2
	}
	if cfg.PrintDropIn {
		fmt.Fprint(stdout, app.KubeletDropIn(cfg.DynamicConfigDir))
		return 0
	}
	log, err := zaplog.New(cfg.LogLevel, cfg.LogDevelopment)
	if err != nil {
		fmt.Fprintf(stderr, "dkc-sidecar: %v\n", err)
		return 2
	}
	defer func() { _ = log.Sync() }()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cfg.Log = log.Named("dkc-sidecar")
	if err := app.New(cfg).Run(ctx); err != nil {
		log.Error("dkc-sidecar failed", zap.Error(err))
		return 1
	}
	return 0
}

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }
