// SPDX-License-Identifier: Apache-2.0

//go:build integration

package installed

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dkc-dev/dkc/api/v1alpha1"
)

// TestPoolWaitsForItsMaintenanceWindow: a pool applied with a window that opens a minute or two later, in a
// time zone other than UTC (dkc-server's image carries the time zone database), assigns no node before the
// window opens — its status and `kubectl dkc rollout status` say when it does — and then rolls out to
// every node.
func TestPoolWaitsForItsMaintenanceWindow(t *testing.T) {
	resetAfter(t)
	const pool = "installed-window"
	deletePoolAtEnd(t, pool)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	createConfig(t, pool, "node-1", 46)

	// Kolkata is UTC+05:30: a start read as UTC, or a day taken from UTC's calendar, would be off by hours.
	loc, err := time.LoadLocation("Asia/Kolkata")
	if err != nil {
		t.Fatal(err)
	}
	since := time.Now()
	opens := since.Truncate(time.Minute).Add(2 * time.Minute)
	local := opens.In(loc)
	applyPool(t, pool, fmt.Sprintf(`  maintenanceWindows:
  - days: [%s]
    start: "%s"
    duration: 30m
    timeZone: Asia/Kolkata
`, local.Weekday().String()[:3], local.Format("15:04")))
	t.Logf("pool applied at %s, its window opens at %s (%s in Asia/Kolkata)",
		since.UTC().Format(time.RFC3339), opens.UTC().Format(time.RFC3339), local.Format("Mon 15:04"))

	// Before the window: the controller says when it opens, and assigns nothing. Every look until then is
	// also a look at the nodes: neither may carry the pool's assignment.
	sawWaiting := false
	for time.Now().Before(opens.Add(-3 * time.Second)) {
		p := getPool(t, pool)
		if c := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionUpdating); c != nil &&
			c.Reason == v1alpha1.ReasonWaitingForMaintenanceWindow {
			w := p.Status.MaintenanceWindow
			if w == nil || w.Open || w.NextOpenTime == nil || !w.NextOpenTime.Equal(&metav1.Time{Time: opens}) {
				t.Fatalf("status.maintenanceWindow %+v, want closed until %s", w, opens.UTC())
			}
			if !sawWaiting {
				t.Logf("waiting: %s", c.Message)
				out, err := kubectlDKC(ctx, "rollout", "status", pool, "--wait=false")
				want := "nothing new is assigned until the next opens at " + opens.UTC().Format(time.RFC3339)
				if err != nil || !strings.Contains(out, want) {
					t.Errorf("kubectl dkc rollout status before the window: %v, want %q\n%s", err, want, out)
				}
			}
			sawWaiting = true
		}
		if n := p.Status.Nodes.InProgress + p.Status.Nodes.Updated; n != 0 {
			t.Fatalf("%d nodes assigned before the window opens at %s: %+v", n, opens.UTC(), p.Status)
		}
		for _, n := range nodes {
			node, err := admin(t).CoreV1().Nodes().Get(ctx, n, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if a, ok := node.Annotations[v1alpha1.AnnotationAssignment]; ok {
				t.Fatalf("%s assigned at %s, before the window opens at %s: %s", n, time.Now().UTC(), opens.UTC(), a)
			}
		}
		time.Sleep(time.Second) // paces the look: nothing is awaited here, an assignment is watched for
	}
	if !sawWaiting {
		t.Fatalf("the pool never said it waits for its window: %+v", getPool(t, pool).Status)
	}

	// Once it opens: every node, one at a time.
	out, err := kubectlDKC(ctx, "rollout", "status", pool, "--timeout", "6m")
	if err != nil || !strings.Contains(out, "rollout complete: 2 nodes run revision") {
		t.Fatalf("kubectl dkc rollout status once the window opened: %v\n%s", err, out)
	}
	for _, n := range nodes {
		a := assignmentOn(t, n)
		if a.Time.Before(&metav1.Time{Time: opens}) {
			t.Errorf("%s assigned at %s, before the window opened at %s", n, a.Time.UTC(), opens.UTC())
		}
		for _, s := range startsSince(t, n, since) {
			if s.Before(opens) {
				t.Errorf("%s: kubelet started at %s, before the window opened at %s", n, s.UTC(), opens.UTC())
			}
		}
		if got := configzQPS(t, n); got != 46 {
			t.Errorf("%s: configz eventRecordQPS %v, want 46", n, got)
		}
	}
	oneAtATime(t, since)
	p := getPool(t, pool)
	if w := p.Status.MaintenanceWindow; w == nil || !w.Open || w.CloseTime == nil ||
		!w.CloseTime.Equal(&metav1.Time{Time: opens.Add(30 * time.Minute)}) {
		t.Errorf("status.maintenanceWindow %+v, want open until %s", w, opens.Add(30*time.Minute).UTC())
	}
}
