// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"fmt"
	"strings"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	statsapi "k8s.io/kubelet/pkg/apis/stats/v1alpha1"

	"github.com/dkc-dev/dkc/internal/capacity"
	"github.com/dkc-dev/dkc/internal/configcheck"
)

// This file keeps a restart from failing or evicting running pods behind their PodDisruptionBudgets' backs.
// In either case the sidecar leaves the kubelet alone and says the node must be drained first, as it does
// for the resource managers' state: a pool that may drain evicts the pods through the Eviction API,
// honouring their budgets; one that may not fails the node, naming them.
//
// Admission: a kubelet restarted with less allocatable (a lower maxPods, larger reservations or memory
// eviction threshold) admits the node's pods again, oldest first, against it, and fails those that no
// longer fit (OutOfpods, OutOfcpu, ...). Before restarting into a config that changes allocatable, the
// sidecar plays that admission (capacity.OnRestart) with the Node's capacity (the service sends it), the
// config the kubelet runs (/configz, flags applied) and its pods (/pods). The pool controller refuses such
// a revision before assigning it where it knows both configs (a node on one of its revisions); this covers
// the rest: a node on its local config or on another source, or assigned through its annotation.
//
// Evictions: a kubelet restarted with higher eviction thresholds than the node's usage allows evicts pods
// at once (and, while admitting the node's pods again under the pressure it finds, rejects some): its
// eviction manager honours no budget. So before restarting into a config that changes the thresholds, the
// sidecar asks its own kubelet what its eviction manager decides on (/stats/summary, /pods) and predicts
// what the new thresholds do (capacity.Evictions, as kubectl dkc diff does). Only dkc-server's view of the
// node is missing for a prediction before assignment: it holds no credential a kubelet accepts for its
// stats (nodes/proxy would be root on every node), and must not send one to the nodes.

// Usage reads what the kubelet's admission and eviction manager decide on; implemented by probe.Kubelet. A
// Prober without it predicts nothing.
type Usage interface {
	Summary(ctx context.Context, kc *configcheck.Checked) (*statsapi.Summary, error)
	Pods(ctx context.Context, kc *configcheck.Checked) ([]corev1.Pod, error)
}

// evictions returns a needs-drain error naming the pods the kubelet would evict or reject once restarted
// into target, with the eviction thresholds the config it runs (running, reached as listening says) does
// not have; nil when none would go, or when that cannot be told. A prediction that cannot be made does not
// hold the node: it goes as it always has, and the pool's workload gate counts what the kubelet then
// evicts as the node's failure.
func (a *Agent) evictions(ctx context.Context, listening *configcheck.Checked, running map[string]any,
	target candidate, ds drainState) error {
	if !capacity.EvictionChanges(running, target.config.Fields) {
		return nil
	}
	usage, ok := a.kubelet.(Usage)
	if !ok {
		return nil
	}
	predict := func() (capacity.Eviction, error) {
		summary, err := usage.Summary(ctx, listening)
		if err != nil {
			return capacity.Eviction{}, fmt.Errorf("read the kubelet's stats summary: %w", err)
		}
		pods, err := usage.Pods(ctx, listening)
		if err != nil {
			return capacity.Eviction{}, fmt.Errorf("read the kubelet's pods: %w", err)
		}
		return capacity.Evictions(summary, running, target.config.Fields, pods)
	}
	ev, err := predict()
	if err != nil {
		a.log.Warn("evictions under the config's new eviction thresholds not predicted; restarting as always",
			append(sourceFields(target.src), zap.String("node", a.cfg.NodeName), zap.Error(err))...)
		return nil
	}
	if !ev.Stops() {
		// Nothing goes, or the kubelet evicts already under the thresholds it runs: a restart adds nothing.
		return nil
	}
	node := a.cfg.NodeName
	if node == "" {
		node = "the node"
	}
	return fmt.Errorf("%w: the kubelet, restarted with %s, would evict or reject pods at once under its eviction "+
		"thresholds, which honours no PodDisruptionBudget: %s; it keeps running its config. To make the change, %s",
		errNeedsDrain, describe(target.src), strings.Join(ev.Findings(node), "; "),
		a.drainHow(ds, "restarts the kubelet"))
}

