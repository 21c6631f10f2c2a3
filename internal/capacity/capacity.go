// SPDX-License-Identifier: Apache-2.0

// Package capacity predicts what a kubelet config does to a node's allocatable and to the pods running
// there, as the kubelet computes allocatable and re-admits its pods when it restarts. kubectl dkc diff and
// rollout --dry-run print it; the pool controller refuses a revision on it (CapacityRefused).
package capacity

import (
	"fmt"
	"math"
	"reflect"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	resourcehelper "k8s.io/component-helpers/resource"
	"k8s.io/utils/cpuset"
)

// Fields are the config fields that change a node's allocatable.
var Fields = []string{"maxPods", "podsPerCore", "kubeReserved", "systemReserved", "reservedSystemCPUs", "evictionHard"}

// systemCriticalPriority is the priority from which the kubelet treats a pod as critical
// (scheduling.SystemCriticalPriority): it evicts other pods to admit one rather than reject it.
const systemCriticalPriority = 2000000000

// mirrorAnnotation marks a static pod's mirror in the API (kubelettypes.ConfigMirrorAnnotationKey).
const mirrorAnnotation = "kubernetes.io/config.mirror"

// sourceAnnotation is where the kubelet got a pod from (kubelettypes.ConfigSourceAnnotationKey): "api" for
// pods from the apiserver; a static pod, as the kubelet's own /pods lists it, says "file" or "http".
const sourceAnnotation = "kubernetes.io/config.source"

// ResourceFit is one resource of a node: what the kubelet allocates now, what it would under a config, and
// what the pods on the node request; "-" where the node has none of it.
type ResourceFit struct {
	Resource  corev1.ResourceName `json:"resource"`
	Now       string              `json:"now"`
	Next      string              `json:"next"`
	Requested string              `json:"requested"`
}

// UnfitPod is a pod the kubelet may reject when it restarts with a config: it admits the pods bound to the
// node again, oldest first, each against what the config leaves once the earlier ones are admitted. A
// critical pod is not rejected: the kubelet evicts lower-priority pods to admit it (Preempts).
type UnfitPod struct {
	Pod      string              `json:"pod"` // namespace/name
	Resource corev1.ResourceName `json:"resource"`
	Reason   string              `json:"reason"`
	Preempts bool                `json:"preempts,omitempty"`
}

// Capacity is a config's effect on a node's allocatable and on the pods running there.
type Capacity struct {
	Resources []ResourceFit `json:"resources"`
	Unfit     []UnfitPod    `json:"unfit,omitempty"`
	// NotStarting says why the kubelet would refuse to start: reservations over the node's capacity.
	NotStarting string `json:"notStarting,omitempty"`
	// Unpredicted says why no pod is named: the node's allocatable now is not what its running config gives
	// (a flag such as --max-pods or --kube-reserved wins over the config), so neither is the prediction.
	Unpredicted string `json:"unpredicted,omitempty"`
	// Eviction is what the config's eviction thresholds do to the node as its stats show it now; nil when
	// they do not change or were not looked at (EvictionUnpredicted says why).
	Eviction            *Eviction `json:"eviction,omitempty"`
	EvictionUnpredicted string    `json:"evictionUnpredicted,omitempty"`
}

// Changes says whether going from running to next changes what the kubelet allocates.
func Changes(running, next map[string]any) bool {
	for _, f := range Fields {
		if !reflect.DeepEqual(running[f], next[f]) {
			return true
		}
	}
	return false
}

