// SPDX-License-Identifier: Apache-2.0

//go:build integration

package integration

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/dkc-dev/dkc/test/devcluster"
	"github.com/dkc-dev/dkc/test/devcluster/devclustertest"
)

// TestKubeadmStyleNode runs, in a cluster of its own, a real node set up the way kubeadm and distributions set
// up theirs: a kubelet.service without a start limit (kubeadm's StartLimitIntervalSec=0) whose kubelet merges
// --config-dir drop-ins; beside it the service and a simulated node. The tests that need a cluster of their
// own share this one, in order, as starting one costs a minute: the drop-ins (first: it counts the node's
// restarts since it started), the burst of reassignments with nothing to pace it, then stopping the cluster
// as `make down` does, which must leave nothing behind.
func TestKubeadmStyleNode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	const node = "kubeadm-1"
	dir := clusterDir(t, "integration-kubeadm")
	c, err := startSecondCluster(ctx, t, dir, node, 1, nil, func(cfg *devcluster.Config) {
		cfg.KubeletDropIns = testDropIns
		cfg.NoKubeletStartLimit = true
		cfg.HealthTimeout = devclustertest.HealthTimeout
	})
	if err != nil {
		t.Fatalf("start the kubeadm-style node's cluster: %v", err)
	}
	// Stopped by the last subtest; here only if it never got that far.
	t.Cleanup(func() {
		if _, err := os.Stat(filepath.Join(dir, "state.json")); err == nil {
			if err := c.Stop(context.Background()); err != nil {
				t.Errorf("stop the kubeadm-style node's cluster: %v", err)
			}
		}
	})

	shared := cluster
	cluster = c // the helpers (createConfigMap, waitNodeStatus, configz …) talk to the package's cluster
	t.Run("ConfigDirDropIns", func(t *testing.T) { configDirDropIns(ctx, t, c, node) })
	t.Run("BurstWithoutAStartLimit", func(t *testing.T) {
		times := burst(t, node)
		t.Logf("restarts without a start limit: %v", times)
	})
	cluster = shared
	t.Run("StopLeavesNothingBehind", func(t *testing.T) { stopLeavesNothingBehind(ctx, t, dir, c, node) })
}
