// SPDX-License-Identifier: Apache-2.0

package devcluster

import (
	"errors"
	"strings"
	"testing"
)

// fakeSysctl is a kernel whose settings are a map; a name in fail refuses writes (read-only /proc/sys).
type fakeSysctl struct {
	values map[string]int
	fail   map[string]bool
	writes []string
}

func (f *fakeSysctl) GetSysctl(name string) (int, error) {
	v, ok := f.values[name]
	if !ok {
		return 0, errors.New("no such file or directory")
	}
	return v, nil
}

func (f *fakeSysctl) SetSysctl(name string, v int) error {
	if f.fail[name] {
		return errors.New("read-only file system")
	}
	f.values[name] = v
	f.writes = append(f.writes, name)
	return nil
}

// freshKernel is a brand-new machine's kernel as measured (panic 1, panic_on_oops 0, overcommit 0), with
// the kernel's own defaults for the key quotas.
func freshKernel() map[string]int {
	return map[string]int{"vm/overcommit_memory": 0, "vm/panic_on_oom": 0, "kernel/panic": 1, "kernel/panic_on_oops": 0,
		"kernel/keys/root_maxkeys": 200, "kernel/keys/root_maxbytes": 20000}
}

func provisioned() map[string]int {
	m := map[string]int{}
	for _, t := range KubeletKernelTunables() {
		m[t.Name] = t.Value
	}
	return m
}

func TestProvisionKernel(t *testing.T) {
	for _, tc := range []struct {
		name        string
		values      map[string]int
		fail        map[string]bool
		wantChanged []string
		wantErr     string
		wantOutput  string
	}{
		{
			name:        "fresh machine: everything the kubelet requires is set",
			values:      freshKernel(),
			wantChanged: []string{"vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops", "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes"},
			wantOutput:  "node provisioning: set vm.overcommit_memory=1 (was 0), kernel.panic=10 (was 1), kernel.panic_on_oops=1 (was 0)",
		},
		{
			name:   "provisioned machine: nothing is written or said",
			values: provisioned(),
		},
		{
			name:        "a setting that cannot be written is an error naming it and its old value",
			values:      freshKernel(),
			fail:        map[string]bool{"kernel/panic": true},
			wantChanged: []string{"vm/overcommit_memory"},
			wantErr:     "set kernel setting kernel.panic=10 the kubelet requires (was 1): read-only file system",
		},
		{
			name:    "a setting that cannot be read is an error",
			values:  map[string]int{"vm/overcommit_memory": 1},
			wantErr: "read kernel setting vm.panic_on_oom=0 the kubelet requires",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sys := &fakeSysctl{values: tc.values, fail: tc.fail}
			var out strings.Builder
			changes, err := ProvisionKernel(sys, &out)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, c := range changes {
				got = append(got, c.Name)
				if tc.values[c.Name] != c.Value {
					t.Errorf("%s reported set to %d but is %d", c.Name, c.Value, tc.values[c.Name])
				}
			}
			if strings.Join(got, ",") != strings.Join(tc.wantChanged, ",") || strings.Join(sys.writes, ",") != strings.Join(tc.wantChanged, ",") {
				t.Errorf("changed %v, wrote %v, want %v", got, sys.writes, tc.wantChanged)
			}
			if !strings.Contains(out.String(), tc.wantOutput) || (tc.wantOutput == "" && out.Len() > 0) {
				t.Errorf("output %q, want %q", out.String(), tc.wantOutput)
			}
			if tc.wantErr == "" {
				for name, want := range provisioned() {
					if tc.values[name] != want {
						t.Errorf("%s = %d after provisioning, want %d", name, tc.values[name], want)
					}
				}
			}
		})
	}
}

func TestProvisionInotify(t *testing.T) {
	for _, tc := range []struct {
		name        string
		values      map[string]int
		wantChanged []string
		want        map[string]int
	}{
		{
			name:        "kernel defaults: both raised",
			values:      map[string]int{"fs/inotify/max_user_instances": 128, "fs/inotify/max_user_watches": 8192},
			wantChanged: []string{"fs/inotify/max_user_instances", "fs/inotify/max_user_watches"},
			want:        map[string]int{"fs/inotify/max_user_instances": 512, "fs/inotify/max_user_watches": 524288},
		},
		{
			name:        "a higher limit is kept",
			values:      map[string]int{"fs/inotify/max_user_instances": 10000, "fs/inotify/max_user_watches": 8192},
			wantChanged: []string{"fs/inotify/max_user_watches"},
			want:        map[string]int{"fs/inotify/max_user_instances": 10000, "fs/inotify/max_user_watches": 524288},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sys := &fakeSysctl{values: tc.values}
			var out strings.Builder
			changes, err := ProvisionInotify(sys, &out)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, c := range changes {
				got = append(got, c.Name)
			}
			if strings.Join(got, ",") != strings.Join(tc.wantChanged, ",") {
				t.Errorf("changed %v, want %v", got, tc.wantChanged)
			}
			for name, want := range tc.want {
				if tc.values[name] != want {
					t.Errorf("%s = %d, want %d", name, tc.values[name], want)
				}
			}
		})
	}
}