// Under computes what node's kubelet allocates under next (a complete v1beta1 config as JSON values)
// as the kubelet does — capacity less kubeReserved, systemReserved, the hard eviction threshold of memory and
// the hugepages; pods from maxPods and podsPerCore — and which of pods it may no longer admit. running is
// the config the kubelet runs: only where it gives the node's allocatable now is the prediction made.
func Under(node *corev1.Node, running, next map[string]any, pods []corev1.Pod) (Capacity, error) {
	after, err := allocatableUnder(node.Status.Capacity, next)
	if err != nil {
		return Capacity{}, fmt.Errorf("node %s: %w", node.Name, err)
	}
	live := admitted(pods)
	requested := corev1.ResourceList{corev1.ResourcePods: *resource.NewQuantity(int64(len(live)), resource.DecimalSI)}
	for i := range live {
		for r, q := range podRequests(&live[i]) {
			sum := requested[r]
			sum.Add(q)
			requested[r] = sum
		}
	}
	c := Capacity{NotStarting: after.notStarting}
	for _, r := range []corev1.ResourceName{corev1.ResourcePods, corev1.ResourceCPU, corev1.ResourceMemory} {
		f := ResourceFit{Resource: r, Now: "-", Next: "-", Requested: "-"}
		if q, ok := node.Status.Allocatable[r]; ok {
			f.Now = q.String()
		}
		if q, ok := after.list[r]; ok {
			f.Next = q.String()
		}
		if q, ok := requested[r]; ok {
			f.Requested = q.String()
		}
		c.Resources = append(c.Resources, f)
	}
	if c.NotStarting != "" {
		return c, nil
	}
	if now, err := allocatableUnder(node.Status.Capacity, running); err == nil {
		for _, r := range []corev1.ResourceName{corev1.ResourcePods, corev1.ResourceCPU, corev1.ResourceMemory} {
			a, b := node.Status.Allocatable[r], now.list[r]
			if a.Cmp(b) != 0 {
				c.Unpredicted = fmt.Sprintf("the node's allocatable %s is %s, not the %s its running config gives (a "+
					"kubelet flag wins over the config): no pod is named", r, a.String(), b.String())
				return c, nil
			}
		}
	}
	c.Unfit = admit(live, after.list)
	return c, nil
}

// OnRestart is Under for a node's kubelet whose running config is known as it runs (its /configz, its flags
// applied, as the sidecar reads it) and next with the node's flags applied too: the node's allocatable now is
// what running leaves of capacity, so no flag can make the prediction wrong.
func OnRestart(node string, capacity corev1.ResourceList, running, next map[string]any,
	pods []corev1.Pod) (Capacity, error) {
	now, err := allocatableUnder(capacity, running)
	if err != nil {
		return Capacity{}, fmt.Errorf("node %s: %w", node, err)
	}
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node},
		Status: corev1.NodeStatus{Capacity: capacity, Allocatable: now.list}}
	return Under(n, running, next, pods)
}

// admitted are the pods the kubelet admits again when it restarts: those bound to the node that have not
// finished, oldest first (by name among pods of the same second: the kubelet's own sort of them is not
// stable). Mirror pods stand for static pods, which the kubelet admits from their files, as critical.
func admitted(pods []corev1.Pod) []corev1.Pod {
	var out []corev1.Pod
	for _, p := range pods {
		if p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
			out = append(out, p)
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i].CreationTimestamp, out[j].CreationTimestamp
		if !a.Equal(&b) {
			return a.Before(&b)
		}
		return out[i].Namespace+"/"+out[i].Name < out[j].Namespace+"/"+out[j].Name
	})
	return out
}

// critical is the kubelet's IsCriticalPod for a pod as the API has it.
func critical(p *corev1.Pod) bool {
	_, mirror := p.Annotations[mirrorAnnotation]
	source, fromKubelet := p.Annotations[sourceAnnotation]
	static := fromKubelet && source != "api"
	return mirror || static || (p.Spec.Priority != nil && *p.Spec.Priority >= systemCriticalPriority)
}

// podRequests is what the kubelet admits a pod with: its allocated resources where the status has them
// (an in-place resize), else its spec's.
func podRequests(p *corev1.Pod) corev1.ResourceList {
	return resourcehelper.PodRequests(p, resourcehelper.PodResourcesOptions{UseStatusResources: true})
}

// admit plays the kubelet's admission of pods, in order, against alloc: a pod that does not fit (one pod
// too many, or more CPU or memory requested than is left) is rejected and takes nothing, unless it is
// critical: then the kubelet evicts lower-priority pods to admit it, and it takes its share.
func admit(pods []corev1.Pod, alloc corev1.ResourceList) []UnfitPod {
	var unfit []UnfitPod
	admittedPods := int64(0)
	used := corev1.ResourceList{}
	maxPods := alloc[corev1.ResourcePods]
	for i := range pods {
		p := &pods[i]
		reqs := podRequests(p)
		var short *UnfitPod
		if admittedPods+1 > maxPods.Value() {
			short = &UnfitPod{Resource: corev1.ResourcePods,
				Reason: fmt.Sprintf("pod %d of %d allowed (OutOfpods)", admittedPods+1, maxPods.Value())}
		}
		for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			q, ok := reqs[r]
			a, has := alloc[r]
			if short != nil || !ok || q.IsZero() || !has {
				continue
			}
			total := used[r].DeepCopy()
			total.Add(q)
			if total.Cmp(a) > 0 {
				left := a.DeepCopy()
				left.Sub(used[r])
				short = &UnfitPod{Resource: r, Reason: fmt.Sprintf("requests %s of %s, %s left (OutOf%s)", q.String(), r,
					left.String(), r)}
			}
		}
		if short != nil {
			short.Pod = p.Namespace + "/" + p.Name
			if !critical(p) {
				unfit = append(unfit, *short)
				continue
			}
			short.Preempts = true
			short.Reason = "critical, " + short.Reason + ": the kubelet evicts lower-priority pods to admit it"
			unfit = append(unfit, *short)
		}
		admittedPods++
		for r, q := range reqs {
			sum := used[r]
			sum.Add(q)
			used[r] = sum
		}
	}
	return unfit
}

