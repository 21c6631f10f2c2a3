// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"fmt"
	"strings"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	statsapi "k8s.io/kubelet/pkg/apis/stats/v1alpha1"

	"github.com/dkc-dev/dkc/internal/capacity"
	"github.com/dkc-dev/dkc/internal/configcheck"
)

// This file keeps a restart from evicting pods behind their PodDisruptionBudgets' backs. A kubelet restarted
// with higher eviction thresholds than the node's usage allows evicts pods at once (and, while admitting
// the node's pods again under the pressure it finds, rejects some): its eviction manager honours no
// budget. So before restarting into a config that changes the thresholds, the sidecar asks its own kubelet
// what its eviction manager decides on (/stats/summary, /pods) and predicts what the new thresholds do
// (capacity.Evictions, as kubectl dkc diff does). If pods would go, it leaves the kubelet alone and says
// the node must be drained first, as it does for the resource managers' state: a pool that may drain
// evicts them through the Eviction API, honouring their budgets; one that may not fails the node, naming
// them. Only dkc-server's view of the node is missing for a prediction before assignment: it holds no
// credential a kubelet accepts for its stats (nodes/proxy would be root on every node).

// Usage reads what the kubelet's eviction manager decides on; implemented by probe.Kubelet. A Prober
// without it predicts no evictions.
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
