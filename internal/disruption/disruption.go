// SPDX-License-Identifier: Apache-2.0

// Package disruption says which kubelet config changes the kubelet refuses to start with on a node whose
// resource managers checkpointed state under the running config: such a change needs the node drained and
// the named state file removed first, and restarting the kubelet into it only fails.
package disruption

import (
	"fmt"
	"reflect"
	"sort"
	"strings"
)

// Reset is a state file of the kubelet that a change invalidates, and the changed fields that do it.
type Reset struct {
	// File is the state file's name in the kubelet's root directory (/var/lib/kubelet).
	File string
	// Fields are the changed config fields (v1beta1 JSON names; "systemReserved.cpu" for a key of one).
	Fields []string
}

// String says what must happen, e.g. "cpu_manager_state (cpuManagerPolicy: none → static)".
func (r Reset) String() string { return r.File + " (" + strings.Join(r.Fields, ", ") + ")" }

// manager is one resource manager's checkpoint and the fields its state is computed from.
type manager struct {
	file   string
	policy string
	// static is the policy value under which the reservations are part of the state (the CPU manager's
	// "static", the memory manager's "Static"); under any other, only a policy change invalidates it.
	static string
	// reserved are the fields that, under the static policy, decide what the state holds.
	reserved []string
}

// The kubelet's CPU manager refuses a cpu_manager_state written under another policy ("configured policy
// ... differs from state checkpoint policy ..., please drain this node and delete the CPU manager checkpoint
// file") and, under the static policy, one whose CPU sets another reservation produced (reservedSystemCPUs,
// or the CPUs kubeReserved and systemReserved round up to). The memory manager does the same with
// memory_manager_state under its Static policy and reservedMemory (k8s.io/kubernetes pkg/kubelet/cm).
var managers = []manager{
	{file: "cpu_manager_state", policy: "cpuManagerPolicy", static: "static",
		reserved: []string{"reservedSystemCPUs", "kubeReserved.cpu", "systemReserved.cpu"}},
	{file: "memory_manager_state", policy: "memoryManagerPolicy", static: "Static",
		reserved: []string{"reservedMemory", "kubeReserved.memory", "systemReserved.memory"}},
}

// Resets are the state files that going from running to next (complete v1beta1 configs as JSON maps, as
// the kubelet's /configz shows them) invalidates, with the fields that do; none when the kubelet restarts
// into next without a drain.
func Resets(running, next map[string]any) []Reset {
	var out []Reset
	for _, m := range managers {
		var changed []string
		from, to := lookup(running, m.policy), lookup(next, m.policy)
		if !reflect.DeepEqual(from, to) {
			changed = append(changed, fmt.Sprintf("%s: %v → %v", m.policy, show(from), show(to)))
		} else if to == m.static {
			for _, f := range m.reserved {
				if a, b := lookup(running, f), lookup(next, f); !reflect.DeepEqual(a, b) {
					changed = append(changed, fmt.Sprintf("%s: %v → %v", f, show(a), show(b)))
				}
			}
		}
		if len(changed) > 0 {
			sort.Strings(changed)
			out = append(out, Reset{File: m.file, Fields: changed})
		}
	}
	return out
}

// Files are the names of every state file Resets may name, in its order: what a node drained for a change
// may lose when it cannot tell what the kubelet runs. A caller that removes files takes their names from
// here or from a Reset, never from elsewhere.
func Files() []string {
	out := make([]string, 0, len(managers))
	for _, m := range managers {
		out = append(out, m.file)
	}
	return out
}

// lookup reads a field, or a key of one ("kubeReserved.cpu"); nil when absent.
func lookup(cfg map[string]any, path string) any {
	field, key, nested := strings.Cut(path, ".")
	v := cfg[field]
	if !nested {
		return v
	}
	m, _ := v.(map[string]any)
	return m[key]
}

func show(v any) any {
	if v == nil {
		return "unset"
	}
	return v
}
