// SPDX-License-Identifier: Apache-2.0

//go:build integration

package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/dkc-dev/dkc/internal/poll"
)

// TestSyncErrorClearedWhileTheServiceWasAwayClears: the real node is pointed at a ConfigMap that does not
// exist (a sync error on its status), then, while dkc-server is down, reset to its local config (removing
// the source needs no webhook). The sidecar resumes its stream with the same (local) assignment; the
// error it holds must clear, on the node and on the Node, without a kubelet restart.
func TestSyncErrorClearedWhileTheServiceWasAwayClears(t *testing.T) {
	client := adminClient(t)
	resetRealNode(t)
	serverDown := false
	t.Cleanup(func() {
		if serverDown {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := cluster.Restart(ctx, "dkc-server"); err != nil {
				t.Errorf("restart dkc-server: %v", err)
			}
		}
		resetRealNode(t)
	})
	pid := kubeletPID(t)

	setSource(t, client, realNode, cmSource("resume-never-created"))
	const download = "failed to sync: failed to download config"
	waitNodeStatus(t, realNode, "local", "local", "*", download, time.Minute)

	if err := cluster.StopProcess("dkc-server"); err != nil {
		t.Fatal(err)
	}
	serverDown = true
	setSource(t, client, realNode, "")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := cluster.Restart(ctx, "dkc-server"); err != nil {
		t.Fatal(err)
	}
	serverDown = false

	waitNodeStatus(t, realNode, "local", "local", "*", "", time.Minute)
	poll.ForNil(t, 30*time.Second, 300*time.Millisecond, "ConfigOK True once the error cleared", func() error {
		if c := configOK(t, realNode); c.Status != corev1.ConditionTrue {
			return fmt.Errorf("ConfigOK %s (%s: %s)", c.Status, c.Reason, c.Message)
		}
		return nil
	})
	if c := configOK(t, realNode); strings.Contains(c.Message, "failed to sync") {
		t.Errorf("ConfigOK message still names the sync error: %q", c.Message)
	}
	if got := kubeletPID(t); got != pid {
		t.Errorf("kubelet restarted (pid %d → %d): clearing a sync error needs no restart", pid, got)
	}
}
