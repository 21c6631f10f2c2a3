//go:build integration

package installed

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

var diagnosed sync.Once

// diagnoseOnFailure logs, when t has failed and once per run, what tells why from the test output alone:
// the Nodes, every pod with its readiness and node, kube-system's recent events, the describe output of
// each kube-system pod that is not ready, and the error lines of each node's kubelet and containerd. CI
// keeps only the output; the log files under the cluster's directory leave with its machine, and the first
// failure is the one to explain (the tests after it usually fail because of it). Register it after the
// test's resetAll cleanup, so that it runs first and sees the state the test failed in.
func diagnoseOnFailure(t *testing.T) {
	t.Cleanup(func() {
		if t.Failed() {
			diagnosed.Do(func() { t.Log(diagnosis(t)) })
		}
	})
}

func diagnosis(t *testing.T) string {
	var b strings.Builder
	b.WriteString("diagnosis at the run's first failure\n")
	section := func(title string, args ...string) {
		out, err := kubectl(t, args...)
		fmt.Fprintf(&b, "--- %s\n%s", title, out)
		if err != nil {
			fmt.Fprintf(&b, "(%v)\n", err)
		}
	}
	section("nodes", "get", "nodes", "-o", "wide")
	section("pods", "get", "pods", "-A", "-o", "wide")
	if out, err := kubectl(t, "-n", "kube-system", "get", "events", "--sort-by=.lastTimestamp"); err == nil {
		fmt.Fprintf(&b, "--- kube-system events (last 40)\n%s", lastLines(out, 40))
	}
	pods, err := admin(t).CoreV1().Pods("kube-system").List(ctxFor(t), metav1.ListOptions{})
	if err == nil {
		for _, p := range pods.Items {
			if ready(&p) || p.Status.Phase == corev1.PodSucceeded {
				continue
			}
			if out, err := kubectl(t, "-n", "kube-system", "describe", "pod", p.Name); err == nil {
				fmt.Fprintf(&b, "--- not ready: pod %s on %s (describe, last 30 lines)\n%s", p.Name, p.Spec.NodeName, lastLines(out, 30))
			}
		}
	}
	for _, n := range nodes {
		for _, f := range []struct{ name, marker string }{
			{"kubelet.log", "\nE"}, // klog's error lines start with E
			{"containerd.log", "level=error"},
		} {
			raw, err := os.ReadFile(filepath.Join(cluster.NodeLogDir(n), f.name))
			if err != nil {
				fmt.Fprintf(&b, "--- %s %s: %v\n", n, f.name, err)
				continue
			}
			fmt.Fprintf(&b, "--- %s %s: last 25 error lines\n%s", n, f.name, lastLines(errorLines(raw, f.marker), 25))
		}
	}
	return b.String()
}

func ready(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// errorLines are the lines of raw that contain marker (a leading "\n" in marker anchors it at a line's start).
func errorLines(raw []byte, marker string) string {
	var b strings.Builder
	anchored := strings.HasPrefix(marker, "\n")
	for line := range bytes.Lines(raw) {
		s := string(line)
		if anchored && strings.HasPrefix(s, marker[1:]) || !anchored && strings.Contains(s, marker) {
			b.WriteString(s)
		}
	}
	return b.String()
}

func lastLines(s string, n int) string {
	lines := strings.SplitAfter(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "") + "\n"
}
