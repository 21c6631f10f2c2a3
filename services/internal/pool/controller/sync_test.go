// SPDX-License-Identifier: Apache-2.0

package controller

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dkc-dev/dkc/api/v1alpha1"
	"github.com/dkc-dev/dkc/services/internal/pool/revision"
)

// The tables of sync's steps (rollout), one each; the tests in controller_test.go run them together.

// stepConfigMaps is a tracker whose answer a row sets, recording what it was asked to track.
type stepConfigMaps struct {
	fakeConfigMaps
	synced  bool
	err     error
	tracked string
}

func (f *stepConfigMaps) Track(_, key string) { f.tracked = key }
func (f *stepConfigMaps) Get(string) (*corev1.ConfigMap, bool, error) {
	return f.cm, f.synced, f.err
}

func TestConfigMapStep(t *testing.T) {
	cm := configMap(map[string]string{"kubelet": goodConfig})
	for _, tc := range []struct {
		name      string
		namespace string // the pool's ConfigMap's, default kube-system
		tracker   stepConfigMaps
		want      *corev1.ConfigMap
		synced    bool
		err       string // a substring, "" for none
		tracked   string
	}{
		{name: "tracked and read", tracker: stepConfigMaps{fakeConfigMaps: fakeConfigMaps{cm: cm}, synced: true},
			want: cm, synced: true, tracked: "kube-system/blue-config"},
		{name: "none: nil, for checkConfig to say so", tracker: stepConfigMaps{synced: true},
			synced: true, tracked: "kube-system/blue-config"},
		{name: "the tracker has not listed yet: not synced", tracker: stepConfigMaps{},
			tracked: "kube-system/blue-config"},
		{name: "the tracker fails", tracker: stepConfigMaps{err: errors.New("boom")},
			err: "read configmap kube-system/blue-config: boom", tracked: "kube-system/blue-config"},
		{name: "a namespace dkc-server does not read: untracked, nil", namespace: "default",
			tracker: stepConfigMaps{fakeConfigMaps: fakeConfigMaps{cm: cm}, synced: true, tracked: "left over"},
			synced:  true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool := testPool()
			if tc.namespace != "" {
				pool.Spec.ConfigMap.Namespace = tc.namespace
			}
			h := newHarness(t, pool, nil)
			tracker := tc.tracker
			h.c.cms = &tracker
			got, synced, err := h.c.configMap(pool)
			if got != tc.want || synced != tc.synced {
				t.Errorf("configmap %v synced %v, want %v synced %v", got, synced, tc.want, tc.synced)
			}
			if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Errorf("error %v, want %q", err, tc.err)
			}
			if tracker.tracked != tc.tracked {
				t.Errorf("tracking %q, want %q", tracker.tracked, tc.tracked)
			}
		})
	}
}

func TestSelectNodes(t *testing.T) {
	nodes := []*corev1.Node{node("a", nil, nil), node("b", nil, map[string]string{"pool": "green"}), node("c", nil, nil)}
	for _, tc := range []struct {
		name     string
		selector metav1.LabelSelector
		selected string // names, comma-separated
		bad      bool   // the selector does not parse
	}{
		{name: "by label", selector: metav1.LabelSelector{MatchLabels: map[string]string{"pool": "blue"}},
			selected: "a,c"},
		{name: "the empty selector selects every node", selected: "a,b,c"},
		{name: "a selector that does not parse selects nothing", bad: true,
			selector: metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
				{Key: "pool", Operator: "Near", Values: []string{"blue"}}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool := testPool()
			pool.Spec.NodeSelector = tc.selector
			h := newHarness(t, pool, nil, nodes...)
			all, selected, selectorErr, err := h.c.selectNodes(pool)
			if err != nil {
				t.Fatal(err)
			}
			if len(all) != len(nodes) {
				t.Errorf("%d nodes in all, want every one (%d)", len(all), len(nodes))
			}
			var names []string
			for _, n := range selected {
				names = append(names, n.Name)
			}
			slices.Sort(names)
			if got := strings.Join(names, ","); got != tc.selected {
				t.Errorf("selected %q, want %q", got, tc.selected)
			}
			if (selectorErr != nil) != tc.bad {
				t.Errorf("selector error %v, want one: %v", selectorErr, tc.bad)
			}
		})
	}
}

