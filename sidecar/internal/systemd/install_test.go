// SPDX-License-Identifier: Apache-2.0

package systemd

import (
	"errors"
	"fmt"
	"testing"
)

// TestInstallUnitProperties: what InstallFile asks systemd for, without a bus — a oneshot copying exactly the
// file given next to the drop-in, syncing it, renaming it onto the drop-in and syncing the directory,
// failing when any command does, collected afterwards — and the paths it refuses to send.
func TestInstallUnitProperties(t *testing.T) {
	const (
		src = "/var/lib/kubelet/dynamic-config/kubelet-dropin.conf"
		dst = "/etc/systemd/system/kubelet.service.d/20-dkc.conf"
	)
	props, err := InstallUnitProperties(src, dst)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, p := range props {
		got[p.Name] = p.Value.Signature().String() + " " + fmt.Sprint(p.Value.Value())
	}
	tmp := dst + ".dkc-tmp"
	want := map[string]string{
		"Description": `s dkc: restore the kubelet drop-in dkc installed`,
		"Type":        `s oneshot`,
		// Path, argv (argv[0] the program again), and a failed exit fails the job; in order.
		"ExecStart": `a(sasb) [` +
			`{/bin/cp [/bin/cp -f -T -- ` + src + ` ` + tmp + `] true} ` +
			`{/bin/sync [/bin/sync -- ` + tmp + `] true} ` +
			`{/bin/mv [/bin/mv -f -T -- ` + tmp + ` ` + dst + `] true} ` +
			`{/bin/sync [/bin/sync -- /etc/systemd/system/kubelet.service.d] true}]`,
		"CollectMode": `s inactive-or-failed`,
	}
	if len(got) != len(want) {
		t.Errorf("properties %v, want %v", got, want)
	}
	for name, w := range want {
		if got[name] != w {
			t.Errorf("%s = %s, want %s", name, got[name], w)
		}
	}

	for _, tc := range []struct{ src, dst string }{
		{"", dst},
		{src, ""},
		{"kubelet-dropin.conf", dst},
		{src, "kubelet.service.d/20-dkc.conf"},
		{src, src},
		{dst, dst},
		{src, "/etc/systemd/system/kubelet.service.d/../kubelet.service.d/20-dkc.conf"},
		{src, "/etc/systemd/system/kubelet.service.d/"},
		{src, "/"},
		{src, "/etc/systemd/system/kubelet.service.d/20-dkc"},
		{src, "/etc/systemd/system/kubelet.service.d/.conf"},
		{src, "/etc/systemd/system/kubelet.service"},
		{src, "/etc/systemd/system/20-dkc.conf"},
		{src, "/etc/systemd/system/.service.d/20-dkc.conf"},
		{src, "/etc/cron.d/20-dkc.conf"},
		{src, "/etc/systemd/system/kubelet.service.d/$HOME.conf"},
		{src, "/etc/systemd/system/kubelet.service.d/%h.conf"},
		{src, "/etc/systemd/system/kubelet.service.d/20 dkc.conf"},
		{src, "/etc/systemd/system/kubelet.service.d/20-dkc.conf\n"},
		{"/var/lib/kubelet/dynamic-config/$X", dst},
		{"/var/lib/kubelet/dynamic-config/a b", dst},
	} {
		if _, err := InstallUnitProperties(tc.src, tc.dst); !errors.Is(err, ErrUnsafePath) {
			t.Errorf("InstallUnitProperties(%q, %q) = %v, want %v", tc.src, tc.dst, err, ErrUnsafePath)
		}
	}
}
