// SPDX-License-Identifier: Apache-2.0

package capacity

import (
	"fmt"
	"reflect"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	statsapi "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
)

// EvictionFields are the config fields that decide when the kubelet's eviction manager evicts pods.
var EvictionFields = []string{"evictionHard", "evictionSoft", "evictionMinimumReclaim"}

// EvictionChanges says whether going from running to next changes when the kubelet evicts pods.
func EvictionChanges(running, next map[string]any) bool {
	for _, f := range EvictionFields {
		if !reflect.DeepEqual(running[f], next[f]) {
			return true
		}
	}
	return false
}

// Pressure is an eviction signal the node would cross under a config: what the kubelet observes now, the
// threshold it would compare it with.
type Pressure struct {
	Signal    string `json:"signal"`
	Kind      string `json:"kind"` // "hard", or "soft" (evicts once it held for evictionSoftGracePeriod)
	Observed  string `json:"observed"`
	Threshold string `json:"threshold"`
	// Already: the running config's threshold of the signal is crossed too; the kubelet is evicting now.
	Already bool `json:"already,omitempty"`
}

// EvictedPod is a pod the kubelet would evict to get a signal back above its threshold, or reject when
// it admits the node's pods again under the pressure (BestEffort pods under MemoryPressure).
type EvictedPod struct {
	Pod      string `json:"pod"` // namespace/name
	Signal   string `json:"signal"`
	Usage    string `json:"usage"`
	Rejected bool   `json:"rejected,omitempty"`
}

// Eviction is what a config's eviction thresholds do to a node as it is now.
type Eviction struct {
	Pressure []Pressure   `json:"pressure,omitempty"`
	Evicted  []EvictedPod `json:"evicted,omitempty"`
	// Short says, per signal, what is still missing once every pod the kubelet may evict is gone.
	Short []string `json:"short,omitempty"`
}

// observation is one eviction signal as the kubelet's eviction manager makes it from the stats summary
// (makeSignalObservations): what is available, and the capacity a percentage threshold is taken of.
type observation struct {
	available, capacity int64
}

// observe reads the signals the kubelet evicts on from a summary of the node's stats.
func observe(s *statsapi.Summary) map[string]observation {
	out := map[string]observation{}
	if m := s.Node.Memory; m != nil && m.AvailableBytes != nil && m.WorkingSetBytes != nil {
		out["memory.available"] = observation{int64(*m.AvailableBytes), int64(*m.AvailableBytes + *m.WorkingSetBytes)}
	}
	if fs := s.Node.Fs; fs != nil {
		if fs.AvailableBytes != nil && fs.CapacityBytes != nil {
			out["nodefs.available"] = observation{int64(*fs.AvailableBytes), int64(*fs.CapacityBytes)}
		}
		if fs.InodesFree != nil && fs.Inodes != nil {
			out["nodefs.inodesFree"] = observation{int64(*fs.InodesFree), int64(*fs.Inodes)}
		}
	}
	if rt := s.Node.Runtime; rt != nil && rt.ImageFs != nil {
		fs := rt.ImageFs
		if fs.AvailableBytes != nil && fs.CapacityBytes != nil {
			out["imagefs.available"] = observation{int64(*fs.AvailableBytes), int64(*fs.CapacityBytes)}
		}
		if fs.InodesFree != nil && fs.Inodes != nil {
			out["imagefs.inodesFree"] = observation{int64(*fs.InodesFree), int64(*fs.Inodes)}
		}
	}
	if r := s.Node.Rlimit; r != nil && r.MaxPID != nil && r.NumOfRunningProcesses != nil {
		out["pid.available"] = observation{*r.MaxPID - int64(*r.NumOfRunningProcesses), *r.MaxPID}
	}
	return out
}

// threshold is a config's threshold of signal in field (evictionHard, evictionSoft, evictionMinimumReclaim)
// against capacity: a quantity, or a percentage of capacity (0% and 100% mean none, as the kubelet
// parses them); ok false when the field does not set the signal.
func threshold(cfg map[string]any, field, signal string, capacity int64) (int64, bool, error) {
	m, _ := cfg[field].(map[string]any)
	s, _ := m[signal].(string)
	if s == "" {
		return 0, false, nil
	}
	if pct, isPct := strings.CutSuffix(s, "%"); isPct {
		v, err := strconv.ParseFloat(pct, 32)
		if err != nil || v < 0 || v > 100 {
			return 0, false, fmt.Errorf("%s %s %q: not a percentage", field, signal, s)
		}
		if v == 0 || v == 100 {
			return 0, false, nil
		}
		return int64(float64(float32(v)/100) * float64(capacity)), true, nil
	}
	q, err := resource.ParseQuantity(s)
	if err != nil {
		return 0, false, fmt.Errorf("%s %s %q: %w", field, signal, s, err)
	}
	return q.Value(), true, nil
}

