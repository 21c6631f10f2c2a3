// SPDX-License-Identifier: Apache-2.0

// Command helmchart writes the Helm chart deploy/helm/dkc from deploy/, the kustomize source of truth: it
// renders the self-signed and cert-manager overlays and the config-namespace component with the kustomize
// library dkc's go.mod pins, and turns the few values a chart user sets (images, replicas, config
// namespaces, TLS mode, placement) into template expressions. `make chart` runs it; see its -help.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/dkc-dev/dkc/hack/helmchart/chart"
)

func main() {
	fs := flag.NewFlagSet("helmchart", flag.ContinueOnError)
	cfg, err := parse(fs, os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "helmchart:", err)
		os.Exit(2)
	}
	if err := chart.Write(cfg); err != nil {
		fmt.Fprintln(os.Stderr, "helmchart:", err)
		os.Exit(1)
	}
}

func parse(fs *flag.FlagSet, args []string) (chart.Config, error) {
	var c chart.Config
	fs.StringVar(&c.DeployDir, "deploy", "deploy", "the kustomize source of truth: deploy/ of the checkout")
	fs.StringVar(&c.OutDir, "out", "deploy/helm/dkc", "chart directory, replaced as a whole")
	fs.StringVar(&c.Version, "version", "",
		"chart version (Chart.yaml version); default: the existing chart's, else "+chart.DefaultVersion)
	fs.StringVar(&c.AppVersion, "app-version", "",
		"dkc version (Chart.yaml appVersion); default: dkc-server's image tag in deploy/base")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	return c, c.Validate()
}