// allocation is what a config leaves of a node's capacity.
type allocation struct {
	list corev1.ResourceList
	// notStarting: the reservations exceed the capacity, and the kubelet refuses to start.
	notStarting string
}

// allocatableUnder is the kubelet's allocatable for capacity under cfg: capacity − kubeReserved −
// systemReserved (for CPU, or the CPUs of reservedSystemCPUs) − for memory the hard eviction threshold of
// memory.available (a quantity, or a percentage of capacity) and the hugepages, never below zero; pods
// are maxPods, or podsPerCore × CPUs when that is set and lower. Reservations over the capacity keep the
// kubelet from starting (validateNodeAllocatable).
func allocatableUnder(capacity corev1.ResourceList, cfg map[string]any) (allocation, error) {
	out := allocation{list: corev1.ResourceList{}}
	var over []string
	for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		c, ok := capacity[r]
		if !ok {
			continue
		}
		var reservation resource.Quantity
		for _, f := range []string{"kubeReserved", "systemReserved"} {
			v, err := reserved(cfg, f, r)
			if err != nil {
				return allocation{}, err
			}
			reservation.Add(v)
		}
		if r == corev1.ResourceCPU {
			// The kubelet reserves the CPUs of reservedSystemCPUs as system-reserved CPU (it refuses the field
			// beside a kubeReserved or systemReserved cpu).
			n, err := reservedCPUs(cfg)
			if err != nil {
				return allocation{}, err
			}
			reservation.Add(*resource.NewQuantity(int64(n), resource.DecimalSI))
		}
		if r == corev1.ResourceMemory {
			v, err := evictionMemory(cfg, c)
			if err != nil {
				return allocation{}, err
			}
			reservation.Add(v)
		}
		if reservation.Cmp(c) > 0 {
			over = append(over, fmt.Sprintf("%s reserved %s, capacity %s", r, reservation.String(), c.String()))
		}
		q := c.DeepCopy()
		q.Sub(reservation)
		if r == corev1.ResourceMemory {
			for name, h := range capacity {
				if strings.HasPrefix(string(name), corev1.ResourceHugePagesPrefix) {
					q.Sub(h)
				}
			}
		}
		if q.Sign() < 0 {
			q = *resource.NewQuantity(0, q.Format)
		}
		out.list[r] = q
	}
	if len(over) > 0 {
		out.notStarting = "the kubelet refuses to start: invalid Node Allocatable configuration (" +
			strings.Join(over, "; ") + ")"
	}
	pods := number(cfg["maxPods"])
	if perCore := number(cfg["podsPerCore"]); perCore > 0 {
		if cpu, ok := capacity[corev1.ResourceCPU]; ok {
			pods = math.Min(pods, perCore*float64(cpu.Value()))
		}
	}
	out.list[corev1.ResourcePods] = *resource.NewQuantity(int64(pods), resource.DecimalSI)
	return out, nil
}

// reserved is cfg's field (kubeReserved, systemReserved) for resource r; zero when unset.
func reserved(cfg map[string]any, field string, r corev1.ResourceName) (resource.Quantity, error) {
	m, _ := cfg[field].(map[string]any)
	s, _ := m[string(r)].(string)
	if s == "" {
		return resource.Quantity{}, nil
	}
	q, err := resource.ParseQuantity(s)
	if err != nil {
		return resource.Quantity{}, fmt.Errorf("%s.%s %q: %w", field, r, s, err)
	}
	return q, nil
}

