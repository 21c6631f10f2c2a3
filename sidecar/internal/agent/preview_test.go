// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	statsapi "k8s.io/kubelet/pkg/apis/stats/v1alpha1"

	"github.com/dkc-dev/dkc/internal/nodeconfig"
	"github.com/dkc-dev/dkc/internal/poll"
	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
	"github.com/dkc-dev/dkc/sidecar/internal/probe"
)

// previewOf is pool's request, at at, to preview the revision whose snapshot is a.
func previewOf(pool string, at time.Time, a *dkcv1.Assignment) *dkcv1.Preview {
	return &dkcv1.Preview{Pool: pool, Revision: a.GetContentHash(), RequestTime: timestamppb.New(at), Assignment: a}
}

// preview hands the agent an update whose only news is p (nil: no preview stands) and returns its answer.
func (n *node) preview(p *dkcv1.Preview) *dkcv1.PreviewResult {
	n.t.Helper()
	defer n.drive()()
	n.agent.Apply(context.Background(), Desired{Preview: p})
	return n.agent.Preview()
}

// lastReport is the last report made.
func (r *recordingReporter) lastReport() reported {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.reports) == 0 {
		return reported{}
	}
	return r.reports[len(r.reports)-1]
}

// runningPods are count BestEffort pods web/p0, web/p1, ..., oldest first.
func runningPods(count int) []corev1.Pod {
	var pods []corev1.Pod
	for i := range count {
		pods = append(pods, corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "web", Name: fmt.Sprintf("p%d", i),
			UID: types.UID(fmt.Sprintf("p%d", i)), CreationTimestamp: metav1.Unix(int64(1000+i), 0)},
			Spec:   corev1.PodSpec{Containers: []corev1.Container{{Name: "app"}}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, QOSClass: corev1.PodQOSBestEffort}})
	}
	return pods
}

var nodeCapacity = map[string]string{"pods": "110", "cpu": "4", "memory": "8Gi"}

