// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
)

// deployment is what the shipped dkc-server Deployment gives a replica: its flags, memory limit,
// GOMEMLIMIT and GOGC. The benchmark runs dkc-server with the same flags (serviceArgs), GOMEMLIMIT and
// GOGC and holds the peak RSS to the limit, read from the manifest at run time so that the two cannot
// drift apart.
type deployment struct {
	args       []string
	limit      int64
	goMemLimit string
	goGC       string // "" when the manifest sets none (Go's default, 100)
}

// podOnlyFlags are the Deployment's flags that name the pod's own ports and files: the dev cluster gives
// dkc-server its own (devcluster.Cluster.startService), and the benchmark keeps them.
var podOnlyFlags = []string{"--listen-address", "--webhook-address", "--metrics-address", "--tls-cert-file",
	"--tls-key-file"}

// benchOnlyArgs are what the benchmark adds to the Deployment's flags, and why: neither touches how status
// is written or how much the service may ask of the apiserver.
var benchOnlyArgs = []string{
	// CPU and heap profiles of dkc-server (served on the metrics address, read by the benchmark).
	"--profiling",
	// Every simulated node connects from this one address; in a cluster each node has its own, which
	// the per-address TokenReview limit is sized for.
	"--token-review-per-peer-qps=0",
	// Likewise the per-address cap on connections not yet authenticated: 10,000 simulated nodes connecting
	// from one address would be let in 16 at a time.
	"--max-unauthenticated-connections-per-address=0",
	// And the per-address cap on connections and the rate of new ones: 10,000 simulated nodes hold 10,000
	// connections from that one address, opened at once.
	"--max-connections-per-address=0",
	"--new-connections-per-address-qps=0",
	// The fan-out phase measures how fast one in-place edit reaches every node of a shared ConfigMap: the
	// raw path, not the pace an operator sets for kubelet restarts.
	"--max-direct-config-changes=0",
}

// serviceArgs are the flags the benchmark runs dkc-server with: the Deployment's, less podOnlyFlags, plus
// benchOnlyArgs. They come after the dev cluster's own, so they win.
func (d deployment) serviceArgs() []string {
	var out []string
	for _, a := range d.args {
		name, _, _ := strings.Cut(a, "=")
		if !slices.Contains(podOnlyFlags, name) {
			out = append(out, a)
		}
	}
	return append(out, benchOnlyArgs...)
}

var (
	memoryLimitRE = regexp.MustCompile(`limits:\s*\{\s*memory:\s*([0-9A-Za-z.]+)\s*\}`)
	goMemLimitRE  = regexp.MustCompile(`name:\s*GOMEMLIMIT\s*\n\s*value:\s*"?([0-9A-Za-z]+)"?`)
	goGCRE        = regexp.MustCompile(`name:\s*GOGC\s*\n\s*value:\s*"?([0-9A-Za-z]+)"?`)
	// argsRE is the container's args list: "args:" followed by "- --flag[=value]" lines, each maybe with a
	// trailing comment.
	argsRE = regexp.MustCompile(`(?m)^\s*args:\s*\n((?:\s*-\s*--\S+.*\n)+)`)
	argRE  = regexp.MustCompile(`(?m)^\s*-\s*(--[^\s#]+)`)
)

// readDeployment reads the manifest at path (deploy/base/server.yaml).
func readDeployment(path string) (deployment, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return deployment{}, fmt.Errorf("read the dkc-server Deployment: %w", err)
	}
	lm := memoryLimitRE.FindSubmatch(data)
	gm := goMemLimitRE.FindSubmatch(data)
	if lm == nil || gm == nil {
		return deployment{}, fmt.Errorf("%s: no limits.memory or GOMEMLIMIT found", path)
	}
	q, err := resource.ParseQuantity(string(lm[1]))
	if err != nil {
		return deployment{}, fmt.Errorf("%s: limits.memory: %w", path, err)
	}
	d := deployment{limit: q.Value(), goMemLimit: string(gm[1])}
	am := argsRE.FindSubmatch(data)
	if am == nil {
		return deployment{}, fmt.Errorf("%s: no container args found", path)
	}
	for _, m := range argRE.FindAllSubmatch(am[1], -1) {
		d.args = append(d.args, string(m[1]))
	}
	if gc := goGCRE.FindSubmatch(data); gc != nil {
		d.goGC = string(gc[1])
	}
	return d, nil
}
