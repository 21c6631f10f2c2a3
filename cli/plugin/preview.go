// SPDX-License-Identifier: Apache-2.0

package plugin

import (
	"context"
	"fmt"
	"text/tabwriter"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dkc-dev/dkc/api/v1alpha1"
	"github.com/dkc-dev/dkc/internal/capacity"
	"github.com/dkc-dev/dkc/internal/disruption"
)

// NodePreview is what a pool's config would do to one node it selects (`kubectl dkc rollout --dry-run`).
type NodePreview struct {
	Node           string `json:"node"`
	KubeletVersion string `json:"kubeletVersion,omitempty"`
	// Changes are the fields that change, with how safe each change is (as `kubectl dkc diff` shows them).
	Changes []FieldChange `json:"changes,omitempty"`
	// Needs is the most disruptive class among the changes: restart-safe, disruptive or
	// needs-state-reset-and-drain; "" when nothing changes.
	Needs string `json:"needs,omitempty"`
	// Resets are the state files the kubelet refuses to start on, with the fields (disruption.Resets).
	Resets []string `json:"resets,omitempty"`
	// Capacity, when the change moves the node's allocatable.
	Capacity *capacity.Capacity `json:"capacity,omitempty"`
	// Error says why the node could not be previewed (its /configz or its minor's helper).
	Error string `json:"error,omitempty"`
}

// safetyRank orders the safety classes, least disruptive first.
var safetyRank = map[string]int{RestartSafe: 1, Disruptive: 2, NeedsReset: 3}

// preview shows, writing nothing, what pool's config would do to each node its selector picks: the changes
// and what they need, the state files the kubelet would refuse, and its allocatable against its pods.
func (o *Options) preview(ctx context.Context, pool *v1alpha1.KubeletConfigPool, checkDir string) error {
	ref := pool.Spec.ConfigMap
	sel, err := metav1.LabelSelectorAsSelector(&pool.Spec.NodeSelector)
	if err != nil {
		return fmt.Errorf("the pool's nodeSelector: %w", err)
	}
	nodes, err := o.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		return fmt.Errorf("list the nodes of %s: %w", sel, err)
	}
	rows := make([]NodePreview, 0, len(nodes.Items))
	for i := range nodes.Items {
		rows = append(rows, o.previewNode(ctx, &nodes.Items[i], ref, checkDir))
	}
	if o.output != "table" && o.output != "" {
		return o.print(o.io.Out, rows)
	}
	fmt.Fprintf(o.io.Out, "dry run, nothing written: kubeletconfigpool/%s with configmap %s/%s key %s on %d nodes\n",
		pool.Name, ref.Namespace, ref.Name, ref.KubeletConfigKey, len(rows))
	w := tabwriter.NewWriter(o.io.Out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "NODE\tKUBELET\tCHANGES\tNEEDS\tPODS\tCPU\tMEMORY\tNOT ADMITTED\tEVICTED")
	for _, r := range rows {
		if r.Error != "" {
			fmt.Fprintf(w, "%s\t%s\t<%s>\t\t\t\t\t\t\n", r.Node, r.KubeletVersion, r.Error)
			continue
		}
		fit := map[corev1.ResourceName]string{}
		unfit, evicted := "-", "-"
		if r.Capacity != nil {
			switch {
			case r.Capacity.Eviction != nil:
				evicted = fmt.Sprint(len(r.Capacity.Eviction.Evicted))
			case r.Capacity.EvictionUnpredicted != "":
				evicted = "?"
			}
			for _, f := range r.Capacity.Resources {
				fit[f.Resource] = fmt.Sprintf("%s→%s (%s)", f.Now, f.Next, f.Requested)
			}
			switch {
			case r.Capacity.NotStarting != "":
				unfit = "kubelet would not start"
			case r.Capacity.Unpredicted != "":
				unfit = "?"
			default:
				unfit = fmt.Sprint(len(r.Capacity.Unfit))
			}
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Node, r.KubeletVersion, len(r.Changes), dash(r.Needs),
			dash(fit[corev1.ResourcePods]), dash(fit[corev1.ResourceCPU]), dash(fit[corev1.ResourceMemory]), unfit, evicted)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	for _, r := range rows {
		for _, reset := range r.Resets {
			fmt.Fprintf(o.io.Out, "%s: the kubelet refuses to start with this on its state: drain it and remove %s "+
				"first\n", r.Node, reset)
		}
		if r.Capacity != nil {
			for _, line := range r.Capacity.Findings(r.Node) {
				fmt.Fprintln(o.io.Out, line)
			}
		}
	}
	return nil
}

// previewNode is what the config of ref would do to node n.
func (o *Options) previewNode(ctx context.Context, n *corev1.Node, ref v1alpha1.ConfigMapReference,
	checkDir string) NodePreview {
	p := NodePreview{Node: n.Name, KubeletVersion: n.Status.NodeInfo.KubeletVersion}
	running, version, err := o.runningConfig(ctx, n.Name)
	var next map[string]any
	if err == nil {
		next, err = o.configMapConfig(ctx, ref.Namespace, ref.Name, ref.KubeletConfigKey, version, checkDir)
	}
	if err != nil {
		p.Error = err.Error()
		return p
	}
	p.Changes = Diff(running, next)
	for _, c := range p.Changes {
		if safetyRank[c.Safety] > safetyRank[p.Needs] {
			p.Needs = c.Safety
		}
	}
	for _, r := range disruption.Resets(running, next) {
		p.Resets = append(p.Resets, r.String())
	}
	if capacity.Changes(running, next) || capacity.EvictionChanges(running, next) {
		c, err := o.capacityOf(ctx, n, running, next)
		if err != nil {
			p.Error = err.Error()
			return p
		}
		p.Capacity = &c
	}
	return p
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