// Evictions predicts what next's eviction thresholds do to the node as summary shows it now: each
// signal the kubelet observes below a threshold of next (a hard one at once, a soft one once it held for
// its grace period) is pressure; for memory.available it names the pods the kubelet would stop: under a
// hard threshold the restarted kubelet sees MemoryPressure as it admits the node's pods again, and rejects
// every BestEffort pod (its eviction manager's admission: "The node had condition: [MemoryPressure]");
// then it evicts in its order (pkg/kubelet/eviction rankMemoryPressure: pods using more than they request
// first, then lower priority, then the largest use above the request) until the signal is back above the
// threshold plus evictionMinimumReclaim. Critical pods are never evicted. Disk and PID pressure is reported without
// names: the kubelet first reclaims images and dead containers there.
func Evictions(summary *statsapi.Summary, running, next map[string]any, pods []corev1.Pod) (Eviction, error) {
	var e Eviction
	obs := observe(summary)
	signals := make([]string, 0, len(obs))
	for s := range obs {
		signals = append(signals, s)
	}
	sort.Strings(signals)
	for _, signal := range signals {
		o := obs[signal]
		for _, kind := range []string{"hard", "soft"} {
			field := "eviction" + strings.ToUpper(kind[:1]) + kind[1:]
			thr, ok, err := threshold(next, field, signal, o.capacity)
			if err != nil {
				return Eviction{}, err
			}
			if !ok || o.available >= thr {
				continue
			}
			was, wasSet, err := threshold(running, field, signal, o.capacity)
			if err != nil {
				was, wasSet = 0, false // the running config was read by the kubelet; a prediction does not need it
			}
			e.Pressure = append(e.Pressure, Pressure{Signal: signal, Kind: kind, Observed: quantity(signal, o.available),
				Threshold: quantity(signal, thr), Already: wasSet && o.available < was})
			if signal != "memory.available" || kind == "soft" && hasHard(e.Pressure, signal) {
				continue
			}
			reclaim, _, err := threshold(next, "evictionMinimumReclaim", signal, o.capacity)
			if err != nil {
				return Eviction{}, err
			}
			evicted, short := evictForMemory(summary, pods, thr+reclaim-o.available, kind == "hard")
			e.Evicted = append(e.Evicted, evicted...)
			if short > 0 {
				e.Short = append(e.Short, fmt.Sprintf("%s still %s below its %s threshold after every pod that can be "+
					"evicted", signal, quantity(signal, short), kind))
			}
		}
	}
	return e, nil
}

func hasHard(ps []Pressure, signal string) bool {
	for _, p := range ps {
		if p.Signal == signal && p.Kind == "hard" {
			return true
		}
	}
	return false
}

func quantity(signal string, v int64) string {
	if strings.HasSuffix(signal, "inodesFree") || signal == "pid.available" {
		return strconv.FormatInt(v, 10)
	}
	return resource.NewQuantity(v, resource.BinarySI).String()
}

// evictForMemory takes, when rejecting, the BestEffort pods the kubelet rejects as it admits them again
// under MemoryPressure, then ranks the others as the kubelet does under memory pressure and takes them
// until the working sets of all taken free need bytes; short is what is still missing after all of them.
func evictForMemory(summary *statsapi.Summary, pods []corev1.Pod, need int64, rejecting bool) (evicted []EvictedPod,
	short int64) {
	usage := map[types.UID]int64{}
	for _, ps := range summary.Pods {
		if ps.Memory != nil && ps.Memory.WorkingSetBytes != nil {
			usage[types.UID(ps.PodRef.UID)] = int64(*ps.Memory.WorkingSetBytes)
		}
	}
	var cands []*corev1.Pod
	for i := range pods {
		p := &pods[i]
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed || critical(p) {
			continue
		}
		if rejecting && p.Status.QOSClass == corev1.PodQOSBestEffort { // the apiserver sets it on every pod
			u := usage[p.UID]
			evicted = append(evicted, EvictedPod{Pod: p.Namespace + "/" + p.Name, Signal: "memory.available",
				Usage: quantity("memory.available", u), Rejected: true})
			need -= u
			continue
		}
		cands = append(cands, p)
	}
	request := func(p *corev1.Pod) int64 {
		q := podRequests(p)[corev1.ResourceMemory]
		return q.Value()
	}
	prio := func(p *corev1.Pod) int32 {
		if p.Spec.Priority != nil {
			return *p.Spec.Priority
		}
		return 0
	}
	sort.SliceStable(cands, func(i, j int) bool {
		a, b := cands[i], cands[j]
		ua, okA := usage[a.UID]
		ub, okB := usage[b.UID]
		if okA != okB { // no stats: evicted first
			return !okA
		}
		if !okA {
			return false
		}
		if ea, eb := ua > request(a), ub > request(b); ea != eb {
			return ea
		}
		if pa, pb := prio(a), prio(b); pa != pb {
			return pa < pb
		}
		return ua-request(a) > ub-request(b)
	})
	for _, p := range cands {
		if need <= 0 {
			break
		}
		u := usage[p.UID]
		evicted = append(evicted, EvictedPod{Pod: p.Namespace + "/" + p.Name, Signal: "memory.available",
			Usage: quantity("memory.available", u)})
		need -= u
	}
	return evicted, max(need, 0)
}

// Findings are what e says of node, a line each.
func (e Eviction) Findings(node string) []string {
	var out []string
	for _, p := range e.Pressure {
		line := fmt.Sprintf("%s: %s %s is below the new %s eviction threshold %s", node, p.Signal, p.Observed, p.Kind,
			p.Threshold)
		if p.Already {
			line += " (and below the running config's: the kubelet evicts already)"
		}
		switch {
		case p.Signal == "memory.available" && p.Kind == "soft":
			line += ": the kubelet evicts pods once it holds for evictionSoftGracePeriod"
		case p.Signal != "memory.available":
			line += ": the kubelet reports pressure, reclaims images and dead containers, then evicts pods"
		}
		out = append(out, line)
	}
	for _, ev := range e.Evicted {
		if ev.Rejected {
			out = append(out, fmt.Sprintf("%s: %s would be evicted: BestEffort, rejected under MemoryPressure when the "+
				"kubelet admits it again (it uses %s)", node, ev.Pod, ev.Usage))
			continue
		}
		out = append(out, fmt.Sprintf("%s: %s would be evicted (memory.available; it uses %s)", node, ev.Pod, ev.Usage))
	}
	for _, s := range e.Short {
		out = append(out, node+": "+s)
	}
	return out
}
