// SPDX-License-Identifier: Apache-2.0

// Package configcheck is the sidecar's view of a kubelet config checked by the kubelet's own code: the
// endpoints to probe the kubelet on, the config's fields as /configz shows them, warnings, and whether it
// failed to load, to take the kubelet's flags or to validate.
//
// The kubelet's code (module internal/kubeletcheck) is not linked into the sidecar daemon: it runs in a
// short-lived helper process (dkc-kubelet-check-<minor>) for each check, one helper per kubelet minor dkc
// supports, chosen by the version of the kubelet the config is for (Helpers). Linking it cost the idle
// daemon ~30 MiB of resident memory, for code it needs a few times per assignment; a helper process also
// keeps a crash in that code (the kubelet's defaulting panics on some configs) out of the daemon; and one
// binary can link only one Kubernetes version.
package configcheck

import (
	"context"
	"strings"

	"github.com/dkc-dev/dkc/internal/kubeletcheck/checkapi"
)

// Kinds of failure, mapped by the agent to the original's status errors (checkapi's: errors.Is works on
// both sides of the helper process).
var (
	ErrLoad               = checkapi.ErrLoad
	ErrFlags              = checkapi.ErrFlags
	ErrValidate           = checkapi.ErrValidate
	ErrUnsupportedKubelet = checkapi.ErrUnsupportedKubelet
)

type (
	// Checked is a config as the kubelet would run it (checkapi.Checked).
	Checked = checkapi.Checked
	// Request asks for one check (checkapi.Request).
	Request = checkapi.Request
)

// Checker loads and validates req.File with the kubelet's flags (without --config) applied, with the code
// of the kubelet req.KubeletVersion names. Errors wrap ErrLoad, ErrFlags, ErrValidate or
// ErrUnsupportedKubelet when the config cannot be run; any other error means the check itself failed.
type Checker interface {
	Check(ctx context.Context, req Request) (*Checked, error)
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
