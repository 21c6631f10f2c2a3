// Package configcheck is the sidecar's view of a kubelet config checked by the kubelet's own code: the
// endpoints to probe the kubelet on, the config's fields as /configz shows them, warnings, and whether it
// failed to load, to take the kubelet's flags or to validate.
//
// The kubelet's code (k8s.io/kubernetes, package internal/kubeletconfig) is not linked into the sidecar
// daemon: it runs in a short-lived helper process (dkc-kubelet-check) for each check. Linking it cost the
// idle daemon ~30 MiB of resident memory, for code it needs a few times per assignment; a helper process
// also keeps a crash in that code (the kubelet's defaulting panics on some configs) out of the daemon.
package configcheck

import (
	"context"
	"errors"
	"strings"
)

// Kinds of failure, mapped by the agent to the original's status errors.
var (
	// ErrLoad: the file is missing, empty, not YAML/JSON, or not a KubeletConfiguration.
	ErrLoad = errors.New("failed to load config")
	// ErrFlags: the node kubelet's flags, or the drop-ins of its --config-dir, cannot be applied (the
	// original's internal failure): the node's kubelet setup is at fault, not the config.
	ErrFlags = errors.New("failed to apply kubelet flags")
	// ErrValidate: the kubelet would refuse to run with it.
	ErrValidate = errors.New("failed to validate config")
)

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
}

// Checker loads and validates the config file at path with the kubelet's flags (without --config) applied.
// Errors wrap ErrLoad, ErrFlags or ErrValidate when the config is at fault; any other error means the check
// itself failed.
type Checker interface {
	Check(ctx context.Context, path string, flags []string) (*Checked, error)
}

// ConfigFlag splits a kubelet command line into its --config value and the other arguments.
func ConfigFlag(args []string) (config string, rest []string) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--config" && i+1 < len(args):
			config = args[i+1]
			i++
		case strings.HasPrefix(a, "--config="):
			config = strings.TrimPrefix(a, "--config=")
		default:
			rest = append(rest, a)
		}
	}
	return config, rest
}
