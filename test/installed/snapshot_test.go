// SPDX-License-Identifier: Apache-2.0

//go:build integration

package installed

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dkc-dev/dkc/api/v1alpha1"
	"github.com/dkc-dev/dkc/cli/plugin"
	"github.com/dkc-dev/dkc/internal/nodeconfig"
	"github.com/dkc-dev/dkc/internal/poll"
)

// forgedSnapshot is a ConfigMap shaped exactly like pool's snapshot of rev (name, labels, immutable),
// holding data that are not the revision's.
func forgedSnapshot(pool, rev, data string) *corev1.ConfigMap {
	immutable := true
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: v1alpha1.SnapshotName(pool, rev),
			Labels: map[string]string{v1alpha1.LabelPool: pool, v1alpha1.LabelRevision: rev}},
		Immutable: &immutable,
		Data:      map[string]string{"kubelet": data},
	}
}

// TestSnapshotPreCreatedIsRefused: node-1 runs a pool's revision; before the pool's ConfigMap is edited, a
// ConfigMap is created under the name, labels and shape of the snapshot the edit's revision will have, with
// other data. The edit is refused: the pool is ConfigInvalid (SnapshotMismatch) naming the ConfigMap and its
// UID, node-1 is not assigned it and its kubelet does not restart, and the ConfigMap is left as it is.
//
// The pool exists first: a snapshot-shaped ConfigMap of a pool that does not exist is the collector's
// garbage (docs/pools.md, "Revision snapshots"), deleted unless a node uses it.
func TestSnapshotPreCreatedIsRefused(t *testing.T) {
	resetAfter(t)
	const pool = "snapshot-precreated"
	deletePoolAtEnd(t, pool)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cm := createConfig(t, pool, "node-1", 45)
	if out, err := kubectlDKC(ctx, "rollout", pool, "--configmap", "kube-system/"+pool, "-l", "kubernetes.io/hostname=node-1",
		"--timeout", "4m"); err != nil || !strings.Contains(out, "rollout complete") {
		t.Fatalf("rollout on node-1: %v\n%s", err, out)
	}
	good := snapshotCM(t, pool)
	waitRunning(t, "node-1", good, time.Minute)

	next := nodeConfig(t, "node-1", 46)
	rev := v1alpha1.RevisionName("kube-system", "kubelet", map[string]string{"kubelet": next})
	forged, err := admin(t).CoreV1().ConfigMaps("kube-system").Create(ctx, forgedSnapshot(pool, rev, nodeConfig(t, "node-1", 47)), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = admin(t).CoreV1().ConfigMaps("kube-system").Delete(context.Background(), forged.Name, metav1.DeleteOptions{})
	})
	since := time.Now()
	editConfig(t, cm, next)
	out, err := kubectlDKC(ctx, "rollout", pool, "--configmap", "kube-system/"+pool, "-l", "kubernetes.io/hostname=node-1", "--timeout", "2m")
	var stopped *plugin.ErrRolloutStopped
	if !errors.As(err, &stopped) || stopped.Reason != v1alpha1.ReasonSnapshotMismatch {
		t.Fatalf("rollout over a pre-created snapshot: %v, want ConfigInvalid %s\n%s", err, v1alpha1.ReasonSnapshotMismatch, out)
	}
	for _, want := range []string{"kube-system/" + forged.Name, string(forged.UID), "not created by pool " + pool} {
		if !strings.Contains(stopped.Message, want) {
			t.Errorf("ConfigInvalid %q does not say %q", stopped.Message, want)
		}
	}
	t.Logf("refused: %s", stopped.Message)
	if s := startsSince(t, "node-1", since); len(s) != 0 {
		t.Errorf("node-1: kubelet started %v for a pre-created snapshot", s)
	}
	if v := view(t, "node-1"); srcName(v.status.Assigned) != name(good) || srcName(v.status.Active) != name(good) {
		t.Errorf("node-1: %s; want it on %s still", v, name(good))
	}
	if got, err := admin(t).CoreV1().ConfigMaps("kube-system").Get(ctx, forged.Name, metav1.GetOptions{}); err != nil || got.UID != forged.UID {
		t.Errorf("the pre-created ConfigMap was replaced or deleted (%v): only the operator decides", err)
	}
}

// TestSnapshotRecreatedIsNotServed: node-2 runs a pool's revision; a cluster-admin deletes the snapshot and
// creates it again under the same name and labels with other data. dkc-server does not send it: node-2's
// status shows the snapshot mismatch, its kubelet does not restart and its configz is unchanged; the pool
// is ConfigInvalid (SnapshotMismatch).
func TestSnapshotRecreatedIsNotServed(t *testing.T) {
	recreatedSnapshot(t, "snapshot-recreated", false)
}

