// SPDX-License-Identifier: Apache-2.0

package plugin

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/util/retry"

	"github.com/dkc-dev/dkc/api/v1alpha1"
)

// `kubectl dkc rollout` is a front end to KubeletConfigPools (api/v1alpha1): it writes the pool and follows
// dkc-server's pool controller rolling it out. Nothing here assigns a node: the rollout goes on in the
// cluster when kubectl-dkc exits, and `kubectl apply` of a pool manifest is the same rollout.

// ErrRolloutStopped is returned when a followed rollout ended short of every node updated: the pool halted
// after maxFailures nodes failed its revision, or its config cannot be rolled out.
type ErrRolloutStopped struct {
	Pool    string
	Reason  string // the condition's: ReasonFailureBudgetExhausted, or ConfigInvalid's reason
	Message string
}

func (e *ErrRolloutStopped) Error() string {
	return fmt.Sprintf("kubeletconfigpool %s: %s: %s", e.Pool, e.Reason, e.Message)
}

// poolFlags are the spec fields `kubectl dkc rollout` sets; a flag not given leaves the field alone.
type poolFlags struct {
	configMap, key, selector  string
	maxUnavailable            string
	maxFailures               int32
	nodeTimeout, pauseBetween time.Duration
	wait                      bool
	timeout, poll             time.Duration
	changed                   func(flag string) bool
	// dryRun: write nothing; show what the change does to each selected node (preview.go).
	dryRun   bool
	checkDir string
}

func (o *Options) rolloutCommand() *cobra.Command {
	var f poolFlags
	cmd := &cobra.Command{
		Use:   "rollout POOL [--configmap NAMESPACE/NAME] [-l SELECTOR] [--max-unavailable N|P%] [flags]",
		Short: "Roll a kubelet config out to many nodes through a KubeletConfigPool, and follow it",
		Long: `rollout creates the KubeletConfigPool POOL, or updates the fields whose flags are given, and follows
dkc-server rolling it out: at most --max-unavailable nodes in progress at a time, halting once
--max-failures nodes failed the config (they fall back to their last-known-good config; nodes not yet
assigned are not touched). The pool is declarative: the rollout goes on in the cluster when this command
exits, and kubectl apply of a KubeletConfigPool manifest does the same.

It returns when every selected node runs the pool's revision (exit 0), when the pool halts or its config
cannot be rolled out (exit 1, naming the failed nodes and what to do), when the pool is paused, or at
--timeout. --wait=false returns once the pool is written.

An edit of the pool's ConfigMap in place is rolled out by itself, as a new revision; run rollout POOL
to follow it (it waits for the edit's revision).`,
		Example: `  # create or update the pool "blue" and follow it
  kubectl dkc rollout blue --configmap kube-system/my-node-config -l pool=blue --max-unavailable 10%

  kubectl dkc rollout status blue       # follow it again, or another rollout
  kubectl dkc rollout undo blue         # back to the previous revision
  kubectl dkc rollout retry blue        # a halted pool goes on
  kubectl dkc rollout pause blue; kubectl dkc rollout resume blue
  kubectl dkc rollout history blue`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f.changed = cmd.Flags().Changed
			return o.rollout(cmd.Context(), args[0], f)
		},
	}
	cmd.Flags().StringVar(&f.configMap, "configmap", "",
		"the ConfigMap holding the KubeletConfiguration, NAMESPACE/NAME (required to create a pool)")
	cmd.Flags().StringVar(&f.key, "key", "kubelet", "the ConfigMap key holding the KubeletConfiguration")
	cmd.Flags().StringVarP(&f.selector, "selector", "l", "",
		"label selector of the pool's nodes (required to create a pool; -l '' selects every node)")
	cmd.Flags().StringVar(&f.maxUnavailable, "max-unavailable", "1",
		"nodes in progress at once: a number, or a percentage of the selected nodes (rounded down, at least 1)")
	cmd.Flags().Int32Var(&f.maxFailures, "max-failures", v1alpha1.DefaultMaxFailures,
		"nodes that may fail the config before the pool halts")
	cmd.Flags().DurationVar(&f.nodeTimeout, "node-timeout", 30*time.Minute,
		"how long a node may stay in progress (its trial included) before it counts as failed")
	cmd.Flags().DurationVar(&f.pauseBetween, "pause-between-batches", 0,
		"wait this long after each batch is done before the next (0: fill a free slot at once)")
	addFollowFlags(cmd, &f)
	cmd.Flags().BoolVar(&f.dryRun, "dry-run", false,
		"write nothing: show, for each node the pool would select, what the change needs (restart-safe, "+
			"needs-state-reset-and-drain, disruptive), its allocatable now and under the config, and the pods its "+
			"kubelet would no longer admit")
	cmd.Flags().StringVar(&f.checkDir, "kubelet-check-dir", "",
		"with --dry-run: directory of the dkc-kubelet-check-<minor> helpers; default: next to kubectl-dkc, else the "+
			"directory of the first on $PATH")
	cmd.AddCommand(o.rolloutStatusCommand(), o.rolloutPauseCommand(true), o.rolloutPauseCommand(false),
		o.rolloutRetryCommand(), o.rolloutUndoCommand(), o.rolloutHistoryCommand())
	return cmd
}

