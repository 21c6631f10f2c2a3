// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"go.uber.org/zap"

	"github.com/dkc-dev/dkc/internal/configcheck"
	"github.com/dkc-dev/dkc/sidecar/internal/kubeletunit"
	"github.com/dkc-dev/dkc/sidecar/internal/probe"
)

// kubeletFlags returns the kubelet's command-line flags without --config.
func (a *Agent) kubeletFlags(ctx context.Context) ([]string, error) {
	if a.cfg.KubeletFlags != nil {
		return a.cfg.KubeletFlags, nil
	}
	pid, err := a.svc.MainPID(ctx)
	if err == nil && pid > 0 {
		args, err := kubeletunit.CommandLine(a.procDir(), pid)
		if err != nil {
			// E.g. a host /proc mounted with hidepid, which hides the kubelet (it holds capabilities this
			// process lacks): say so; --kubelet-flags is the way out.
			a.log.Warn("cannot read the kubelet's command line; using the flags seen last (--kubelet-flags gives them)",
				zap.Int("pid", pid), zap.Error(err))
		} else if len(args) > 0 {
			config, rest := configcheck.ConfigFlag(args[1:])
			if err := checkConfigFlag(config, a.cfg.LocalConfig, a.store.Dir()); err != nil {
				return nil, err
			}
			if rest == nil {
				rest = []string{}
			}
			if a.state.setFlags(rest) {
				if err := a.state.save(); err != nil {
					a.log.Warn("persist kubelet flags", zap.Error(err))
				}
			}
			return rest, nil
		}
	}
	if f := a.state.s.KubeletFlags; f != nil {
		return f, nil
	}
	return nil, errors.New("the kubelet is not running and its flags were never seen")
}

// procDir is where the node's processes are seen: /proc, or the host's /proc mounted into the pod.
func (a *Agent) procDir() string {
	if a.cfg.ProcDir != "" {
		return a.cfg.ProcDir
	}
	return "/proc"
}

// errForeignConfig marks a kubelet running with a --config dkc did not give it.
var errForeignConfig = errors.New("kubelet runs a config dkc does not manage")

// checkConfigFlag accepts the running kubelet's --config value when it is the node's local config
// (--kubelet-config) or one of dkc's checkpoints (inside --dynamic-config-dir). Anything else means
// --kubelet-config is wrong: the next restart dkc makes would replace the kubelet's real config with it. No
// --config at all is accepted: the kubelet then runs on flags and defaults, and there is no path to compare.
func checkConfigFlag(running, local, dynamicConfigDir string) error {
	if running == "" || filepath.Clean(running) == filepath.Clean(local) {
		return nil
	}
	if rel, err := filepath.Rel(dynamicConfigDir, running); err == nil && filepath.IsAbs(running) && rel != "." &&
		rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return nil
	}
	return fmt.Errorf("%w: the kubelet runs with --config=%s, which is neither --kubelet-config=%s nor inside "+
		"--dynamic-config-dir=%s; fix --kubelet-config (a restart by dkc would switch the kubelet to that file)",
		errForeignConfig, running, local, dynamicConfigDir)
}

// DefaultRootDir is the kubelet's --root-dir default, where its resource managers keep their state.
const DefaultRootDir = "/var/lib/kubelet"

// rootDir is the kubelet's --root-dir in its command line, DefaultRootDir without one.
func rootDir(flags []string) string { return probe.FlagValue(flags, "root-dir", DefaultRootDir) }
