// SPDX-License-Identifier: Apache-2.0

// Command dkc-server is the dkc config service (a Deployment): it resolves every Node's kubelet config
// source, streams the result to the node's sidecar over gRPC, and writes what the nodes report back onto
// their Nodes; its leader replica rolls KubeletConfigPools out. See `dkc-server --help`.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	// The time zone database, for KubeletConfigPools' maintenance windows: the image has no /usr/share/zoneinfo.
	_ "time/tzdata"

	flag "github.com/spf13/pflag"
	"go.uber.org/zap"

	"github.com/dkc-dev/dkc/internal/version"
	"github.com/dkc-dev/dkc/internal/zaplog"
	"github.com/dkc-dev/dkc/services/internal/server"
)

func parse(fs *flag.FlagSet, args []string) (server.Config, error) {
	cfg := server.DefaultConfig()
	cfg.BindFlags(fs)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `dkc-server resolves each Node's kubelet config source (spec.configSource or the
dkc.dev/config-source annotation) to a ConfigMap version, streams it to the node's dkc-sidecar over gRPC
(dkc.v1.ConfigService), and writes the reported status onto the Node (annotation dkc.dev/config-status,
condition ConfigOK, status.config where kept, KubeletConfigChanged events). The replica holding the
Lease --leader-election-id also rolls KubeletConfigPools (dkc.dev/v1alpha1) out to the Nodes they select.

Usage: dkc-server [flags]

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
	fs := flag.NewFlagSet("dkc-server", flag.ContinueOnError)
	fs.SetOutput(stderr)
	showVersion := fs.Bool("version", false, "print the version and exit")
	cfg, err := parse(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if *showVersion {
		fmt.Fprintf(stdout, "dkc-server %s\n", version.String())
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "dkc-server: %v\n", err)
		return 2
	}
	log, err := zaplog.New(cfg.LogLevel, cfg.LogDevelopment)
	if err != nil {
		fmt.Fprintf(stderr, "dkc-server: %v\n", err)
		return 2
	}
	defer func() { _ = log.Sync() }()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := server.Run(ctx, cfg, log.Named("dkc-server")); err != nil {
		log.Error("dkc-server failed", zap.Error(err))
		return 1
	}
	return 0
}

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }
