// SPDX-License-Identifier: Apache-2.0

package systemd

import (
	"errors"
	"fmt"
	"testing"
)

// TestRemoveUnitProperties: what RemoveFiles asks systemd for, without a bus — a oneshot running rm -f on
// exactly the paths given, failing when rm does, collected afterwards — and the paths it refuses to send.
func TestRemoveUnitProperties(t *testing.T) {
	props, err := RemoveUnitProperties([]string{"/var/lib/kubelet/cpu_manager_state",
		"/var/lib/kubelet/memory_manager_state"})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, p := range props {
		got[p.Name] = p.Value.Signature().String() + " " + fmt.Sprint(p.Value.Value())
	}
	want := map[string]string{
		"Description": `s dkc: remove kubelet state a config change invalidates`,
		"Type":        `s oneshot`,
		// Path, argv (argv[0] the program again), and a failed exit fails the job.
		"ExecStart": `a(sasb) [{/bin/rm [/bin/rm -f -- /var/lib/kubelet/cpu_manager_state ` +
			`/var/lib/kubelet/memory_manager_state] true}]`,
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

	for _, bad := range [][]string{
		nil,
		{"cpu_manager_state"},
		{"/var/lib/kubelet/../kubelet/cpu_manager_state"},
		{"/var/lib/kubelet/"},
		{"/"},
		{"/var/lib/$HOME/cpu_manager_state"},
		{"/var/lib/%h/cpu_manager_state"},
		{"/var/lib/kubelet/cpu_manager_state\n"},
		{"/var/lib/kubelet/cpu_manager_state", "-rf"},
	} {
		if _, err := RemoveUnitProperties(bad); !errors.Is(err, ErrUnsafePath) {
			t.Errorf("RemoveUnitProperties(%q) = %v, want %v", bad, err, ErrUnsafePath)
		}
	}
}
