// SPDX-License-Identifier: Apache-2.0

package plugin

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dkc-dev/dkc/api/v1alpha1"
	"github.com/dkc-dev/dkc/internal/capacity"
	"github.com/dkc-dev/dkc/internal/configz"
	"github.com/dkc-dev/dkc/internal/disruption"
	"github.com/dkc-dev/dkc/internal/pernode"
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
	// Values are what the pool's spec.perNode computes for the node ("field=<JSON>", then "exception NAME" per
	// exception that applies), as pernode.Result has them; none without perNode.
	Values []string `json:"values,omitempty"`
	// Revision is the revision of the node's computed config, under perNode only: nodes whose values come out
	// equal share one.
	Revision string `json:"revision,omitempty"`
	// Error says why the node could not be previewed (its /configz, its minor's helper or its perNode values).
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
	computed, err := o.computeNodes(ctx, pool, nodes.Items, time.Now())
	if err != nil {
		return err
	}
	rows := make([]NodePreview, 0, len(nodes.Items))
	for i := range nodes.Items {
		if computed == nil {
			rows = append(rows, o.previewNode(ctx, &nodes.Items[i], ref, nil, checkDir))
			continue
		}
		c := computed[i]
		if c.row.Error != "" {
			rows = append(rows, c.row)
			continue
		}
		p := o.previewNode(ctx, &nodes.Items[i], ref, c.data, checkDir)
		p.Values, p.Revision = c.row.Values, c.row.Revision
		rows = append(rows, p)
	}
	if o.output != "table" && o.output != "" {
		return o.print(o.io.Out, rows)
	}
	return printPreview(o.io.Out, pool, rows)
}

// printPreview writes the preview's table, then the findings under it. The VALUES column is there only when
// the pool has spec.perNode, so that a pool without it previews as it always did.
func printPreview(out io.Writer, pool *v1alpha1.KubeletConfigPool, rows []NodePreview) error {
	ref := pool.Spec.ConfigMap
	perNode := pool.Spec.PerNode != nil
	fmt.Fprintf(out, "dry run, nothing written: kubeletconfigpool/%s with configmap %s/%s key %s on %d nodes\n",
		pool.Name, ref.Namespace, ref.Name, ref.KubeletConfigKey, len(rows))
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	header := "NODE\tKUBELET\tCHANGES\tNEEDS\tPODS\tCPU\tMEMORY\tNOT ADMITTED\tEVICTED"
	if perNode {
		header += "\tVALUES"
	}
	fmt.Fprintln(w, header)
	for _, r := range rows {
		values := ""
		if perNode {
			values = "\t" + dash(strings.Join(r.Values, ", "))
		}
		if r.Error != "" {
			fmt.Fprintf(w, "%s\t%s\t<%s>\t\t\t\t\t\t%s\n", r.Node, r.KubeletVersion, r.Error, values)
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
		fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s%s\n", r.Node, r.KubeletVersion, len(r.Changes),
			dash(r.Needs), dash(fit[corev1.ResourcePods]), dash(fit[corev1.ResourceCPU]),
			dash(fit[corev1.ResourceMemory]), unfit, evicted, values)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	for _, r := range rows {
		for _, reset := range r.Resets {
			fmt.Fprintf(out, "%s: the kubelet refuses to start with this on its state: drain it and remove %s "+
				"first\n", r.Node, reset)
		}
		if r.Capacity != nil {
			for _, line := range r.Capacity.Findings(r.Node) {
				fmt.Fprintln(out, line)
			}
		}
	}
	return nil
}

// computedNode is a node's config under the pool's spec.perNode: the start of its row (values and revision,
// or the error computing them) and the data it is previewed against.
type computedNode struct {
	row  NodePreview
	data map[string]string
}

// computeNodes computes each node's config under the pool's spec.perNode, in the order of nodes; nil for a
// pool without it. The ConfigMap is read once here rather than per node, since every node's config is
// computed from the same content. An expression that does not compile, or a ConfigMap that cannot be read,
// fails the whole preview: it would fail every node the same way.
func (o *Options) computeNodes(ctx context.Context, pool *v1alpha1.KubeletConfigPool, nodes []corev1.Node,
	now time.Time) ([]computedNode, error) {
	if pool.Spec.PerNode == nil {
		return nil, nil
	}
	prog, err := pernode.Compile(pool.Spec.PerNode)
	if err != nil {
		return nil, fmt.Errorf("kubeletconfigpool %s: %w", pool.Name, err)
	}
	ref := pool.Spec.ConfigMap
	cm, err := o.client.CoreV1().ConfigMaps(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("configmap %s/%s: %w", ref.Namespace, ref.Name, err)
	}
	out := make([]computedNode, 0, len(nodes))
	for i := range nodes {
		n := &nodes[i]
		c := computedNode{row: NodePreview{Node: n.Name, KubeletVersion: n.Status.NodeInfo.KubeletVersion}}
		res, err := prog.Compute(n, ref.KubeletConfigKey, cm.Data, now)
		if err != nil {
			c.row.Error = err.Error()
		} else {
			c.data = res.Data
			c.row.Values = res.Values
			c.row.Revision = v1alpha1.RevisionName(ref.Namespace, ref.KubeletConfigKey, res.Data)
		}
		out = append(out, c)
	}
	return out, nil
}

// previewNode is what the config of ref would do to node n: the ConfigMap's, or data when the pool's
// spec.perNode computed the node's own.
func (o *Options) previewNode(ctx context.Context, n *corev1.Node, ref v1alpha1.ConfigMapReference,
	data map[string]string, checkDir string) NodePreview {
	p := NodePreview{Node: n.Name, KubeletVersion: n.Status.NodeInfo.KubeletVersion}
	running, version, err := o.runningConfig(ctx, n.Name)
	var next map[string]any
	switch {
	case err != nil:
	case data == nil:
		next, err = o.configMapConfig(ctx, ref.Namespace, ref.Name, ref.KubeletConfigKey, version, checkDir)
	default:
		next, err = computedConfig(ctx, ref, n.Name, data, version, checkDir)
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

// computedConfig is node's computed config as its kubelet would load it: what configMapConfig (diff.go) is
// for the ConfigMap's own content, for content that is in no ConfigMap and so is handed to the helper in
// memory.
func computedConfig(ctx context.Context, ref v1alpha1.ConfigMapReference, node string, data map[string]string,
	kubeletVersion, checkDir string) (map[string]any, error) {
	checker, err := kubeletCheckers(checkDir)
	if err != nil {
		return nil, err
	}
	content, ok := data[ref.KubeletConfigKey]
	if !ok {
		return nil, fmt.Errorf("configmap %s/%s has no key %q", ref.Namespace, ref.Name, ref.KubeletConfigKey)
	}
	checked, err := checker.CheckData(ctx, kubeletVersion, []byte(content))
	if err != nil {
		return nil, fmt.Errorf("configmap %s/%s key %s as computed for node %s, for kubelet %s: %w", ref.Namespace,
			ref.Name, ref.KubeletConfigKey, node, kubeletVersion, err)
	}
	return configz.Config(kubeletVersion, checked.Fields, nil)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
