// SPDX-License-Identifier: Apache-2.0

package plugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/dkc-dev/dkc/internal/capacity"
	"github.com/dkc-dev/dkc/internal/configz"
	"github.com/dkc-dev/dkc/internal/disruption"
	"github.com/dkc-dev/dkc/internal/nodeconfig"
	"github.com/dkc-dev/dkc/internal/nodedrain"
)

func (o *Options) assignCommand() *cobra.Command {
	var selector, cm, key, checkDir string
	var drained, drain bool
	var opts drainOptions
	cmd := &cobra.Command{
		Use:   "assign (NODE... | -l SELECTOR) --configmap NAMESPACE/NAME [--key kubelet]",
		Short: "Point nodes at a ConfigMap holding a KubeletConfiguration",
		Long: `assign points nodes at a ConfigMap holding a KubeletConfiguration; each node's dkc-sidecar then
validates it, restarts the kubelet onto it and proves it, or rolls back.

Before assigning any node, assign compares each node's running config (/configz) with the new one, both as
the node kubelet's own minor loads them (the dkc-kubelet-check helpers, as diff does), and refuses a change
the kubelet refuses to start with on a node whose resource managers keep state: another cpuManagerPolicy or
memoryManagerPolicy, or other reservations under their static policies. Such a node must be drained first,
and its sidecar then removes the state file, with the kubelet stopped, before it restarts the kubelet:

  --drain    assign does it, one node after the other: cordons the node (unless someone else did), evicts
             its pods through the Eviction API (PodDisruptionBudgets hold; DaemonSet and mirror pods stay),
             assigns the config marked as drained for exactly the ConfigMap's version, waits until the node
             reports it active (or failed and rolled back), then removes its mark and uncordons it.
             Nodes that need no drain are assigned as usual.
  --drained  you drained and cordoned the nodes yourself: assign marks them drained and assigns; uncordon
             them once they report the config active.

It refuses the same way, naming the pods, a config under which the restarted kubelet would stop running
pods: those it would no longer admit in the room the config leaves (it admits the node's pods again, oldest
first, and fails the newest with OutOfpods, OutOfcpu, ... after a lower maxPods or larger reservations), and
those its new eviction thresholds would evict or reject where the running ones leave them alone (predicted
from the node's stats summary through the apiserver's node proxy, get nodes/proxy, and its pods, list pods).
--drain drains such nodes first (also nodes whose pods or usage cannot be read, when those fields change).

Where the check cannot run (no helper for the node's minor, /configz unreadable), assign says so and assigns;
a node whose sidecar finds that the change needs a drain then refuses it (status "the node must be drained
first") and keeps its config until it is drained.`,
		Example: `  kubectl dkc assign node-1 --configmap kube-system/my-node-config-gkt4c2m4b2
  kubectl dkc assign -l pool=blue --configmap kube-system/my-node-config-gkt4c2m4b2 --key kubelet
  kubectl dkc assign node-1 --configmap kube-system/static-cpus --drain
  kubectl dkc assign node-1 --configmap kube-system/static-cpus --drained   # after kubectl drain node-1`,
		RunE: func(cmd *cobra.Command, args []string) error {
			ns, name, err := parseConfigMap(cm)
			if err != nil {
				return err
			}
			src := &corev1.NodeConfigSource{ConfigMap: &corev1.ConfigMapNodeConfigSource{Namespace: ns, Name: name,
				KubeletConfigKey: key}}
			if errs := nodeconfig.ValidateSpec(src, field.NewPath("spec", "configSource")); len(errs) > 0 {
				return errs.ToAggregate()
			}
			ctx := cmd.Context()
			if _, err := o.client.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{}); err != nil {
				return fmt.Errorf("configmap %s/%s: %w", ns, name, err)
			}
			nodes, err := o.selectNodes(ctx, args, selector)
			if err != nil {
				return err
			}
			switch {
			case drain && drained:
				return fmt.Errorf("give --drain or --drained, not both")
			case drain:
				evicts := map[string]evictions{}
				resets := o.stateResets(ctx, nodes, ns, name, key, checkDir, evicts)
				return o.assignDraining(ctx, nodes, src, resets, evicts, opts)
			case drained:
				return o.assignDrained(ctx, nodes, src)
			}
			evicts := map[string]evictions{}
			if err := refuseStateResets(ns, name, o.stateResets(ctx, nodes, ns, name, key, checkDir, evicts)); err != nil {
				return err
			}
			if err := o.refuseEvictions(ns, name, evicts); err != nil {
				return err
			}
			for i := range nodes {
				where, err := o.setSource(ctx, &nodes[i], src)
				if err != nil {
					return fmt.Errorf("assign node %s: %w", nodes[i].Name, err)
				}
				fmt.Fprintf(o.io.Out, "node/%s assigned %s/%s (key %s) via %s\n", nodes[i].Name, ns, name, key, where)
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&selector, "selector", "l", "", "label selector of the nodes")
	cmd.Flags().StringVar(&cm, "configmap", "", "the ConfigMap, NAMESPACE/NAME")
	cmd.Flags().StringVar(&key, "key", "kubelet", "the ConfigMap key holding the KubeletConfiguration")
	cmd.Flags().BoolVar(&drain, "drain", false,
		"cordon and drain each node whose kubelet would refuse the change on its resource managers' state, or "+
			"would reject or evict running pods under it, one after the other, let its sidecar remove that "+
			"state and restart the kubelet, wait until it runs the config, then uncordon it")
	drainFlags(cmd, &opts)
	cmd.Flags().BoolVar(&drained, "drained", false,
		"the nodes are cordoned and drained already (kubectl drain): mark them drained for the ConfigMap's "+
			"version so that their sidecars remove the state the change invalidates, and assign")
	cmd.Flags().StringVar(&checkDir, "kubelet-check-dir", "",
		"directory of the dkc-kubelet-check-<minor> helpers; default: next to kubectl-dkc, else the "+
			"directory of the first on $PATH")
	_ = cmd.MarkFlagRequired("configmap")
	return cmd
}

// stateResets compares each node's running config (/configz) with the new one, both as the node kubelet's
// minor loads them: the state files the change invalidates, per node. A node it cannot check is warned
// about and has a nil entry (its sidecar checks again before it restarts the kubelet). With evicts, it also
// records there, per node, the running pods the restarted kubelet would stop: those it would no longer
// admit in the room the config leaves (admissionOf), and those its new eviction thresholds would evict
// (evictionsOf). Such a node is drained too.
func (o *Options) stateResets(ctx context.Context, nodes []corev1.Node, ns, name, key,
	checkDir string, evicts map[string]evictions) map[string][]disruption.Reset {
	out := map[string][]disruption.Reset{}
	for _, n := range nodes {
		running, kubeletVersion, err := o.runningConfig(ctx, n.Name)
		var next map[string]any
		if err == nil {
			next, err = o.configMapConfig(ctx, ns, name, key, kubeletVersion, checkDir)
		}
		if err != nil {
			fmt.Fprintf(o.io.ErrOut, "warning: node %s: state check skipped: %v\n", n.Name, err)
			out[n.Name] = nil
			continue
		}
		if r := disruption.Resets(running, next); len(r) > 0 {
			out[n.Name] = r
		}
		if evicts == nil {
			continue
		}
		var e evictions
		if capacity.Changes(running, next) {
			e = o.admissionOf(ctx, &n, running, next)
		}
		if capacity.EvictionChanges(running, next) {
			ev := o.evictionsOf(ctx, &n, running, next)
			e.lines, e.unread = append(e.lines, ev.lines...), append(e.unread, ev.unread...)
		}
		if len(e.lines)+len(e.unread) > 0 {
			evicts[n.Name] = e
		}
	}
	return out
}

// evictions is what a node's kubelet, restarted with a config, would do to its running pods: the pods it
// would reject or evict (predicted), or why that could not be told.
type evictions struct {
	lines  []string // the pods it would stop, predicted
	unread []string // why a prediction could not be made
}

// admissionOf says which running pods node's kubelet, restarted with next, would stop (capacity.Under:
// those it would no longer admit in the room next leaves — OutOfpods, OutOfcpu, ... — and critical ones it
// would admit by evicting others; the prediction its sidecar makes before it restarts the kubelet, which
// refuses an undrained node the change), or that it would not start at all; when that cannot be told, why.
func (o *Options) admissionOf(ctx context.Context, node *corev1.Node, running, next map[string]any) evictions {
	unchecked := func(err error) evictions {
		return evictions{unread: []string{"the pods it admits again under the config could not be checked: " + err.Error()}}
	}
	pods, err := o.client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node.Name})
	if err != nil {
		return unchecked(fmt.Errorf("list its pods: %w", err))
	}
	c, err := capacity.Under(node, running, next, pods.Items)
	switch {
	case err != nil:
		return unchecked(err)
	case c.NotStarting != "":
		return evictions{lines: []string{node.Name + ": " + c.NotStarting}}
	case c.Unpredicted != "":
		return unchecked(errors.New(c.Unpredicted))
	}
	var e evictions
	for _, l := range c.Stopping() {
		e.lines = append(e.lines, node.Name+": "+l)
	}
	return e
}

