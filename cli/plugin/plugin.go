// SPDX-License-Identifier: Apache-2.0

// Package plugin is `kubectl dkc`, the operator's CLI: assign and reset config sources, read status, dump a
// node's running config, diff it against a ConfigMap with per-field safety advice, and roll a config out
// over many nodes through a KubeletConfigPool (rollout.go), which dkc-server paces. It uses the usual kubectl flags
// (cli-runtime) and writes the annotation dkc.dev/config-source, or spec.configSource on Nodes where the apiserver
// keeps it.
package plugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/yaml"

	"github.com/dkc-dev/dkc/api/generated/clientset"
	"github.com/dkc-dev/dkc/internal/nodeconfig"
)

// Options shared by the subcommands.
type Options struct {
	flags  *genericclioptions.ConfigFlags
	io     genericiooptions.IOStreams
	client kubernetes.Interface
	pools  clientset.Interface // KubeletConfigPools
	output string
	// podLogs reads a container's log; nil: through the API (a fake clientset's logs are fixed text).
	podLogs func(ctx context.Context, p *corev1.Pod, opts *corev1.PodLogOptions) ([]byte, error)
}

// NewCommand returns the `kubectl dkc` command tree.
func NewCommand(streams genericiooptions.IOStreams) *cobra.Command {
	o := &Options{flags: genericclioptions.NewConfigFlags(true), io: streams}
	root := &cobra.Command{
		Use:   "kubectl-dkc",
		Short: "Reconfigure the kubelets of a live cluster through the API (dkc)",
		Long: `kubectl dkc drives dkc, the Dynamic Kubelet Configuration of Kubernetes 1.8-1.23 brought back:
point Nodes at a ConfigMap holding a KubeletConfiguration, watch them apply it, fall back when it is bad.`,
		SilenceUsage: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := o.flags.ToRESTConfig()
			if err != nil {
				return err
			}
			if o.client, err = kubernetes.NewForConfig(cfg); err != nil {
				return err
			}
			// JSON whatever the kubeconfig prefers: CRDs speak no protobuf.
			poolCfg := rest.CopyConfig(cfg)
			poolCfg.ContentType, poolCfg.AcceptContentTypes = runtime.ContentTypeJSON, runtime.ContentTypeJSON
			o.pools, err = clientset.NewForConfig(poolCfg)
			return err
		},
	}
	o.flags.AddFlags(root.PersistentFlags())
	root.PersistentFlags().StringVarP(&o.output, "output", "o", "table", "output format: table, json or yaml")
	root.AddCommand(o.assignCommand(), o.resetCommand(), o.statusCommand(), o.dumpCommand(), o.diffCommand(),
		o.checkCommand(), o.rolloutCommand(), o.uninstallCommand(), o.versionCommand())
	return root
}

// selectNodes returns the named nodes, or those matching selector.
func (o *Options) selectNodes(ctx context.Context, names []string, selector string) ([]corev1.Node, error) {
	if len(names) > 0 && selector != "" {
		return nil, fmt.Errorf("name nodes or give -l, not both")
	}
	if len(names) == 0 && selector == "" {
		return nil, fmt.Errorf("name at least one node, or select nodes with -l")
	}
	if selector != "" {
		list, err := o.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return nil, err
		}
		if len(list.Items) == 0 {
			return nil, fmt.Errorf("no nodes match %q", selector)
		}
		sort.Slice(list.Items, func(i, j int) bool { return list.Items[i].Name < list.Items[j].Name })
		return list.Items, nil
	}
	var nodes []corev1.Node
	for _, n := range names {
		node, err := o.client.CoreV1().Nodes().Get(ctx, n, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		nodes = append(nodes, *node)
	}
	return nodes, nil
}

// parseConfigMap splits NS/NAME.
func parseConfigMap(ref string) (string, string, error) {
	ns, name, ok := strings.Cut(ref, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return "", "", fmt.Errorf("--configmap %q: want NAMESPACE/NAME", ref)
	}
	return ns, name, nil
}

// setSource points node at src (nil: reset to local), through spec.configSource where the apiserver keeps
// it (the stored Node has it), else through the annotation. A source is validated first with the
// apiserver's own rules.
func (o *Options) setSource(ctx context.Context, node *corev1.Node, src *corev1.NodeConfigSource) (string, error) {
	var patch map[string]any
	where := "annotation " + nodeconfig.SourceAnnotation
	if node.Spec.ConfigSource != nil {
		where = "spec.configSource"
		patch = map[string]any{"spec": map[string]any{"configSource": src}}
		if src == nil {
			// Clear both: after a reset the apiserver will no longer keep the spec field.
			patch["metadata"] = map[string]any{"annotations": map[string]any{nodeconfig.SourceAnnotation: nil}}
		}
	} else {
		var value any
		if src != nil {
			raw, err := json.Marshal(src)
			if err != nil {
				return "", err
			}
			value = string(raw)
		}
		patch = map[string]any{"metadata": map[string]any{"annotations": map[string]any{nodeconfig.SourceAnnotation: value}}}
	}
	raw, err := json.Marshal(patch)
	if err != nil {
		return "", err
	}
	// Transient failures (an apiserver restarting, a webhook replica away) are retried for a while.
	err = retry.OnError(wait.Backoff{Steps: 20, Duration: 250 * time.Millisecond, Factor: 1.5, Cap: 5 * time.Second},
		transient, func() error {
			_, err := o.client.CoreV1().Nodes().Patch(ctx, node.Name, types.StrategicMergePatchType, raw,
				metav1.PatchOptions{FieldManager: "kubectl-dkc"})
			return err
		})
	return where, err
}

// transient says whether err may pass by itself: the apiserver overloaded or restarting (refused, reset or
// closed connections, a TLS handshake or response that timed out) or asking to be called again later. The
// callers retry such errors within their own bounds; their own context's end is not transient (a
// context.DeadlineExceeded is a net.Error that timed out too).
func transient(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return false
	}
	var netErr net.Error
	return apierrors.IsInternalError(err) || apierrors.IsServiceUnavailable(err) || apierrors.IsServerTimeout(err) ||
		apierrors.IsTimeout(err) || apierrors.IsTooManyRequests(err) || utilnet.IsConnectionRefused(err) ||
		utilnet.IsConnectionReset(err) || utilnet.IsProbableEOF(err) || (errors.As(err, &netErr) && netErr.Timeout())
}

func (o *Options) print(w io.Writer, v any) error {
	switch o.output {
	case "json":
		data, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintln(w, string(data))
		return err
	case "yaml":
		data, err := yaml.Marshal(v)
		if err != nil {
			return err
		}
		_, err = w.Write(data)
		return err
	case "table", "":
		return nil
	default:
		return fmt.Errorf("--output %q: want table, json or yaml", o.output)
	}
}
