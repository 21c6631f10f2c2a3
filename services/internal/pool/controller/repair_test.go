// SPDX-License-Identifier: Apache-2.0

package controller

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/dkc-dev/dkc/internal/nodeconfig"
)

// TestRepairsAskedUntilTheCacheShowsThem: a request this controller wrote stands in for what the Node
// cache shows until the cache shows it (or a newer one), the node runs another version, or cacheLag passed.
func TestRepairsAskedUntilTheCacheShowsThem(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	runs := func(rv string) corev1.NodeConfigStatus {
		return corev1.NodeConfigStatus{Active: &corev1.NodeConfigSource{ConfigMap: &corev1.ConfigMapNodeConfigSource{UID: "u1", ResourceVersion: rv}}}
	}
	req := nodeconfig.DriftRepair{Cause: nodeconfig.DriftWiringRemoved, UID: "u1", ResourceVersion: "7", RequestTime: t0}
	older := req
	older.RequestTime = t0.Add(-time.Hour)
	for _, tc := range []struct {
		name  string
		st    corev1.NodeConfigStatus
		shown *nodeconfig.DriftRepair
		now   time.Time
		want  *nodeconfig.DriftRepair
	}{
		{"the cache shows none yet", runs("7"), nil, t0.Add(time.Second), &req},
		{"the cache shows an older one", runs("7"), &older, t0.Add(time.Second), &req},
		{"the cache shows it", runs("7"), &req, t0.Add(time.Second), &req},
		{"the node runs another version since", runs("8"), nil, t0.Add(time.Second), nil},
		{"remembered past cacheLag", runs("7"), nil, t0.Add(2 * cacheLag), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r repairsAsked
			r.asked("a", req)
			got := r.of("a", tc.st, tc.shown, tc.now)
			if (got == nil) != (tc.want == nil) || (got != nil && !got.RequestTime.Equal(tc.want.RequestTime)) {
				t.Fatalf("of = %+v, want %+v", got, tc.want)
			}
			if tc.want == nil || tc.shown != nil && tc.shown.RequestTime.Equal(req.RequestTime) {
				if _, kept := r.m["a"]; kept {
					t.Errorf("still remembered after %s", tc.name)
				}
			}
		})
	}
}
