// Command dkc-kubelet-check is the dkc sidecar's helper that loads and validates one kubelet config with
// the kubelet's own code (k8s.io/kubernetes): it reads {"file": ..., "flags": [...]} on stdin and writes the
// result as JSON on stdout. The sidecar runs it for each check, so the kubelet's code never sits in the
// daemon's memory. It ships next to dkc-sidecar.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/dkc-dev/dkc/internal/kubeletconfig"
)

func main() {
	if len(os.Args) > 1 {
		fmt.Fprintln(os.Stderr, "usage: dkc-kubelet-check < {\"file\": \"<kubelet config>\", \"flags\": [\"<kubelet flag>\", ...]}")
		os.Exit(2)
	}
	if err := kubeletconfig.Serve(context.Background(), os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "dkc-kubelet-check:", err)
		os.Exit(1)
	}
}
