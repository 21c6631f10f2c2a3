// SPDX-License-Identifier: Apache-2.0

package plugin

import (
	"context"
	"fmt"
	"math"
	"sort"
	"strings"
	"text/tabwriter"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	resourcehelper "k8s.io/component-helpers/resource"
)

// capacityFields are the config fields that change a node's allocatable.
var capacityFields = []string{"maxPods", "podsPerCore", "kubeReserved", "systemReserved", "evictionHard"}

// ResourceFit is one resource of a node: what the kubelet allocates now, what it would under a config, and
// what the pods on the node request.
type ResourceFit struct {
	Resource  corev1.ResourceName `json:"resource"`
	Now       string              `json:"allocatable"`
	Next      string              `json:"next"`
	Requested string              `json:"requested"`
}

// UnfitPod is a pod the kubelet would reject when it restarts with a config: it admits the pods bound to
// the node again, oldest first, each against what the config leaves once the earlier ones are admitted.
type UnfitPod struct {
	Pod      string              `json:"pod"` // namespace/name
	Resource corev1.ResourceName `json:"resource"`
	Reason   string              `json:"reason"`
}

// Capacity is a config's effect on a node's allocatable and on the pods running there.
type Capacity struct {
	Resources []ResourceFit `json:"resources"`
	Unfit     []UnfitPod    `json:"unfit,omitempty"`
}

// capacityChanges says whether going from running to next changes what the kubelet allocates.
func capacityChanges(running, next map[string]any) bool {
	for _, f := range capacityFields {
		if compact(running[f]) != compact(next[f]) {
			return true
		}
	}
	return false
}

// CapacityUnder computes what node's kubelet allocates under cfg (a complete v1beta1 config as JSON values)
// as the kubelet does — capacity less kubeReserved, systemReserved and, for memory, the hard eviction
// threshold; pods from maxPods and podsPerCore — and which of pods it would no longer admit.
func CapacityUnder(node *corev1.Node, cfg map[string]any, pods []corev1.Pod) (Capacity, error) {
	next, err := allocatableUnder(node.Status.Capacity, cfg)
	if err != nil {
		return Capacity{}, fmt.Errorf("node %s: %w", node.Name, err)
	}
	live := running(pods)
	requested := corev1.ResourceList{corev1.ResourcePods: *resource.NewQuantity(int64(len(live)), resource.DecimalSI)}
	for i := range live {
		for r, q := range resourcehelper.PodRequests(&live[i], resourcehelper.PodResourcesOptions{}) {
			sum := requested[r]
			sum.Add(q)
			requested[r] = sum
		}
	}
	var c Capacity
	for _, r := range []corev1.ResourceName{corev1.ResourcePods, corev1.ResourceCPU, corev1.ResourceMemory} {
		now, n, req := node.Status.Allocatable[r], next[r], requested[r]
		c.Resources = append(c.Resources, ResourceFit{Resource: r, Now: now.String(), Next: n.String(), Requested: req.String()})
	}
	c.Unfit = admit(live, next)
	return c, nil
}

