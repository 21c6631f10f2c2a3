// SPDX-License-Identifier: Apache-2.0

package systemd

import (
	"errors"
	"testing"

	godbus "github.com/godbus/dbus/v5"
)

func TestVersionUnitProperties(t *testing.T) {
	const out = "/var/lib/kubelet/dynamic-config/kubelet-version"
	for _, tc := range []struct {
		name, bin, out string
		ok             bool
	}{
		{name: "kubelet", bin: "/usr/local/bin/kubelet", out: out, ok: true},
		{name: "relative binary", bin: "kubelet", out: out},
		{name: "unclean binary", bin: "/usr/bin/../bin/kubelet", out: out},
		{name: "binary with a space", bin: "/usr/bin/kube let", out: out},
		{name: "binary with a specifier", bin: "/usr/bin/%h", out: out},
		{name: "another output file", bin: "/usr/bin/kubelet", out: "/etc/passwd"},
		{name: "relative output", bin: "/usr/bin/kubelet", out: "kubelet-version"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			props, err := VersionUnitProperties(tc.bin, tc.out)
			if !tc.ok {
				if !errors.Is(err, ErrUnsafePath) {
					t.Fatalf("VersionUnitProperties(%q, %q) = %v, want ErrUnsafePath", tc.bin, tc.out, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]any{}
			for _, p := range props {
				got[p.Name] = p.Value.Value()
			}
			if got["Type"] != "oneshot" || got["StandardOutputFile"] != tc.out || got["CollectMode"] != "inactive-or-failed" ||
				got["PrivateNetwork"] != true || got["NoNewPrivileges"] != true {
				t.Errorf("properties %v", got)
			}
			cmds, ok := got["ExecStart"].([]execCommand)
			if !ok || len(cmds) != 1 || cmds[0].Path != tc.bin || len(cmds[0].Args) != 2 || cmds[0].Args[1] != "--version" {
				t.Errorf("ExecStart %#v, want %s --version", got["ExecStart"], tc.bin)
			}
		})
	}
}

func TestExecPath(t *testing.T) {
	for _, tc := range []struct {
		name  string
		value any
		want  string
	}{
		{name: "kubeadm's", value: [][]any{{"/usr/bin/kubelet", []string{"/usr/bin/kubelet", "$KUBELET_CONFIG_ARGS"}, false,
			uint64(0), uint64(0), uint64(0), uint64(0), uint32(0), int32(0), int32(0)}}, want: "/usr/bin/kubelet"},
		{name: "none", value: [][]any{}},
		{name: "relative", value: [][]any{{"kubelet"}}},
		{name: "not a path", value: [][]any{{42}}},
		{name: "wrong type", value: "kubelet"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := execPath(godbus.MakeVariant(tc.value))
			if got != tc.want || (err == nil) != (tc.want != "") {
				t.Errorf("execPath = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}