// evictionsOf says what node's kubelet, restarted with next's eviction thresholds, would stop that it does
// not under running's (the prediction its sidecar makes before it restarts the kubelet, which refuses an
// undrained node the change); when that cannot be told, why.
func (o *Options) evictionsOf(ctx context.Context, node *corev1.Node, running, next map[string]any) evictions {
	unchecked := func(err error) evictions {
		return evictions{unread: []string{"its new eviction thresholds could not be checked: " + err.Error()}}
	}
	pods, err := o.client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node.Name})
	if err != nil {
		return unchecked(fmt.Errorf("list its pods: %w", err))
	}
	summary, err := o.statsSummary(ctx, node.Name)
	if err != nil {
		return unchecked(err)
	}
	e, err := capacity.Evictions(summary, running, next, pods.Items)
	if err != nil {
		return unchecked(err)
	}
	if !e.Stops() {
		return evictions{}
	}
	return evictions{lines: e.Findings(node.Name)}
}

// refuseEvictions fails, before any node is assigned, when a node's kubelet, restarted with the config,
// would reject or evict pods (its sidecar would refuse it undrained). Nodes whose pods or usage could not be
// read are warned about and left to their sidecars, which read their own kubelet.
func (o *Options) refuseEvictions(ns, name string, evicts map[string]evictions) error {
	var refused []string
	for node, e := range evicts {
		if len(e.unread) > 0 {
			fmt.Fprintf(o.io.ErrOut, "warning: node %s: %s; its sidecar predicts again before restarting the kubelet\n",
				node, strings.Join(e.unread, "; "))
		}
		for _, l := range e.lines {
			refused = append(refused, "  "+l)
		}
	}
	if len(refused) == 0 {
		return nil
	}
	sort.Strings(refused)
	return fmt.Errorf("the kubelet, restarted with %s/%s, would stop running pods (rejected as it admits them "+
		"again in the room the config leaves, or evicted for a critical pod or under its eviction thresholds), "+
		"honouring no PodDisruptionBudget, or would not start; nothing was assigned (predicted from the config as "+
		"written: where a kubelet flag such as --max-pods sets a field instead, the node's sidecar, which knows "+
		"its flags, predicts again before the restart):\n%s\n"+
		"assign again with --drain (dkc drains each such node through the Eviction API first), or drain the nodes "+
		"yourself (kubectl drain NODE --ignore-daemonsets) and assign with --drained", ns, name,
		strings.Join(refused, "\n"))
}

