// SPDX-License-Identifier: Apache-2.0

package plugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"

	"github.com/dkc-dev/dkc/api/v1alpha1"
	"github.com/dkc-dev/dkc/internal/nodeconfig"
)

// The workloads dkc is installed as (deploy/base).
const (
	sidecarDaemonSet = "dkc-sidecar"
	sidecarContainer = "dkc-sidecar"
	serverDeployment = "dkc-server"
	// defaultDropIn is where deploy/base's init container installs the kubelet drop-in, when its arguments
	// do not say.
	defaultDropIn = "/etc/systemd/system/kubelet.service.d/20-dkc.conf"
	// dropInVolume names the host directory of the drop-in in the pod (deploy/base's name, kept if present).
	dropInVolume = "kubelet-dropins"
)

// ErrNotConfirmed: uninstall without --yes, which only prints the plan.
var ErrNotConfirmed = errors.New("nothing changed: run again with --yes to uninstall")

// dkcAnnotations are the Node annotations dkc writes: the assignment (the operator's or a pool's), the
// pool controller's record, the status, a drain's mark (a node cordoned by a drain in progress keeps its
// nodedrain.CordonedAnnotation, which says who cordoned it) and a pool's request to repair drift.
var dkcAnnotations = []string{nodeconfig.SourceAnnotation, v1alpha1.AnnotationAssignment, nodeconfig.StatusAnnotation,
	nodeconfig.DrainedAnnotation, nodeconfig.DriftRepairAnnotation}

