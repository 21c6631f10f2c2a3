// SPDX-License-Identifier: Apache-2.0

package app

import (
	"strings"
	"testing"
)

func TestValidate(t *testing.T) {
	base := func() Config {
		c := DefaultConfig()
		c.NodeName, c.Server, c.ServerCAFile = "node-1", "dkc-server:9443", "/etc/dkc/ca/ca.crt"
		return c
	}
	for _, tc := range []struct {
		name    string
		change  func(*Config)
		wantErr string // "" for valid
	}{
		{"the DaemonSet's main container", func(c *Config) { c.HostProc = "/host/proc" }, ""},
		{"the DaemonSet's init container", func(c *Config) {
			*c = DefaultConfig()
			c.InstallOnly, c.InstallDropIn = true, "/etc/systemd/system/kubelet.service.d/20-dkc.conf"
		}, ""},
		{"install-only without a drop-in path", func(c *Config) { c.InstallOnly = true }, "--install-only needs"},
		{"install-only with a relative drop-in path", func(c *Config) { c.InstallOnly, c.InstallDropIn = true, "20-dkc.conf" }, "--install-only needs"},
		{"install-only in signal mode", func(c *Config) {
			c.InstallOnly, c.InstallDropIn, c.RestartMode = true, "/etc/systemd/system/kubelet.service.d/20-dkc.conf", "signal"
		}, "--install-only needs"},
		{"the uninstall mode, without the service's flags", func(c *Config) {
			*c = DefaultConfig()
			c.Uninstall, c.HostProc = true, "/host/proc"
		}, ""},
		{"uninstall in signal mode", func(c *Config) { c.Uninstall, c.RestartMode = true, "signal" }, "--uninstall needs --restart-mode=systemd"},
		{"uninstall with a relative drop-in", func(c *Config) { c.Uninstall, c.KubeletDropIn = true, "20-dkc.conf" }, "--uninstall needs absolute"},
		{"uninstall and install-only", func(c *Config) {
			c.Uninstall, c.InstallOnly, c.InstallDropIn = true, true, "/etc/systemd/system/kubelet.service.d/20-dkc.conf"
		}, "exclude each other"},
		{"a relative --host-proc", func(c *Config) { c.HostProc = "host/proc" }, "--host-proc must be absolute"},
		{"signal mode needs the host's PID namespace", func(c *Config) {
			c.RestartMode, c.KubeletPIDFile, c.HostProc = "signal", "/run/kubelet.pid", "/host/proc"
		}, "needs the host's PID namespace"},
		{"signal mode on the host", func(c *Config) { c.RestartMode, c.KubeletPIDFile = "signal", "/run/kubelet.pid" }, ""},
		{"no node name", func(c *Config) { c.NodeName = "" }, "--node-name"},
		{"no CA", func(c *Config) { c.ServerCAFile = "" }, "--server-ca-file is required"},
		{"a kubelet version override", func(c *Config) { c.KubeletVersion = "v1.36.3" }, ""},
		{"a kubelet version override without the v", func(c *Config) { c.KubeletVersion = "1.34.4" }, ""},
		{"a kubelet version override that names no minor", func(c *Config) { c.KubeletVersion = "latest" }, `--kubelet-version "latest"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := base()
			tc.change(&c)
			err := c.Validate()
			switch {
			case tc.wantErr == "" && err != nil:
				t.Errorf("Validate = %v, want valid", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("Validate = %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
}
