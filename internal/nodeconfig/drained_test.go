// SPDX-License-Identifier: Apache-2.0

package nodeconfig

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

func TestIsDrainedFor(t *testing.T) {
	mark := MarshalDrained("u1", "7")
	tests := []struct {
		name          string
		mark          *string
		unschedulable bool
		want          bool
	}{
		{name: "cordoned and marked for the version", mark: &mark, unschedulable: true, want: true},
		{name: "marked but uncordoned since", mark: &mark},
		{name: "cordoned without a mark", unschedulable: true},
		{name: "marked for another resourceVersion", mark: ptr(MarshalDrained("u1", "8")), unschedulable: true},
		{name: "marked for another object of the name", mark: ptr(MarshalDrained("u2", "7")), unschedulable: true},
		{name: "a mark that does not parse", mark: ptr("u1/7"), unschedulable: true},
		{name: "a mark for the local config", mark: ptr(MarshalDrained("", "")), unschedulable: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{}},
				Spec: corev1.NodeSpec{Unschedulable: tt.unschedulable}}
			if tt.mark != nil {
				n.Annotations[DrainedAnnotation] = *tt.mark
			}
			if got := IsDrainedFor(n, "u1", "7"); got != tt.want {
				t.Errorf("IsDrainedFor = %v, want %v", got, tt.want)
			}
		})
	}
	if IsDrainedFor(&corev1.Node{Spec: corev1.NodeSpec{Unschedulable: true}}, "", "") {
		t.Error("a node without annotations is drained for no version")
	}
	local := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{
		DrainedAnnotation: MarshalDrained("", ""),
		StatusAnnotation:  `{"active":{"configMap":{"uid":"u1","resourceVersion":"7"}}}`}},
		Spec: corev1.NodeSpec{Unschedulable: true}}
	if !IsDrainedFor(local, "", "") {
		t.Error("a node marked drained for its local config is not drained for it")
	}
	// Once the node runs the version marked, the mark has served.
	for _, tc := range []struct {
		name, status string
		uid, rv      string
		want         bool
	}{
		{"runs the version", `{"active":{"configMap":{"uid":"u1","resourceVersion":"7"}}}`, "u1", "7", false},
		{"runs an earlier version", `{"active":{"configMap":{"uid":"u1","resourceVersion":"6"}}}`, "u1", "7", true},
		{"reports an error about it", `{"active":{"configMap":{"uid":"u1","resourceVersion":"7"}},"error":"e"}`,
			"u1", "7", true},
		{"runs its local config, marked for it", `{}`, "", "", false},
	} {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{
			DrainedAnnotation: MarshalDrained(types.UID(tc.uid), tc.rv), StatusAnnotation: tc.status}},
			Spec: corev1.NodeSpec{Unschedulable: true}}
		if got := IsDrainedFor(n, types.UID(tc.uid), tc.rv); got != tc.want {
			t.Errorf("%s: IsDrainedFor = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func ptr(s string) *string { return &s }
