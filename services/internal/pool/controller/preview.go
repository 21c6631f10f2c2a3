// SPDX-License-Identifier: Apache-2.0

package controller

import (
	"fmt"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dkc-dev/dkc/api/v1alpha1"
	"github.com/dkc-dev/dkc/internal/nodeconfig"
	"github.com/dkc-dev/dkc/services/internal/pool/plan"
	"github.com/dkc-dev/dkc/services/internal/pool/revision"
	"github.com/dkc-dev/dkc/services/internal/resolve"
)

// This file asks the selected nodes' sidecars what a new revision would do on their nodes before the pool
// assigns it to any: what nodeChecks cannot judge from here. nodeChecks knows both configs only on a node
// that runs one of the pool's revisions, and knows neither the node's flags nor its usage; a sidecar knows
// all of it (/configz, /stats/summary, /pods) and judges the revision exactly as it judges an assignment
// before restarting the kubelet (its resource managers' state, the pods the restart would stop or evict,
// the kubelet's own check with the node's flags). dkc-server never holds a credential a kubelet accepts,
// so the question goes through the sidecars:
//
//   - the pool writes status.preview {revision, requestTime}, once per revision;
//   - every serving replica sends it (WatchConfigResponse.preview, with the revision's snapshot) to the
//     selected nodes it serves that do not run it;
//   - each sidecar answers in its status report, and its replica writes the answer as the Node's
//     ConfigPreview condition, whose message names the pool, revision and request time (PreviewPrefix);
//   - the pool holds its current revision until every node asked answered, or previewTimeout passed, then
//     sets completionTime and the Previewed condition. With findings, a pool that may not drain refuses
//     the revision (ConfigInvalid); one that may drain goes on, and drains those nodes when their sidecars
//     ask; a config a node's kubelet refuses is refused either way (a drain does not change it).
//
// A node that never answers (no sidecar connected, an older one) is named and does not block beyond the
// timeout: its sidecar still checks before its own restart.

// previewRecheck is how long a revision refused for its preview's findings stays refused before the
// nodes are asked again: the pods in the way may be moved, or the usage drop, without any event the pool
// watches. Each round is one status write per node asked.
const previewRecheck = 5 * time.Minute

// maxPreviewFindings bounds the nodes the Previewed condition names for each kind of answer.
const maxPreviewFindings = 5

// previewAnswer is a node's answer to the pool's standing preview request.
type previewAnswer struct {
	node    string
	reason  string // a nodeconfig.Preview* reason
	message string // without PreviewPrefix
}

// previewOutcome is what preview decides for a new revision.
type previewOutcome struct {
	preview *plan.Preview
	// invalid refuses the revision for its findings.
	invalid *plan.Invalid
}

// preview decides where the preview of the pool's new revision rev stands, on the selected nodes, at now:
// a request to write, answers to wait for, or the findings (and a refusal). It reads only the pool's
// status and the Nodes' ConfigPreview conditions; the status write is the rollout's. others are every
// pool's selectors (view): a node another pool selects too is held, and not asked.
func (c *Controller) preview(pool *v1alpha1.KubeletConfigPool, rev string, selected []*corev1.Node,
	others []selector, now time.Time) previewOutcome {
	timeout := pool.Spec.PreviewTimeoutOrDefault()
	st := pool.Status.Preview.DeepCopy()
	// A revision refused for its preview stays refused while its nodes are asked again: ConfigInvalid must not
	// go False (an Event, a GitOps tool's "progressing") for the minute they take to answer.
	kept := keptRefusal(pool, rev)
	if st == nil || st.Revision != rev ||
		(kept != nil && st.CompletionTime != nil && !now.Before(st.CompletionTime.Add(previewRecheck))) {
		st = &v1alpha1.PreviewStatus{Revision: rev, RequestTime: metav1.Time{Time: now}}
		c.log.Info("asking the pool's nodes to preview its new revision before assigning it",
			zap.String("pool", pool.Name), zap.String("revision", rev), zap.Int("nodes", len(selected)))
	}
	asked, answers := previewAnswers(pool, st, selected, others, c.cfg.Namespaces)
	deadline := st.RequestTime.Add(timeout)
	if st.CompletionTime == nil {
		if len(answers) < len(asked) && now.Before(deadline) {
			missing := unanswered(asked, answers)
			msg := fmt.Sprintf("revision %s: waiting until %s for %d of %d selected nodes to preview it (%s); nothing "+
				"is assigned meanwhile", rev, deadline.UTC().Format(time.RFC3339), len(missing), len(asked),
				capped(missing))
			out := previewOutcome{preview: &plan.Preview{Status: st, Waiting: true, Message: msg,
				Wait: deadline.Sub(now) + time.Second}}
			if kept != nil {
				// Previewed keeps the findings it refused the revision for until the new answers decide.
				out.invalid = kept
				return out
			}
			out.preview.Condition = metav1.Condition{Status: metav1.ConditionUnknown,
				Reason: v1alpha1.ReasonWaitingForPreview, Message: msg}
			return out
		}
		st.CompletionTime = &metav1.Time{Time: now}
		return c.previewFindings(pool, st, asked, answers, true)
	}
	return c.previewFindings(pool, st, asked, answers, false)
}

