// SPDX-License-Identifier: Apache-2.0

// Package kubeletunit is how the kubelet is made to use a config without touching the node's own config
// file: the kubelet's systemd unit reads KUBELET_CONFIG_ARGS from an environment file that the sidecar owns
// (<dynamic-config-dir>/kubelet.env), installed once per node with the drop-in below. Switching between the
// local config, the assigned checkpoint and the last-known-good one is one atomic, durable rename of that
// file; the next kubelet start uses it. The kubelet reads the checkpoint file in place, so relative paths in
// the config resolve inside the checkpoint directory and the kubelet's own command-line flags still override
// the file (the seed semantics), both done by the kubelet itself.
package kubeletunit

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/dkc-dev/dkc/internal/durable"
)

// EnvFileName is the environment file in the dynamic config dir.
const EnvFileName = "kubelet.env"

// Variable is what the kubelet's ExecStart must use in place of its --config flag (kubeadm's units already
// do: `ExecStart=/usr/bin/kubelet ... $KUBELET_CONFIG_ARGS ...`).
const Variable = "KUBELET_CONFIG_ARGS"

// DropIn is the one-time node setup for kubeadm-style kubelet units, installed as
// /etc/systemd/system/kubelet.service.d/20-dkc.conf: variables from an EnvironmentFile take precedence over
// Environment= lines (systemd.exec(5)), so this overrides kubeadm's KUBELET_CONFIG_ARGS only while the file
// exists; the leading "-" keeps the kubelet starting when it does not.
func DropIn(dynamicConfigDir string) string {
	return fmt.Sprintf(
		`# Installed by dkc: lets dkc-sidecar choose the kubelet's --config (local, assigned or last-known-good)
# by rewriting %[1]s atomically. Remove this file to take dkc out of the loop.
[Service]
EnvironmentFile=-%[1]s
`, filepath.Join(dynamicConfigDir, EnvFileName))
}

// DropInCopyName is the sidecar's copy of DropIn in the dynamic config dir: the long-running sidecar cannot
// write the unit directory, and has the node's systemd copy this file onto the drop-in when it repairs
// dkc's wiring (systemd.Manager.InstallFile).
const DropInCopyName = "kubelet-dropin.conf"

// EnvFile is the sidecar's handle on the environment file.
type EnvFile struct {
	Path string
}

// New returns the env file in dynamicConfigDir.
func New(dynamicConfigDir string) EnvFile {
	return EnvFile{Path: filepath.Join(dynamicConfigDir, EnvFileName)}
}

// MaxPathLength is PATH_MAX: no longer config path can be opened.
const MaxPathLength = 4096

// ValidatePath checks that configFile can be the value of one --config= argument whatever reads the env file.
// systemd's EnvironmentFile= parser strips whitespace, removes quotes, honours backslash escapes and
// line continuations and expands "$"; an unquoted $KUBELET_CONFIG_ARGS in ExecStart= is then split on
// space, tab, CR and newline (and unquoted again); "%" is a unit-file specifier; the dev cluster's
// simulated nodes even source the file with sh, which adds globbing and command syntax. A deny-list of
// those rules would be one missed byte away from a second kubelet flag, so this is an allow-list instead:
// an absolute path made of the POSIX portable file name characters [A-Za-z0-9._-] and "/", which every
// config path dkc writes (checkpoint names are held to the API's characters by package payload) and every
// kubelet config path in practice is.
func ValidatePath(configFile string) error {
	switch {
	case configFile == "":
		return fmt.Errorf("kubelet config path %q is empty", configFile)
	case len(configFile) > MaxPathLength:
		return fmt.Errorf("kubelet config path of %d bytes is longer than %d", len(configFile), MaxPathLength)
	case !strings.HasPrefix(configFile, "/"):
		return fmt.Errorf("kubelet config path %q is not absolute", configFile)
	}
	for i := 0; i < len(configFile); i++ {
		if c := configFile[i]; !portable(c) && c != '/' {
			return fmt.Errorf("kubelet config path %q has %q at byte %d; only A-Z a-z 0-9 . _ - / are allowed", configFile, c, i)
		}
	}
	return nil
}

// portable reports whether c is in the POSIX portable file name character set.
func portable(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
}

// Set makes the kubelet's next start use configFile. A path ValidatePath refuses is never written, so the
// env file always adds exactly one kubelet argument.
func (e EnvFile) Set(configFile string) error {
	if err := ValidatePath(configFile); err != nil {
		return fmt.Errorf("write %s: %w", e.Path, err)
	}
	return durable.WriteFile(e.Path, []byte(EnvContent(configFile)), 0o644)
}

// EnvContent is what Set writes for configFile: the sidecar's drift check compares the file with it.
func EnvContent(configFile string) string {
	return fmt.Sprintf("# Written by dkc-sidecar: the kubelet config in use. Do not edit.\n%s=--config=%s\n", Variable,
		configFile)
}

// Get returns the config file the kubelet's next start uses; "" when the env file does not exist. A file
// that does not set the variable exactly once to one --config= argument with a path ValidatePath accepts
// (edited by hand, or by something else) is an error, so that the caller rewrites it.
func (e EnvFile) Get() (string, error) {
	data, err := os.ReadFile(e.Path)
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read %s: %w", e.Path, err)
	}
	var values []string
	s := bufio.NewScanner(bytes.NewReader(data))
	for s.Scan() {
		if v, ok := strings.CutPrefix(strings.TrimSpace(s.Text()), Variable+"="); ok {
			values = append(values, v)
		}
	}
	if err := s.Err(); err != nil {
		return "", fmt.Errorf("read %s: %w", e.Path, err)
	}
	if len(values) != 1 {
		return "", fmt.Errorf("%s sets %s %d times, want once", e.Path, Variable, len(values))
	}
	path, ok := strings.CutPrefix(values[0], "--config=")
	if !ok {
		return "", fmt.Errorf("%s: %s=%q is not --config=<path>", e.Path, Variable, values[0])
	}
	if err := ValidatePath(path); err != nil {
		return "", fmt.Errorf("%s: %w", e.Path, err)
	}
	return path, nil
}

// CommandLine reads the arguments of process pid from procDir (the host's /proc as the sidecar mounts it):
// how the sidecar learns the kubelet's flags and the --config it runs, which systemd does not tell. An
// empty result with a nil error is a process that exited while being read.
func CommandLine(procDir string, pid int) ([]string, error) {
	raw, err := os.ReadFile(filepath.Join(procDir, strconv.Itoa(pid), "cmdline"))
	if err != nil {
		return nil, err
	}
	raw = bytes.TrimRight(raw, "\x00")
	if len(raw) == 0 {
		return nil, nil
	}
	return strings.Split(string(raw), "\x00"), nil
}
