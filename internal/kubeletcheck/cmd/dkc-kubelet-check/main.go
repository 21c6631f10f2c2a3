// SPDX-License-Identifier: Apache-2.0

// Command dkc-kubelet-check is the dkc sidecar's helper that loads and validates one kubelet config with
// the kubelet's own code (k8s.io/kubernetes) of one Kubernetes minor: it reads {"file": ..., "flags": [...],
// "kubeletVersion": ...} on stdin and writes the result as JSON on stdout. One is built per supported minor
// (dkc-kubelet-check-1.34 … -1.37, build.sh) and ships next to dkc-sidecar, which runs the one of the node's
// kubelet for each check, so the kubelet's code never sits in the daemon's memory.
//
//	dkc-kubelet-check < request.json   check a config
//	dkc-kubelet-check version          the Kubernetes version whose code it runs
//	dkc-kubelet-check defaults         that kubelet's defaulted, otherwise empty v1beta1 config (JSON)
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/dkc-dev/dkc/internal/kubeletcheck"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "dkc-kubelet-check:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	switch {
	case len(args) == 0:
		return kubeletcheck.Serve(context.Background(), os.Stdin, os.Stdout)
	case len(args) == 1 && args[0] == "version":
		_, err := fmt.Println(kubeletcheck.Version())
		return err
	case len(args) == 1 && args[0] == "defaults":
		data, err := kubeletcheck.Defaults()
		if err != nil {
			return err
		}
		_, err = os.Stdout.Write(append(data, '\n'))
		return err
	}
	//nolint:lll // the usage text is printed as its lines stand
	fmt.Fprintln(os.Stderr, `usage: dkc-kubelet-check < {"file": "<kubelet config>", "flags": ["<kubelet flag>", ...], "kubeletVersion": "v1.37.2"}
       dkc-kubelet-check version | defaults`)
	os.Exit(2)
	return nil
}
