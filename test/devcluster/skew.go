// SPDX-License-Identifier: Apache-2.0

package devcluster

// Version skew: a real node may run a kubelet older than the control plane (Config.KubeletVersions,
// KUBELET_VERSIONS), as on a cluster whose control plane was upgraded before its nodes. The version skew
// policy (kubernetes.io/releases/version-skew-policy) allows a kubelet up to three minors older than
// kube-apiserver and never newer; so does the dev cluster.

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// ParseKubeletVersions parses KUBELET_VERSIONS: comma-separated node=minor pairs, e.g.
// "node-1=1.34,node-2=1.37". An empty string is no pairs (every node runs the control plane's kubelet).
// It checks the form only; Start checks the nodes and versions against the cluster.
func ParseKubeletVersions(s string) (map[string]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	versions := map[string]string{}
	for _, pair := range strings.Split(s, ",") {
		pair = strings.TrimSpace(pair)
		node, minor, ok := strings.Cut(pair, "=")
		node, minor = strings.TrimSpace(node), strings.TrimPrefix(strings.TrimSpace(minor), "v")
		if !ok || node == "" || minor == "" {
			return nil, fmt.Errorf("kubelet versions %q: %q is not node=minor (e.g. node-1=1.34)", s, pair)
		}
		if _, _, err := parseMinor(minor); err != nil {
			return nil, fmt.Errorf("kubelet versions %q: node %s: %w", s, node, err)
		}
		if _, dup := versions[node]; dup {
			return nil, fmt.Errorf("kubelet versions %q: node %s is named twice", s, node)
		}
		versions[node] = minor
	}
	return versions, nil
}

// FormatKubeletVersions is the KUBELET_VERSIONS form of versions, sorted by node.
func FormatKubeletVersions(versions map[string]string) string {
	nodes := make([]string, 0, len(versions))
	for n := range versions {
		nodes = append(nodes, n)
	}
	sort.Strings(nodes)
	pairs := make([]string, len(nodes))
	for i, n := range nodes {
		pairs[i] = n + "=" + versions[n]
	}
	return strings.Join(pairs, ",")
}

// checkKubeletVersions checks versions (node → kubelet minor) against a cluster whose control plane runs
// controlPlane and whose real nodes are nodes: each node named must be one of them, and each minor must
// have a wrapper module and lie within the skew policy.
func checkKubeletVersions(controlPlane string, nodes []string, versions map[string]string) error {
	isReal := map[string]bool{}
	for _, n := range nodes {
		isReal[n] = true
	}
	named := make([]string, 0, len(versions))
	for n := range versions {
		named = append(named, n)
	}
	sort.Strings(named)
	var errs []error
	for _, node := range named {
		minor := versions[node]
		if !isReal[node] {
			errs = append(errs, fmt.Errorf("kubelet version for node %s: not a real node of the cluster (real nodes: %s)", node,
				listOrNone(nodes)))
			continue
		}
		if _, ok := kubeModule[minor]; !ok {
			errs = append(errs, fmt.Errorf("kubelet %s on node %s: no wrapper module hack/kube/v%s "+
				"(kubelets for control plane %s: %s)",
				minor, node, minor, controlPlane, listOrNone(KubeletVersionsFor(controlPlane))))
			continue
		}
		switch d := minorDistance(controlPlane, minor); {
		case d < 0:
			errs = append(errs, fmt.Errorf("kubelet %s on node %s is newer than the control plane %s; a kubelet must not be "+
				"newer than kube-apiserver (kubelets for control plane %s: %s)",
				minor, node, controlPlane, controlPlane, listOrNone(KubeletVersionsFor(controlPlane))))
		case d > maxKubeletSkew:
			errs = append(errs, fmt.Errorf("kubelet %s on node %s is %d minors older than the control plane %s; the skew "+
				"policy allows %d (kubelets for control plane %s: %s)",
				minor, node, d, controlPlane, maxKubeletSkew, controlPlane, listOrNone(KubeletVersionsFor(controlPlane))))
		}
	}
	return errors.Join(errs...)
}

// KubeletVersionsFor are the kubelet minors with a module that may run beside controlPlane, oldest first.
func KubeletVersionsFor(controlPlane string) []string {
	var vs []string
	for _, v := range KubeVersions() {
		if d := minorDistance(controlPlane, v); d >= 0 && d <= maxKubeletSkew {
			vs = append(vs, v)
		}
	}
	return vs
}

func listOrNone(vs []string) string {
	if len(vs) == 0 {
		return "none"
	}
	return strings.Join(vs, ", ")
}

// parseMinor parses "1.34" into 1 and 34.
func parseMinor(v string) (major, minor int, err error) {
	a, b, ok := strings.Cut(v, ".")
	if ok {
		major, err = strconv.Atoi(a)
	}
	if ok && err == nil {
		minor, err = strconv.Atoi(b)
	}
	if !ok || err != nil || major < 1 || minor < 0 {
		return 0, 0, fmt.Errorf("%q is not a Kubernetes minor version like 1.34", v)
	}
	return major, minor, nil
}

// minorDistance is how many minors older b is than a (negative when newer); both are parseable minors of
// the same major (Kubernetes has only 1).
func minorDistance(a, b string) int {
	_, am, _ := parseMinor(a)
	_, bm, _ := parseMinor(b)
	return am - bm
}

// sortMinors sorts minor versions numerically (1.9 before 1.10).
func sortMinors(vs []string) {
	sort.Slice(vs, func(i, j int) bool {
		ai, am, _ := parseMinor(vs[i])
		bi, bm, _ := parseMinor(vs[j])
		if ai != bi {
			return ai < bi
		}
		return am < bm
	})
}