func addFollowFlags(cmd *cobra.Command, f *poolFlags) {
	cmd.Flags().BoolVar(&f.wait, "wait", true, "follow the rollout until it is done, halts or is paused")
	cmd.Flags().DurationVar(&f.timeout, "timeout", time.Hour, "give up following after this long (the rollout goes on)")
	cmd.Flags().DurationVar(&f.poll, "poll", 2*time.Second, "how often the pool's status is read")
}

func (o *Options) rollout(ctx context.Context, name string, f poolFlags) error {
	pool, err := o.getPool(ctx, name)
	creating := apierrors.IsNotFound(err)
	if err != nil && !creating {
		return err
	}
	if creating {
		if f.configMap == "" || !f.changed("selector") {
			return fmt.Errorf("kubeletconfigpool %s does not exist: create it with --configmap and -l", name)
		}
		pool = &v1alpha1.KubeletConfigPool{TypeMeta: poolKind, ObjectMeta: metav1.ObjectMeta{Name: name}}
	}
	before := pool.Spec.DeepCopy()
	if err := applyPoolFlags(&pool.Spec, f, creating); err != nil {
		return err
	}
	if f.dryRun {
		return o.preview(ctx, pool, f.checkDir)
	}
	// The ConfigMap is read here too, so that a typo fails now rather than as the pool's ConfigInvalid.
	ref := pool.Spec.ConfigMap
	cm, err := o.client.CoreV1().ConfigMaps(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("configmap %s/%s: %w", ref.Namespace, ref.Name, err)
	}
	if _, ok := cm.Data[ref.KubeletConfigKey]; !ok {
		return fmt.Errorf("configmap %s/%s has no key %q", ref.Namespace, ref.Name, ref.KubeletConfigKey)
	}
	want := v1alpha1.RevisionName(ref.Namespace, ref.KubeletConfigKey, cm.Data)
	verb := "unchanged"
	switch {
	case creating:
		verb = "created"
		pool, err = o.createPool(ctx, pool)
	case !apiequality.Semantic.DeepEqual(before, &pool.Spec):
		verb = "updated"
		pool, err = o.modifyPool(ctx, name,
			func(p *v1alpha1.KubeletConfigPool) error { return applyPoolFlags(&p.Spec, f, false) })
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(o.io.Out, "kubeletconfigpool/%s %s: %s/%s key %s, revision %s\n", name, verb, ref.Namespace, ref.Name,
		ref.KubeletConfigKey, want)
	if !f.wait {
		return nil
	}
	return o.follow(ctx, name, pool.Generation, want, f.timeout, f.poll)
}

// applyPoolFlags sets the spec fields whose flags were given (every field when creating).
func applyPoolFlags(spec *v1alpha1.KubeletConfigPoolSpec, f poolFlags, creating bool) error {
	set := func(flag string) bool { return creating || f.changed(flag) }
	if f.configMap != "" || set("key") {
		ns, name := spec.ConfigMap.Namespace, spec.ConfigMap.Name
		if f.configMap != "" {
			var err error
			if ns, name, err = parseConfigMap(f.configMap); err != nil {
				return err
			}
		}
		key := spec.ConfigMap.KubeletConfigKey
		if set("key") || key == "" {
			key = f.key
		}
		spec.ConfigMap = v1alpha1.ConfigMapReference{Namespace: ns, Name: name, KubeletConfigKey: key}
	}
	if set("selector") {
		sel, err := metav1.ParseToLabelSelector(f.selector)
		if err != nil {
			return fmt.Errorf("-l %q: %w", f.selector, err)
		}
		spec.NodeSelector = *sel
	}
	if set("max-unavailable") {
		mu := intstr.Parse(f.maxUnavailable)
		if _, err := intstr.GetScaledValueFromIntOrPercent(&mu, 100, false); err != nil {
			return fmt.Errorf("--max-unavailable: %w", err)
		}
		spec.MaxUnavailable = &mu
	}
	if set("max-failures") {
		spec.MaxFailures = &f.maxFailures
	}
	if set("node-timeout") {
		spec.NodeTimeout = &metav1.Duration{Duration: f.nodeTimeout}
	}
	if set("pause-between-batches") && (f.pauseBetween > 0 || spec.PauseBetweenBatches != nil) {
		spec.PauseBetweenBatches = &metav1.Duration{Duration: f.pauseBetween}
	}
	return nil
}

// verdict is what a followed rollout's pool says: done (err nil: complete or paused; err set: stopped),
// or not yet, with a line describing where it is.
func verdict(p *v1alpha1.KubeletConfigPool, generation int64, revision string) (line string, done bool, err error) {
	n := p.Status.Nodes
	rev := p.Status.CurrentRevision
	if rev == "" {
		rev = "<none>"
	}
	line = fmt.Sprintf("revision %s: %d of %d nodes updated, %d in progress, %d failed, %s",
		rev, n.Updated, n.Selected, n.InProgress, n.Failed, heldSummary(p.Status))
	if n.Drifted > 0 {
		line += fmt.Sprintf(", %d drifted", n.Drifted)
	}
	if p.Status.ObservedGeneration < generation {
		return "waiting for dkc-server to see the pool's generation " + fmt.Sprint(generation), false, nil
	}
	cond := func(t string) *metav1.Condition { return meta.FindStatusCondition(p.Status.Conditions, t) }
	taken := revision == "" || p.Status.CurrentRevision == revision
	if c := cond(v1alpha1.ConditionConfigInvalid); c != nil && c.Status == metav1.ConditionTrue {
		// A ConfigMap or key the caller has just read is there: such a finding is from before an edit the
		// controller has not seen yet. So is a finding on content that names another revision than the
		// one the caller read (the controller's messages on content say "(revision R)").
		stale := !taken && (c.Reason == v1alpha1.ReasonConfigMapNotFound || c.Reason == v1alpha1.ReasonKeyNotFound ||
			((c.Reason == v1alpha1.ReasonValidationFailed || c.Reason == v1alpha1.ReasonDrainRequired ||
				c.Reason == v1alpha1.ReasonCapacityRefused) && revision != "" &&
				strings.Contains(c.Message, "(revision ") &&
				!strings.Contains(c.Message, "(revision "+revision+")")))
		if !stale {
			return line, true, &ErrRolloutStopped{Pool: p.Name, Reason: c.Reason, Message: c.Message}
		}
	}
	if pv := p.Status.Preview; !taken && pv != nil && pv.Revision == revision {
		// Taken, but not assigned anywhere until the nodes' sidecars previewed it.
		if u := cond(v1alpha1.ConditionUpdating); u != nil && u.Reason == v1alpha1.ReasonWaitingForPreview {
			return u.Message, false, nil
		}
	}
	if !taken {
		// An in-place edit is seen by the controller after the ConfigMap's watch event, not with a generation.
		return fmt.Sprintf("waiting for dkc-server to take revision %s (current %s)", revision, rev), false, nil
	}
	if c := cond(v1alpha1.ConditionHalted); c != nil && c.Status == metav1.ConditionTrue {
		return line, true, &ErrRolloutStopped{Pool: p.Name, Reason: c.Reason, Message: c.Message}
	}
	updated := cond(v1alpha1.ConditionUpdated)
	if updated != nil && updated.Status == metav1.ConditionTrue {
		return fmt.Sprintf("rollout complete: %d nodes run revision %s", n.Updated, rev), true, nil
	}
	if updated != nil && updated.Reason == v1alpha1.ReasonNoNodesSelected {
		return line, true, &ErrRolloutStopped{Pool: p.Name, Reason: updated.Reason,
			Message: "the pool's nodeSelector matches no node"}
	}
	if p.Spec.Paused {
		return line + "; paused (kubectl dkc rollout resume " + p.Name + ")", true, nil
	}
	updating := cond(v1alpha1.ConditionUpdating)
	if updating != nil && updating.Status == metav1.ConditionFalse && updating.Reason == v1alpha1.ReasonNothingToAssign {
		// Settled short of every node: the rest failed within maxFailures or are held. Failures that still
		// count need a look (exit 1); those a retry forgave, and held nodes, are someone's decision already.
		counting := 0
		for _, f := range p.Status.FailedNodes {
			if f.Retry == p.Spec.Retry {
				counting++
			}
		}
		if counting > 0 {
			return line, true, &ErrRolloutStopped{Pool: p.Name, Reason: updating.Reason, Message: updating.Message}
		}
		return line + "; nothing more to assign: the others are held, drifted or failed before a retry (kubectl dkc " +
			"rollout status " + p.Name + ")", true, nil
	}
	if updating != nil && updating.Status == metav1.ConditionFalse &&
		updating.Reason == v1alpha1.ReasonInvalidMaintenanceWindow {
		return line, true, &ErrRolloutStopped{Pool: p.Name, Reason: updating.Reason, Message: updating.Message}
	}
	if w := windowSummary(p.Status.MaintenanceWindow, time.Now()); w != "" && !p.Status.MaintenanceWindow.Open {
		line += "; " + w
	} else if updating != nil && updating.Status == metav1.ConditionTrue &&
		updating.Reason != v1alpha1.ReasonRollingOut {
		line += " (" + updating.Reason + ")"
	}
	if c := cond(v1alpha1.ConditionDegraded); c != nil && c.Status == metav1.ConditionTrue &&
		c.Reason == v1alpha1.ReasonSelectorOverlap {
		line += "; " + c.Message
	}
	return line, false, nil
}

// follow prints the pool's progress as it changes until verdict says done, or timeout.
func (o *Options) follow(ctx context.Context, name string, generation int64, revision string, timeout,
	poll time.Duration) error {
	poll = max(poll, 100*time.Millisecond)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	last := ""
	for {
		p, err := o.getPool(ctx, name)
		switch {
		case err == nil:
			line, done, verr := verdict(p, generation, revision)
			if line != last {
				fmt.Fprintf(o.io.Out, "%s %s\n", time.Now().Format(time.TimeOnly), line)
				last = line
			}
			if done {
				if verr != nil {
					o.explainStop(p)
				}
				return verr
			}
		case apierrors.IsNotFound(err):
			return fmt.Errorf("kubeletconfigpool %s was deleted", name)
		case !transient(err) && ctx.Err() == nil:
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kubeletconfigpool %s: not done after %v (the rollout goes on; follow it with "+
				"kubectl dkc rollout status %s): %s",
				name, timeout, name, last)
		case <-time.After(poll):
		}
	}
}

// explainStop writes, for a pool that stopped, which nodes failed and what the operator can do.
func (o *Options) explainStop(p *v1alpha1.KubeletConfigPool) {
	w := o.io.ErrOut
	for _, f := range p.Status.FailedNodes {
		fmt.Fprintf(w, "  node %s failed revision %s (%s): %s\n", f.Name, f.Revision, f.Reason, f.Error)
	}
	if c := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionConfigInvalid); c != nil &&
		c.Status == metav1.ConditionTrue {
		fmt.Fprintf(w, "no node was touched for this config; fix the ConfigMap (or point the pool at another) and run "+
			"kubectl dkc rollout %s again\n", p.Name)
		return
	}
	if c := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionHalted); c == nil ||
		c.Status != metav1.ConditionTrue {
		if len(p.Status.FailedNodes) > 0 {
			fmt.Fprintln(w, "failed nodes run their last-known-good config; every other node is updated or held.")
			fmt.Fprintf(w, "to roll back: kubectl dkc rollout undo %s; to fix forward: edit the ConfigMap\n", p.Name)
		}
		return
	}
	fmt.Fprintln(w, "failed nodes run their last-known-good config; nodes not yet assigned were not touched.")
	if p.Status.PreviousRevision != "" {
		fmt.Fprintf(w, "to roll back:   kubectl dkc rollout undo %s   (revision %s)\n", p.Name, p.Status.PreviousRevision)
	}
	fmt.Fprintf(w, "to go on:       kubectl dkc rollout retry %s   (failures so far stop counting)\n", p.Name)
	fmt.Fprintf(w, "to fix forward: edit the ConfigMap, or kubectl dkc rollout %s --configmap NAMESPACE/NAME\n", p.Name)
}