func TestFreeze(t *testing.T) {
	good := configMap(map[string]string{"kubelet": goodConfig})
	rev, snap := revision.Snapshot(testPool(), good)
	taken := snap.DeepCopy() // the snapshot's name, someone else's object
	taken.Data = map[string]string{"kubelet": "something else"}
	for _, tc := range []struct {
		name      string
		cm        *corev1.ConfigMap
		pool      func(*v1alpha1.KubeletConfigPool)
		existing  *corev1.ConfigMap // in the apiserver, not in the cache
		reason    string            // the invalid's, "" for valid
		target    string
		snapshots int // the revisions the returned pool records
	}{
		{name: "a valid config: its revision, snapshot recorded", cm: good, target: rev, snapshots: 1},
		{name: "no ConfigMap, no revision yet: nothing to judge against", reason: v1alpha1.ReasonConfigMapNotFound},
		{name: "no key, with a current revision: judged against it", cm: configMap(map[string]string{"other": "x"}),
			pool:   func(p *v1alpha1.KubeletConfigPool) { p.Status.CurrentRevision = "old" },
			reason: v1alpha1.ReasonKeyNotFound, target: "old"},
		{name: "a namespace dkc-server does not read", cm: good,
			pool:   func(p *v1alpha1.KubeletConfigPool) { p.Spec.ConfigMap.Namespace = "default" },
			reason: v1alpha1.ReasonNamespaceNotAllowed},
		{name: "the snapshot's name taken by an object the pool does not record", cm: good, existing: taken,
			reason: v1alpha1.ReasonSnapshotMismatch},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool := testPool()
			if tc.pool != nil {
				tc.pool(pool)
			}
			h := newHarness(t, pool, tc.cm)
			if tc.existing != nil {
				if _, err := h.client.CoreV1().ConfigMaps(tc.existing.Namespace).Create(context.Background(), tc.existing,
					metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			got, target, invalid, _, err := h.c.freeze(context.Background(), pool, tc.cm, nil, time.Now())
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case tc.reason == "" && invalid != nil:
				t.Errorf("invalid (%s: %s), want valid", invalid.Reason, invalid.Message)
			case tc.reason != "" && (invalid == nil || invalid.Reason != tc.reason):
				t.Errorf("invalid %+v, want reason %s", invalid, tc.reason)
			}
			if target.Revision != tc.target {
				t.Errorf("target %q, want %q", target.Revision, tc.target)
			}
			if tc.target != "" && target.Source != revision.Source(got, tc.target) {
				t.Errorf("target source %+v, want the revision's snapshot", target.Source)
			}
			var recorded int
			if rec := got.Status.RevisionSnapshots; rec != nil {
				recorded = len(rec.Items)
			}
			if recorded != tc.snapshots {
				t.Errorf("the pool records %d snapshots, want %d", recorded, tc.snapshots)
			}
		})
	}
}

func TestRequeueAfter(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name     string
		expected bool // an assignment the cache has not confirmed
		planned  time.Duration
		want     time.Duration
	}{
		{name: "nothing planned, nothing expected: not again"},
		{name: "as planned", planned: time.Minute, want: time.Minute},
		{name: "an expectation and nothing planned: when it expires", expected: true, want: expectationTTL + time.Second},
		{name: "an expectation expires before the plan's time", expected: true, planned: time.Hour,
			want: expectationTTL + time.Second},
		{name: "the plan's time comes first", expected: true, planned: time.Minute, want: time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, testPool(), nil)
			if tc.expected {
				h.c.exp.expect("blue", "a", v1alpha1.Assignment{Pool: "blue", Revision: "r1"}, now)
			}
			if got := h.c.requeueAfter("blue", tc.planned); got != tc.want {
				t.Errorf("requeue after %v, want %v", got, tc.want)
			}
		})
	}
}

// TestFreezePreviews: with previews on, a new revision waits for its preview (the target stays the current
// revision), and a preview that no longer stands for anything is withdrawn: an undo back to the current
// revision, or a config refused, while it waited. A completed preview is left as the record it is.
func TestFreezePreviews(t *testing.T) {
	good := configMap(map[string]string{"kubelet": goodConfig})
	rev, _ := revision.Snapshot(testPool(), good)
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	standing := &v1alpha1.PreviewStatus{Revision: "newer", RequestTime: metav1.Time{Time: now.Add(-time.Minute)}}
	for _, tc := range []struct {
		name    string
		cm      *corev1.ConfigMap
		pool    func(*v1alpha1.KubeletConfigPool)
		target  string
		waiting bool
		reason  string // the Previewed condition's, "" for none set
		cleared bool   // status.preview withdrawn
		none    bool   // no preview decided at all
	}{
		{name: "a new revision waits for its preview", cm: good,
			pool:   func(p *v1alpha1.KubeletConfigPool) { p.Status.CurrentRevision = "old" },
			target: "old", waiting: true, reason: v1alpha1.ReasonWaitingForPreview},
		{name: "an undo while a preview waits withdraws it", cm: good,
			pool: func(p *v1alpha1.KubeletConfigPool) {
				p.Status.CurrentRevision, p.Status.Preview = rev, standing.DeepCopy()
			},
			target: rev, reason: v1alpha1.ReasonPreviewWithdrawn, cleared: true},
		{name: "a config refused while a preview waits withdraws it", cm: configMap(map[string]string{"other": "x"}),
			pool: func(p *v1alpha1.KubeletConfigPool) {
				p.Status.CurrentRevision, p.Status.Preview = "old", standing.DeepCopy()
			},
			target: "old", reason: v1alpha1.ReasonPreviewWithdrawn, cleared: true},
		{name: "a completed preview stays", cm: good,
			pool: func(p *v1alpha1.KubeletConfigPool) {
				p.Status.CurrentRevision, p.Status.Preview = rev, standing.DeepCopy()
				p.Status.Preview.CompletionTime = &metav1.Time{Time: now}
			},
			target: rev, none: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool := testPool()
			tc.pool(pool)
			h := newHarness(t, pool, tc.cm)
			h.c.cfg.Previews = true
			_, target, _, pv, err := h.c.freeze(context.Background(), pool, tc.cm, []*corev1.Node{node("a", nil, nil)}, now)
			if err != nil {
				t.Fatal(err)
			}
			if target.Revision != tc.target {
				t.Errorf("target %q, want %q", target.Revision, tc.target)
			}
			if tc.none {
				if pv != nil {
					t.Errorf("preview %+v, want none decided", pv)
				}
				return
			}
			if pv == nil {
				t.Fatal("no preview decided")
			}
			if pv.Waiting != tc.waiting || pv.Condition.Reason != tc.reason {
				t.Errorf("waiting %v, Previewed %s (%s); want %v, %s", pv.Waiting, pv.Condition.Reason, pv.Condition.Message,
					tc.waiting, tc.reason)
			}
			if (pv.Status == nil) != tc.cleared {
				t.Errorf("status.preview %+v, want withdrawn: %v", pv.Status, tc.cleared)
			}
		})
	}
}
