package plugin

import (
	"context"
	"encoding/json"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/dkc-dev/dkc/internal/configz"
	"github.com/dkc-dev/dkc/internal/nodeconfig"
)

func (o *Options) assignCommand() *cobra.Command {
	var selector, cm, key string
	cmd := &cobra.Command{
		Use:   "assign (NODE... | -l SELECTOR) --configmap NAMESPACE/NAME [--key kubelet]",
		Short: "Point nodes at a ConfigMap holding a KubeletConfiguration",
		Example: `  kubectl dkc assign node-1 --configmap kube-system/my-node-config-gkt4c2m4b2
  kubectl dkc assign -l pool=blue --configmap kube-system/my-node-config-gkt4c2m4b2 --key kubelet`,
		RunE: func(cmd *cobra.Command, args []string) error {
			ns, name, err := parseConfigMap(cm)
			if err != nil {
				return err
			}
			src := &corev1.NodeConfigSource{ConfigMap: &corev1.ConfigMapNodeConfigSource{Namespace: ns, Name: name, KubeletConfigKey: key}}
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
	_ = cmd.MarkFlagRequired("configmap")
	return cmd
}

func (o *Options) resetCommand() *cobra.Command {
	var selector string
	cmd := &cobra.Command{
		Use:   "reset (NODE... | -l SELECTOR)",
		Short: "Return nodes to their local kubelet config (forgets last-known-good)",
		RunE: func(cmd *cobra.Command, args []string) error {
			nodes, err := o.selectNodes(cmd.Context(), args, selector)
			if err != nil {
				return err
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
	return cmd
}

// NodeStatus is one row of `kubectl dkc status`.
type NodeStatus struct {
	Node      string                   `json:"node"`
	Status    *corev1.NodeConfigStatus `json:"status,omitempty"`
	ConfigOK  string                   `json:"configOK,omitempty"`
	Message   string                   `json:"message,omitempty"`
	Reported  bool                     `json:"reported"`
	Transited *metav1.Time             `json:"lastTransitionTime,omitempty"`
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
		if c.Type == nodeconfig.ConditionType {
			ns.ConfigOK, ns.Message = string(c.Status), c.Message
			t := c.LastTransitionTime
			ns.Transited = &t
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
		Short: "Show each node's assigned, active and last-known-good config, error and ConfigOK",
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
			fmt.Fprintln(w, "NODE\tASSIGNED\tACTIVE\tLAST-KNOWN-GOOD\tCONFIGOK\tERROR\tAGE")
			for _, r := range rows {
				if !r.Reported {
					fmt.Fprintf(w, "%s\t<no dkc sidecar report>\t\t\t%s\t\t\n", r.Node, r.ConfigOK)
					continue
				}
				age := "-"
				if r.Transited != nil {
					age = duration.HumanDuration(time.Since(r.Transited.Time))
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Node, describe(r.Status.Assigned), describe(r.Status.Active),
					describe(r.Status.LastKnownGood), r.ConfigOK, r.Status.Error, age)
			}
			return w.Flush()
		},
	}
	cmd.Flags().StringVarP(&selector, "selector", "l", "", "label selector of the nodes")
	return cmd
}

// runningConfig returns the node's running config from /configz as a complete KubeletConfiguration, with
// the defaults of the node kubelet's own minor, and that kubelet's version.
func (o *Options) runningConfig(ctx context.Context, node string) (cfg map[string]any, kubeletVersion string, err error) {
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
