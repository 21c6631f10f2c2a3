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
	"k8s.io/klog/v2"
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
	// Already: the running config's threshold of the signal is crossed too, and no lower: the kubelet is
	// evicting as much now. (A higher new threshold has it evict more.)
	Already bool `json:"already,omitempty"`
}

// EvictedPod is a pod the kubelet would stop: evict to get memory.available back above its threshold
// (Signal), or reject as it admits the node's pods again under pressure conditions (Rejected names them).
type EvictedPod struct {
	Pod      string `json:"pod"` // namespace/name
	Signal   string `json:"signal,omitempty"`
	Usage    string `json:"usage"`
	Rejected string `json:"rejected,omitempty"`
	bytes    int64
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

// Evictions predicts what next's eviction thresholds do to the node as summary shows it now, as
// pkg/kubelet/eviction decides. Each signal observed below a threshold of next is pressure, and sets the
// node's pressure condition at once (a soft threshold's grace period delays only its evictions). The
// restarted kubelet admits the node's pods again under those conditions: under MemoryPressure alone it
// rejects BestEffort pods that do not tolerate the memory-pressure taint, under any other every pod;
// critical pods never (Admit). Whether the first eviction check comes before the pods are admitted again
// is a race, hence "may" for those. Then, for memory.available, it evicts in its order (rankMemoryPressure:
// pods using more than they request first, then lower priority, then the largest use above the request)
// until the signal is back above the threshold plus evictionMinimumReclaim. Disk and PID pressure names
// no further pods: the kubelet first reclaims images and dead containers there.
func Evictions(summary *statsapi.Summary, running, next map[string]any, pods []corev1.Pod) (Eviction, error) {
	var e Eviction
	obs := observe(summary)
	signals := make([]string, 0, len(obs))
	for s := range obs {
		signals = append(signals, s)
	}
	sort.Strings(signals)
	type memoryNeed struct {
		kind string
		need int64
	}
	var needs []memoryNeed
	conditions := map[corev1.NodeConditionType]bool{}
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
				Threshold: quantity(signal, thr), Already: wasSet && o.available < was && was >= thr})
			conditions[conditionOf(signal)] = true
			if signal != "memory.available" {
				continue
			}
			reclaim, _, err := threshold(next, "evictionMinimumReclaim", signal, o.capacity)
			if err != nil {
				return Eviction{}, err
			}
			needs = append(needs, memoryNeed{kind: kind, need: thr + reclaim - o.available})
		}
	}
	usage := podUsage(summary)
	e.Evicted = rejectedUnder(conditions, pods, usage)
	freed := int64(0)
	for _, r := range e.Evicted {
		freed += r.bytes
	}
	// The largest need decides which pods go: with a hard and a soft threshold crossed, the kubelet evicts
	// for the hard one at once and goes on for the soft one once its grace period passed.
	var worst *memoryNeed
	for i := range needs {
		if worst == nil || needs[i].need > worst.need {
			worst = &needs[i]
		}
	}
	if worst != nil {
		evicted, short := evictForMemory(pods, usage, worst.need-freed, e.Evicted)
		e.Evicted = append(e.Evicted, evicted...)
		if short > 0 {
			e.Short = append(e.Short, fmt.Sprintf("memory.available still %s below its %s threshold after every pod "+
				"that can be evicted", quantity("memory.available", short), worst.kind))
		}
	}
	return e, nil
}

// conditionOf is the node condition a signal's pressure sets.
func conditionOf(signal string) corev1.NodeConditionType {
	switch signal {
	case "memory.available":
		return corev1.NodeMemoryPressure
	case "pid.available":
		return corev1.NodePIDPressure
	}
	return corev1.NodeDiskPressure
}

// podUsage is each pod's memory working set in the summary, by UID; a pod in the summary without memory
// stats uses 0 (the kubelet finds it and reads no usage), one missing is not in the map.
func podUsage(summary *statsapi.Summary) map[types.UID]int64 {
	usage := map[types.UID]int64{}
	for _, ps := range summary.Pods {
		var u int64
		if ps.Memory != nil && ps.Memory.WorkingSetBytes != nil {
			u = int64(*ps.Memory.WorkingSetBytes)
		}
		usage[types.UID(ps.PodRef.UID)] = u
	}
	return usage
}