// refuseStateResets fails, before any node is assigned, when the config would make a node's kubelet refuse
// to start on the state its resource managers checkpointed under the running config.
func refuseStateResets(ns, name string, resets map[string][]disruption.Reset) error {
	var refused []string
	for node, rs := range resets {
		for _, r := range rs {
			refused = append(refused, fmt.Sprintf("  node %s: %s", node, r))
		}
	}
	if len(refused) == 0 {
		return nil
	}
	sort.Strings(refused)
	return fmt.Errorf("the kubelet refuses to start with %s/%s on state its resource managers "+
		"checkpointed; nothing was assigned:\n"+
		"%s\n"+
		"assign again with --drain (dkc cordons and drains each such node, its sidecar removes the state), or "+
		"drain the nodes yourself (kubectl drain NODE --ignore-daemonsets) and assign with --drained",
		ns, name, strings.Join(refused, "\n"))
}

// assignDrained assigns nodes the user cordoned and drained, marked drained for the ConfigMap's version.
func (o *Options) assignDrained(ctx context.Context, nodes []corev1.Node, src *corev1.NodeConfigSource) error {
	ref := src.ConfigMap
	cm, err := o.client.CoreV1().ConfigMaps(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("configmap %s/%s: %w", ref.Namespace, ref.Name, err)
	}
	for i := range nodes {
		if !nodes[i].Spec.Unschedulable {
			return fmt.Errorf("node %s is not cordoned: drain it first (kubectl drain %s --ignore-daemonsets), "+
				"or assign with --drain", nodes[i].Name, nodes[i].Name)
		}
	}
	d := &nodedrain.Drainer{Client: o.client, FieldManager: "kubectl-dkc"}
	for i := range nodes {
		if err := d.MarkDrained(ctx, &nodes[i], src, cm); err != nil {
			return err
		}
		fmt.Fprintf(o.io.Out, "node/%s assigned %s/%s (key %s) as drained for resourceVersion %s; uncordon it once "+
			"it runs the config\n", nodes[i].Name, ref.Namespace, ref.Name, ref.KubeletConfigKey, cm.ResourceVersion)
	}
	return nil
}

