// SPDX-License-Identifier: Apache-2.0

package controller

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/clock"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/dkc-dev/dkc/api/v1alpha1"
	"github.com/dkc-dev/dkc/internal/configcheck"
	"github.com/dkc-dev/dkc/internal/kubeletcheck/checkapi"
	"github.com/dkc-dev/dkc/internal/payload"
	"github.com/dkc-dev/dkc/services/internal/pool/plan"
	"github.com/dkc-dev/dkc/services/internal/pool/revision"
	"github.com/dkc-dev/dkc/services/internal/resolve"
)

// kubeletConfigAPIVersion and kubeletConfigKind are what the kubelet's config file loader accepts.
const (
	kubeletConfigAPIVersion = "kubelet.config.k8s.io/v1beta1"
	kubeletConfigKind       = "KubeletConfiguration"
)

// checkConfig says why the pool's ConfigMap cannot be rolled out, or nil. cm is nil when the ConfigMap
// does not exist.
//
// This is the part of the sidecar's check a server can make without a node: the namespace is one
// dkc-server reads (the webhook would refuse the assignment otherwise), the key exists, the payload fits
// what a node accepts (a node refuses more with "too large"), and the key holds a KubeletConfiguration
// document (what the kubelet's loader refuses as "failed to load config" before anything else). The
// kubelet's own loading and validation follow, in kubeletChecks.
func checkConfig(ref v1alpha1.ConfigMapReference, allowed resolve.Namespaces, cm *corev1.ConfigMap) *plan.Invalid {
	if !allowed.Allows(ref.Namespace) {
		return &plan.Invalid{Reason: v1alpha1.ReasonNamespaceNotAllowed,
			Message: fmt.Sprintf("namespace %q is not one dkc-server reads configs from; allowed: %s "+
				"(dkc-server --config-namespaces)", ref.Namespace, allowed)}
	}
	if cm == nil {
		return &plan.Invalid{Reason: v1alpha1.ReasonConfigMapNotFound,
			Message: fmt.Sprintf("configmap %s/%s not found", ref.Namespace, ref.Name)}
	}
	content, ok := cm.Data[ref.KubeletConfigKey]
	if !ok {
		return &plan.Invalid{Reason: v1alpha1.ReasonKeyNotFound,
			Message: fmt.Sprintf("configmap %s/%s has no key %q", ref.Namespace, ref.Name, ref.KubeletConfigKey)}
	}
	// Messages about the content name its revision: `kubectl dkc rollout` following an in-place edit
	// tells by it whether a finding is about the edit or about the content before it.
	rev := revision.Name(ref.Namespace, ref.KubeletConfigKey, cm.Data)
	if err := payload.CheckSize(cm.Data); err != nil {
		return &plan.Invalid{Reason: v1alpha1.ReasonValidationFailed,
			Message: fmt.Sprintf("configmap %s/%s (revision %s): %v", ref.Namespace, ref.Name, rev, err)}
	}
	var doc struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
	}
	if err := sigsyaml.Unmarshal([]byte(content), &doc); err != nil {
		return &plan.Invalid{Reason: v1alpha1.ReasonValidationFailed,
			Message: fmt.Sprintf("configmap %s/%s (revision %s) key %q is not a YAML or JSON object: %v", ref.Namespace,
				ref.Name, rev, ref.KubeletConfigKey, err)}
	}
	if doc.APIVersion != kubeletConfigAPIVersion || doc.Kind != kubeletConfigKind {
		return &plan.Invalid{Reason: v1alpha1.ReasonValidationFailed,
			Message: fmt.Sprintf("configmap %s/%s (revision %s) key %q is apiVersion %q kind %q, not %s %s", ref.Namespace,
				ref.Name, rev, ref.KubeletConfigKey,
				doc.APIVersion, doc.Kind, kubeletConfigAPIVersion, kubeletConfigKind)}
	}
	return nil
}