func (o *Options) rolloutStatusCommand() *cobra.Command {
	var f poolFlags
	cmd := &cobra.Command{
		Use:   "status POOL",
		Short: "Show a pool's rollout, and follow it until it is done, halts or is paused",
		Long: `status prints the pool's revision, node counts and conditions, and the nodes that failed. With --wait
(the default) it then follows the rollout like rollout POOL does: exit 0 when every selected node runs the
current revision or the pool is paused, 1 when the pool halted or its config cannot be rolled out. Right
after an in-place edit of the pool's ConfigMap, follow with rollout POOL instead: it waits for the edit's
revision, where status may still see the previous one complete.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := o.getPool(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if o.output != "table" && o.output != "" {
				return o.print(o.io.Out, p)
			}
			o.describePool(p)
			if !f.wait {
				return nil
			}
			return o.follow(cmd.Context(), p.Name, p.Generation, "", f.timeout, f.poll)
		},
	}
	addFollowFlags(cmd, &f)
	return cmd
}

// describePool prints the pool as status shows it.
func (o *Options) describePool(p *v1alpha1.KubeletConfigPool) {
	w := tabwriter.NewWriter(o.io.Out, 0, 4, 2, ' ', 0)
	ref := p.Spec.ConfigMap
	sel, _ := metav1.LabelSelectorAsSelector(&p.Spec.NodeSelector)
	fmt.Fprintf(w, "Pool:\t%s\n", p.Name)
	fmt.Fprintf(w, "Config:\t%s/%s key %s\n", ref.Namespace, ref.Name, ref.KubeletConfigKey)
	fmt.Fprintf(w, "Selector:\t%s\n", sel)
	mu := p.Spec.MaxUnavailableOrDefault()
	fmt.Fprintf(w, "Max unavailable:\t%s\tmax failures: %d\tnode timeout: %v\tpaused: %v\n", mu.String(),
		p.Spec.MaxFailuresOrDefault(), p.Spec.NodeTimeoutOrDefault(), p.Spec.Paused)
	if len(p.Spec.MaintenanceWindows) > 0 {
		fmt.Fprintf(w, "Maintenance windows:\t%s\t%s\n", windowsSpec(p.Spec.MaintenanceWindows),
			orNone(windowSummary(p.Status.MaintenanceWindow, time.Now())))
	}
	fmt.Fprintf(w, "Revision:\t%s\tprevious: %s\n", orNone(p.Status.CurrentRevision), orNone(p.Status.PreviousRevision))
	if pv := p.Status.Preview; pv != nil {
		done := "waiting for the nodes' answers"
		if pv.CompletionTime != nil {
			done = "completed " + pv.CompletionTime.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(w, "Preview:\trevision %s\trequested %s\t%s\n", pv.Revision,
			pv.RequestTime.UTC().Format(time.RFC3339), done)
	}
	n := p.Status.Nodes
	fmt.Fprintf(w, "Nodes:\t%d selected\t%d updated (%d ready)\t%d drifted\t%d in progress\t%d failed\t%s\n",
		n.Selected, n.Updated, n.Ready, n.Drifted, n.InProgress, n.Failed, heldSummary(p.Status))
	_ = w.Flush()
	if len(p.Status.NodeRevisions) > 0 {
		// spec.perNode: the node revisions of the current revision, each with its values.
		w = tabwriter.NewWriter(o.io.Out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "NODE REVISION\tNODES\tUPDATED\tVALUES")
		for _, r := range p.Status.NodeRevisions {
			fmt.Fprintf(w, "%s\t%d\t%d\t%s\n", r.Revision, r.Nodes, r.Updated, orNone(strings.Join(r.Values, ", ")))
		}
		_ = w.Flush()
	}
	w = tabwriter.NewWriter(o.io.Out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "CONDITION\tSTATUS\tREASON\tAGE\tMESSAGE")
	for _, c := range p.Status.Conditions {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", c.Type, c.Status, c.Reason,
			duration.HumanDuration(time.Since(c.LastTransitionTime.Time)), c.Message)
	}
	_ = w.Flush()
	if len(p.Status.FailedNodes) > 0 {
		w = tabwriter.NewWriter(o.io.Out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "FAILED NODE\tREVISION\tREASON\tCOUNTS\tERROR")
		for _, f := range p.Status.FailedNodes {
			counts := "yes"
			if f.Retry != p.Spec.Retry {
				counts = "no (retried)"
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", f.Name, f.Revision, f.Reason, counts, f.Error)
		}
		_ = w.Flush()
	}
	o.describeHeld(p.Status)
}

// heldReasons say, for an operator, what each held reason means and what gives the node back.
var heldReasons = map[string]string{
	"HandAssigned": "its source was set by hand after the pool assigned it: remove its " +
		v1alpha1.AnnotationAssignment + " to give it back",
	"SelectedByOtherPools": "another pool selects it too: neither touches it",
	"NoSidecar": "the dkc sidecar does not run there (not Linux, or labelled dkc.dev/sidecar=disabled): " +
		"nothing would apply it",
	"NotReported": "its sidecar has not reported a status yet: assigned once it has",
}

// heldSummary is "N held", with the count of each reason status.heldNodes lists.
func heldSummary(st v1alpha1.KubeletConfigPoolStatus) string {
	out := fmt.Sprintf("%d held", st.Nodes.Held)
	if len(st.HeldNodes) == 0 {
		return out
	}
	counts := map[string]int{}
	for _, h := range st.HeldNodes {
		counts[h.Reason]++
	}
	var parts []string
	for _, r := range slices.Sorted(maps.Keys(counts)) {
		parts = append(parts, fmt.Sprintf("%d %s", counts[r], r))
	}
	if more := int(st.Nodes.Held) - len(st.HeldNodes); more > 0 {
		parts = append(parts, fmt.Sprintf("%d more", more))
	}
	return out + " (" + strings.Join(parts, ", ") + ")"
}

// describeHeld prints the held nodes status lists, with what each reason means.
func (o *Options) describeHeld(st v1alpha1.KubeletConfigPoolStatus) {
	if len(st.HeldNodes) == 0 {
		return
	}
	w := tabwriter.NewWriter(o.io.Out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "HELD NODE\tREASON\tMEANING")
	for _, h := range st.HeldNodes {
		fmt.Fprintf(w, "%s\t%s\t%s\n", h.Name, h.Reason, heldReasons[h.Reason])
	}
	if more := int(st.Nodes.Held) - len(st.HeldNodes); more > 0 {
		fmt.Fprintf(w, "(%d more)\t\t\n", more)
	}
	_ = w.Flush()
}

// windowsSpec is spec.maintenanceWindows on one line: "Sat,Sun 02:00+4h Europe/Berlin; 22:00+1h UTC".
func windowsSpec(ws []v1alpha1.MaintenanceWindow) string {
	var parts []string
	for _, mw := range ws {
		days := "daily"
		if len(mw.Days) > 0 {
			ds := make([]string, len(mw.Days))
			for i, d := range mw.Days {
				ds[i] = string(d)
			}
			days = strings.Join(ds, ",")
		}
		tz := mw.TimeZone
		if tz == "" {
			tz = "UTC"
		}
		parts = append(parts, fmt.Sprintf("%s %s+%v %s", days, mw.Start, mw.Duration.Duration, tz))
	}
	return strings.Join(parts, "; ")
}

// windowSummary says where the pool stood with its windows when its status was written: "open until T" or
// "closed: the next opens at T (in 2h)"; "" without windows.
func windowSummary(st *v1alpha1.MaintenanceWindowStatus, now time.Time) string {
	if st == nil {
		return ""
	}
	when := func(t *metav1.Time) string {
		s := t.UTC().Format(time.RFC3339)
		if d := t.Sub(now); d > 0 {
			s += " (in " + duration.HumanDuration(d) + ")"
		}
		return s
	}
	switch {
	case st.Open && st.CloseTime != nil:
		return "a maintenance window is open until " + when(st.CloseTime)
	case st.Open:
		return "a maintenance window is open"
	case st.NextOpenTime != nil:
		return "no maintenance window is open: nothing new is assigned until the next opens at " + when(st.NextOpenTime)
	default:
		return "no maintenance window is open"
	}
}

func orNone(s string) string {
	if s == "" {
		return "<none>"
	}
	return s
}

func (o *Options) rolloutPauseCommand(pause bool) *cobra.Command {
	use, short := "resume POOL", "Let a paused pool assign nodes again"
	if pause {
		use, short = "pause POOL", "Stop a pool assigning nodes; nodes already assigned carry on and are still judged"
	}
	return &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			patch := fmt.Sprintf(`{"spec":{"paused":%t}}`, pause)
			if _, err := o.patchPool(cmd.Context(), args[0], []byte(patch)); err != nil {
				return err
			}
			verb := "resumed"
			if pause {
				verb = "paused"
			}
			fmt.Fprintf(o.io.Out, "kubeletconfigpool/%s %s\n", args[0], verb)
			return nil
		},
	}
}

func (o *Options) rolloutRetryCommand() *cobra.Command {
	var f poolFlags
	cmd := &cobra.Command{
		Use:   "retry POOL",
		Short: "Let a halted pool go on: the failures so far stop counting against maxFailures",
		Long: `retry sets the pool's spec.retry to one more. The nodes that failed stay listed and are not assigned
again (they run their last-known-good config); the others are rolled out to, until maxFailures new
failures halt the pool again.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := o.modifyPool(cmd.Context(), args[0], func(p *v1alpha1.KubeletConfigPool) error {
				p.Spec.Retry++
				return nil
			})
			if err != nil {
				return err
			}
			fmt.Fprintf(o.io.Out, "kubeletconfigpool/%s retried (retry %d)\n", p.Name, p.Spec.Retry)
			if !f.wait {
				return nil
			}
			return o.follow(cmd.Context(), p.Name, p.Generation, "", f.timeout, f.poll)
		},
	}
	addFollowFlags(cmd, &f)
	return cmd
}