// TestSnapshotRecreatedWithItsDataIsNotServed: the same with the snapshot's own data, so that its data
// still hash to its revision: only the UID the pool recorded tells it from the pool's own.
func TestSnapshotRecreatedWithItsDataIsNotServed(t *testing.T) {
	recreatedSnapshot(t, "snapshot-recreated-same", true)
}

// recreatedSnapshot is TestSnapshotRecreatedIsNotServed on pool, the snapshot re-created with its own data
// if sameData, else with other data.
func recreatedSnapshot(t *testing.T, pool string, sameData bool) {
	resetAfter(t)
	deletePoolAtEnd(t, pool)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	createConfig(t, pool, "node-2", 47)
	if out, err := kubectlDKC(ctx, "rollout", pool, "--configmap", "kube-system/"+pool, "-l", "kubernetes.io/hostname=node-2",
		"--timeout", "4m"); err != nil || !strings.Contains(out, "rollout complete") {
		t.Fatalf("rollout on node-2: %v\n%s", err, out)
	}
	good := snapshotCM(t, pool)
	waitRunning(t, "node-2", good, time.Minute)
	rev := good.Labels[v1alpha1.LabelRevision]

	// Replaced while dkc-server is down: running, the pool's controller creates its own snapshot again the
	// moment it sees the deletion, and wins the race to the name.
	since := time.Now()
	scaleServer(t, 0)
	if err := admin(t).CoreV1().ConfigMaps("kube-system").Delete(ctx, good.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	data := nodeConfig(t, "node-2", 48)
	if sameData {
		data = good.Data["kubelet"]
	}
	forged, err := admin(t).CoreV1().ConfigMaps("kube-system").Create(ctx, forgedSnapshot(pool, rev, data), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create the forged snapshot: %v", err)
	}
	t.Logf("replaced %s (UID %s) with UID %s", good.Name, good.UID, forged.UID)
	scaleServer(t, 2)

	poll.ForNil(t, time.Minute, 300*time.Millisecond, fmt.Sprintf("node-2 to have the error %q", nodeconfig.SnapshotMismatchError), func() error {
		v := view(t, "node-2")
		if v.status.Error == string(nodeconfig.SnapshotMismatchError) && v.configOK != nil && v.configOK.Status == corev1.ConditionFalse {
			t.Logf("node-2: %s", v)
			return nil
		}
		return errors.New(v.String())
	})
	// The pool refuses it too.
	poll.ForNil(t, time.Minute, 300*time.Millisecond, "the pool to be ConfigInvalid "+v1alpha1.ReasonSnapshotMismatch, func() error {
		p := getPool(t, pool)
		c := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionConfigInvalid)
		if c != nil && c.Status == metav1.ConditionTrue && c.Reason == v1alpha1.ReasonSnapshotMismatch {
			if !strings.Contains(c.Message, "kube-system/"+forged.Name+" (UID "+string(forged.UID)+")") || !strings.Contains(c.Message, "the pool records UID ") {
				t.Errorf("ConfigInvalid %q: want the forged ConfigMap, its UID %s and the UID recorded", c.Message, forged.UID)
			}
			return nil
		}
		return fmt.Errorf("conditions %+v", p.Status.Conditions)
	})
	// Had the node been sent the forged data, its kubelet would have restarted by now (it restarts within
	// seconds of an assignment); give it a few more.
	time.Sleep(5 * time.Second) // proves a negative: no kubelet start meanwhile
	if s := startsSince(t, "node-2", since); len(s) != 0 {
		t.Errorf("node-2: kubelet started %v after its snapshot was replaced", s)
	}
	if got := configzQPS(t, "node-2"); got != 47 {
		t.Errorf("node-2: configz eventRecordQPS %v, want 47 (the snapshot it ran)", got)
	}
}

// scaleServer scales deployment/dkc-server to replicas and waits: for 0, until no pod of it is left; else
// until both replicas are ready (waitServerSettled). Scaled to 0, it is scaled back to 2 when t ends.
func scaleServer(t *testing.T, replicas int) {
	t.Helper()
	if out, err := kubectl(t, "-n", "kube-system", "scale", "deployment/dkc-server", fmt.Sprintf("--replicas=%d", replicas)); err != nil {
		t.Fatalf("scale dkc-server to %d: %v\n%s", replicas, err, out)
	}
	if replicas > 0 {
		waitServerSettled(t)
		return
	}
	t.Cleanup(func() {
		if out, err := runKubectl(context.Background(), "-n", "kube-system", "scale", "deployment/dkc-server", "--replicas=2"); err != nil {
			t.Errorf("scale dkc-server back to 2: %v\n%s", err, out)
		}
		waitServerSettled(t)
	})
	poll.ForNil(t, 2*time.Minute, 500*time.Millisecond, "dkc-server scaled to 0 to have no pod left", func() error {
		if n := len(serverPods(t)); n > 0 {
			return fmt.Errorf("%d pods left", n)
		}
		return nil
	})
}