// running are the pods the kubelet admits again when it restarts: those not finished, oldest first (as the
// kubelet orders them; by name among pods of the same second).
func running(pods []corev1.Pod) []corev1.Pod {
	var out []corev1.Pod
	for _, p := range pods {
		if p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed && p.DeletionTimestamp == nil {
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

// admit plays the kubelet's admission of pods, in order, against alloc: a pod that does not fit (one pod
// too many, or more CPU or memory requested than is left) is rejected and takes nothing.
func admit(pods []corev1.Pod, alloc corev1.ResourceList) []UnfitPod {
	var unfit []UnfitPod
	admitted := int64(0)
	used := corev1.ResourceList{}
	maxPods := alloc[corev1.ResourcePods]
	for i := range pods {
		p := &pods[i]
		name := p.Namespace + "/" + p.Name
		if admitted+1 > maxPods.Value() {
			unfit = append(unfit, UnfitPod{Pod: name, Resource: corev1.ResourcePods,
				Reason: fmt.Sprintf("pod %d of %d allowed (OutOfpods)", admitted+1, maxPods.Value())})
			continue
		}
		reqs := resourcehelper.PodRequests(p, resourcehelper.PodResourcesOptions{})
		var short *UnfitPod
		for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			q, ok := reqs[r]
			if !ok || q.IsZero() {
				continue
			}
			total := used[r]
			total.Add(q)
			if a := alloc[r]; total.Cmp(a) > 0 {
				left := a.DeepCopy()
				u := used[r]
				left.Sub(u)
				short = &UnfitPod{Pod: name, Resource: r, Reason: fmt.Sprintf("requests %s of %s, %s left (OutOf%s)",
					q.String(), r, left.String(), r)}
				break
			}
		}
		if short != nil {
			unfit = append(unfit, *short)
			continue
		}
		admitted++
		for r, q := range reqs {
			sum := used[r]
			sum.Add(q)
			used[r] = sum
		}
	}
	return unfit
}

// allocatableUnder is the kubelet's allocatable for capacity under cfg: capacity − kubeReserved −
// systemReserved − the hard eviction threshold of memory.available (a quantity, or a percentage of
// capacity), never below zero; pods are maxPods, or podsPerCore × CPUs when that is set and lower.
func allocatableUnder(capacity corev1.ResourceList, cfg map[string]any) (corev1.ResourceList, error) {
	out := corev1.ResourceList{}
	for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		q, ok := capacity[r]
		if !ok {
			continue
		}
		q = q.DeepCopy()
		for _, f := range []string{"kubeReserved", "systemReserved"} {
			v, err := reserved(cfg, f, r)
			if err != nil {
				return nil, err
			}
			q.Sub(v)
		}
		if r == corev1.ResourceMemory {
			v, err := evictionMemory(cfg, capacity[r])
			if err != nil {
				return nil, err
			}
			q.Sub(v)
		}
		if q.Sign() < 0 {
			q = *resource.NewQuantity(0, q.Format)
		}
		out[r] = q
	}
	pods := number(cfg["maxPods"])
	if perCore := number(cfg["podsPerCore"]); perCore > 0 {
		if cpu, ok := capacity[corev1.ResourceCPU]; ok {
			pods = math.Min(pods, perCore*float64(cpu.Value()))
		}
	}
	out[corev1.ResourcePods] = *resource.NewQuantity(int64(pods), resource.DecimalSI)
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

// evictionMemory is the hard eviction threshold of memory.available: a quantity, or a percentage of
// capacity.
func evictionMemory(cfg map[string]any, capacity resource.Quantity) (resource.Quantity, error) {
	m, _ := cfg["evictionHard"].(map[string]any)
	s, _ := m["memory.available"].(string)
	if s == "" {
		return resource.Quantity{}, nil
	}
	if pct, ok := strings.CutSuffix(s, "%"); ok {
		var f float64
		if _, err := fmt.Sscanf(pct, "%g", &f); err != nil {
			return resource.Quantity{}, fmt.Errorf("evictionHard memory.available %q: %w", s, err)
		}
		return *resource.NewQuantity(int64(f/100*float64(capacity.Value())), resource.BinarySI), nil
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

// capacityOf is CapacityUnder with the pods bound to node.
func (o *Options) capacityOf(ctx context.Context, node *corev1.Node, next map[string]any) (Capacity, error) {
	pods, err := o.client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node.Name})
	if err != nil {
		return Capacity{}, fmt.Errorf("list the pods of node %s: %w", node.Name, err)
	}
	return CapacityUnder(node, next, pods.Items)
}

// printCapacity prints what next does to node's allocatable and to the pods bound to it.
func (o *Options) printCapacity(ctx context.Context, nodeName string, next map[string]any) error {
	node, err := o.client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("node %s: %w", nodeName, err)
	}
	c, err := o.capacityOf(ctx, node, next)
	if err != nil {
		return err
	}
	fmt.Fprintf(o.io.Out, "\ncapacity of node %s (allocatable now, under this config; requested by its pods):\n", nodeName)
	w := tabwriter.NewWriter(o.io.Out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "RESOURCE\tNOW\tNEW\tREQUESTED")
	for _, r := range c.Resources {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", r.Resource, r.Now, r.Next, r.Requested)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if len(c.Unfit) == 0 {
		fmt.Fprintf(o.io.Out, "every pod on node %s still fits\n", nodeName)
		return nil
	}
	fmt.Fprintf(o.io.Out, "the kubelet would reject these pods when it restarts with this config (it admits the "+
		"node's pods again, oldest first):\n")
	for _, u := range c.Unfit {
		fmt.Fprintf(o.io.Out, "  %s: %s\n", u.Pod, u.Reason)
	}
	return nil
}
