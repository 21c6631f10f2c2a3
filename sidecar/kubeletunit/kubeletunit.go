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
	"strings"

	"github.com/dkc-dev/dkc/sidecar/durable"
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
	return fmt.Sprintf(`# Installed by dkc: lets dkc-sidecar choose the kubelet's --config (local, assigned or last-known-good)
# by rewriting %[1]s atomically. Remove this file to take dkc out of the loop.
[Service]
EnvironmentFile=-%[1]s
`, filepath.Join(dynamicConfigDir, EnvFileName))
}

// EnvFile is the sidecar's handle on the environment file.
type EnvFile struct {
	Path string
}

// New returns the env file in dynamicConfigDir.
func New(dynamicConfigDir string) EnvFile {
	return EnvFile{Path: filepath.Join(dynamicConfigDir, EnvFileName)}
}

// Set makes the kubelet's next start use configFile.
func (e EnvFile) Set(configFile string) error {
	if configFile == "" || strings.ContainsAny(configFile, "\n\"\\ ") {
		return fmt.Errorf("kubelet config path %q cannot be written to %s", configFile, e.Path)
	}
	content := fmt.Sprintf("# Written by dkc-sidecar: the kubelet config in use. Do not edit.\n%s=--config=%s\n", Variable, configFile)
	return durable.WriteFile(e.Path, []byte(content), 0o644)
}

// Get returns the config file the kubelet's next start uses; "" when the env file does not exist.
func (e EnvFile) Get() (string, error) {
	data, err := os.ReadFile(e.Path)
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read %s: %w", e.Path, err)
	}
	s := bufio.NewScanner(bytes.NewReader(data))
	for s.Scan() {
		if v, ok := strings.CutPrefix(strings.TrimSpace(s.Text()), Variable+"=--config="); ok {
			return v, nil
		}
	}
	return "", fmt.Errorf("%s has no %s=--config=... line", e.Path, Variable)
}