// TestPreviewVerdicts: a node running its local config (cpuManagerPolicy none, its cpu_manager_state
// written under it) answers a pool's preview of a revision as the revision's restart would find it, and
// touches nothing: no kubelet stop or restart, the env file, assigned, active and last-known-good as they
// were. Each report made while the preview stands carries the answer.
func TestPreviewVerdicts(t *testing.T) {
	tests := []struct {
		name    string
		config  string
		setup   func(n *node)
		payload func(a *dkcv1.Assignment) // tampers with the snapshot sent
		verdict string
		want    []string // in the message
	}{
		{name: "a harmless change", config: cfgHeader + "eventRecordQPS: 7\n", verdict: nodeconfig.PreviewNoPodsAffected,
			want: []string{"changes neither the node's allocatable, nor its eviction thresholds, nor its resource managers' state"}},
		{name: "cpuManagerPolicy none to static", config: static, verdict: nodeconfig.PreviewDrainRequired,
			want: []string{"cpu_manager_state (cpuManagerPolicy: none → static)", cpuState, "configmap kube-system/c"}},
		{name: "cpuManagerPolicy none to static where this restart mode cannot reset", config: static,
			setup:   func(n *node) { n.agent.svc = plainService{n.kubelet} },
			verdict: nodeconfig.PreviewConfigRefused, want: []string{"cpu_manager_state", "cannot stop the kubelet"}},
		{name: "maxPods below the pods running", config: cfgHeader + "maxPods: 2\n",
			setup: func(n *node) {
				n.agent.setCapacity(nodeCapacity)
				n.kubelet.summary, n.kubelet.pods = &statsapi.Summary{}, runningPods(3)
			},
			verdict: nodeconfig.PreviewPodsAffected,
			want:    []string{"would stop 1 of them", "web/p2: pod 3 of 2 allowed (OutOfpods)"}},
		{name: "an eviction threshold above the memory available", config: cfgHeader + "evictionHard:\n  memory.available: 2Gi\n",
			setup: func(n *node) {
				n.agent.setCapacity(nodeCapacity)
				n.kubelet.summary, n.kubelet.pods = hungryNode()
			},
			verdict: nodeconfig.PreviewPodsAffected,
			want:    []string{"node-1: memory.available 1Gi is below the new hard eviction threshold 2Gi", "web/hungry"}},
		{name: "an eviction threshold below the memory available", config: cfgHeader + "evictionHard:\n  memory.available: 512Mi\n",
			setup: func(n *node) {
				n.agent.setCapacity(nodeCapacity)
				n.kubelet.summary, n.kubelet.pods = hungryNode()
			},
			verdict: nodeconfig.PreviewNoPodsAffected, want: []string{"would admit every running pod again and evict none"}},
		{name: "a config the kubelet refuses", config: cfgHeader + "eventRecordQPS: -1\n",
			verdict: nodeconfig.PreviewConfigRefused, want: []string{"eventRecordQPS"}},
		{name: "a config that does not load", config: "{{{ not yaml", verdict: nodeconfig.PreviewConfigRefused},
		{name: "a payload whose content hash does not match", config: cfgHeader + "eventRecordQPS: 7\n",
			payload: func(a *dkcv1.Assignment) { a.Files["kubelet"] = cfgHeader + "eventRecordQPS: 8\n" },
			verdict: nodeconfig.PreviewConfigRefused, want: []string{"content hash"}},
		{name: "/configz unreadable", config: cfgHeader + "eventRecordQPS: 7\n",
			setup:   func(n *node) { n.kubelet.configzErr = probe.ErrRefused },
			verdict: nodeconfig.PreviewNotPredicted, want: []string{"the config the kubelet runs is unknown (its /configz)"}},
		{name: "allocatable changes and no node capacity was sent", config: cfgHeader + "maxPods: 2\n",
			setup:   func(n *node) { n.kubelet.summary, n.kubelet.pods = &statsapi.Summary{}, runningPods(3) },
			verdict: nodeconfig.PreviewNotPredicted, want: []string{"the service sent no node capacity"}},
		{name: "thresholds change and the kubelet's stats are unreadable", config: cfgHeader + "evictionHard:\n  memory.available: 2Gi\n",
			setup:   func(n *node) { n.agent.setCapacity(nodeCapacity) },
			verdict: nodeconfig.PreviewNotPredicted, want: []string{"read the kubelet's stats summary", "read the kubelet's pods"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := newNode(t)
			n.kubelet.cpuState = "none"
			n.agent.cfg.NodeName = "node-1"
			if tt.setup != nil {
				tt.setup(n)
			}
			a := assignment("pv", "1", tt.config)
			if tt.payload != nil {
				tt.payload(a)
			}
			at := n.clock.Now()
			got := n.preview(previewOf("pool-a", at, a))
			t.Logf("%s: %s", got.GetVerdict(), got.GetMessage())
			if got.GetVerdict() != tt.verdict {
				t.Errorf("verdict %s (%s), want %s", got.GetVerdict(), got.GetMessage(), tt.verdict)
			}
			for _, w := range tt.want {
				if !strings.Contains(got.GetMessage(), w) {
					t.Errorf("message %q does not say %q", got.GetMessage(), w)
				}
			}
			if got.GetPool() != "pool-a" || got.GetRevision() != a.GetContentHash() || !got.GetRequestTime().AsTime().Equal(at) {
				t.Errorf("answer names pool %q revision %q requestTime %v, not the preview's", got.GetPool(), got.GetRevision(),
					got.GetRequestTime().AsTime())
			}
			if r := n.reporter.lastReport(); !proto.Equal(r.preview, got) {
				t.Errorf("last report carries preview %v, want %v", r.preview, got)
			}
			// Nothing was touched: no stop, removal or restart, and the node's config is what it was.
			n.expect("local", "local", "local", "", 0)
			n.checkCalls()
			if f, _ := n.kubelet.env.Get(); f != n.local {
				t.Errorf("env file names %s, want the local config", f)
			}
			if n.agent.phase != PhaseLocal {
				t.Errorf("phase %s, want %s", n.agent.phase, PhaseLocal)
			}
		})
	}
}

