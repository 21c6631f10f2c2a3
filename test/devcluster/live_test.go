// SPDX-License-Identifier: Apache-2.0

package devcluster

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestLiveRuntimeDirs(t *testing.T) {
	for _, tc := range []struct {
		name    string
		dirs    []string
		cgroups []string // one /proc/<pid>/cgroup each
		want    []string
	}{
		{name: "no runtime dirs"},
		{
			name:    "a node's process in its cgroup",
			dirs:    []string{"a9e1ac07af"},
			cgroups: []string{"1:name=systemd:/dkc-dkc-a9e1ac07-node-1/payload\n0::/dkc-dkc-a9e1ac07-node-1/payload\n"},
			want:    []string{"a9e1ac07af"},
		},
		{
			name:    "a killed run's dir: nothing alive in its cgroups",
			dirs:    []string{"a9e1ac07af"},
			cgroups: []string{"0::/init.scope\n", "1:name=systemd:/user.slice\n"},
		},
		{
			name:    "only the live one of two",
			dirs:    []string{"a9e1ac07af", "0123456789"},
			cgroups: []string{"0::/system.slice/dkc-dkc-01234567-node-2/kubepods\n"},
			want:    []string{"0123456789"},
		},
		{
			name:    "a cgroup name that only starts the same",
			dirs:    []string{"a9e1ac07af"},
			cgroups: []string{"0::/dkc-dkc-a9e1ac07x-node-1\n"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root, proc := t.TempDir(), t.TempDir()
			for _, d := range tc.dirs {
				if err := os.Mkdir(filepath.Join(root, d), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			for i, c := range tc.cgroups {
				pid := filepath.Join(proc, string(rune('1'+i)))
				if err := os.Mkdir(pid, 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(pid, "cgroup"), []byte(c), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			got, err := liveRuntimeDirs(root, proc)
			if err != nil {
				t.Fatal(err)
			}
			var want []string
			for _, w := range tc.want {
				want = append(want, filepath.Join(root, w))
			}
			if !slices.Equal(got, want) {
				t.Errorf("live runtime dirs = %v, want %v", got, want)
			}
		})
	}
	if got, err := liveRuntimeDirs(filepath.Join(t.TempDir(), "absent"), t.TempDir()); err != nil || got != nil {
		t.Errorf("absent runtime root: %v, %v; want none and no error", got, err)
	}
}
