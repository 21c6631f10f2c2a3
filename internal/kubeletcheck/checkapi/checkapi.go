// SPDX-License-Identifier: Apache-2.0

// Package checkapi is what the sidecar and its dkc-kubelet-check helpers say to each other: one Request on
// the helper's stdin, one Response on its stdout. It imports nothing of the kubelet, so that the sidecar
// daemon, which links it, stays small; each helper links the kubelet code of one Kubernetes minor.
package checkapi

import (
	"cmp"
	"errors"
	"fmt"
	"strings"
)

// Kinds of failure, mapped by the sidecar's agent to the original's status errors.
var (
	// ErrLoad: the file is missing, empty, not YAML/JSON, or not a KubeletConfiguration.
	ErrLoad = errors.New("failed to load config")
	// ErrFlags: the node kubelet's flags, or the drop-ins of its --config-dir, cannot be applied (the
	// original's internal failure): the node's kubelet setup is at fault, not the config.
	ErrFlags = errors.New("failed to apply kubelet flags")
	// ErrValidate: the kubelet would refuse to run with it.
	ErrValidate = errors.New("failed to validate config")
	// ErrUnsupportedKubelet: no helper of this dkc speaks the node kubelet's minor, or the helper asked
	// is of another minor. Nothing is validated with another version's code.
	ErrUnsupportedKubelet = errors.New("unsupported kubelet version")
)

// Request is what a helper reads from stdin.
type Request struct {
	File  string   `json:"file"`
	Flags []string `json:"flags"`
	// KubeletVersion is the version of the kubelet that will run the config (a Node's
	// status.nodeInfo.kubeletVersion, e.g. "v1.37.2"); a helper refuses one of another minor than its own.
	// Empty: not checked (the caller chose the helper itself, as kubectl-dkc does for a file).
	KubeletVersion string `json:"kubeletVersion,omitempty"`
}

// Response is what a helper writes to stdout: Checked, or the kind of failure and its message.
type Response struct {
	Checked *Checked `json:"checked,omitempty"`
	// Kind is "load", "flags", "validate" or "unsupported" when the config cannot be run, "" when it passed.
	Kind  string `json:"kind,omitempty"`
	Error string `json:"error,omitempty"`
	// KubeletVersion is the Kubernetes version whose code the helper runs (e.g. "v1.34.4").
	KubeletVersion string `json:"kubeletVersion,omitempty"`
}

// Checked is a config as the kubelet would run it (file, defaults, the drop-ins of its --config-dir and the
// node's flags), reduced to what the sidecar needs.
type Checked struct {
	HealthzBindAddress string `json:"healthzBindAddress"`
	HealthzPort        int32  `json:"healthzPort"`
	Address            string `json:"address"`
	Port               int32  `json:"port"`
	// Fields are the kubelet.config.k8s.io/v1beta1 fields as JSON values, as the kubelet's /configz shows them.
	Fields map[string]any `json:"fields"`
	// DropInKeys are the top-level fields the kubelet's --config-dir drop-ins set: the kubelet runs their
	// values, so /configz is compared on them as on the file's.
	DropInKeys []string `json:"dropInKeys,omitempty"`
	// Warnings, e.g. fields unknown to this kubelet version that were ignored.
	Warnings []string `json:"warnings,omitempty"`
	// KubeletVersion is the Kubernetes version whose code checked it (e.g. "v1.34.4").
	KubeletVersion string `json:"kubeletVersion,omitempty"`
}

// Kinds maps a Response's Kind to its error.
var Kinds = map[string]error{"load": ErrLoad, "flags": ErrFlags, "validate": ErrValidate,
	"unsupported": ErrUnsupportedKubelet}

// Split gives err's kind for a Response and its message without the kind's text (the client wraps it in
// the kind again); kind is "" if err is not the config's fault.
func Split(err error) (kind, message string) {
	for k, e := range Kinds {
		if errors.Is(err, e) {
			return k, strings.TrimPrefix(err.Error(), e.Error()+": ")
		}
	}
	return "", ""
}

// Minor is the "1.37" of a Kubernetes version such as "v1.37.2", "1.37", "v1.37.0-rc.1" or
// "v1.37.2-eks-1234"; "" when v is not one.
func Minor(v string) string {
	v = strings.TrimPrefix(v, "v")
	major, rest, ok := strings.Cut(v, ".")
	if !ok || !digits(major) {
		return ""
	}
	minor := rest
	if i := strings.IndexAny(rest, ".-+"); i >= 0 {
		minor = rest[:i]
	}
	if !digits(minor) {
		return ""
	}
	return major + "." + minor
}

// CompareMinors orders minors ("1.9" before "1.10") for slices.SortFunc; a part that does not parse counts
// as 0.
func CompareMinors(a, b string) int {
	var am, an, bm, bn int
	_, _ = fmt.Sscanf(a, "%d.%d", &am, &an)
	_, _ = fmt.Sscanf(b, "%d.%d", &bm, &bn)
	return cmp.Or(cmp.Compare(am, bm), cmp.Compare(an, bn))
}

func digits(s string) bool {
	if s == "" || len(s) > 4 {
		return false
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}