// TestPreviewLeavesTheAssignmentAlone: a preview on a node running an assigned config in its trial neither
// restarts the kubelet nor changes assigned, active, last-known-good, the trial or the env file; the
// checkpoint it wrote survives garbage collection while the preview stands, and goes with it — unless the
// node's config is that checkpoint.
func TestPreviewLeavesTheAssignmentAlone(t *testing.T) {
	n := newNode(t)
	n.kubelet.cpuState = "none"
	n.agent.cfg.KeepCheckpoints = 0 // no unreferenced checkpoint is kept: only the preview's reference keeps it
	n.apply(assignment("u", "1", cfgHeader+"eventRecordQPS: 7\n"), "")
	n.expect("1", "1", "local", "", 1)
	trial := n.agent.state.s.TrialSource

	pv := assignment("pv", "1", static)
	p := previewOf("pool-a", n.clock.Now(), pv)
	if got := n.preview(p); got.GetVerdict() != nodeconfig.PreviewDrainRequired {
		t.Fatalf("verdict %s (%s), want %s", got.GetVerdict(), got.GetMessage(), nodeconfig.PreviewDrainRequired)
	}
	n.expect("1", "1", "local", "", 1)
	n.checkCalls("restart 1")
	if f, _ := n.kubelet.env.Get(); f != filepath.Join(n.dir, "checkpoints/u/1/kubelet") {
		t.Errorf("env file names %s, want config 1's", f)
	}
	if n.agent.phase != PhaseTrial || !sameSrc(n.agent.state.s.TrialSource, trial) {
		t.Errorf("phase %s, trial of %v; want %s, the trial of config 1", n.agent.phase, n.agent.state.s.TrialSource, PhaseTrial)
	}
	previewDir := filepath.Join(n.dir, "checkpoints/pv/1")
	exists := func(dir string) bool { _, err := os.Stat(dir); return err == nil }
	if !exists(previewDir) {
		t.Fatal("the preview's checkpoint was not written")
	}

	// Another assignment, the preview still standing (every update says so), runs healthy: garbage
	// collection removes config 1's checkpoint, not the preview's.
	func() {
		defer n.drive()()
		n.agent.Apply(context.Background(), Desired{Assignment: assignment("u", "2", cfgHeader+"eventRecordQPS: 8\n"),
			Preview: p})
	}()
	n.expect("2", "2", "local", "", 2)
	if exists(filepath.Join(n.dir, "checkpoints/u/1")) || !exists(previewDir) {
		t.Errorf("after garbage collection: config 1's checkpoint there %v (want false), the preview's %v (want true)",
			exists(filepath.Join(n.dir, "checkpoints/u/1")), exists(previewDir))
	}
	if r := n.reporter.lastReport(); r.preview.GetRevision() != pv.GetContentHash() {
		t.Errorf("a report while the preview stands carries %v", r.preview)
	}

	// Withdrawn: its checkpoint goes, and the reports carry no answer.
	if got := n.preview(nil); got != nil {
		t.Errorf("answer %v after the preview was withdrawn", got)
	}
	if exists(previewDir) || exists(filepath.Join(n.dir, "checkpoints/pv")) {
		t.Error("the checkpoint of the withdrawn preview is still there")
	}
	if r := n.reporter.lastReport(); r.preview != nil {
		t.Errorf("a report after the withdrawal carries %v", r.preview)
	}

	// A preview of the config the node runs: its checkpoint stays when the preview goes.
	if got := n.preview(previewOf("pool-a", n.clock.Now(), assignment("u", "2", cfgHeader+"eventRecordQPS: 8\n"))); got.GetVerdict() != nodeconfig.PreviewNoPodsAffected {
		t.Errorf("preview of the running config: %s (%s)", got.GetVerdict(), got.GetMessage())
	}
	n.preview(nil)
	if !exists(filepath.Join(n.dir, "checkpoints/u/2")) {
		t.Error("the assigned config's checkpoint went with a preview of it")
	}
	n.expect("2", "2", "local", "", 2)

	// The pool assigns the node the revision it previewed, the preview withdrawn with the same update: the
	// checkpoint is the assignment's now.
	next := assignment("pv", "2", cfgHeader+"eventRecordQPS: 9\n")
	n.preview(previewOf("pool-a", n.clock.Now(), next))
	n.apply(next, "")
	n.expect("2", "2", "local", "", 3)
	if !exists(filepath.Join(n.dir, "checkpoints/pv/2")) {
		t.Error("the checkpoint of the previewed revision went when the node was assigned it")
	}
}