// KubeletChecker checks a kubelet config held in memory with the code of the kubelet of one version
// (configcheck.Helpers: a dkc-kubelet-check-<minor> process per check; dkc-server links no kubelet code).
type KubeletChecker interface {
	CheckData(ctx context.Context, kubeletVersion string, data []byte) (*configcheck.Checked, error)
}

// kubeletCheckTimeout bounds one check; the helper takes well under a second.
const kubeletCheckTimeout = 30 * time.Second

// maxKubeletChecks bounds the outcomes kept; a revision is a content hash, so dropping them all only
// costs a check again.
const maxKubeletChecks = 512

// kubeletChecks runs the kubelet's own loading and validation on a pool's new revision for every kubelet
// minor among its selected nodes, before the revision exists and any node is assigned it: the sidecar runs
// the same check on each node (with that node's flags, feature gates and drop-ins, which the server does
// not know), so what fails here fails on the nodes — the pool stops with ConfigInvalid instead of spending
// its failure budget on them. The pool's current revision is not checked again (nodes of a minor that
// joins later check it themselves): what it refuses, it refuses before any node has it.
//
// An outcome is kept per revision (a content hash) and minor, with the config as that kubelet runs it
// (nodeChecks compares a node's running revision with the new one on it): syncs are many, configs few.
// One helper runs at a time (each is a process of up to ~85 MiB inside dkc-server's memory limit); a
// worker whose outcome is kept never waits for another's helper.
type kubeletChecks struct {
	checker KubeletChecker
	log     *zap.Logger
	clock   clock.PassiveClock
	slot    chan struct{} // one helper at a time

	mu       sync.Mutex
	outcomes map[kubeletCheckKey]checkOutcome
}

func newKubeletChecks(checker KubeletChecker, log *zap.Logger, clk clock.PassiveClock) *kubeletChecks {
	return &kubeletChecks{checker: checker, log: log, clock: clk, slot: make(chan struct{}, 1),
		outcomes: map[kubeletCheckKey]checkOutcome{}}
}

// uncheckedRetry is how long a check that could not be made (a helper that crashed or timed out, say
// under load) is left to the nodes before the next sync tries again: not for good, not at every sync.
const uncheckedRetry = time.Minute

type kubeletCheckKey struct{ revision, minor string }

// checkOutcome is what one check of a revision with one minor's code found.
type checkOutcome struct {
	// err is why the kubelet refuses the config; nil when it passed, or could not be checked (logged once).
	err error
	// fields are the config as that kubelet runs it (its defaults applied, v1beta1 JSON names); nil when
	// it was refused or could not be checked.
	fields map[string]any
	// retryAt, for a check that could not be made, is when it is made again; zero: kept for good.
	retryAt time.Time
}

// fresh says whether o answers for now: a pass or a refusal always, a failed check until retryAt.
func (o checkOutcome) fresh(now time.Time) bool { return o.retryAt.IsZero() || now.Before(o.retryAt) }

// check returns why no kubelet of the selected nodes' minors would load or validate content, or nil.
// versions maps each minor to one kubelet version of it and the count of selected nodes running it.
// A check that cannot be made (a minor no helper speaks, a helper that crashed or timed out) is logged
// and passes: each node still checks the config itself before its kubelet uses it; a failed one is made
// again at a sync after uncheckedRetry. The error is ctx's: the sync ends, deciding nothing.
func (k *kubeletChecks) check(ctx context.Context, ref v1alpha1.ConfigMapReference, rev string, content []byte,
	versions map[string]minorNodes) (*plan.Invalid, error) {
	if k == nil || k.checker == nil {
		return nil, nil
	}
	minors := make([]string, 0, len(versions))
	for m := range versions {
		minors = append(minors, m)
	}
	slices.SortFunc(minors, checkapi.CompareMinors)
	for _, minor := range minors {
		v := versions[minor]
		o, err := k.outcome(ctx, ref, rev, content, minor, v.version)
		if err != nil {
			return nil, err
		}
		if err := o.err; err != nil {
			return &plan.Invalid{Reason: v1alpha1.ReasonValidationFailed,
				Message: fmt.Sprintf("configmap %s/%s (revision %s) key %q: the kubelet %s refuses it (%s; checked "+
					"with kubelet %s's code before any node is touched, without the nodes' flags and drop-ins: a feature "+
					"gate the nodes enable by flag must be in the config's featureGates too): %v",
					ref.Namespace, ref.Name, rev, ref.KubeletConfigKey, minor,
					plural(v.nodes, "selected node runs it", "selected nodes run it"), v.version, err)}, nil
		}
	}
	return nil, nil
}