func (o *Options) uninstallCommand() *cobra.Command {
	var ns string
	var timeout time.Duration
	var yes bool
	cmd := &cobra.Command{
		Use: "uninstall [--namespace kube-system] [--timeout 10m] --yes",
		Short: "Take dkc off every node (kubelets back on their local config, dkc's files removed) " +
			"before its workloads are deleted",
		Long: `uninstall returns every node to its local kubelet config and removes dkc's files from the nodes, then
dkc's marks from the Nodes; the workloads are deleted last, by you, with the command it prints:

  1. delete every KubeletConfigPool, so that nothing assigns configs any more;
  2. switch the dkc-sidecar DaemonSet to its cleanup mode (dkc-sidecar --uninstall) and wait for its
     rollout: on each node the kubelet drop-in and kubelet.env are removed (daemon-reload), a kubelet
     running a dkc config is restarted once onto its local config and must come back healthy, then the
     checkpoints go; a pod is ready only once its node is clean;
  3. scale dkc-server to 0 (it would write the nodes' status back), then remove from every Node the
     annotations dkc.dev/config-source, dkc.dev/pool-assignment and dkc.dev/config-status,
     spec.configSource and status.config, and the ConfigOK condition;
  4. print the kubectl delete -k step, which you run.

Without --yes it prints this plan for the cluster and exits non-zero. Every step is skipped when done: after
an interruption, run it again. Against a cluster without dkc it says so and exits 0.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			st, err := o.survey(ctx, ns)
			if err != nil {
				return err
			}
			if st.notInstalled() {
				fmt.Fprintf(o.io.Out, "dkc is not installed: no daemonset/%s or deployment/%s in namespace %s, no "+
					"KubeletConfigPool CRD, and no Node carries dkc's annotations or ConfigOK condition. Nothing to do.\n",
					sidecarDaemonSet, serverDeployment, ns)
				return nil
			}
			if st.daemonSet == nil && len(st.markedNodes) > 0 {
				return fmt.Errorf("no daemonset/%s in namespace %s, but Nodes carry dkc's marks (%s): without the sidecar the "+
					"nodes' files cannot be removed. If dkc runs in another namespace, give --namespace; if its workloads were "+
					"deleted already, install them again (kubectl apply -k <your overlay>) and run this again", sidecarDaemonSet, ns,
					strings.Join(st.markedNodes, ", "))
			}
			writePlan(o.io.Out, st)
			if !yes {
				return ErrNotConfirmed
			}
			return o.uninstall(ctx, st, timeout)
		},
	}
	cmd.Flags().StringVar(&ns, "namespace", "kube-system",
		"the namespace dkc is installed in (its DaemonSet and Deployment)")
	cmd.Flags().DurationVar(&timeout, "timeout", 10*time.Minute,
		"how long each wait may take: the sidecar's rollout over every node, dkc-server's scale-down")
	cmd.Flags().BoolVar(&yes, "yes", false, "do it; without, print the plan and exit non-zero")
	return cmd
}

// uninstallState is what the cluster holds of dkc.
type uninstallState struct {
	namespace string
	// crd: the KubeletConfigPool CRD is installed; pools are its objects.
	crd   bool
	pools []string
	// daemonSet and server are dkc's workloads, nil when absent.
	daemonSet *appsv1.DaemonSet
	server    *appsv1.Deployment
	// markedNodes carry dkc's annotations, spec.configSource, status.config or the ConfigOK condition.
	markedNodes []string
	// configNamespaces are dkc-server's --config-namespaces, where pools' snapshots live.
	configNamespaces []string
}

func (st *uninstallState) notInstalled() bool {
	return st.daemonSet == nil && st.server == nil && !st.crd && len(st.markedNodes) == 0
}

// survey reads what the cluster holds of dkc; nothing absent is an error.
func (o *Options) survey(ctx context.Context, ns string) (*uninstallState, error) {
	st := &uninstallState{namespace: ns}
	list, err := o.pools.DkcV1alpha1().KubeletConfigPools().List(ctx, metav1.ListOptions{})
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return nil, fmt.Errorf("list KubeletConfigPools: %w", err)
	default:
		st.crd = true
		for _, p := range list.Items {
			st.pools = append(st.pools, p.Name)
		}
	}
	if st.daemonSet, err = o.client.AppsV1().DaemonSets(ns).Get(ctx, sidecarDaemonSet,
		metav1.GetOptions{}); apierrors.IsNotFound(err) {
		st.daemonSet = nil
	} else if err != nil {
		return nil, fmt.Errorf("daemonset %s/%s: %w", ns, sidecarDaemonSet, err)
	}
	if st.server, err = o.client.AppsV1().Deployments(ns).Get(ctx, serverDeployment,
		metav1.GetOptions{}); apierrors.IsNotFound(err) {
		st.server = nil
	} else if err != nil {
		return nil, fmt.Errorf("deployment %s/%s: %w", ns, serverDeployment, err)
	}
	if st.server != nil {
		st.configNamespaces = configNamespaces(st.server)
	}
	nodes, err := o.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	for i := range nodes.Items {
		if marked(&nodes.Items[i]) {
			st.markedNodes = append(st.markedNodes, nodes.Items[i].Name)
		}
	}
	sort.Strings(st.markedNodes)
	return st, nil
}

// configNamespaces are the --config-namespaces of dkc-server's container.
func configNamespaces(d *appsv1.Deployment) []string {
	for _, c := range d.Spec.Template.Spec.Containers {
		for _, a := range c.Args {
			if v, ok := strings.CutPrefix(a, "--config-namespaces="); ok {
				return strings.Split(v, ",")
			}
		}
	}
	return nil
}

// marked says whether n carries anything of dkc's.
func marked(n *corev1.Node) bool {
	for _, a := range dkcAnnotations {
		if _, ok := n.Annotations[a]; ok {
			return true
		}
	}
	return n.Spec.ConfigSource != nil || n.Status.Config != nil || len(dkcConditions(n)) > 0
}

// dkcConditions are the conditions dkc-server writes that n carries: ConfigOK, ConfigPreview, ConfigDrift.
func dkcConditions(n *corev1.Node) []any {
	var out []any
	for _, t := range []corev1.NodeConditionType{nodeconfig.ConditionType, nodeconfig.PreviewConditionType,
		nodeconfig.DriftConditionType} {
		if slices.ContainsFunc(n.Status.Conditions, func(c corev1.NodeCondition) bool { return c.Type == t }) {
			out = append(out, map[string]any{"type": string(t), "$patch": "delete"})
		}
	}
	return out
}

// writePlan prints what uninstall will do on the cluster st describes.
func writePlan(w io.Writer, st *uninstallState) {
	fmt.Fprintf(w, "Uninstalling dkc (namespace %s):\n", st.namespace)
	switch {
	case !st.crd:
		fmt.Fprintln(w, "  1. KubeletConfigPools: no CRD, nothing to delete")
	case len(st.pools) == 0:
		fmt.Fprintln(w, "  1. KubeletConfigPools: none to delete")
	default:
		fmt.Fprintf(w, "  1. delete the KubeletConfigPools (%s), so that nothing assigns configs any more\n",
			strings.Join(st.pools, ", "))
	}
	switch st.daemonSet {
	case nil:
		fmt.Fprintf(w, "  2. daemonset/%s: gone, and no Node carries dkc's marks: nothing to clean on the nodes\n",
			sidecarDaemonSet)
	default:
		verb := "switch daemonset/" + sidecarDaemonSet + " to its cleanup mode (dkc-sidecar --uninstall) and wait"
		if cleanupMode(st.daemonSet.Spec.Template.Spec.Containers) {
			verb = "daemonset/" + sidecarDaemonSet + " is in its cleanup mode already: wait"
		}
		fmt.Fprintf(w, "  2. %s until it is ready on every node (%d): there the kubelet drop-in, kubelet.env, the "+
			"checkpoints and the sidecar's state\n"+
			"     are removed and a kubelet running a dkc config is restarted once onto its local "+
			"config, which it must run healthy\n",
			verb, st.daemonSet.Status.DesiredNumberScheduled)
	}
	step3 := "  3. "
	if st.server != nil && (st.server.Spec.Replicas == nil || *st.server.Spec.Replicas > 0) {
		fmt.Fprintf(w, "%sscale deployment/%s to 0, so that it writes no status back, then\n     ", step3, serverDeployment)
		step3 = ""
	}
	if len(st.markedNodes) == 0 {
		fmt.Fprintf(w, "%sNodes: none carries dkc's annotations, spec.configSource, status.config or ConfigOK condition\n",
			step3)
	} else {
		fmt.Fprintf(w, "%sremove dkc's annotations (%s), spec.configSource, status.config and the ConfigOK "+
			"condition from %d Node(s): %s\n",
			step3, strings.Join(dkcAnnotations, ", "), len(st.markedNodes), strings.Join(st.markedNodes, ", "))
	}
	fmt.Fprintln(w, "  4. then you delete dkc's workloads, its CRD and the pools' snapshots (the "+
		"commands are printed at the end)")
}

// writeDeleteStep prints the last step, the user's.
func writeDeleteStep(w io.Writer, st *uninstallState) {
	fmt.Fprintln(w, "Every node runs its local kubelet config and holds no dkc file. Last, delete dkc's workloads and "+
		"CRD with the overlay you installed:")
	fmt.Fprintln(w, "  kubectl delete -k <your overlay, e.g. deploy/overlays/self-signed>   # the overlay "+
		"includes the KubeletConfigPool CRD")
	fmt.Fprintln(w, "and the pools' revision snapshots, which dkc-server no longer runs to delete:")
	namespaces := st.configNamespaces
	if len(namespaces) == 0 {
		namespaces = []string{"<each of dkc-server's --config-namespaces>"}
	}
	for _, ns := range namespaces {
		fmt.Fprintf(w, "  kubectl -n %s delete configmap -l %s,%s\n", ns, v1alpha1.LabelPool, v1alpha1.LabelRevision)
	}
}

// uninstall carries out the plan.
func (o *Options) uninstall(ctx context.Context, st *uninstallState, timeout time.Duration) error {
	out := o.io.Out
	if st.crd {
		if err := o.deletePools(ctx, timeout); err != nil {
			return err
		}
	}
	if st.daemonSet != nil {
		if err := o.cleanNodes(ctx, st.namespace, timeout); err != nil {
			return err
		}
	}
	if st.server != nil {
		if err := o.stopServer(ctx, st.server, timeout); err != nil {
			return err
		}
	}
	if err := o.unmarkNodes(ctx); err != nil {
		return err
	}
	fmt.Fprintln(out, "dkc is off every node.")
	writeDeleteStep(out, st)
	return nil
}

// deletePools deletes every KubeletConfigPool and waits until none is left (they have no finalizer).
func (o *Options) deletePools(ctx context.Context, timeout time.Duration) error {
	pools := o.pools.DkcV1alpha1().KubeletConfigPools()
	list, err := pools.List(ctx, metav1.ListOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("list KubeletConfigPools: %w", err)
	}
	for _, p := range list.Items {
		if err := pools.Delete(ctx, p.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete kubeletconfigpool %s: %w", p.Name, err)
		}
		fmt.Fprintf(o.io.Out, "kubeletconfigpool/%s deleted\n", p.Name)
	}
	return poll(ctx, timeout, func() (bool, string, error) {
		list, err := pools.List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, "", err
		}
		return len(list.Items) == 0, fmt.Sprintf("%d KubeletConfigPools still there", len(list.Items)), nil
	})
}

// cleanNodes puts the sidecar's DaemonSet into its cleanup mode and waits until its rollout is complete:
// every node clean.
func (o *Options) cleanNodes(ctx context.Context, ns string, timeout time.Duration) error {
	dsClient := o.client.AppsV1().DaemonSets(ns)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		ds, err := dsClient.Get(ctx, sidecarDaemonSet, metav1.GetOptions{})
		if err != nil {
			return err
		}
		changed, err := toCleanupMode(&ds.Spec.Template)
		if err != nil || !changed {
			return err
		}
		if _, err := dsClient.Update(ctx, ds, metav1.UpdateOptions{FieldManager: fieldManager}); err != nil {
			return err
		}
		fmt.Fprintf(o.io.Out, "daemonset/%s switched to its cleanup mode (dkc-sidecar --uninstall)\n", sidecarDaemonSet)
		return nil
	})
	if err != nil {
		return fmt.Errorf("switch daemonset %s/%s to its cleanup mode: %w", ns, sidecarDaemonSet, err)
	}
	fmt.Fprintf(o.io.Out, "waiting until every node is clean (daemonset/%s rolled out, every pod ready)...\n",
		sidecarDaemonSet)
	last := ""
	var looked time.Time
	err = poll(ctx, timeout, func() (bool, string, error) {
		ds, err := dsClient.Get(ctx, sidecarDaemonSet, metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		done, progress := rolledOut(ds)
		if progress != last {
			fmt.Fprintf(o.io.Out, "  %s\n", progress)
			last = progress
		}
		// The pods are looked at while the counts say not done too (every refusalInterval): a node whose
		// cleanup refused is never ready, so the counts never say done, and its refusal must end the wait.
		if !done && (ds.Status.ObservedGeneration < ds.Generation || time.Since(looked) < refusalInterval) {
			return false, progress, nil
		}
		looked = time.Now()
		// The DaemonSet's counts are per node; a replaced pod of the normal mode may still be terminating
		// beside its successor, and would report status again. Done is when no such pod is left.
		pending, err := o.uncleanNodes(ctx, ds)
		if err != nil {
			return false, "", err
		}
		if !done {
			return false, progress, nil
		}
		return len(pending) == 0, strings.Join(pending, "; "), nil
	})
	if errors.Is(err, errNodeRefused) {
		return err
	}
	if err == nil {
		return nil
	}
	if ctx.Err() == nil {
		ds, gerr := dsClient.Get(ctx, sidecarDaemonSet, metav1.GetOptions{})
		if gerr != nil {
			return err
		}
		pending, uerr := o.uncleanNodes(ctx, ds)
		if errors.Is(uerr, errNodeRefused) {
			return uerr
		}
		if len(pending) > 0 {
			err = fmt.Errorf("%w\n"+
				"not clean yet:\n"+
				"  %s\n"+
				"its cleanup pod's log says why (kubectl -n %s logs <pod>); run this again to go on waiting",
				err, strings.Join(pending, "\n  "), ns)
		}
	}
	return err
}

// rolledOut says whether the DaemonSet runs its current template, ready, on every node it should, and how
// far it is.
func rolledOut(ds *appsv1.DaemonSet) (bool, string) {
	s := ds.Status
	progress := fmt.Sprintf("%d of %d nodes updated, %d ready", s.UpdatedNumberScheduled, s.DesiredNumberScheduled,
		s.NumberReady)
	if s.ObservedGeneration < ds.Generation {
		return false, "the DaemonSet controller has not seen the change yet"
	}
	return s.UpdatedNumberScheduled == s.DesiredNumberScheduled && s.NumberReady == s.DesiredNumberScheduled, progress
}

// uncleanNodes names the nodes whose sidecar pod is not a ready cleanup pod (or that still have a pod of
// the normal mode, terminating), and why.
func (o *Options) uncleanNodes(ctx context.Context, ds *appsv1.DaemonSet) ([]string, error) {
	sel, err := metav1.LabelSelectorAsSelector(ds.Spec.Selector)
	if err != nil {
		return nil, err
	}
	pods, err := o.client.CoreV1().Pods(ds.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		return nil, fmt.Errorf("list the pods of daemonset %s/%s: %w", ds.Namespace, ds.Name, err)
	}
	var out []string
	for _, p := range pods.Items {
		switch {
		case !cleanupMode(p.Spec.Containers):
			out = append(out, fmt.Sprintf("%s: pod %s still runs the sidecar's normal mode", p.Spec.NodeName, p.Name))
		case !podReady(&p):
			if why := o.refusal(ctx, &p); why != "" {
				return nil, fmt.Errorf("%w: %s (pod %s): %s\n"+
					"The other nodes go on being cleaned. Fix what it says on %s, then run this again: its cleanup pod "+
					"tries again by itself every 30s", errNodeRefused, p.Spec.NodeName, p.Name, why, p.Spec.NodeName)
			}
			out = append(out, fmt.Sprintf("%s: pod %s has not finished the cleanup (not ready)", p.Spec.NodeName, p.Name))
		}
	}
	sort.Strings(out)
	return out, nil
}

// refusalInterval is how often the wait looks for a refusal in the unready cleanup pods' logs before the
// DaemonSet's counts say done: a refusal comes within seconds of a pod's start, and a log read per
// unready pod every poll (2s) would be a load on a large cluster's apiserver and kubelets.
const refusalInterval = 10 * time.Second

// errNodeRefused: a node's cleanup refused to restart its kubelet onto its local config; it stays on its dkc
// config.
var errNodeRefused = errors.New("dkc was not removed from a node, which stays on its dkc config")

// refusedMessage is the message a cleanup pod logs its refusal with, the reason in its "error" field
// (uninstall.RefusedMessage, sidecar/internal/uninstall).
const refusedMessage = "uninstall refused; the node stays on its dkc config"

// refusal is why the cleanup pod p refused to take dkc off its node, from the end of its log; "" when it
// did not (or its log cannot be read). Only a pod whose container has run a while is asked: a refusal comes
// from its first pass, which takes seconds, and a rollout over many nodes polls every unready pod.
func (o *Options) refusal(ctx context.Context, p *corev1.Pod) string {
	started := time.Time{}
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name == sidecarContainer && cs.State.Running != nil {
			started = cs.State.Running.StartedAt.Time
		}
	}
	if started.IsZero() || time.Since(started) < 5*time.Second {
		return ""
	}
	tail, limit := int64(20), int64(64<<10)
	opts := &corev1.PodLogOptions{Container: sidecarContainer, TailLines: &tail, LimitBytes: &limit}
	var raw []byte
	var err error
	if o.podLogs != nil {
		raw, err = o.podLogs(ctx, p, opts)
	} else {
		raw, err = o.client.CoreV1().Pods(p.Namespace).GetLogs(p.Name, opts).DoRaw(ctx)
	}
	if err != nil {
		return ""
	}
	return refusalIn(string(raw))
}

// refusalIn is the reason of the last refusal in a cleanup pod's log lines (zap's JSON: the reason in
// "error"; other formats: the whole line).
func refusalIn(log string) string {
	lines := strings.Split(strings.TrimSpace(log), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if !strings.Contains(lines[i], refusedMessage) {
			continue
		}
		var entry struct {
			Error string `json:"error"`
		}
		if json.Unmarshal([]byte(lines[i]), &entry) == nil && entry.Error != "" {
			return entry.Error
		}
		return lines[i]
	}
	return ""
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// cleanupMode says whether the containers (a pod's or a template's) run the sidecar with --uninstall.
func cleanupMode(containers []corev1.Container) bool {
	return slices.ContainsFunc(containers, func(c corev1.Container) bool {
		return c.Name == sidecarContainer && slices.Contains(c.Args, "--uninstall")
	})
}

// toCleanupMode changes the sidecar's pod template into its cleanup mode, and says whether it changed:
//   - the sidecar container gets --uninstall and --kubelet-dropin (the path the init container installs
//     the drop-in at), and its other arguments are kept (its paths; the service's flags are ignored);
//   - it mounts the drop-in's host directory read-write, which the normal mode does not (the long-running
//     sidecar, which acts on what the network sends it, must not write unit files; this one only removes);
//   - the init container that installs the drop-in goes: it would put the drop-in back at every pod start.
//
// Nothing else changes, so the cleanup pods keep the normal mode's probes (readiness: the node is clean),
// security context and other mounts.
func toCleanupMode(t *corev1.PodTemplateSpec) (bool, error) {
	spec := &t.Spec
	i := slices.IndexFunc(spec.Containers, func(c corev1.Container) bool { return c.Name == sidecarContainer })
	if i < 0 {
		return false, fmt.Errorf("no container %q in the pod template", sidecarContainer)
	}
	c := &spec.Containers[i]
	dropIn, volume := defaultDropIn, ""
	var kept []corev1.Container
	for _, ic := range spec.InitContainers {
		if !slices.Contains(ic.Args, "--install-only") {
			kept = append(kept, ic)
			continue
		}
		for _, a := range ic.Args {
			if v, ok := strings.CutPrefix(a, "--install-kubelet-dropin="); ok {
				dropIn = v
			}
		}
		for _, m := range ic.VolumeMounts {
			if m.MountPath == filepath.Dir(dropIn) {
				volume = m.Name
			}
		}
	}
	changed := len(kept) != len(spec.InitContainers)
	spec.InitContainers = kept
	isDropIn := func(a string) bool { return strings.HasPrefix(a, "--kubelet-dropin=") }
	if !slices.Contains(c.Args, "--uninstall") {
		// Removing a drop-in elsewhere than where the DaemonSet installed it would leave it.
		c.Args = slices.DeleteFunc(c.Args, isDropIn)
		c.Args = append(c.Args, "--uninstall", "--kubelet-dropin="+dropIn)
		changed = true
	}
	if j := slices.IndexFunc(c.Args, isDropIn); j >= 0 {
		dropIn = strings.TrimPrefix(c.Args[j], "--kubelet-dropin=")
	}
	dir := filepath.Dir(dropIn)
	if !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == dir && !m.ReadOnly }) {
		if volume == "" {
			volume = dropInVolume
		}
		if !slices.ContainsFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == volume }) {
			create := corev1.HostPathDirectoryOrCreate
			spec.Volumes = append(spec.Volumes, corev1.Volume{Name: volume,
				VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: dir, Type: &create}}})
		}
		c.VolumeMounts = slices.DeleteFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == dir })
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: volume, MountPath: dir})
		changed = true
	}
	return changed, nil
}

// stopServer scales dkc-server to 0 and waits until none of its pods is left. A running replica keeps the
// status its sidecars reported and writes it back onto a Node that lost it (services/internal/nodestatus),
// so the Nodes are cleaned only once no replica runs. With none, the admission webhook (failurePolicy Fail)
// refuses Node writes that set dkc.dev/config-source — none are made here: removing the annotation is not
// sent to it (its matchConditions) — and the admission policy lets an administrator remove every mark.
func (o *Options) stopServer(ctx context.Context, d *appsv1.Deployment, timeout time.Duration) error {
	deployments := o.client.AppsV1().Deployments(d.Namespace)
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 0 {
		patch := []byte(`{"spec":{"replicas":0}}`)
		if _, err := deployments.Patch(ctx, d.Name, types.MergePatchType, patch,
			metav1.PatchOptions{FieldManager: fieldManager}); err != nil {
			return fmt.Errorf("scale deployment %s/%s to 0: %w", d.Namespace, d.Name, err)
		}
		fmt.Fprintf(o.io.Out, "deployment/%s scaled to 0 (it would write the nodes' status back)\n", d.Name)
	}
	sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
	if err != nil {
		return err
	}
	return poll(ctx, timeout, func() (bool, string, error) {
		pods, err := o.client.CoreV1().Pods(d.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
		if err != nil {
			return false, "", err
		}
		return len(pods.Items) == 0, fmt.Sprintf("%d dkc-server pods still there", len(pods.Items)), nil
	})
}

// unmarkNodes removes dkc's marks from every Node: through the Node the annotations and spec.configSource,
// through its status subresource the ConfigOK condition and status.config.
func (o *Options) unmarkNodes(ctx context.Context) error {
	nodes, err := o.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list nodes: %w", err)
	}
	for i := range nodes.Items {
		n := &nodes.Items[i]
		if !marked(n) {
			continue
		}
		nodePatch, statusPatch := unmarkPatches(n)
		if nodePatch != nil {
			if err := o.patchNode(ctx, n.Name, types.MergePatchType, nodePatch); err != nil {
				return err
			}
		}
		if statusPatch != nil {
			if err := o.patchNode(ctx, n.Name, types.StrategicMergePatchType, statusPatch, "status"); err != nil {
				return err
			}
		}
		fmt.Fprintf(o.io.Out, "node/%s: dkc's annotations, config source and ConfigOK condition removed\n", n.Name)
	}
	return nil
}

func (o *Options) patchNode(ctx context.Context, name string, pt types.PatchType, patch []byte, sub ...string) error {
	err := retry.OnError(retry.DefaultBackoff, transient, func() error {
		_, err := o.client.CoreV1().Nodes().Patch(ctx, name, pt, patch, metav1.PatchOptions{FieldManager: fieldManager},
			sub...)
		return err
	})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("node %s: remove dkc's marks: %w", name, err)
	}
	return nil
}

// unmarkPatches are the patches that remove dkc's marks from n: a JSON merge patch of the Node, and a
// strategic merge patch of its status (the ConfigOK condition deleted by its merge key); nil when there is
// nothing to remove there.
func unmarkPatches(n *corev1.Node) (node, status []byte) {
	meta := map[string]any{}
	for _, a := range dkcAnnotations {
		if _, ok := n.Annotations[a]; ok {
			meta[a] = nil
		}
	}
	p := map[string]any{}
	if len(meta) > 0 {
		p["metadata"] = map[string]any{"annotations": meta}
	}
	if n.Spec.ConfigSource != nil {
		p["spec"] = map[string]any{"configSource": nil}
	}
	if len(p) > 0 {
		node, _ = json.Marshal(p)
	}
	s := map[string]any{}
	if conds := dkcConditions(n); len(conds) > 0 {
		s["conditions"] = conds
	}
	if n.Status.Config != nil {
		s["config"] = nil
	}
	if len(s) > 0 {
		status, _ = json.Marshal(map[string]any{"status": s})
	}
	return node, status
}

// poll calls check every 2s until it is done, ctx ends or timeout passes; the error says what was
// awaited last.
func poll(ctx context.Context, timeout time.Duration, check func() (done bool, progress string, err error)) error {
	deadline := time.Now().Add(timeout)
	var last string
	for {
		done, progress, err := check()
		if err != nil && !transient(err) {
			return err
		}
		if done {
			return nil
		}
		if progress != "" {
			last = progress
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not done after %v: %s", timeout, last)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}
}
