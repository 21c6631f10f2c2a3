// SPDX-License-Identifier: Apache-2.0

package plugin

import (
	"context"
	"fmt"
	"text/tabwriter"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dkc-dev/dkc/internal/capacity"
)

// capacityOf is capacity.Under with the pods bound to node.
func (o *Options) capacityOf(ctx context.Context, node *corev1.Node, running, next map[string]any) (capacity.Capacity,
	error) {
	pods, err := o.client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node.Name})
	if err != nil {
		return capacity.Capacity{}, fmt.Errorf("list the pods of node %s: %w", node.Name, err)
	}
	return capacity.Under(node, running, next, pods.Items)
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
