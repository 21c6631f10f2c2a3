// SPDX-License-Identifier: Apache-2.0

package controller

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/dkc-dev/dkc/api/v1alpha1"
	"github.com/dkc-dev/dkc/internal/nodeconfig"
	"github.com/dkc-dev/dkc/services/internal/pool/revision"
	"github.com/dkc-dev/dkc/services/internal/resolve"
)

// answered is n with a ConfigPreview condition answering pool's preview of rev requested at asked.
func answered(n *corev1.Node, pool *v1alpha1.KubeletConfigPool, rev string, asked time.Time, reason, msg string) *corev1.Node {
	st := map[string]corev1.ConditionStatus{nodeconfig.PreviewNoPodsAffected: corev1.ConditionTrue,
		nodeconfig.PreviewNotPredicted: corev1.ConditionUnknown}[reason]
	if st == "" {
		st = corev1.ConditionFalse
	}
	n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: nodeconfig.PreviewConditionType,
		Status: st, Reason: reason, Message: v1alpha1.PreviewPrefix(pool.Name, rev, asked) + msg})
	return n
}

// TestPreview: a new revision is previewed on the selected nodes that have a sidecar, reported, and do not
// run it; the pool waits for exactly this request's answers until previewTimeout, then says what they
// found, and refuses the revision for findings it may not act on.
func TestPreview(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	asked := t0.Add(-time.Minute)
	const rev = "r2"
	standing := &v1alpha1.PreviewStatus{Revision: rev, RequestTime: metav1.Time{Time: asked}}
	done := &v1alpha1.PreviewStatus{Revision: rev, RequestTime: metav1.Time{Time: asked},
		CompletionTime: &metav1.Time{Time: asked.Add(time.Second)}}
	base := testPool()
	// c runs r2 already: not asked.
	runsIt := func() *corev1.Node {
		src := revision.Source(base, rev)
		st, _ := json.Marshal(corev1.NodeConfigStatus{Active: &corev1.NodeConfigSource{ConfigMap: &src}})
		return node("c", map[string]string{nodeconfig.StatusAnnotation: string(st)}, nil)
	}
	pods := "pod default/web-2 (OutOfpods)"
	for _, tc := range []struct {
		name    string
		status  *v1alpha1.PreviewStatus
		drain   v1alpha1.DrainPolicy
		refused bool // the stored status's Previewed condition is False
		nodes   func(p *v1alpha1.KubeletConfigPool) []*corev1.Node
		others  []selector
		// waiting, the Previewed condition's status and reason, the ConfigInvalid reason ("" none).
		waiting   bool
		cond      metav1.ConditionStatus
		reason    string
		invalid   string
		newAsk    bool     // a new request time
		mentions  []string // in the condition's message
		completed bool
	}{
		{name: "a new revision is asked for", nodes: func(p *v1alpha1.KubeletConfigPool) []*corev1.Node {
			return []*corev1.Node{node("a", nil, nil), node("b", nil, nil)}
		}, waiting: true, cond: metav1.ConditionUnknown, reason: v1alpha1.ReasonWaitingForPreview, newAsk: true,
			mentions: []string{"2 of 2 selected nodes", "a, b"}},
		{name: "one answer of two waits, naming the other", status: standing,
			nodes: func(p *v1alpha1.KubeletConfigPool) []*corev1.Node {
				return []*corev1.Node{answered(node("a", nil, nil), p, rev, asked, nodeconfig.PreviewNoPodsAffected, "nothing"),
					node("b", nil, nil)}
			}, waiting: true, cond: metav1.ConditionUnknown, reason: v1alpha1.ReasonWaitingForPreview,
			mentions: []string{"1 of 2 selected nodes", "(b)"}},
		{name: "an answer to an older request is no answer", status: standing,
			nodes: func(p *v1alpha1.KubeletConfigPool) []*corev1.Node {
				return []*corev1.Node{answered(node("a", nil, nil), p, rev, asked.Add(-time.Hour), nodeconfig.PreviewNoPodsAffected, "")}
			}, waiting: true, cond: metav1.ConditionUnknown, reason: v1alpha1.ReasonWaitingForPreview},
		{name: "nodes without sidecar, without status or on the revision are not asked", status: standing,
			nodes: func(p *v1alpha1.KubeletConfigPool) []*corev1.Node {
				return []*corev1.Node{
					answered(node("a", nil, nil), p, rev, asked, nodeconfig.PreviewNoPodsAffected, "nothing"),
					node("b", nil, map[string]string{"pool": "blue", LabelSidecar: "disabled"}),
					unreported(node("d", nil, nil)), runsIt()}
			}, cond: metav1.ConditionTrue, reason: v1alpha1.ReasonNoPodsAffected, completed: true,
			mentions: []string{"1 of 1 nodes asked found nothing"}},
		{name: "nodes the pool holds or has assigned the revision are not asked", status: standing,
			others: []selector{{pool: "green", sel: labels.SelectorFromSet(labels.Set{"also": "green"})}},
			nodes: func(p *v1alpha1.KubeletConfigPool) []*corev1.Node {
				return []*corev1.Node{
					answered(node("a", nil, nil), p, rev, asked, nodeconfig.PreviewNoPodsAffected, "nothing"),
					node("b", nil, map[string]string{"pool": "blue", "also": "green"}),
					node("e", map[string]string{nodeconfig.SourceAnnotation: sourceJSON(revision.Source(p, rev))}, nil),
					// f was assigned an earlier revision by the pool: asked.
					answered(node("f", map[string]string{
						nodeconfig.SourceAnnotation: sourceJSON(revision.Source(p, "r1")),
						v1alpha1.AnnotationAssignment: assignmentJSON(v1alpha1.Assignment{Pool: p.Name, Revision: "r1",
							Namespace: "kube-system", KubeletConfigKey: "kubelet"})}, nil),
						p, rev, asked, nodeconfig.PreviewNoPodsAffected, "nothing")}
			}, cond: metav1.ConditionTrue, reason: v1alpha1.ReasonNoPodsAffected, completed: true,
			mentions: []string{"2 of 2 nodes asked found nothing"}},
		{name: "pods affected, drain Never: refused", status: standing,
			nodes: func(p *v1alpha1.KubeletConfigPool) []*corev1.Node {
				return []*corev1.Node{answered(node("a", nil, nil), p, rev, asked, nodeconfig.PreviewPodsAffected, pods),
					answered(node("b", nil, nil), p, rev, asked, nodeconfig.PreviewNoPodsAffected, "")}
			}, cond: metav1.ConditionFalse, reason: v1alpha1.ReasonNodesAffected, invalid: v1alpha1.ReasonCapacityRefused,
			completed: true, mentions: []string{"a: " + pods, "1 of 2 nodes asked found nothing"}},
		{name: "pods affected, drain Allowed: goes on", status: standing, drain: v1alpha1.DrainAllowed,
			nodes: func(p *v1alpha1.KubeletConfigPool) []*corev1.Node {
				return []*corev1.Node{answered(node("a", nil, nil), p, rev, asked, nodeconfig.PreviewPodsAffected, pods)}
			}, cond: metav1.ConditionFalse, reason: v1alpha1.ReasonNodesAffected, completed: true, mentions: []string{pods}},
		{name: "state reset, drain Never: refused", status: standing,
			nodes: func(p *v1alpha1.KubeletConfigPool) []*corev1.Node {
				return []*corev1.Node{answered(node("a", nil, nil), p, rev, asked, nodeconfig.PreviewDrainRequired, "cpuManagerPolicy")}
			}, cond: metav1.ConditionFalse, reason: v1alpha1.ReasonNodesAffected, invalid: v1alpha1.ReasonDrainRequired,
			completed: true},
		{name: "the node's kubelet refuses it: refused even where the pool may drain", status: standing,
			drain: v1alpha1.DrainAllowed, nodes: func(p *v1alpha1.KubeletConfigPool) []*corev1.Node {
				return []*corev1.Node{answered(node("a", nil, nil), p, rev, asked, nodeconfig.PreviewConfigRefused, "invalid")}
			}, cond: metav1.ConditionFalse, reason: v1alpha1.ReasonNodesAffected, invalid: v1alpha1.ReasonValidationFailed,
			completed: true},
		{name: "not predicted is no finding, nor a clean preview", status: standing,
			nodes: func(p *v1alpha1.KubeletConfigPool) []*corev1.Node {
				return []*corev1.Node{answered(node("a", nil, nil), p, rev, asked, nodeconfig.PreviewNotPredicted, "no /configz")}
			}, cond: metav1.ConditionUnknown, reason: v1alpha1.ReasonNotAllPredicted, completed: true,
			mentions: []string{"not predicted on 1 nodes: a: no /configz"}},
		{name: "past the timeout, the silent are named and do not block",
			status: &v1alpha1.PreviewStatus{Revision: rev, RequestTime: metav1.Time{Time: t0.Add(-6 * time.Minute)}},
			nodes:  func(p *v1alpha1.KubeletConfigPool) []*corev1.Node { return []*corev1.Node{node("a", nil, nil)} },
			cond:   metav1.ConditionUnknown, reason: v1alpha1.ReasonNotAllPredicted, completed: true,
			mentions: []string{"no answer by the timeout from 1 nodes", ": a"}},
		{name: "a preview of another revision is replaced",
			status:  &v1alpha1.PreviewStatus{Revision: "r1", RequestTime: metav1.Time{Time: asked}},
			nodes:   func(p *v1alpha1.KubeletConfigPool) []*corev1.Node { return []*corev1.Node{node("a", nil, nil)} },
			waiting: true, cond: metav1.ConditionUnknown, reason: v1alpha1.ReasonWaitingForPreview, newAsk: true},
		{name: "a refusal stands until the re-check", status: done, refused: true,
			nodes: func(p *v1alpha1.KubeletConfigPool) []*corev1.Node {
				return []*corev1.Node{answered(node("a", nil, nil), p, rev, asked, nodeconfig.PreviewPodsAffected, pods)}
			}, cond: metav1.ConditionFalse, reason: v1alpha1.ReasonNodesAffected, invalid: v1alpha1.ReasonCapacityRefused,
			completed: true},
		{name: "a refusal is asked again after the re-check, and stays refused meanwhile",
			status: &v1alpha1.PreviewStatus{Revision: rev, RequestTime: metav1.Time{Time: t0.Add(-time.Hour)},
				CompletionTime: &metav1.Time{Time: t0.Add(-time.Hour)}}, refused: true,
			nodes: func(p *v1alpha1.KubeletConfigPool) []*corev1.Node {
				return []*corev1.Node{answered(node("a", nil, nil), p, rev, t0.Add(-time.Hour), nodeconfig.PreviewPodsAffected, pods)}
			}, waiting: true, invalid: v1alpha1.ReasonCapacityRefused, newAsk: true},
		{name: "a re-check answered clean lifts the refusal", refused: true,
			status: &v1alpha1.PreviewStatus{Revision: rev, RequestTime: metav1.Time{Time: asked}},
			nodes: func(p *v1alpha1.KubeletConfigPool) []*corev1.Node {
				return []*corev1.Node{answered(node("a", nil, nil), p, rev, asked, nodeconfig.PreviewNoPodsAffected, "")}
			}, cond: metav1.ConditionTrue, reason: v1alpha1.ReasonNoPodsAffected, completed: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool := testPool()
			pool.Status.Preview = tc.status.DeepCopy()
			if tc.drain != "" {
				pool.Spec.Disruption = &v1alpha1.Disruption{Drain: tc.drain}
			}
			if tc.refused {
				pool.Status.Conditions = []metav1.Condition{
					{Type: v1alpha1.ConditionPreviewed, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonNodesAffected,
						Message: "revision " + rev + ", requested ...: 0 of 1 nodes asked found nothing"},
					{Type: v1alpha1.ConditionConfigInvalid, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonCapacityRefused,
						Message: "configmap kube-system/blue-config (revision " + rev + ") key \"kubelet\": refused"}}
			}
			src := revision.Source(pool, rev)
			pool.Status.RevisionSnapshots = &v1alpha1.RevisionSnapshots{Items: []v1alpha1.RevisionSnapshot{{Revision: rev,
				Namespace: src.Namespace, Name: src.Name, UID: "snap-uid", KubeletConfigKey: src.KubeletConfigKey}}}
			c := &Controller{log: zap.NewNop(), cfg: Config{Namespaces: resolve.NewNamespaces("kube-system")}}
			o := c.preview(pool, rev, tc.nodes(pool), tc.others, t0)
			p := o.preview
			if p == nil {
				t.Fatal("no preview")
			}
			if p.Waiting != tc.waiting {
				t.Errorf("waiting %v, want %v (%s)", p.Waiting, tc.waiting, p.Message)
			}
			if p.Condition.Status != tc.cond || p.Condition.Reason != tc.reason {
				t.Errorf("Previewed %s/%s, want %s/%s: %s", p.Condition.Status, p.Condition.Reason, tc.cond, tc.reason,
					p.Condition.Message)
			}
			for _, m := range tc.mentions {
				if !strings.Contains(p.Condition.Message, m) {
					t.Errorf("Previewed message %q does not mention %q", p.Condition.Message, m)
				}
			}
			switch {
			case tc.invalid == "" && o.invalid != nil:
				t.Errorf("refused (%s: %s), want not", o.invalid.Reason, o.invalid.Message)
			case tc.invalid != "" && (o.invalid == nil || o.invalid.Reason != tc.invalid):
				t.Errorf("refused %+v, want %s", o.invalid, tc.invalid)
			case tc.invalid != "" && !tc.waiting && (p.Wait <= 0 || p.Wait > previewRecheck+time.Second):
				t.Errorf("a refusal decides again in %v, want within the re-check", p.Wait)
			}
			if p.Status == nil || p.Status.Revision != rev {
				t.Fatalf("status.preview %+v, want revision %s", p.Status, rev)
			}
			if newAsk := p.Status.RequestTime.Equal(&metav1.Time{Time: t0}); newAsk != tc.newAsk {
				t.Errorf("request time %v, new: %v, want %v", p.Status.RequestTime, newAsk, tc.newAsk)
			}
			if (p.Status.CompletionTime != nil) != tc.completed {
				t.Errorf("completion time %v, want set: %v", p.Status.CompletionTime, tc.completed)
			}
			if tc.waiting && (p.Wait <= 0 || p.Wait > pool.Spec.PreviewTimeoutOrDefault()+time.Second) {
				t.Errorf("waits %v, want until the timeout", p.Wait)
			}
		})
	}
}