// reservedCPUs is the number of CPUs in cfg's reservedSystemCPUs (a cpuset such as "0-1,6"); 0 when unset.
func reservedCPUs(cfg map[string]any) (int, error) {
	v, _ := cfg["reservedSystemCPUs"].(string)
	if v == "" {
		return 0, nil
	}
	set, err := cpuset.Parse(v)
	if err != nil {
		return 0, fmt.Errorf("reservedSystemCPUs %q: %w", v, err)
	}
	return set.Size(), nil
}

// evictionMemory is the hard eviction threshold of memory.available as the kubelet parses it: a quantity,
// or a percentage of capacity (float32, as the kubelet's; 0% and 100% mean none).
func evictionMemory(cfg map[string]any, capacity resource.Quantity) (resource.Quantity, error) {
	m, _ := cfg["evictionHard"].(map[string]any)
	s, _ := m["memory.available"].(string)
	if s == "" || s == "0%" || s == "100%" {
		return resource.Quantity{}, nil
	}
	if pct, ok := strings.CutSuffix(s, "%"); ok {
		v, err := strconv.ParseFloat(pct, 32)
		if err != nil || v < 0 {
			return resource.Quantity{}, fmt.Errorf("evictionHard memory.available %q: not a percentage", s)
		}
		return *resource.NewQuantity(int64(float64(float32(v)/100)*float64(capacity.Value())), resource.BinarySI), nil
	}
	q, err := resource.ParseQuantity(s)
	if err != nil {
		return resource.Quantity{}, fmt.Errorf("evictionHard memory.available %q: %w", s, err)
	}
	return q, nil
}

// number reads a JSON number; 0 when absent.
func number(v any) float64 {
	switch n := v.(type) {
	case float64:
		return n
	case int64:
		return float64(n)
	case int:
		return float64(n)
	}
	return 0
}

// Stopping names the running pods a kubelet restarted under the config stops, a line each ("namespace/name:
// why"): those it no longer admits, and each critical one it admits only by evicting lower-priority pods,
// whose PodDisruptionBudgets it does not ask either. Empty when the kubelet would not start at all
// (NotStarting) or no prediction was made (Unpredicted).
func (c Capacity) Stopping() []string {
	out := make([]string, 0, len(c.Unfit))
	for _, u := range c.Unfit {
		out = append(out, u.Pod+": "+u.Reason)
	}
	return out
}

// DrainKeeps are the pods of pods a drain leaves on the node (kubectl drain --ignore-daemonsets): those of a
// DaemonSet, and static pods (their mirrors in the API, or as the kubelet's /pods lists them).
func DrainKeeps(pods []corev1.Pod) []corev1.Pod {
	var out []corev1.Pod
	for _, p := range pods {
		_, mirror := p.Annotations[mirrorAnnotation]
		source, fromKubelet := p.Annotations[sourceAnnotation]
		daemon := false
		for _, o := range p.OwnerReferences {
			daemon = daemon || (o.Kind == "DaemonSet" && o.Controller != nil && *o.Controller)
		}
		if mirror || (fromKubelet && source != "api") || daemon {
			out = append(out, p)
		}
	}
	return out
}

// Findings are what c says of node, a line each: admission, then eviction.
func (c Capacity) Findings(node string) []string {
	out := c.admission(node)
	switch {
	case c.Eviction != nil && len(c.Eviction.Pressure) == 0:
		out = append(out, node+": no eviction threshold is crossed at the node's current use")
	case c.Eviction != nil:
		out = append(out, c.Eviction.Findings(node)...)
	case c.EvictionUnpredicted != "":
		out = append(out, node+": "+c.EvictionUnpredicted)
	}
	return out
}

func (c Capacity) admission(node string) []string {
	switch {
	case c.NotStarting != "":
		return []string{node + ": " + c.NotStarting}
	case c.Unpredicted != "":
		return []string{node + ": " + c.Unpredicted}
	case len(c.Unfit) == 0:
		return []string{node + ": every pod still fits its pods, CPU and memory"}
	}
	var out []string
	for _, u := range c.Unfit {
		if u.Preempts {
			out = append(out, fmt.Sprintf("%s: %s: %s", node, u.Pod, u.Reason))
			continue
		}
		out = append(out, fmt.Sprintf("%s: %s may not be admitted again when the kubelet restarts (it admits the "+
			"node's pods again, oldest first): %s", node, u.Pod, u.Reason))
	}
	return out
}