// setCapacity records the Node's capacity the service sent; a quantity that does not parse is left out
// (the prediction is then made without that resource, or not at all without pods).
func (a *Agent) setCapacity(m map[string]string) {
	c := make(corev1.ResourceList, len(m))
	for r, v := range m {
		q, err := resource.ParseQuantity(v)
		if err != nil {
			a.log.Warn("node capacity from the service does not parse; left out of admission predictions",
				zap.String("resource", r), zap.String("quantity", v), zap.Error(err))
			continue
		}
		c[corev1.ResourceName(r)] = q
	}
	a.nodeCapacity = c
}

// admission returns a needs-drain error naming the running pods the kubelet, restarted into target, would
// stop, when target changes allocatable from the config it runs (running, reached as listening says): it
// admits the node's pods again, oldest first, against the allocatable target leaves, rejects those that no
// longer fit, and admits a critical one that does not fit (the sidecar's own pod, newest after a rollout)
// by evicting lower-priority pods. nil when every pod fits, or when that cannot be told (no capacity from
// the service, the pods unread, a config that leaves the kubelet unable to start, which the health wait
// rolls back): the node then goes as it always has, and the pool's workload gate counts the failed pods.
func (a *Agent) admission(ctx context.Context, listening *configcheck.Checked, running map[string]any,
	target candidate, ds drainState) error {
	if !capacity.Changes(running, target.config.Fields) {
		return nil
	}
	if len(a.nodeCapacity) == 0 {
		if !a.noCapacityLogged {
			a.noCapacityLogged = true
			a.log.Info("pods the kubelet would no longer admit under a config not predicted: the service sends no "+
				"node capacity (a dkc-server older than this sidecar)", zap.String("node", a.cfg.NodeName))
		}
		return nil
	}
	usage, ok := a.kubelet.(Usage)
	if !ok {
		return nil
	}
	node := a.cfg.NodeName
	if node == "" {
		node = "the node"
	}
	// stops is what the restarted kubelet stops of pods.
	stops := func(pods []corev1.Pod) ([]string, error) {
		got, err := capacity.OnRestart(node, a.nodeCapacity, running, target.config.Fields, pods)
		return got.Stopping(), err
	}
	var kept []string
	predict := func() ([]string, error) {
		pods, err := usage.Pods(ctx, listening)
		if err != nil {
			return nil, fmt.Errorf("read the kubelet's pods: %w", err)
		}
		stopping, err := stops(pods)
		if err != nil || len(stopping) == 0 {
			return nil, err
		}
		// A drain still spares the others, but not these: said, so that nobody waits on it to make room.
		kept, err = stops(capacity.DrainKeeps(pods))
		return stopping, err
	}
	stopping, err := predict()
	if err != nil {
		a.log.Warn("pods the kubelet would no longer admit under the config not predicted; restarting as always",
			append(sourceFields(target.src), zap.String("node", a.cfg.NodeName), zap.Error(err))...)
		return nil
	}
	if len(stopping) == 0 {
		return nil
	}
	n := len(stopping)
	if n > maxNamedPods {
		stopping = append(stopping[:maxNamedPods], fmt.Sprintf("and %d more", n-maxNamedPods))
	}
	even := ""
	if len(kept) > 0 {
		even = fmt.Sprintf(" (even drained, it would not admit %s: DaemonSet and static pods, which a drain leaves; "+
			"the config leaves too little room for them)", strings.Join(kept, "; "))
	}
	return fmt.Errorf("%w: the kubelet, restarted with %s, admits the node's running pods again, oldest first, "+
		"against less room, and would stop %d of them, honouring no PodDisruptionBudget: %s; it keeps running its "+
		"config%s. To make the change, %s", errNeedsDrain, describe(target.src), n, strings.Join(stopping, "; "), even,
		a.drainHow(ds, "restarts the kubelet"))
}

// maxNamedPods bounds the pods a needs-drain detail names.
const maxNamedPods = 10