func (o *Options) rolloutUndoCommand() *cobra.Command {
	var f poolFlags
	var to string
	cmd := &cobra.Command{
		Use:   "undo POOL [--to-revision REVISION]",
		Short: "Roll a pool back to its previous revision (or another kept one)",
		Long: `undo points the pool's spec.configMap at the snapshot of its previous revision (or of --to-revision;
kubectl dkc rollout history lists them), which is rolled out like any revision, and follows it. A halted
pool goes on with it: failures of another revision do not count. The snapshot is taken only from where the
pool records it, and only if it is the revision's as the pool created it: the UID the pool records, and
data that hash to the revision.

The pool's spec then names the snapshot, not your ConfigMap: point it back with rollout POOL --configmap
once the ConfigMap is fixed. Where a GitOps tool applies the pool, revert the change in Git instead.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			var rev string
			var from v1alpha1.ConfigMapReference
			var snap *corev1.ConfigMap
			p, err := o.modifyPool(ctx, args[0], func(p *v1alpha1.KubeletConfigPool) error {
				if rev = to; rev == "" {
					if rev = p.Status.PreviousRevision; rev == "" {
						return fmt.Errorf("kubeletconfigpool %s has no previous revision to go back to", p.Name)
					}
				}
				var err error
				if snap, err = o.snapshot(ctx, p, rev); err != nil {
					return err
				}
				if base := snap.Labels[v1alpha1.LabelBaseRevision]; base != "" {
					return fmt.Errorf("revision %s is one node's values of revision %s (spec.perNode): undo to %s, "+
						"whose per-node values are computed again", rev, base, base)
				}
				if _, ok := snap.Data[p.Spec.ConfigMap.KubeletConfigKey]; !ok {
					return fmt.Errorf("revision %s (%s/%s) has no key %q", rev, snap.Namespace, snap.Name,
						p.Spec.ConfigMap.KubeletConfigKey)
				}
				from = p.Spec.ConfigMap
				p.Spec.ConfigMap = v1alpha1.ConfigMapReference{Namespace: snap.Namespace, Name: snap.Name,
					KubeletConfigKey: from.KubeletConfigKey}
				return nil
			})
			if err != nil {
				return err
			}
			// The revision hashes the key too: with the key the pool has now, the snapshot may be another one.
			want := v1alpha1.RevisionName(snap.Namespace, from.KubeletConfigKey, snap.Data)
			if want != rev {
				fmt.Fprintf(o.io.ErrOut, "revision %s was taken with another kubeletConfigKey: with %q it is revision %s\n", rev,
					from.KubeletConfigKey, want)
			}
			fmt.Fprintf(o.io.Out, "kubeletconfigpool/%s rolled back to revision %s: configMap %s/%s → %s/%s\n", p.Name, rev,
				from.Namespace, from.Name, snap.Namespace, snap.Name)
			if !f.wait {
				return nil
			}
			return o.follow(ctx, p.Name, p.Generation, want, f.timeout, f.poll)
		},
	}
	cmd.Flags().StringVar(&to, "to-revision", "", "the revision to go back to (default: the previous one)")
	addFollowFlags(cmd, &f)
	return cmd
}

// snapshot finds the snapshot ConfigMap of the pool's revision where the pool's snapshots live
// (snapshotNamespaces: the namespace its status records for the revision, else its ConfigMap's), and
// refuses one that is not the revision's (checkSnapshot).
func (o *Options) snapshot(ctx context.Context, pool *v1alpha1.KubeletConfigPool,
	rev string) (*corev1.ConfigMap, error) {
	name := v1alpha1.SnapshotName(pool.Name, rev)
	ns := pool.Spec.ConfigMap.Namespace
	if r, ok := pool.Status.RevisionSnapshots.Snapshot(rev); ok {
		ns = r.Namespace
	}
	cm, err := o.client.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil, fmt.Errorf("kubeletconfigpool %s has no revision %s in namespace %s (kubectl dkc "+
			"rollout history %s lists those kept)",
			pool.Name, rev, ns, pool.Name)
	case err != nil:
		return nil, fmt.Errorf("configmap %s/%s: %w", ns, name, err)
	}
	if err := checkSnapshot(pool, cm, rev); err != nil {
		return nil, err
	}
	return cm, nil
}

// snapshotNamespaces are where a pool's snapshots live: its ConfigMap's namespace, and every namespace
// its status records a snapshot in (its spec named another one before). No other namespace is searched:
// a ConfigMap elsewhere that carries the pool's labels is not one of its revisions.
func snapshotNamespaces(p *v1alpha1.KubeletConfigPool) []string {
	out := []string{p.Spec.ConfigMap.Namespace}
	if rec := p.Status.RevisionSnapshots; rec != nil {
		for _, r := range rec.Items {
			if !slices.Contains(out, r.Namespace) {
				out = append(out, r.Namespace)
			}
		}
	}
	return out
}

// checkSnapshot refuses cm as the pool's revision rev when it is not the revision's snapshot as the pool
// created it: named and labelled for rev, the UID the pool records, and data that hash to rev with the key
// the pool recorded — what dkc-server refuses to send a node too. A snapshot the pool does not record is
// refused: a revision's name is a short digest, which anyone able to create the object could match with
// other data.
func checkSnapshot(p *v1alpha1.KubeletConfigPool, cm *corev1.ConfigMap, rev string) error {
	refuse := func(why string) error {
		return fmt.Errorf("configmap %s/%s (UID %s) is not revision %s of kubeletconfigpool %s: %s",
			cm.Namespace, cm.Name, cm.UID, rev, p.Name, why)
	}
	if cm.Name != v1alpha1.SnapshotName(p.Name, rev) || cm.Labels[v1alpha1.LabelRevision] != rev {
		return refuse(fmt.Sprintf("it is labelled revision %q", cm.Labels[v1alpha1.LabelRevision]))
	}
	r, recorded := p.Status.RevisionSnapshots.Snapshot(rev)
	if !recorded {
		return refuse("the pool records no snapshot of that revision: not created by the pool, or taken by a dkc " +
			"that did not record its snapshots")
	}
	if r.Namespace != cm.Namespace || r.UID != cm.UID {
		return refuse(fmt.Sprintf("the pool records %s/%s with UID %s: created by someone else, or deleted and created again",
			r.Namespace, r.Name, r.UID))
	}
	if got := v1alpha1.RevisionName(cm.Namespace, r.KubeletConfigKey, cm.Data); got != rev {
		return refuse(fmt.Sprintf("its data is revision %s", got))
	}
	return nil
}

func (o *Options) rolloutHistoryCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "history POOL",
		Short: "List a pool's kept revisions, newest first",
		Long: `history lists the pool's revision snapshots, newest first, with the current and previous revisions
marked. It looks only where the pool's snapshots live: the namespace of its spec.configMap and those its
status.revisionSnapshots records. A snapshot the pool does not record, or that is not its revision's as
recorded (another UID, data that hash to another revision), is marked REFUSED, with a warning naming what
differs: undo never takes it, and dkc-server never sends it to a node that does not already run it.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			p, err := o.getPool(ctx, args[0])
			if err != nil {
				return err
			}
			var revs []corev1.ConfigMap
			for _, ns := range snapshotNamespaces(p) {
				list, err := o.client.CoreV1().ConfigMaps(ns).List(ctx,
					metav1.ListOptions{LabelSelector: v1alpha1.LabelPool + "=" + p.Name})
				if err != nil {
					return fmt.Errorf("list the revisions of kubeletconfigpool %s in namespace %s: %w", p.Name, ns, err)
				}
				for _, cm := range list.Items {
					if cm.Labels[v1alpha1.LabelRevision] != "" { // not the pool's own ConfigMap, labelled by its user
						revs = append(revs, cm)
					}
				}
			}
			sort.Slice(revs, func(i, j int) bool { return revs[j].CreationTimestamp.Before(&revs[i].CreationTimestamp) })
			w := tabwriter.NewWriter(o.io.Out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "REVISION\tSNAPSHOT\tCREATED\tSTATE")
			for _, cm := range revs {
				rev := cm.Labels[v1alpha1.LabelRevision]
				state := ""
				switch rev {
				case p.Status.CurrentRevision:
					state = "current"
				case p.Status.PreviousRevision:
					state = "previous"
				}
				if base := cm.Labels[v1alpha1.LabelBaseRevision]; base != "" && state == "" {
					state = "per-node values of " + base
				}
				if err := checkSnapshot(p, &cm, rev); err != nil {
					// Listed, so that the operator finds it, and never offered for undo.
					state = "REFUSED"
					fmt.Fprintf(o.io.ErrOut, "warning: %v\n", err)
				}
				fmt.Fprintf(w, "%s\t%s/%s\t%s\t%s\n", rev, cm.Namespace, cm.Name,
					duration.HumanDuration(time.Since(cm.CreationTimestamp.Time))+" ago", state)
			}
			return w.Flush()
		},
	}
}