// abandonedPreview withdraws a preview that no longer stands for anything (nil when none stands): the pool's
// config went back to its current revision (an undo) or became invalid, or the preview was turned off.
// Left standing, every replica would send it and every selected sidecar judge it again every minute, for
// ever. Without a record, a revision that comes back is asked about anew.
func (c *Controller) abandonedPreview(pool *v1alpha1.KubeletConfigPool, why string) *plan.Preview {
	st := pool.Status.Preview
	if st == nil || st.CompletionTime != nil {
		return nil
	}
	c.log.Info("withdrew the pool's preview", zap.String("pool", pool.Name), zap.String("revision", st.Revision),
		zap.String("why", why))
	return &plan.Preview{Condition: metav1.Condition{Status: metav1.ConditionUnknown,
		Reason: v1alpha1.ReasonPreviewWithdrawn, Message: fmt.Sprintf("revision %s: %s before its preview completed",
			st.Revision, why)}}
}

// previewFindings makes the Previewed condition of a completed preview, and refuses the revision for
// findings the pool may not act on.
// fresh: the preview completed now (its refusal is logged once).
func (c *Controller) previewFindings(pool *v1alpha1.KubeletConfigPool, st *v1alpha1.PreviewStatus, asked []string,
	answers map[string]previewAnswer, fresh bool) previewOutcome {
	by := map[string][]string{} // reason → "node: message"
	for _, n := range asked {
		a, ok := answers[n]
		if !ok {
			by[""] = append(by[""], n)
			continue
		}
		by[a.reason] = append(by[a.reason], n+": "+truncated(a.message, maxPreviewAnswer))
	}
	var parts []string
	add := func(reason, what string) {
		if items := by[reason]; len(items) > 0 {
			parts = append(parts, fmt.Sprintf("%s on %d nodes: %s", what, len(items), cappedN(items, maxPreviewFindings)))
		}
	}
	add(nodeconfig.PreviewConfigRefused, "the node's kubelet refuses the config")
	add(nodeconfig.PreviewDrainRequired, "the kubelet would refuse its resource managers' state until drained")
	add(nodeconfig.PreviewPodsAffected, "running pods the restart would stop or evict")
	found := len(parts) > 0
	add(nodeconfig.PreviewNotPredicted, "not predicted")
	if n := len(by[""]); n > 0 {
		parts = append(parts, fmt.Sprintf("no answer by the timeout from %d nodes (their sidecars check before their "+
			"restarts): %s", n, cappedN(by[""], maxPreviewFindings)))
	}
	ok := len(by[nodeconfig.PreviewNoPodsAffected])
	summary := fmt.Sprintf("revision %s, requested %s: %d of %d nodes asked found nothing", st.Revision,
		st.RequestTime.UTC().Format(time.RFC3339), ok, len(asked))
	if len(parts) > 0 {
		summary += "; " + strings.Join(parts, "; ")
	}
	out := previewOutcome{preview: &plan.Preview{Status: st,
		Condition: metav1.Condition{Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonNoPodsAffected, Message: summary}}}
	if !found {
		if ok < len(asked) {
			// Nothing found, but not everywhere looked at: not a clean preview.
			out.preview.Condition.Status, out.preview.Condition.Reason = metav1.ConditionUnknown, v1alpha1.ReasonNotAllPredicted
		}
		return out
	}
	out.preview.Condition.Status, out.preview.Condition.Reason = metav1.ConditionFalse, v1alpha1.ReasonNodesAffected
	ref := pool.Spec.ConfigMap
	refuse := func(reason, why string) {
		out.invalid = &plan.Invalid{Reason: reason, Message: fmt.Sprintf("configmap %s/%s (revision %s) key %q: %s; "+
			"nothing is assigned. %s. The nodes are asked again every %v while the revision stays refused "+
			"(condition Previewed)", ref.Namespace, ref.Name, st.Revision, ref.KubeletConfigKey, why, summary, previewRecheck)}
		out.preview.Wait = previewRecheck + time.Second
	}
	switch {
	case len(by[nodeconfig.PreviewConfigRefused]) > 0:
		refuse(v1alpha1.ReasonValidationFailed, "the kubelet of selected nodes refuses it with their flags and drop-ins")
	case pool.Spec.MayDrain():
		// The sidecars of those nodes ask for their drain when assigned; the pool makes it.
	case len(by[nodeconfig.PreviewDrainRequired]) > 0:
		refuse(v1alpha1.ReasonDrainRequired, "the kubelet would refuse the state its resource managers checkpointed "+
			"until the node is drained, and the pool may not drain (spec.disruption.drain: Never)")
	default:
		refuse(v1alpha1.ReasonCapacityRefused, "a kubelet restarted with it would stop or evict running pods, "+
			"honouring no PodDisruptionBudget, and the pool may not drain (spec.disruption.drain: Never)")
	}
	if out.invalid != nil && fresh {
		c.log.Info("refused a pool's revision for what its nodes' sidecars previewed", zap.String("pool", pool.Name),
			zap.String("revision", st.Revision), zap.Int("nodes", len(asked)-ok))
	}
	return out
}

