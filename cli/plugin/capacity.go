// SPDX-License-Identifier: Apache-2.0

package plugin

import (
	"context"
	"encoding/json"
	"fmt"
	"text/tabwriter"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	statsapi "k8s.io/kubelet/pkg/apis/stats/v1alpha1"

	"github.com/dkc-dev/dkc/internal/capacity"
)

// capacityOf is capacity.Under with the pods bound to node, and, when the eviction thresholds change,
// capacity.Evictions with the node's stats summary (through the apiserver's node proxy: who lacks get
// nodes/proxy is told the evictions were not predicted).
func (o *Options) capacityOf(ctx context.Context, node *corev1.Node, running, next map[string]any) (capacity.Capacity,
	error) {
	pods, err := o.client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node.Name})
	if err != nil {
		return capacity.Capacity{}, fmt.Errorf("list the pods of node %s: %w", node.Name, err)
	}
	c, err := capacity.Under(node, running, next, pods.Items)
	if err != nil || !capacity.EvictionChanges(running, next) {
		return c, err
	}
	summary, err := o.statsSummary(ctx, node.Name)
	if err != nil {
		c.EvictionUnpredicted = "evictions not predicted: " + err.Error()
		return c, nil
	}
	e, err := capacity.Evictions(summary, running, next, pods.Items)
	if err != nil {
		return capacity.Capacity{}, fmt.Errorf("node %s: %w", node.Name, err)
	}
	c.Eviction = &e
	return c, nil
}

// statsSummary is the kubelet's stats summary of node (/stats/summary), the figures its eviction manager
// decides on.
func (o *Options) statsSummary(ctx context.Context, node string) (*statsapi.Summary, error) {
	rc := o.client.CoreV1().RESTClient()
	if c, ok := rc.(*rest.RESTClient); ok && c == nil { // a fake clientset's
		return nil, fmt.Errorf("no stats summary of node %s: the client has no REST access", node)
	}
	raw, err := rc.Get().AbsPath("/api/v1/nodes", node, "proxy", "stats", "summary").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("read the stats summary of node %s (get nodes/proxy): %w", node, err)
	}
	var s statsapi.Summary
	if err := json.Unmarshal(raw, &s); err != nil {
		return nil, fmt.Errorf("read the stats summary of node %s: %w", node, err)
	}
	return &s, nil
}

// printCapacity prints what next does to node's allocatable and to the pods bound to it.
func (o *Options) printCapacity(ctx context.Context, nodeName string, running, next map[string]any) error {
	node, err := o.client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("node %s: %w", nodeName, err)
	}
	c, err := o.capacityOf(ctx, node, running, next)
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
	for _, line := range c.Findings(nodeName) {
		fmt.Fprintln(o.io.Out, line)
	}
	return nil
}