// The pool's REST calls, over the generated clientset (api/generated).

// poolKind is the pool's type, which the clientset clears from every object it decodes: the pools these
// calls return carry it again, as `rollout status -o yaml` prints them.
var poolKind = metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "KubeletConfigPool"}

func (o *Options) getPool(ctx context.Context, name string) (*v1alpha1.KubeletConfigPool, error) {
	p, err := o.pools.DkcV1alpha1().KubeletConfigPools().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, poolError(name, err)
	}
	p.TypeMeta = poolKind
	return p, nil
}

func (o *Options) createPool(ctx context.Context, p *v1alpha1.KubeletConfigPool) (*v1alpha1.KubeletConfigPool, error) {
	out, err := o.pools.DkcV1alpha1().KubeletConfigPools().Create(ctx, withoutStatus(p),
		metav1.CreateOptions{FieldManager: fieldManager})
	if err != nil {
		return nil, fmt.Errorf("create kubeletconfigpool %s: %w", p.Name, err)
	}
	out.TypeMeta = poolKind
	return out, nil
}

// modifyPool reads the pool, lets change edit it and writes it back, again on a Conflict: the controller's
// status writes change the pool's resourceVersion all through a rollout.
func (o *Options) modifyPool(ctx context.Context, name string,
	change func(*v1alpha1.KubeletConfigPool) error) (*v1alpha1.KubeletConfigPool, error) {
	var out *v1alpha1.KubeletConfigPool
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		p, err := o.getPool(ctx, name)
		if err != nil {
			return err
		}
		if err := change(p); err != nil {
			return err
		}
		if out, err = o.pools.DkcV1alpha1().KubeletConfigPools().Update(ctx, withoutStatus(p),
			metav1.UpdateOptions{FieldManager: fieldManager}); err != nil {
			return fmt.Errorf("update kubeletconfigpool %s: %w", name, err) // a Conflict stays one (errors.As)
		}
		out.TypeMeta = poolKind
		return nil
	})
	return out, err
}