func (o *Options) resetCommand() *cobra.Command {
	var selector string
	var drain bool
	var opts drainOptions
	cmd := &cobra.Command{
		Use:   "reset (NODE... | -l SELECTOR)",
		Short: "Return nodes to their local kubelet config (forgets last-known-good)",
		Long: `reset returns nodes to their local kubelet config; each node's dkc-sidecar restarts the kubelet onto it.

Going back can need a drain as much as leaving it did (a node that runs the static CPU manager policy under
its dkc config and none under its local one, whose local eviction thresholds would evict pods its dkc
config's leave alone, or whose local config leaves less room than its running pods take): its sidecar then
refuses, keeps what the kubelet runs, and says the node must be drained first. --drain does it, one node
after the other, as assign --drain does: cordon, drain, reset marked as drained, wait until the node runs
its local config, uncordon.`,
		Example: `  kubectl dkc reset node-1
  kubectl dkc reset node-1 --drain`,
		RunE: func(cmd *cobra.Command, args []string) error {
			nodes, err := o.selectNodes(cmd.Context(), args, selector)
			if err != nil {
				return err
			}
			if drain {
				d := &nodedrain.Drainer{Client: o.client, FieldManager: "kubectl-dkc", Timeout: opts.drainTimeout,
					Out: o.io.Out, ErrOut: o.io.ErrOut}
				for i := range nodes {
					if err := o.drainAndAssign(cmd.Context(), d, &nodes[i], nil, opts); err != nil {
						return err
					}
				}
				return nil
			}
			for i := range nodes {
				if _, err := o.setSource(cmd.Context(), &nodes[i], nil); err != nil {
					return fmt.Errorf("reset node %s: %w", nodes[i].Name, err)
				}
				fmt.Fprintf(o.io.Out, "node/%s reset to its local config\n", nodes[i].Name)
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&selector, "selector", "l", "", "label selector of the nodes")
	cmd.Flags().BoolVar(&drain, "drain", false,
		"cordon and drain each node, one after the other, reset it marked as drained (its sidecar removes the "+
			"kubelet state the change invalidates), wait until it runs its local config, then uncordon it")
	drainFlags(cmd, &opts)
	return cmd
}

// drainFlags are --drain's bounds, of assign and reset.
func drainFlags(cmd *cobra.Command, opts *drainOptions) {
	cmd.Flags().DurationVar(&opts.drainTimeout, "drain-timeout", 10*time.Minute,
		"with --drain: how long to retry evictions a PodDisruptionBudget refuses, per node, before giving up "+
			"(the node is then uncordoned and keeps its config)")
	cmd.Flags().DurationVar(&opts.applyTimeout, "timeout", 5*time.Minute,
		"with --drain: how long a node may take from its assignment to reporting the config active or failed")
}

// NodeStatus is one row of `kubectl dkc status`.
type NodeStatus struct {
	Node      string                   `json:"node"`
	Status    *corev1.NodeConfigStatus `json:"status,omitempty"`
	ConfigOK  string                   `json:"configOK,omitempty"`
	Message   string                   `json:"message,omitempty"`
	Reported  bool                     `json:"reported"`
	Transited *metav1.Time             `json:"lastTransitionTime,omitempty"`
	// Drift is the node's ConfigDrift condition while True: its cause (reason) and message.
	Drift *Drift `json:"drift,omitempty"`
}

// Drift is what a node's sidecar found its kubelet running differently from its config.
type Drift struct {
	Cause   string `json:"cause"`
	Message string `json:"message,omitempty"`
}

// StatusOf reads a node's dkc status from its annotation and ConfigOK condition.
func StatusOf(n *corev1.Node) NodeStatus {
	ns := NodeStatus{Node: n.Name}
	if raw, ok := n.Annotations[nodeconfig.StatusAnnotation]; ok {
		var st corev1.NodeConfigStatus
		if json.Unmarshal([]byte(raw), &st) == nil {
			ns.Status, ns.Reported = &st, true
		}
	}
	for _, c := range n.Status.Conditions {
		switch {
		case c.Type == nodeconfig.ConditionType:
			ns.ConfigOK, ns.Message = string(c.Status), c.Message
			t := c.LastTransitionTime
			ns.Transited = &t
		case c.Type == nodeconfig.DriftConditionType && c.Status == corev1.ConditionTrue:
			ns.Drift = &Drift{Cause: c.Reason, Message: c.Message}
		}
	}
	return ns
}

func describe(s *corev1.NodeConfigSource) string {
	if s == nil || s.ConfigMap == nil {
		return "local"
	}
	return fmt.Sprintf("%s/%s@%s", s.ConfigMap.Namespace, s.ConfigMap.Name, s.ConfigMap.ResourceVersion)
}

func (o *Options) statusCommand() *cobra.Command {
	var selector string
	cmd := &cobra.Command{
		Use:   "status [NODE... | -l SELECTOR]",
		Short: "Show each node's assigned, active and last-known-good config, error, ConfigOK and drift",
		RunE: func(cmd *cobra.Command, args []string) error {
			var nodes []corev1.Node
			var err error
			if len(args) == 0 && selector == "" {
				list, lerr := o.client.CoreV1().Nodes().List(cmd.Context(), metav1.ListOptions{})
				nodes, err = list.Items, lerr
			} else {
				nodes, err = o.selectNodes(cmd.Context(), args, selector)
			}
			if err != nil {
				return err
			}
			rows := make([]NodeStatus, 0, len(nodes))
			for i := range nodes {
				rows = append(rows, StatusOf(&nodes[i]))
			}
			if o.output != "table" && o.output != "" {
				return o.print(o.io.Out, rows)
			}
			w := tabwriter.NewWriter(o.io.Out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "NODE\tASSIGNED\tACTIVE\tLAST-KNOWN-GOOD\tCONFIGOK\tDRIFT\tERROR\tAGE")
			for _, r := range rows {
				drift := "-"
				if r.Drift != nil {
					drift = r.Drift.Cause
				}
				if !r.Reported {
					fmt.Fprintf(w, "%s\t<no dkc sidecar report>\t\t\t%s\t%s\t\t\n", r.Node, r.ConfigOK, drift)
					continue
				}
				age := "-"
				if r.Transited != nil {
					age = duration.HumanDuration(time.Since(r.Transited.Time))
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Node, describe(r.Status.Assigned),
					describe(r.Status.Active), describe(r.Status.LastKnownGood), r.ConfigOK, drift, r.Status.Error, age)
			}
			return w.Flush()
		},
	}
	cmd.Flags().StringVarP(&selector, "selector", "l", "", "label selector of the nodes")
	return cmd
}

// runningConfig returns the node's running config from /configz as a complete KubeletConfiguration, with
// the defaults of the node kubelet's own minor, and that kubelet's version.
func (o *Options) runningConfig(ctx context.Context,
	node string) (cfg map[string]any, kubeletVersion string, err error) {
	n, err := o.client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return nil, "", fmt.Errorf("node %s: %w", node, err)
	}
	kubeletVersion = n.Status.NodeInfo.KubeletVersion
	body, err := o.client.CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes/" + node + "/proxy/configz").DoRaw(ctx)
	if err != nil {
		return nil, "", fmt.Errorf("configz of node %s: %w", node, err)
	}
	running, err := configz.Decode(body)
	if err != nil {
		return nil, "", err
	}
	cfg, err = configz.Config(kubeletVersion, running, nil)
	if err != nil {
		return nil, "", fmt.Errorf("node %s: %w", node, err)
	}
	return cfg, kubeletVersion, nil
}

func (o *Options) dumpCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "dump NODE",
		Short: "Print the node's running kubelet config as a ready KubeletConfiguration (from /configz)",
		Long: `dump reads the kubelet's /configz through the apiserver and prints it as a KubeletConfiguration
(kind and apiVersion included) that loads back to exactly the running config: fields the kubelet runs
with an empty value, which /configz omits, are written out (the seed's curl | jq recipe misses them).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, _, err := o.runningConfig(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if o.output == "json" {
				return o.print(o.io.Out, cfg)
			}
			data, err := configz.YAML(cfg)
			if err != nil {
				return err
			}
			_, err = o.io.Out.Write(data)
			return err
		},
	}
}
