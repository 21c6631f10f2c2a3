// SPDX-License-Identifier: Apache-2.0

package disruption

import (
	"fmt"
	"testing"
)

func TestResets(t *testing.T) {
	none := map[string]any{"cpuManagerPolicy": "none", "memoryManagerPolicy": "None", "reservedSystemCPUs": ""}
	with := func(base map[string]any, kv ...any) map[string]any {
		out := map[string]any{}
		for k, v := range base {
			out[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			out[kv[i].(string)] = kv[i+1]
		}
		return out
	}
	static := with(none, "cpuManagerPolicy", "static", "reservedSystemCPUs", "0")
	for _, tc := range []struct {
		name          string
		running, next map[string]any
		want          string
	}{
		{"nothing changes", none, none, "[]"},
		{"a field no manager reads", none, with(none, "maxPods", 50.0), "[]"},
		{"cpu policy none to static", none, static,
			"[cpu_manager_state (cpuManagerPolicy: none → static)]"},
		{"cpu policy static back to none", static, none,
			"[cpu_manager_state (cpuManagerPolicy: static → none)]"},
		{"reserved CPUs under static", static, with(static, "reservedSystemCPUs", "0-1"),
			"[cpu_manager_state (reservedSystemCPUs: 0 → 0-1)]"},
		{"reserved CPUs under none: no state holds them", none, with(none, "reservedSystemCPUs", "0"), "[]"},
		{"kubeReserved cpu under static", with(static, "kubeReserved", map[string]any{"cpu": "500m"}),
			with(static, "kubeReserved", map[string]any{"cpu": "1"}),
			"[cpu_manager_state (kubeReserved.cpu: 500m → 1)]"},
		{"kubeReserved memory under static cpu only", with(static, "kubeReserved", map[string]any{"memory": "1Gi"}),
			with(static, "kubeReserved", map[string]any{"memory": "2Gi"}), "[]"},
		{"memory policy None to Static", none, with(none, "memoryManagerPolicy", "Static"),
			"[memory_manager_state (memoryManagerPolicy: None → Static)]"},
		{"reservedMemory under Static", with(none, "memoryManagerPolicy", "Static", "reservedMemory", []any{"a"}),
			with(none, "memoryManagerPolicy", "Static", "reservedMemory", []any{"b"}),
			"[memory_manager_state (reservedMemory: [a] → [b])]"},
		{"both managers", none, with(static, "memoryManagerPolicy", "Static"),
			"[cpu_manager_state (cpuManagerPolicy: none → static) memory_manager_state (memoryManagerPolicy: None → Static)]"},
		{"a policy the running config leaves unset", map[string]any{}, map[string]any{"cpuManagerPolicy": "static"},
			"[cpu_manager_state (cpuManagerPolicy: unset → static)]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := fmt.Sprint(Resets(tc.running, tc.next)); got != tc.want {
				t.Errorf("Resets = %s, want %s", got, tc.want)
			}
		})
	}
}

// TestFiles: every file a Reset can name is listed, and nothing else.
func TestFiles(t *testing.T) {
	if got := fmt.Sprint(Files()); got != "[cpu_manager_state memory_manager_state]" {
		t.Errorf("Files = %s", got)
	}
	all := Resets(map[string]any{}, map[string]any{"cpuManagerPolicy": "static", "memoryManagerPolicy": "Static"})
	if len(all) != len(Files()) {
		t.Fatalf("Resets named %v, Files %v", all, Files())
	}
	for i, r := range all {
		if r.File != Files()[i] {
			t.Errorf("Reset %d names %s, Files %s", i, r.File, Files()[i])
		}
	}
}
