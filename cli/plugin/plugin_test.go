// SPDX-License-Identifier: Apache-2.0

package plugin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/dkc-dev/dkc/api/v1alpha1"
	"github.com/dkc-dev/dkc/internal/nodeconfig"
)

func TestDiff(t *testing.T) {
	for _, tc := range []struct {
		name          string
		running, next map[string]any
		want          []FieldChange
	}{
		{"identical", map[string]any{"kind": "KubeletConfiguration", "eventRecordQPS": 5.0}, map[string]any{"kind": "KubeletConfiguration", "eventRecordQPS": 5.0}, nil},
		{"apiVersion and kind are not fields", map[string]any{"apiVersion": "a", "kind": "b"}, map[string]any{"apiVersion": "c", "kind": "d"}, nil},
		{"changed, sorted by field, with safety",
			map[string]any{"maxPods": 110.0, "eventRecordQPS": 5.0},
			map[string]any{"maxPods": 50.0, "eventRecordQPS": 7.0},
			[]FieldChange{
				{Field: "eventRecordQPS", Running: 5.0, New: 7.0, Safety: RestartSafe},
				{Field: "maxPods", Running: 110.0, New: 50.0, Safety: Disruptive, Reason: "lowering it below the running pods rejects pods on the next admission"},
			}},
		{"added and removed fields",
			map[string]any{"staticPodPath": "/etc/kubernetes/manifests"},
			map[string]any{"cpuManagerPolicy": "static"},
			[]FieldChange{
				{Field: "cpuManagerPolicy", Running: nil, New: "static", Safety: NeedsReset, Reason: fieldSafety["cpuManagerPolicy"].reason},
				{Field: "staticPodPath", Running: "/etc/kubernetes/manifests", New: nil, Safety: Disruptive, Reason: fieldSafety["staticPodPath"].reason},
			}},
		{"nested values compared whole",
			map[string]any{"evictionHard": map[string]any{"memory.available": "100Mi"}},
			map[string]any{"evictionHard": map[string]any{"memory.available": "200Mi"}},
			[]FieldChange{{Field: "evictionHard", Running: map[string]any{"memory.available": "100Mi"}, New: map[string]any{"memory.available": "200Mi"},
				Safety: Disruptive, Reason: fieldSafety["evictionHard"].reason}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Diff(tc.running, tc.next); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Diff = %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestSafety(t *testing.T) {
	for _, tc := range []struct{ field, class string }{
		{"eventRecordQPS", RestartSafe},
		{"cpuManagerPolicy", NeedsReset},
		{"authorization", Disruptive},
		{"aFieldNobodyClassified", RestartSafe}, // most fields take effect on the restart applying is
	} {
		if class, reason := Safety(tc.field); class != tc.class || (class != RestartSafe && reason == "") {
			t.Errorf("Safety(%q) = %q, %q; want %q with a reason unless restart-safe", tc.field, class, reason, tc.class)
		}
	}
}

func node(annotations map[string]string, conditions ...corev1.NodeCondition) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Annotations: annotations}, Status: corev1.NodeStatus{Conditions: conditions}}
}

func TestStatusOf(t *testing.T) {
	at := metav1.Unix(1700000000, 0)
	ok := corev1.NodeCondition{Type: nodeconfig.ConditionType, Status: corev1.ConditionTrue, Message: "using current", LastTransitionTime: at}
	status := `{"assigned":{"configMap":{"namespace":"kube-system","name":"c","uid":"u","resourceVersion":"7","kubeletConfigKey":"kubelet"}},"error":"boom"}`
	for _, tc := range []struct {
		name string
		n    *corev1.Node
		want NodeStatus
	}{
		{"nothing reported", node(nil), NodeStatus{Node: "n1"}},
		{"unparseable annotation is not a report", node(map[string]string{nodeconfig.StatusAnnotation: "{"}), NodeStatus{Node: "n1"}},
		{"status and condition", node(map[string]string{nodeconfig.StatusAnnotation: status}, ok), NodeStatus{Node: "n1", Reported: true,
			Status: &corev1.NodeConfigStatus{Assigned: &corev1.NodeConfigSource{ConfigMap: &corev1.ConfigMapNodeConfigSource{
				Namespace: "kube-system", Name: "c", UID: "u", ResourceVersion: "7", KubeletConfigKey: "kubelet"}}, Error: "boom"},
			ConfigOK: "True", Message: "using current", Transited: &at}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := StatusOf(tc.n); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("StatusOf = %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestApplyPoolFlags(t *testing.T) {
	given := func(flags ...string) func(string) bool {
		return func(f string) bool { return slices.Contains(flags, f) }
	}
	base := func() poolFlags {
		return poolFlags{configMap: "kube-system/c", key: "kubelet", selector: "pool=blue", maxUnavailable: "1", maxFailures: 1, nodeTimeout: 30 * time.Minute}
	}
	existing := func() v1alpha1.KubeletConfigPoolSpec {
		mu, mf := intstr.FromString("10%"), int32(3)
		return v1alpha1.KubeletConfigPoolSpec{NodeSelector: metav1.LabelSelector{MatchLabels: map[string]string{"pool": "green"}},
			ConfigMap: v1alpha1.ConfigMapReference{Namespace: "dkc-configs", Name: "old", KubeletConfigKey: "config"}, MaxUnavailable: &mu, MaxFailures: &mf}
	}
	for _, tc := range []struct {
		name     string
		flags    func(*poolFlags)
		changed  []string
		creating bool
		spec     v1alpha1.KubeletConfigPoolSpec
		check    func(t *testing.T, s v1alpha1.KubeletConfigPoolSpec)
		wantErr  string
	}{
		{name: "creating sets every field", creating: true, changed: []string{"selector"},
			check: func(t *testing.T, s v1alpha1.KubeletConfigPoolSpec) {
				if s.ConfigMap != (v1alpha1.ConfigMapReference{Namespace: "kube-system", Name: "c", KubeletConfigKey: "kubelet"}) ||
					s.NodeSelector.MatchLabels["pool"] != "blue" || s.MaxUnavailable.String() != "1" || *s.MaxFailures != 1 ||
					s.NodeTimeout.Duration != 30*time.Minute || s.PauseBetweenBatches != nil {
					t.Errorf("spec %+v", s)
				}
			}},
		{name: "an update changes only the flags given", spec: existing(), flags: func(f *poolFlags) { f.configMap = ""; f.maxUnavailable = "25%" },
			changed: []string{"max-unavailable"},
			check: func(t *testing.T, s v1alpha1.KubeletConfigPoolSpec) {
				if s.ConfigMap.Name != "old" || s.NodeSelector.MatchLabels["pool"] != "green" || s.MaxUnavailable.String() != "25%" || *s.MaxFailures != 3 || s.NodeTimeout != nil {
					t.Errorf("spec %+v", s)
				}
			}},
		{name: "a new ConfigMap keeps the key unless --key is given", spec: existing(), flags: func(f *poolFlags) { f.configMap = "kube-system/new" },
			check: func(t *testing.T, s v1alpha1.KubeletConfigPoolSpec) {
				if s.ConfigMap != (v1alpha1.ConfigMapReference{Namespace: "kube-system", Name: "new", KubeletConfigKey: "config"}) {
					t.Errorf("configMap %+v", s.ConfigMap)
				}
			}},
		{name: "--key alone changes the key of the same ConfigMap", spec: existing(), flags: func(f *poolFlags) { f.configMap = ""; f.key = "other" },
			changed: []string{"key"},
			check: func(t *testing.T, s v1alpha1.KubeletConfigPoolSpec) {
				if s.ConfigMap != (v1alpha1.ConfigMapReference{Namespace: "dkc-configs", Name: "old", KubeletConfigKey: "other"}) {
					t.Errorf("configMap %+v", s.ConfigMap)
				}
			}},
		{name: "-l '' selects every node", creating: true, flags: func(f *poolFlags) { f.selector = "" }, changed: []string{"selector"},
			check: func(t *testing.T, s v1alpha1.KubeletConfigPoolSpec) {
				if len(s.NodeSelector.MatchLabels)+len(s.NodeSelector.MatchExpressions) != 0 {
					t.Errorf("selector %+v", s.NodeSelector)
				}
			}},
		{name: "a bad selector", creating: true, flags: func(f *poolFlags) { f.selector = "a in (" }, wantErr: "-l"},
		{name: "a bad maxUnavailable", creating: true, flags: func(f *poolFlags) { f.maxUnavailable = "many" }, wantErr: "--max-unavailable"},
		{name: "a bad ConfigMap reference", creating: true, flags: func(f *poolFlags) { f.configMap = "c" }, wantErr: "NAMESPACE/NAME"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := base()
			if tc.flags != nil {
				tc.flags(&f)
			}
			f.changed = given(tc.changed...)
			spec := tc.spec
			err := applyPoolFlags(&spec, f, tc.creating)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one about %s", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, spec)
		})
	}
}

func TestVerdict(t *testing.T) {
	cond := func(typ string, status metav1.ConditionStatus, reason string) metav1.Condition {
		return metav1.Condition{Type: typ, Status: status, Reason: reason, Message: reason + " message"}
	}
	pool := func(observed int64, rev string, paused bool, conds ...metav1.Condition) *v1alpha1.KubeletConfigPool {
		return &v1alpha1.KubeletConfigPool{ObjectMeta: metav1.ObjectMeta{Name: "blue", Generation: 2}, Spec: v1alpha1.KubeletConfigPoolSpec{Paused: paused},
			Status: v1alpha1.KubeletConfigPoolStatus{ObservedGeneration: observed, CurrentRevision: rev, Conditions: conds,
				Nodes: v1alpha1.NodeCounts{Selected: 5, Updated: 2, InProgress: 1}}}
	}
	// settled: nothing more to assign, with failed nodes recorded at retry failedAt (the spec's is 1) and held ones.
	settled := func(failedAt []int64, held int32) *v1alpha1.KubeletConfigPool {
		p := pool(2, "r1", false, cond(v1alpha1.ConditionUpdating, metav1.ConditionFalse, v1alpha1.ReasonNothingToAssign),
			cond(v1alpha1.ConditionUpdated, metav1.ConditionFalse, v1alpha1.ReasonNodesNotUpdated))
		p.Spec.Retry = 1
		for i, r := range failedAt {
			p.Status.FailedNodes = append(p.Status.FailedNodes, v1alpha1.FailedNode{Name: fmt.Sprint("f", i), Revision: "r1", Retry: r})
		}
		failed := int32(len(failedAt))
		p.Status.Nodes = v1alpha1.NodeCounts{Selected: 5, Updated: 5 - failed - held, Failed: failed, Held: held}
		return p
	}
	updated := cond(v1alpha1.ConditionUpdated, metav1.ConditionTrue, v1alpha1.ReasonAllNodesUpdated)
	halted := cond(v1alpha1.ConditionHalted, metav1.ConditionTrue, v1alpha1.ReasonFailureBudgetExhausted)
	invalid := cond(v1alpha1.ConditionConfigInvalid, metav1.ConditionTrue, v1alpha1.ReasonConfigMapNotFound)
	notValid := cond(v1alpha1.ConditionConfigInvalid, metav1.ConditionTrue, v1alpha1.ReasonValidationFailed)
	notValid.Message = `configmap kube-system/blue (revision r1) key "kubelet": the kubelet 1.37 refuses it`
	notValidR2 := notValid
	notValidR2.Message = `configmap kube-system/blue (revision r2) key "kubelet": the kubelet 1.37 refuses it`
	notValidSelector := cond(v1alpha1.ConditionConfigInvalid, metav1.ConditionTrue, v1alpha1.ReasonValidationFailed) // names no revision
	for _, tc := range []struct {
		name     string
		p        *v1alpha1.KubeletConfigPool
		revision string
		done     bool
		stopped  string // the ErrRolloutStopped reason
		lineHas  string
	}{
		{name: "generation not yet observed: an earlier Updated does not count", p: pool(1, "r1", false, updated), done: false, lineHas: "generation 2"},
		{name: "rolling out", p: pool(2, "r1", false), lineHas: "2 of 5 nodes updated, 1 in progress"},
		{name: "complete", p: pool(2, "r1", false, updated), done: true, lineHas: "rollout complete"},
		{name: "an in-place edit not yet taken: the old revision's Updated does not count", p: pool(2, "r1", false, updated), revision: "r2", lineHas: "revision r2"},
		{name: "the edit taken and complete", p: pool(2, "r2", false, updated), revision: "r2", done: true, lineHas: "rollout complete"},
		{name: "halted", p: pool(2, "r1", false, halted), done: true, stopped: v1alpha1.ReasonFailureBudgetExhausted},
		{name: "config invalid ends it", p: pool(2, "r1", false, invalid), done: true, stopped: v1alpha1.ReasonConfigMapNotFound},
		{name: "the edit the caller read does not validate", p: pool(2, "r1", false, notValidR2), revision: "r2", done: true, stopped: v1alpha1.ReasonValidationFailed},
		{name: "content before the edit did not validate: wait for the edit's verdict", p: pool(2, "r1", false, notValid), revision: "r2", lineHas: "revision r2"},
		{name: "a spec change to a config that does not validate", p: pool(2, "r1", false, notValid), done: true, stopped: v1alpha1.ReasonValidationFailed},
		{name: "a finding on the spec, not the content, ends it whatever the revision", p: pool(2, "r1", false, notValidSelector), revision: "r2", done: true, stopped: v1alpha1.ReasonValidationFailed},
		{name: "a ConfigMap found missing before the edit the caller just read: wait", p: pool(2, "r1", false, invalid), revision: "r2", lineHas: "revision r2"},
		{name: "settled with a failed node within maxFailures", p: settled([]int64{1}, 0), done: true, stopped: v1alpha1.ReasonNothingToAssign},
		{name: "settled with held nodes only", p: settled(nil, 2), done: true, lineHas: "held"},
		{name: "settled with nodes without a sidecar, reasons counted", p: func() *v1alpha1.KubeletConfigPool {
			p := settled(nil, 3)
			p.Status.HeldNodes = []v1alpha1.HeldNode{{Name: "a", Reason: "NoSidecar"}, {Name: "b", Reason: "NoSidecar"}, {Name: "c", Reason: "NotReported"}}
			return p
		}(), done: true, lineHas: "3 held (2 NoSidecar, 1 NotReported)"},
		{name: "settled after a retry: the forgiven failure is not a stop", p: settled([]int64{0}, 0), done: true, lineHas: "nothing more to assign"},
		{name: "no node selected", p: pool(2, "r1", false, cond(v1alpha1.ConditionUpdated, metav1.ConditionFalse, v1alpha1.ReasonNoNodesSelected)),
			done: true, stopped: v1alpha1.ReasonNoNodesSelected},
		{name: "paused", p: pool(2, "r1", true), done: true, lineHas: "paused"},
		{name: "outside the maintenance windows: when the next opens", p: func() *v1alpha1.KubeletConfigPool {
			p := pool(2, "r1", false, cond(v1alpha1.ConditionUpdating, metav1.ConditionTrue, v1alpha1.ReasonWaitingForMaintenanceWindow))
			p.Status.MaintenanceWindow = &v1alpha1.MaintenanceWindowStatus{
				NextOpenTime: &metav1.Time{Time: time.Date(2031, 1, 4, 2, 0, 0, 0, time.UTC)}}
			return p
		}(), lineHas: "nothing new is assigned until the next opens at 2031-01-04T02:00:00Z (in "},
		{name: "the edit taken and previewed on the nodes: the preview's wait", p: func() *v1alpha1.KubeletConfigPool {
			p := pool(2, "r1", false, cond(v1alpha1.ConditionUpdating, metav1.ConditionTrue, v1alpha1.ReasonWaitingForPreview))
			p.Status.Preview = &v1alpha1.PreviewStatus{Revision: "r2"}
			return p
		}(), revision: "r2", lineHas: "WaitingForPreview message"},
		{name: "the edit refused on its preview ends it", p: func() *v1alpha1.KubeletConfigPool {
			refused := cond(v1alpha1.ConditionConfigInvalid, metav1.ConditionTrue, v1alpha1.ReasonCapacityRefused)
			refused.Message = `configmap kube-system/blue (revision r2) key "kubelet": a kubelet restarted with it would stop pods`
			p := pool(2, "r1", false, refused)
			p.Status.Preview = &v1alpha1.PreviewStatus{Revision: "r2"}
			return p
		}(), revision: "r2", done: true, stopped: v1alpha1.ReasonCapacityRefused},
		{name: "a maintenance window that cannot be read ends it", p: pool(2, "r1", false,
			cond(v1alpha1.ConditionUpdating, metav1.ConditionFalse, v1alpha1.ReasonInvalidMaintenanceWindow)),
			done: true, stopped: v1alpha1.ReasonInvalidMaintenanceWindow},
	} {
		t.Run(tc.name, func(t *testing.T) {
			line, done, err := verdict(tc.p, 2, tc.revision)
			if done != tc.done {
				t.Errorf("done = %v, want %v (%s)", done, tc.done, line)
			}
			var stopped *ErrRolloutStopped
			if tc.stopped != "" {
				if !errors.As(err, &stopped) || stopped.Reason != tc.stopped || stopped.Pool != "blue" {
					t.Errorf("error %v, want the pool stopped for %s", err, tc.stopped)
				}
			} else if err != nil {
				t.Errorf("error %v, want none", err)
			}
			if !strings.Contains(line, tc.lineHas) {
				t.Errorf("line %q lacks %q", line, tc.lineHas)
			}
		})
	}
}

func TestParseConfigMap(t *testing.T) {
	for _, tc := range []struct {
		ref, ns, name string
		ok            bool
	}{
		{"kube-system/c", "kube-system", "c", true},
		{"c", "", "", false},
		{"/c", "", "", false},
		{"kube-system/", "", "", false},
		{"a/b/c", "", "", false},
	} {
		ns, name, err := parseConfigMap(tc.ref)
		if (err == nil) != tc.ok || ns != tc.ns || name != tc.name {
			t.Errorf("parseConfigMap(%q) = %q, %q, %v; want %q, %q, ok=%v", tc.ref, ns, name, err, tc.ns, tc.name, tc.ok)
		}
	}
}

// handshakeTimeout is what net/http returns when the apiserver accepts a connection but does not finish
// the TLS handshake in time (an apiserver starting, or overloaded).
type handshakeTimeout struct{}

func (handshakeTimeout) Error() string   { return "net/http: TLS handshake timeout" }
func (handshakeTimeout) Timeout() bool   { return true }
func (handshakeTimeout) Temporary() bool { return true }

func TestTransient(t *testing.T) {
	get := func(err error) error { return &url.Error{Op: "Get", URL: "https://apiserver/apis", Err: err} }
	pool := schema.GroupResource{Group: "dkc.dev", Resource: "kubeletconfigpools"}
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"connection refused", get(&net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}), true},
		{"connection reset", get(&net.OpError{Op: "read", Err: syscall.ECONNRESET}), true},
		{"TLS handshake timeout", get(handshakeTimeout{}), true},
		{"connection closed mid-response", get(io.ErrUnexpectedEOF), true},
		{"too many requests", apierrors.NewTooManyRequests("slow down", 1), true},
		{"service unavailable", apierrors.NewServiceUnavailable("starting"), true},
		{"not found", apierrors.NewNotFound(pool, "blue"), false},
		{"forbidden", apierrors.NewForbidden(pool, "blue", errors.New("no")), false},
		{"invalid", apierrors.NewBadRequest("spec.maxUnavailable"), false},
		{"certificate not trusted", get(errors.New("x509: certificate signed by unknown authority")), false},
		{"the caller's deadline", get(context.DeadlineExceeded), false},
		{"the caller gave up", get(context.Canceled), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := transient(tc.err); got != tc.want {
				t.Errorf("transient(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}
