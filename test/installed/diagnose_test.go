// SPDX-License-Identifier: Apache-2.0

//go:build integration

package installed

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dkc-dev/dkc/test/devcluster/devclustertest"
)

var diagnosed sync.Once

// resetAfter resets every node to its local config when t ends, with a diagnosis on failure both before
// the reset (the state the test failed in, after the test's own later cleanups) and after it (a reset that
// failed); the diagnosis is made once per run.
func resetAfter(t *testing.T) {
	diagnoseOnFailure(t)
	t.Cleanup(func() { resetAll(t) })
	diagnoseOnFailure(t)
}

// diagnoseOnFailure logs, when t has failed and no test of this run was diagnosed yet, what tells why from
// the test output alone: the Nodes, every pod with its node, kube-system's events, the describe output of
// each kube-system pod that is not ready, and the error lines of each node's kubelet and containerd. CI
// keeps only the output (the files under the cluster's directory leave with its machine), and the first
// failure is the one to explain: the tests after it usually fail because of it. Each section is logged as
// soon as it is read, and the whole takes at most a minute, so a hung apiserver cannot cost the run's
// timeout.
func diagnoseOnFailure(t *testing.T) {
	t.Cleanup(func() {
		if t.Failed() {
			diagnosed.Do(func() { diagnose(t) })
		}
	})
}

func diagnose(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	t.Log(devclustertest.DiagnosisMarker)
	section := func(title string, lines int, args ...string) {
		out, err := runKubectl(ctx, append([]string{"--request-timeout=15s"}, args...)...)
		if err != nil {
			out += fmt.Sprintf("(%v)\n", err)
		}
		t.Logf("--- %s\n%s", title, lastLines(out, lines))
	}
	section("nodes", 20, "get", "nodes", "-o", "wide")
	section("pods", 60, "get", "pods", "-A", "-o", "wide")
	section("kube-system events (last 40)", 40, "-n", "kube-system", "events")
	if client, err := cluster.Client(); err != nil {
		t.Logf("--- not-ready pods: no client: %v", err)
	} else if pods, err := client.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{}); err != nil {
		t.Logf("--- not-ready pods: list kube-system pods: %v", err)
	} else {
		for _, p := range pods.Items {
			if !ready(&p) && p.Status.Phase != corev1.PodSucceeded {
				section(fmt.Sprintf("not ready: pod %s on %s (describe, last 30 lines)", p.Name, p.Spec.NodeName), 30,
					"-n", "kube-system", "describe", "pod", p.Name)
			}
		}
	}
	for _, n := range nodes {
		for _, f := range []struct {
			name    string
			isError func(string) bool
		}{
			{"kubelet.log", klogError.MatchString},
			{"containerd.log", func(l string) bool { return strings.Contains(l, "level=error") }},
		} {
			raw, err := os.ReadFile(filepath.Join(cluster.NodeLogDir(n), f.name))
			if err != nil {
				t.Logf("--- %s %s: %v", n, f.name, err)
				continue
			}
			t.Logf("--- %s %s: last 25 error lines\n%s", n, f.name, lastLines(matchingLines(string(raw), f.isError), 25))
		}
	}
}

// klogError matches a klog error line's header (E, month and day, then a space).
var klogError = regexp.MustCompile(`^E\d{4} `)

// maxLine bounds each line the diagnosis logs: a kubelet error can carry a whole object.
const maxLine = 500

// matchingLines are the lines of s that keep says to keep, each cut at maxLine bytes.
func matchingLines(s string, keep func(string) bool) string {
	var b strings.Builder
	for line := range strings.Lines(s) {
		if !keep(line) {
			continue
		}
		if len(line) > maxLine {
			line = line[:maxLine] + "…\n"
		}
		b.WriteString(line)
	}
	return b.String()
}

// lastLines is the last n lines of s, "(none)" if it has none.
func lastLines(s string, n int) string {
	s = strings.TrimRight(s, "\n")
	if s == "" {
		return "(none)\n"
	}
	lines := strings.SplitAfter(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "") + "\n"
}

func ready(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
