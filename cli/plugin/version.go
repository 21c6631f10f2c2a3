// SPDX-License-Identifier: Apache-2.0

package plugin

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dkc-dev/dkc/internal/version"
)

// versionInfo is what `kubectl dkc version` reports: the plugin's own release and, unless --client, the
// images dkc runs in the cluster and how far their rollout has come (during an upgrade, both releases).
type versionInfo struct {
	Client  string          `json:"client"`
	Server  *workloadImages `json:"server,omitempty"`
	Sidecar *workloadImages `json:"sidecar,omitempty"`
}

type workloadImages struct {
	Workload string   `json:"workload"`
	Images   []string `json:"images"`
	Desired  int32    `json:"desired"`
	Updated  int32    `json:"updated"`
	Ready    int32    `json:"ready"`
}

func (o *Options) versionCommand() *cobra.Command {
	var ns string
	var client bool
	cmd := &cobra.Command{
		Use:   "version [--client] [--namespace kube-system]",
		Short: "Print kubectl-dkc's version and the images dkc runs in the cluster",
		Long: `version prints the release kubectl-dkc was built as and, unless --client, the images of the dkc-server
Deployment and the dkc-sidecar DaemonSet with how many of their pods run the current template (updated)
and are ready: during an upgrade, updated < desired until the rollout is done (0 right after an apply,
until the workload's controller has seen the new template).`,
		Args: cobra.NoArgs,
		// Only the cluster part needs a client: --client works without a kubeconfig.
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			if client {
				return nil
			}
			return cmd.Root().PersistentPreRunE(cmd, nil)
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			info := versionInfo{Client: version.String()}
			if !client {
				var err error
				if info.Server, info.Sidecar, err = o.clusterImages(cmd.Context(), ns); err != nil {
					return err
				}
			}
			if o.output != "table" {
				return o.print(o.io.Out, info)
			}
			fmt.Fprintf(o.io.Out, "kubectl-dkc: %s\n", info.Client)
			for _, w := range []*workloadImages{info.Server, info.Sidecar} {
				if w != nil {
					fmt.Fprintf(o.io.Out, "%s: %s (%d desired, %d updated, %d ready)\n", w.Workload, strings.Join(w.Images, ", "),
						w.Desired, w.Updated, w.Ready)
				}
			}
			if !client && info.Server == nil && info.Sidecar == nil {
				fmt.Fprintf(o.io.Out, "dkc is not installed in namespace %s\n", ns)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&ns, "namespace", "kube-system",
		"the namespace dkc is installed in (its Deployment and DaemonSet)")
	cmd.Flags().BoolVar(&client, "client", false, "the plugin's version only; do not contact the cluster")
	return cmd
}

// clusterImages reads dkc's Deployment and DaemonSet in ns; nil for one that does not exist.
func (o *Options) clusterImages(ctx context.Context, ns string) (server, sidecar *workloadImages, err error) {
	d, err := o.client.AppsV1().Deployments(ns).Get(ctx, serverDeployment, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return nil, nil, fmt.Errorf("deployment %s/%s: %w", ns, serverDeployment, err)
	default:
		var desired int32 = 1
		if d.Spec.Replicas != nil {
			desired = *d.Spec.Replicas
		}
		server = &workloadImages{Workload: "deployment/" + serverDeployment, Images: images(d.Spec.Template.Spec.Containers),
			Desired: desired, Updated: d.Status.UpdatedReplicas, Ready: d.Status.ReadyReplicas}
		if d.Status.ObservedGeneration < d.Generation {
			server.Updated = 0 // the counts are the previous template's until the controller sees the new one
		}
	}
	ds, err := o.client.AppsV1().DaemonSets(ns).Get(ctx, sidecarDaemonSet, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return nil, nil, fmt.Errorf("daemonset %s/%s: %w", ns, sidecarDaemonSet, err)
	default:
		sidecar = &workloadImages{Workload: "daemonset/" + sidecarDaemonSet, Images: images(ds.Spec.Template.Spec.Containers),
			Desired: ds.Status.DesiredNumberScheduled, Updated: ds.Status.UpdatedNumberScheduled, Ready: ds.Status.NumberReady}
		if ds.Status.ObservedGeneration < ds.Generation {
			sidecar.Updated = 0
		}
	}
	return server, sidecar, nil
}

// images lists the containers' images once each, in order.
func images(cs []corev1.Container) []string {
	var out []string
	for _, c := range cs {
		if !slices.Contains(out, c.Image) {
			out = append(out, c.Image)
		}
	}
	return out
}