// evictable are the pods the kubelet may stop for pressure: running, not critical.
func evictable(pods []corev1.Pod) []*corev1.Pod {
	var out []*corev1.Pod
	for i := range pods {
		p := &pods[i]
		if p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed && !critical(p) {
			out = append(out, p)
		}
	}
	return out
}

// memoryPressureTaint is what a BestEffort pod must tolerate to be admitted under MemoryPressure.
var memoryPressureTaint = corev1.Taint{Key: corev1.TaintNodeMemoryPressure, Effect: corev1.TaintEffectNoSchedule}

// rejectedUnder are the pods the restarted kubelet may reject as it admits them again under conditions
// (the eviction manager's Admit).
func rejectedUnder(conditions map[corev1.NodeConditionType]bool, pods []corev1.Pod,
	usage map[types.UID]int64) []EvictedPod {
	if len(conditions) == 0 {
		return nil
	}
	var names []string
	for c := range conditions {
		names = append(names, string(c))
	}
	sort.Strings(names)
	onlyMemory := len(conditions) == 1 && conditions[corev1.NodeMemoryPressure]
	var out []EvictedPod
	for _, p := range evictable(pods) {
		if onlyMemory && (!bestEffort(p) || tolerates(p, &memoryPressureTaint)) {
			continue
		}
		u := usage[p.UID]
		out = append(out, EvictedPod{Pod: p.Namespace + "/" + p.Name, Usage: quantity("memory.available", u),
			Rejected: strings.Join(names, ", "), bytes: u})
	}
	return out
}

// bestEffort says whether the pod's QoS class is BestEffort: status.qosClass, which the apiserver sets on
// every pod; where it is empty, no container (init containers included) requests or limits CPU or memory.
func bestEffort(p *corev1.Pod) bool {
	if p.Status.QOSClass != "" {
		return p.Status.QOSClass == corev1.PodQOSBestEffort
	}
	for _, cs := range [][]corev1.Container{p.Spec.InitContainers, p.Spec.Containers} {
		for _, c := range cs {
			for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
				if _, ok := c.Resources.Requests[r]; ok {
					return false
				}
				if _, ok := c.Resources.Limits[r]; ok {
					return false
				}
			}
		}
	}
	return true
}

func tolerates(p *corev1.Pod, taint *corev1.Taint) bool {
	for i := range p.Spec.Tolerations {
		if p.Spec.Tolerations[i].ToleratesTaint(klog.Background(), taint, false) {
			return true
		}
	}
	return false
}

// evictForMemory ranks the pods the kubelet may evict as it does under memory pressure (leaving out those
// already rejected) and takes them until their working sets free need bytes; short is what is still
// missing after all of them.
func evictForMemory(pods []corev1.Pod, usage map[types.UID]int64, need int64, rejected []EvictedPod) (
	evicted []EvictedPod, short int64) {
	gone := map[string]bool{}
	for _, r := range rejected {
		gone[r.Pod] = true
	}
	var cands []*corev1.Pod
	for _, p := range evictable(pods) {
		if !gone[p.Namespace+"/"+p.Name] {
			cands = append(cands, p)
		}
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

// Stops says whether a restart into the config stops pods the running config does not: pods would be
// evicted or rejected, and some signal is crossed that the running thresholds do not cross (where they do,
// the kubelet evicts already, restart or not).
func (e Eviction) Stops() bool {
	if len(e.Evicted) == 0 {
		return false
	}
	for _, p := range e.Pressure {
		if !p.Already {
			return true
		}
	}
	return false
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
		if ev.Rejected != "" {
			out = append(out, fmt.Sprintf("%s: %s may be rejected (Evicted) when the restarted kubelet admits it again "+
				"under %s (it uses %s)", node, ev.Pod, ev.Rejected, ev.Usage))
			continue
		}
		out = append(out, fmt.Sprintf("%s: %s would be evicted (memory.available; it uses %s)", node, ev.Pod, ev.Usage))
	}
	for _, s := range e.Short {
		out = append(out, node+": "+s)
	}
	return out
}

func quantity(signal string, v int64) string {
	if strings.HasSuffix(signal, "inodesFree") || signal == "pid.available" {
		return strconv.FormatInt(v, 10)
	}
	return resource.NewQuantity(v, resource.BinarySI).String()
}