// outcome is the kept outcome of (rev, minor), or a new check's; the error is ctx's.
func (k *kubeletChecks) outcome(ctx context.Context, ref v1alpha1.ConfigMapReference, rev string, content []byte, minor,
	version string) (checkOutcome, error) {
	key := kubeletCheckKey{revision: rev, minor: minor}
	k.mu.Lock()
	o, done := k.outcomes[key]
	k.mu.Unlock()
	if done && o.fresh(k.clock.Now()) {
		return o, nil
	}
	select {
	case k.slot <- struct{}{}:
	case <-ctx.Done():
		return checkOutcome{}, ctx.Err()
	}
	defer func() { <-k.slot }()
	k.mu.Lock()
	o, done = k.outcomes[key] // another worker may have checked it meanwhile
	k.mu.Unlock()
	if done && o.fresh(k.clock.Now()) {
		return o, nil
	}
	o = checkOutcome{}
	cctx, cancel := context.WithTimeout(ctx, kubeletCheckTimeout)
	checked, err := k.checker.CheckData(cctx, version, content)
	cancel()
	if ctx.Err() != nil {
		return checkOutcome{}, ctx.Err() // shutting down or no longer leading: nothing is kept or decided
	}
	switch {
	case err == nil:
		if checked != nil {
			o.fields = checked.Fields
		}
	case errors.Is(err, configcheck.ErrLoad) || errors.Is(err, configcheck.ErrValidate):
		o.err = err
	case errors.Is(err, configcheck.ErrUnsupportedKubelet):
		// No helper speaks the minor: asking again changes nothing until dkc-server is upgraded.
		k.log.Warn("cannot check a pool's config with the kubelet's code; its nodes check it themselves",
			zap.String("configMap", ref.Namespace+"/"+ref.Name), zap.String("revision", rev), zap.String("kubelet", version),
			zap.Error(err))
	default:
		o.retryAt = k.clock.Now().Add(uncheckedRetry)
		k.log.Warn("could not check a pool's config with the kubelet's code; its nodes check it themselves, and it is "+
			"checked again after a while", zap.String("configMap", ref.Namespace+"/"+ref.Name), zap.String("revision", rev),
			zap.String("kubelet", version), zap.Duration("retryAfter", uncheckedRetry), zap.Error(err))
	}
	k.mu.Lock()
	if len(k.outcomes) >= maxKubeletChecks {
		clear(k.outcomes)
	}
	k.outcomes[key] = o
	k.mu.Unlock()
	return o, nil
}

// minorNodes is one kubelet version of a minor and how many selected nodes run that minor.
type minorNodes struct {
	version string
	nodes   int
}

// kubeletMinors groups nodes by their kubelet's minor (status.nodeInfo.kubeletVersion); nodes whose
// version is not known yet are left out (they check the config themselves once it is).
func kubeletMinors(nodes []*corev1.Node) map[string]minorNodes {
	out := map[string]minorNodes{}
	for _, n := range nodes {
		v := n.Status.NodeInfo.KubeletVersion
		minor := checkapi.Minor(v)
		if minor == "" {
			continue
		}
		m := out[minor]
		if m.version == "" || v < m.version { // any of the minor will do; the lexically least keeps messages stable
			m.version = v
		}
		m.nodes++
		out[minor] = m
	}
	return out
}

func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}