func sameSrc(a, b *corev1.NodeConfigSource) bool { return nodeconfig.SameSource(a, b) }

// TestPreviewThroughTheStream: through Run, the answer to the preview that stands rides on every report; a
// preview sent again as on a new stream is not a new request, a new request time gets a new answer at once,
// a change of the node's usage gets one within a minute, and an update without a preview drops it from
// the reports.
func TestPreviewThroughTheStream(t *testing.T) {
	n := newNode(t)
	n.agent.cfg.NodeName = "node-1"
	n.agent.setCapacity(nodeCapacity)
	// 3Gi available: a 2Gi hard eviction threshold evicts nothing, until usage grows.
	n.kubelet.summary, n.kubelet.pods = hungryNode()
	avail := uint64(3 << 30)
	n.kubelet.summary.Node.Memory.AvailableBytes = &avail
	updates := make(chan *dkcv1.WatchConfigResponse)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = n.agent.Run(ctx, updates); close(done) }()
	defer func() { cancel(); <-done }()
	// waitFor steps the clock a tick at a time until a report since the i-th matches; it returns the index
	// after it.
	waitFor := func(i int, what string, match func(reported) bool) int {
		t.Helper()
		next := 0
		poll.SteppingNil(t, "a report "+what, n.clock, time.Second, func() error {
			for j, r := range n.reporter.reportsSince(i) {
				if match(r) {
					next = i + j + 1
					return nil
				}
			}
			return fmt.Errorf("reports since #%d: %v", i, n.reporter.reportsSince(i))
		})
		return next
	}
	answers := func(at time.Time, verdict string) func(reported) bool {
		return func(r reported) bool {
			return r.preview.GetRequestTime().AsTime().Equal(at) && r.preview.GetVerdict() == verdict
		}
	}
	a := assignment("pv", "1", cfgHeader+"evictionHard:\n  memory.available: 2Gi\n")
	t1 := n.clock.Now()
	seen := len(n.reporter.reportsSince(0))
	updates <- &dkcv1.WatchConfigResponse{Preview: previewOf("pool-a", t1, a)}
	seen = waitFor(seen, "answering the preview", answers(t1, nodeconfig.PreviewNoPodsAffected))

	// Another update, the preview sent again with it (a new stream): the report carries the same answer.
	updates <- &dkcv1.WatchConfigResponse{SyncError: "failed to sync: e", Preview: previewOf("pool-a", t1, a)}
	seen = waitFor(seen, "of the sync error", func(r reported) bool { return r.status.GetError() == "failed to sync: e" })
	if r := n.reporter.lastReport(); r.preview.GetVerdict() != nodeconfig.PreviewNoPodsAffected ||
		!r.preview.GetRequestTime().AsTime().Equal(t1) {
		t.Errorf("the report of the sync error carries preview %v", r.preview)
	}

	// The pool asks again: a new answer, about the new request.
	t2 := t1.Add(time.Second)
	updates <- &dkcv1.WatchConfigResponse{Preview: previewOf("pool-a", t2, a)}
	seen = waitFor(seen, "answering the new request", answers(t2, nodeconfig.PreviewNoPodsAffected))

	// The node's memory fills up: within a minute the answer says the threshold would evict.
	n.kubelet.mu.Lock()
	low := uint64(1 << 30)
	n.kubelet.summary.Node.Memory.AvailableBytes = &low
	n.kubelet.mu.Unlock()
	start := n.clock.Now()
	seen = waitFor(seen, "answering again as usage changed", answers(t2, nodeconfig.PreviewPodsAffected))
	// The test steps the clock every millisecond of real time, also while the agent works: a bound looser
	// than the minute, but one no run that waits for the next new request or for ever meets.
	if took := n.clock.Since(start); took > 2*previewInterval {
		t.Errorf("answered after %v of the agent's clock, want about %v", took, previewInterval)
	}

	// No preview stands any more.
	updates <- &dkcv1.WatchConfigResponse{}
	first := len(n.reporter.reportsSince(0))
	waitFor(seen, "without a preview", func(r reported) bool { return r.preview == nil })
	for _, r := range n.reporter.reportsSince(first) {
		if r.preview != nil {
			t.Errorf("a report after the withdrawal carries %v", r.preview)
		}
	}
	n.checkCalls()
}