// keptRefusal is the pool's stored refusal of rev for its preview's findings, nil when there is none: its
// Previewed condition is False about rev, and ConfigInvalid True about rev.
func keptRefusal(pool *v1alpha1.KubeletConfigPool, rev string) *plan.Invalid {
	pv := meta.FindStatusCondition(pool.Status.Conditions, v1alpha1.ConditionPreviewed)
	ci := meta.FindStatusCondition(pool.Status.Conditions, v1alpha1.ConditionConfigInvalid)
	if pv == nil || pv.Status != metav1.ConditionFalse || !strings.HasPrefix(pv.Message, "revision "+rev+",") ||
		ci == nil || ci.Status != metav1.ConditionTrue || !strings.Contains(ci.Message, "(revision "+rev+")") {
		return nil
	}
	return &plan.Invalid{Reason: ci.Reason, Message: ci.Message}
}

// previewAnswers are the nodes the preview asks, by name, and the answers among them to exactly this
// request. Asked: the selected nodes the pool would assign the revision — not those without a sidecar or
// that never reported (no sidecar would answer), those it holds (hand-assigned, selected by another pool
// too), those whose source already is the revision's snapshot or that run it — which dkc-server's serving
// replicas send the preview to in turn.
func previewAnswers(pool *v1alpha1.KubeletConfigPool, st *v1alpha1.PreviewStatus, selected []*corev1.Node,
	others []selector, allowed resolve.Namespaces) (asked []string, answers map[string]previewAnswer) {
	prefix := v1alpha1.PreviewPrefix(pool.Name, st.Revision, st.RequestTime.Time)
	target := plan.Target{Revision: st.Revision, Source: revision.Source(pool, st.Revision)}
	answers = map[string]previewAnswer{}
	for _, n := range selected {
		v := view(n, pool, target, others, allowed)
		if v.NoSidecar != "" || v.NoStatus || v.HandAssigned || len(v.OtherPools) > 0 || v.Assigned {
			continue
		}
		if running, _ := runningRevision(pool, v.Status); running == st.Revision {
			continue
		}
		asked = append(asked, n.Name)
		for _, c := range n.Status.Conditions {
			if c.Type == nodeconfig.PreviewConditionType && strings.HasPrefix(c.Message, prefix) {
				answers[n.Name] = previewAnswer{node: n.Name, reason: c.Reason,
					message: strings.TrimPrefix(c.Message, prefix)}
			}
		}
	}
	sort.Strings(asked)
	return asked, answers
}

func unanswered(asked []string, answers map[string]previewAnswer) []string {
	var out []string
	for _, n := range asked {
		if _, ok := answers[n]; !ok {
			out = append(out, n)
		}
	}
	return out
}

// cappedN joins the first max items with "; " and counts the rest.
func cappedN(items []string, most int) string {
	if len(items) <= most {
		return strings.Join(items, "; ")
	}
	return strings.Join(items[:most], "; ") + fmt.Sprintf("; and %d more", len(items)-most)
}

// previewOf is a Node's ConfigPreview condition as the pool reads it: an answer to a preview.
func previewOf(n *corev1.Node) string {
	for _, c := range n.Status.Conditions {
		if c.Type == nodeconfig.PreviewConditionType {
			return string(c.Status) + "/" + c.Reason + "/" + c.Message
		}
	}
	return ""
}

// maxPreviewAnswer bounds what the Previewed condition repeats of each node's answer.
const maxPreviewAnswer = 1 << 10

// truncated is s cut to at most n bytes, on a rune boundary.
func truncated(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + " …"
}