func (o *Options) patchPool(ctx context.Context, name string, patch []byte) (*v1alpha1.KubeletConfigPool, error) {
	p, err := o.pools.DkcV1alpha1().KubeletConfigPools().Patch(ctx, name, types.MergePatchType, patch,
		metav1.PatchOptions{FieldManager: fieldManager})
	if err != nil {
		return nil, poolError(name, err)
	}
	p.TypeMeta = poolKind
	return p, nil
}

// withoutStatus is the pool as a write of its main resource sends it: the status is the controller's, the
// apiserver ignores it there, and an empty one keeps the request small (failedNodes, heldNodes).
func withoutStatus(p *v1alpha1.KubeletConfigPool) *v1alpha1.KubeletConfigPool {
	out := *p // a shallow copy: only Status is replaced
	out.Status = v1alpha1.KubeletConfigPoolStatus{}
	return &out
}

// fieldManager names kubectl-dkc's writes.
const fieldManager = "kubectl-dkc"

// poolError says what is missing when the CRD is not installed, rather than "the server could not find
// the requested resource".
func poolError(name string, err error) error {
	var status apierrors.APIStatus
	if apierrors.IsNotFound(err) && errors.As(err, &status) &&
		(status.Status().Details == nil || status.Status().Details.Name == "") {
		return fmt.Errorf("kubeletconfigpools are not served by this cluster (is dkc's CRD installed? "+
			"kubectl apply -k deploy/crds): %w", err)
	}
	return fmt.Errorf("kubeletconfigpool %s: %w", name, err)
}
