package plugin

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// ErrPaused is returned when a rollout stopped at a failing batch.
type ErrPaused struct{ Message string }

func (e *ErrPaused) Error() string { return e.Message }

// nodeDone reports whether node runs cm's current version healthily; failed carries the node's error once
// the node has taken the assignment and refused or rolled it back.
func nodeDone(n *corev1.Node, cm *corev1.ConfigMap, key string) (done bool, failed string) {
	st := StatusOf(n)
	if !st.Reported {
		return false, ""
	}
	matches := func(s *corev1.NodeConfigSource) bool {
		return s != nil && s.ConfigMap != nil && s.ConfigMap.UID == cm.UID && s.ConfigMap.ResourceVersion == cm.ResourceVersion &&
			s.ConfigMap.KubeletConfigKey == key
	}
	if matches(st.Status.Assigned) && st.Status.Error != "" {
		return false, st.Status.Error + ": " + st.Message
	}
	ready := false
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
			ready = true
		}
	}
	return matches(st.Status.Active) && st.ConfigOK == string(corev1.ConditionTrue) && ready, ""
}

func (o *Options) rolloutCommand() *cobra.Command {
	var selector, cm, key, maxUnavailable string
	var timeout, poll time.Duration
	cmd := &cobra.Command{
		Use:   "rollout --configmap NAMESPACE/NAME -l SELECTOR [--max-unavailable N|P%]",
		Short: "Assign a ConfigMap to many nodes in batches, pausing at the first failure",
		Long: `rollout assigns the ConfigMap's current version to the selected nodes, --max-unavailable at a time.
A batch is done when every node in it reports that version active with ConfigOK True and the Node Ready.
At the first failure (a node reports an error for it, or --timeout passes) the rollout stops and says
which node failed and how to resume or roll back. Nodes already running the version are skipped, so the
same command resumes a paused rollout.`,
		Example: `  kubectl dkc rollout --configmap kube-system/my-node-config-gkt4c2m4b2 -l pool=blue --max-unavailable 10%`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ns, name, err := parseConfigMap(cm)
			if err != nil {
				return err
			}
			if selector == "" {
				return fmt.Errorf("select the nodes with -l")
			}
			return o.rollout(cmd.Context(), ns, name, key, selector, intstr.Parse(maxUnavailable), timeout, poll)
		},
	}
	cmd.Flags().StringVarP(&selector, "selector", "l", "", "label selector of the nodes")
	cmd.Flags().StringVar(&cm, "configmap", "", "the ConfigMap, NAMESPACE/NAME")
	cmd.Flags().StringVar(&key, "key", "kubelet", "the ConfigMap key holding the KubeletConfiguration")
	cmd.Flags().StringVar(&maxUnavailable, "max-unavailable", "1", "nodes changed at once: a number or a percentage of the selected nodes")
	cmd.Flags().DurationVar(&timeout, "timeout", 10*time.Minute, "time a batch may take")
	cmd.Flags().DurationVar(&poll, "poll", time.Second, "how often node status is read")
	_ = cmd.MarkFlagRequired("configmap")
	return cmd
}

func (o *Options) rollout(ctx context.Context, ns, name, key, selector string, maxUnavailable intstr.IntOrString, timeout, poll time.Duration) error {
	target, err := o.client.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("configmap %s/%s: %w", ns, name, err)
	}
	nodes, err := o.selectNodes(ctx, nil, selector)
	if err != nil {
		return err
	}
	size, err := batchSize(maxUnavailable, len(nodes))
	if err != nil {
		return err
	}
	var todo []corev1.Node
	for i := range nodes {
		if done, _ := nodeDone(&nodes[i], target, key); !done {
			todo = append(todo, nodes[i])
		}
	}
	fmt.Fprintf(o.io.Out, "rolling out %s/%s (UID %s, ResourceVersion %s) to %d of %d nodes, %d at a time\n",
		ns, name, target.UID, target.ResourceVersion, len(todo), len(nodes), size)
	var updated []string
	for b, batch := range batches(todo, size) {
		var names []string
		for i := range batch {
			src := &corev1.NodeConfigSource{ConfigMap: &corev1.ConfigMapNodeConfigSource{Namespace: ns, Name: name, KubeletConfigKey: key}}
			if _, err := o.setSource(ctx, &batch[i], src); err != nil {
				return fmt.Errorf("assign node %s: %w", batch[i].Name, err)
			}
			names = append(names, batch[i].Name)
		}
		fmt.Fprintf(o.io.Out, "batch %d: %s\n", b+1, strings.Join(names, ", "))
		if node, why := o.waitBatch(ctx, names, target, key, timeout, poll); node != "" {
			msg := fmt.Sprintf(`rollout paused at batch %d: node %s: %s
nodes on the new config: %s
to resume after fixing the ConfigMap or the node, run the same command again (done nodes are skipped);
to roll the batch back: kubectl dkc assign %s --configmap <previous NAMESPACE/NAME>, or kubectl dkc reset %s`,
				b+1, node, why, strings.Join(updated, ", "), strings.Join(names, " "), strings.Join(names, " "))
			fmt.Fprintln(o.io.ErrOut, msg)
			return &ErrPaused{Message: fmt.Sprintf("rollout paused at batch %d: node %s: %s", b+1, node, why)}
		}
		updated = append(updated, names...)
		fmt.Fprintf(o.io.Out, "batch %d done\n", b+1)
	}
	fmt.Fprintf(o.io.Out, "rollout complete: %d nodes run %s/%s@%s\n", len(nodes), ns, name, target.ResourceVersion)
	return nil
}

// batchSize is how many nodes change at once: --max-unavailable of the selected nodes (a percentage rounds
// down, as a Deployment's maxUnavailable does), at least one.
func batchSize(maxUnavailable intstr.IntOrString, selected int) (int, error) {
	size, err := intstr.GetScaledValueFromIntOrPercent(&maxUnavailable, selected, false)
	if err != nil {
		return 0, fmt.Errorf("--max-unavailable: %w", err)
	}
	return max(size, 1), nil
}

// batches splits items, in order, into batches of size (the last may be smaller; size < 1 counts as 1).
func batches[T any](items []T, size int) [][]T {
	size = max(size, 1)
	var out [][]T
	for i := 0; i < len(items); i += size {
		out = append(out, items[i:min(i+size, len(items))])
	}
	return out
}

// waitBatch returns "" when every node is done, else the first failing node and why.
func (o *Options) waitBatch(ctx context.Context, names []string, cm *corev1.ConfigMap, key string, timeout, poll time.Duration) (string, string) {
	deadline := time.Now().Add(timeout)
	for {
		pending, why := "", ""
		for _, n := range names {
			node, err := o.client.CoreV1().Nodes().Get(ctx, n, metav1.GetOptions{})
			if err != nil {
				// An apiserver restart or a network blip is not the node failing: keep waiting.
				if pending == "" {
					pending, why = n, err.Error()
				}
				continue
			}
			done, failed := nodeDone(node, cm, key)
			if failed != "" {
				return n, failed
			}
			if !done && pending == "" {
				pending = n
			}
		}
		if pending == "" {
			return "", ""
		}
		if time.Now().After(deadline) {
			if why != "" {
				return pending, why
			}
			return pending, fmt.Sprintf("not active with ConfigOK and Ready after %v", timeout)
		}
		select {
		case <-ctx.Done():
			return pending, ctx.Err().Error()
		case <-time.After(poll):
		}
	}
}
