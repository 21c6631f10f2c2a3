// SPDX-License-Identifier: Apache-2.0

package server

import (
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
)

// TestPlacementLog: one line at start, Info on a control-plane node or a node of the dedicated pool the
// install names, Warn anywhere else (the placement dkc-server must not run under unknowingly), nothing
// outside a pod.
func TestPlacementLog(t *testing.T) {
	indexer := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	for name, labels := range map[string]map[string]string{
		"cp":     {controlPlaneLabel: ""},
		"pool":   {"dkc.dev/server-pool": "true"},
		"worker": {"kubernetes.io/os": "linux"},
	} {
		if err := indexer.Add(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}); err != nil {
			t.Fatal(err)
		}
	}
	nodes := corelisters.NewNodeLister(indexer)
	for _, tc := range []struct {
		name      string
		p         placement
		wantLevel zapcore.Level
		wantLines int
	}{
		{"control plane", placement{node: "cp", mode: "controlPlane"}, zap.InfoLevel, 1},
		{"dedicated pool", placement{node: "pool", mode: "dedicated", poolLabel: "dkc.dev/server-pool"}, zap.InfoLevel, 1},
		{"control-plane placement on a worker", placement{node: "worker", mode: "controlPlane"}, zap.WarnLevel, 1},
		{"dedicated, another pool's node", placement{node: "pool", mode: "dedicated", poolLabel: "other"}, zap.WarnLevel, 1},
		{"anywhere, on a worker", placement{node: "worker", mode: "anywhere"}, zap.WarnLevel, 1},
		{"anywhere, on a control-plane node", placement{node: "cp", mode: "anywhere"}, zap.InfoLevel, 1},
		{"unknown node", placement{node: "gone", mode: "controlPlane"}, zap.WarnLevel, 1},
		{"not in a pod", placement{}, zap.InfoLevel, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			core, logs := observer.New(zap.DebugLevel)
			tc.p.log(zap.New(core), nodes)
			entries := logs.All()
			if len(entries) != tc.wantLines {
				t.Fatalf("%d lines, want %d: %v", len(entries), tc.wantLines, entries)
			}
			if len(entries) == 0 {
				return
			}
			e := entries[0]
			if e.Level != tc.wantLevel {
				t.Errorf("level %v, want %v: %s", e.Level, tc.wantLevel, e.Message)
			}
			ctx := e.ContextMap()
			if ctx["node"] != tc.p.node || ctx["placement"] != tc.p.mode {
				t.Errorf("fields %v: want node %q, placement %q", ctx, tc.p.node, tc.p.mode)
			}
		})
	}
}
