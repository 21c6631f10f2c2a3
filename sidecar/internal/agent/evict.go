// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"errors"
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

// errNoUsage: the Prober reads neither the kubelet's pods nor its stats (no Usage), so nothing is predicted.
var errNoUsage = errors.New("the sidecar's kubelet prober reads neither the kubelet's pods nor its stats")

// errNoCapacity: the config changes allocatable, and the service sent no Node capacity to compute it from.
var errNoCapacity = errors.New("the service sends no node capacity (a dkc-server older than this sidecar)")

// predictEvictions is what the eviction thresholds of target do to the node's pods as its kubelet sees them
// now, against the config it runs (running, reached as listening says). changes is false, and nothing is
// asked of the kubelet, when target changes no eviction threshold; an error says why nothing could be
// predicted (errNoUsage, the kubelet's stats or pods unread).
func (a *Agent) predictEvictions(ctx context.Context, listening *configcheck.Checked, running map[string]any,
	target candidate) (ev capacity.Eviction, changes bool, err error) {
	if !capacity.EvictionChanges(running, target.config.Fields) {
		return ev, false, nil
	}
	usage, ok := a.kubelet.(Usage)
	if !ok {
		return ev, true, errNoUsage
	}
	summary, err := usage.Summary(ctx, listening)
	if err != nil {
		return ev, true, fmt.Errorf("read the kubelet's stats summary: %w", err)
	}
	pods, err := usage.Pods(ctx, listening)
	if err != nil {
		return ev, true, fmt.Errorf("read the kubelet's pods: %w", err)
	}
	ev, err = capacity.Evictions(summary, running, target.config.Fields, pods)
	return ev, true, err
}

// evictions returns a needs-drain error naming the pods the kubelet would evict or reject once restarted
// into target, with the eviction thresholds the config it runs (running, reached as listening says) does
// not have; nil when none would go, or when that cannot be told. A prediction that cannot be made does not
// hold the node: it goes as it always has, and the pool's workload gate counts what the kubelet then
// evicts as the node's failure.
func (a *Agent) evictions(ctx context.Context, listening *configcheck.Checked, running map[string]any,
	target candidate, ds drainState) error {
	ev, _, err := a.predictEvictions(ctx, listening, running, target)
	switch {
	case errors.Is(err, errNoUsage):
		return nil
	case err != nil:
		a.log.Warn("evictions under the config's new eviction thresholds not predicted; restarting as always",
			append(sourceFields(target.src), zap.String("node", a.cfg.NodeName), zap.Error(err))...)
		return nil
	case !ev.Stops():
		// Nothing goes, or the kubelet evicts already under the thresholds it runs: a restart adds nothing.
		return nil
	}
	return fmt.Errorf("%w: the kubelet, restarted with %s, would evict or reject pods at once under its eviction "+
		"thresholds, which honours no PodDisruptionBudget: %s; it keeps running its config. To make the change, %s",
		errNeedsDrain, describe(target.src), strings.Join(ev.Findings(a.nodeLabel()), "; "),
		a.drainHow(ds, "restarts the kubelet"))
}

// nodeLabel names the node in predictions: its name, or "the node".
func (a *Agent) nodeLabel() string {
	if a.cfg.NodeName == "" {
		return "the node"
	}
	return a.cfg.NodeName
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

// admissionFinding is what the kubelet, restarted into a config, would do to the running pods when it
// admits them again.
type admissionFinding struct {
	// changes: the config changes allocatable (else nothing else is set, and nothing was asked).
	changes bool
	// stopping names every running pod it would stop ("namespace/name: why"), oldest first; kept, those of
	// them a drain would not spare (DaemonSet and static pods).
	stopping, kept []string
	// notStarting says why the kubelet would not start at all (reservations over the node's capacity);
	// unpredicted, why no pod is named (package capacity's Capacity).
	notStarting, unpredicted string
}

// predictAdmission plays the admission of the node's running pods by the kubelet restarted into target,
// from the config it runs (running, reached as listening says) and the Node's capacity the service sent.
// An error says why it could not be played (errNoCapacity, errNoUsage, the pods unread); with stopping
// found, an error says only that kept is unknown.
func (a *Agent) predictAdmission(ctx context.Context, listening *configcheck.Checked, running map[string]any,
	target candidate) (admissionFinding, error) {
	if !capacity.Changes(running, target.config.Fields) {
		return admissionFinding{}, nil
	}
	f := admissionFinding{changes: true}
	if len(a.nodeCapacity) == 0 {
		return f, errNoCapacity
	}
	usage, ok := a.kubelet.(Usage)
	if !ok {
		return f, errNoUsage
	}
	pods, err := usage.Pods(ctx, listening)
	if err != nil {
		return f, fmt.Errorf("read the kubelet's pods: %w", err)
	}
	node := a.nodeLabel()
	got, err := capacity.OnRestart(node, a.nodeCapacity, running, target.config.Fields, pods)
	if err != nil {
		return f, err
	}
	f.notStarting, f.unpredicted, f.stopping = got.NotStarting, got.Unpredicted, got.Stopping()
	if len(f.stopping) == 0 {
		return f, nil
	}
	// A drain still spares the others, but not these: said, so that nobody waits on it to make room.
	kept, err := capacity.OnRestart(node, a.nodeCapacity, running, target.config.Fields, capacity.DrainKeeps(pods))
	if err != nil {
		return f, err
	}
	f.kept = kept.Stopping()
	return f, nil
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
	f, err := a.predictAdmission(ctx, listening, running, target)
	switch {
	case errors.Is(err, errNoCapacity):
		if !a.noCapacityLogged {
			a.noCapacityLogged = true
			a.log.Info("pods the kubelet would no longer admit under a config not predicted: the service sends no "+
				"node capacity (a dkc-server older than this sidecar)", zap.String("node", a.cfg.NodeName))
		}
		return nil
	case errors.Is(err, errNoUsage):
		return nil
	case err != nil:
		a.log.Warn("pods the kubelet would no longer admit under the config not predicted; restarting as always",
			append(sourceFields(target.src), zap.String("node", a.cfg.NodeName), zap.Error(err))...)
		return nil
	case len(f.stopping) == 0:
		return nil
	}
	even := ""
	if len(f.kept) > 0 {
		even = fmt.Sprintf(" (even drained, it would not admit %s: DaemonSet and static pods, which a drain leaves; "+
			"the config leaves too little room for them)", strings.Join(f.kept, "; "))
	}
	return fmt.Errorf("%w: the kubelet, restarted with %s, admits the node's running pods again, oldest first, "+
		"against less room, and would stop %d of them, honouring no PodDisruptionBudget: %s; it keeps running its "+
		"config%s. To make the change, %s", errNeedsDrain, describe(target.src), len(f.stopping),
		strings.Join(named(f.stopping), "; "), even, a.drainHow(ds, "restarts the kubelet"))
}

// named is lines cut to the first maxNamedPods, and a last one saying how many more there are.
func named(lines []string) []string {
	if len(lines) <= maxNamedPods {
		return lines
	}
	return append(lines[:maxNamedPods:maxNamedPods], fmt.Sprintf("and %d more", len(lines)-maxNamedPods))
}

// maxNamedPods bounds the pods a needs-drain detail names.
const maxNamedPods = 10
