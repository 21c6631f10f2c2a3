// SPDX-License-Identifier: Apache-2.0

// Command kubectl-dkc is the `kubectl dkc` plugin: put it on the PATH and run `kubectl dkc --help`.
package main

import (
	"os"

	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/dkc-dev/dkc/cli/plugin"
)

func main() {
	if err := plugin.NewCommand(genericiooptions.IOStreams{In: os.Stdin, Out: os.Stdout,
		ErrOut: os.Stderr}).Execute(); err != nil {
		os.Exit(1)
	}
}
