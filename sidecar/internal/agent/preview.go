// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"

	"github.com/dkc-dev/dkc/internal/configcheck"
	"github.com/dkc-dev/dkc/internal/disruption"
	"github.com/dkc-dev/dkc/internal/nodeconfig"
	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
	"github.com/dkc-dev/dkc/sidecar/internal/checkpoint"
)

// This file answers a pool's preview of a revision (WatchConfigResponse.preview): what this node's kubelet,
// restarted into the revision, would do — refuse the config, refuse the state its resource managers
// checkpointed, stop running pods, or none of these. It is found as an assignment's restart finds it
// (the payload verified and checkpointed, the config checked with the node's flags and kubelet minor,
// compared with the kubelet's /configz as planReset does, admission and evictions predicted as evict.go
// does), but no node is assigned the revision yet: nothing here touches the kubelet, its env file,
// meta/assigned, meta/last-known-good, the trial or the drain, and the answer is the one for a node that is
// not drained (a pool must learn whether a drain would be needed). The answer rides on every status report
// while the preview stands (ReportStatusRequest.preview) and goes with it.

// previewInterval is how often a standing preview is judged again: the node's pods and usage change, and
// with them whether the revision would stop pods.
const previewInterval = time.Minute

// previewTimeout bounds judging a preview: the check and the kubelet's answers each have their own bounds,
// this one keeps a stuck one from holding the agent's loop (and the next assignment) for long.
const previewTimeout = 30 * time.Second

// maxPreviewMessage bounds a preview answer's message: it becomes a Node condition's message, one per node.
const maxPreviewMessage = 1 << 10

// previewState is the pool preview that stands on the node and the node's answer to it.
type previewState struct {
	// req is the preview that stands; nil: none.
	req *dkcv1.Preview
	// result is the answer to req; nil until judged.
	result *dkcv1.PreviewResult
	// at is when req was last judged (the agent's clock).
	at time.Time
	// due: judge req at the next chance (it is new, or what the kubelet runs changed).
	due bool
	// created is the checkpoint judging req wrote (nil: it was there before): removed once no preview
	// stands for it, unless the node's config has come to reference it meanwhile.
	created *corev1.ConfigMapNodeConfigSource
}

// samePreview says whether a and b are the same request: one pool's request for one revision at one time.
// The service sends a standing preview again on every new stream: that is no new request.
func samePreview(a, b *dkcv1.Preview) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.GetPool() == b.GetPool() && a.GetRevision() == b.GetRevision() &&
		proto.Equal(a.GetRequestTime(), b.GetRequestTime())
}

// previewSource is the checkpoint of the standing preview, which garbage collection keeps; nil: none.
func (a *Agent) previewSource() *corev1.NodeConfigSource {
	if a.preview.req == nil {
		return nil
	}
	return checkpoint.SourceOf(a.preview.req.GetAssignment())
}

// Preview is the node's answer to the pool preview that stands; nil when none stands or it is not judged
// yet.
func (a *Agent) Preview() *dkcv1.PreviewResult { return a.preview.result }

// takePreview takes the preview an update says stands (nil: none). A new request replaces the answer to
// the last one (which no longer stands) and is judged at the next chance. It returns the checkpoint written
// for the preview that went, for the caller to drop once the update's assignment is written (the pool may
// have assigned the node that very revision); nil: none to drop.
func (a *Agent) takePreview(p *dkcv1.Preview) (drop *corev1.ConfigMapNodeConfigSource) {
	if samePreview(a.preview.req, p) {
		return nil
	}
	old := a.preview
	a.preview = previewState{req: p, due: p != nil}
	if old.created != nil {
		if src := a.previewSource(); src != nil && src.ConfigMap != nil &&
			nodeconfig.SameSource(src, &corev1.NodeConfigSource{ConfigMap: old.created}) {
			a.preview.created = old.created // the same revision asked again: its checkpoint serves it
		} else {
			drop = old.created
		}
	}
	if p == nil {
		a.log.Info("preview withdrawn", zap.String("node", a.cfg.NodeName), zap.String("pool", old.req.GetPool()),
			zap.String("revision", old.req.GetRevision()))
	}
	return drop
}

// dropPreviewCheckpoint removes the checkpoint a preview wrote, unless the node's config references it
// now: assigned, last-known-good, active, or an assignment waiting to be written.
func (a *Agent) dropPreviewCheckpoint(cm *corev1.ConfigMapNodeConfigSource) {
	if cm == nil {
		return
	}
	src := &corev1.NodeConfigSource{ConfigMap: cm}
	assigned, err := a.store.Assigned()
	if err != nil {
		return // what is assigned is unknown: the garbage collection of a later round decides
	}
	lkg, err := a.store.LastKnownGood()
	if err != nil {
		return
	}
	for _, ref := range []*corev1.NodeConfigSource{assigned, lkg, a.active, checkpoint.SourceOf(a.unsynced)} {
		if nodeconfig.SameSource(ref, src) {
			return
		}
	}
	if err := a.store.Remove(cm); err != nil {
		a.log.Warn("cannot remove the checkpoint of a preview that no longer stands; garbage collection removes it "+
			"later", append(sourceFields(src), zap.String("node", a.cfg.NodeName), zap.Error(err))...)
		return
	}
	a.log.Info("removed the checkpoint of a preview that no longer stands", sourceFields(src)...)
}

// previewDue says whether a standing preview is to be judged now: it is new, what the kubelet runs
// changed, or previewInterval has passed.
func (a *Agent) previewDue() bool {
	return a.preview.req != nil && (a.preview.due || a.clock.Since(a.preview.at) >= previewInterval)
}

// answerPreview judges the standing preview and, when the answer changed, logs it and reports it.
func (a *Agent) answerPreview(ctx context.Context) {
	p := a.preview.req
	jctx, cancel := context.WithTimeout(ctx, previewTimeout)
	verdict, message := a.judgePreview(jctx, p)
	cancel()
	if ctx.Err() != nil {
		return // stopping: what the judgement failed on says nothing about the revision
	}
	a.preview.at, a.preview.due = a.clock.Now(), false
	res := &dkcv1.PreviewResult{Pool: p.GetPool(), Revision: p.GetRevision(), RequestTime: p.GetRequestTime(),
		Verdict: verdict, Message: truncateMessage(message)}
	if proto.Equal(res, a.preview.result) {
		return
	}
	a.preview.result = res
	a.log.Info("preview answered", zap.String("node", a.cfg.NodeName), zap.String("pool", p.GetPool()),
		zap.String("revision", p.GetRevision()), zap.Time("requestTime", p.GetRequestTime().AsTime()),
		zap.String("verdict", verdict), zap.String("message", message))
	a.report()
}

// judgePreview is what the kubelet, restarted into p's revision, would do on this node, as a verdict
// (nodeconfig.Preview*) and its message.
func (a *Agent) judgePreview(ctx context.Context, p *dkcv1.Preview) (verdict, message string) {
	as := p.GetAssignment()
	src := checkpoint.SourceOf(as)
	if src == nil || src.ConfigMap == nil {
		return nodeconfig.PreviewNotPredicted, "the preview carries no ConfigMap's config to judge"
	}
	// Checkpointed as an assignment is (its content hash verified first), so that the kubelet's code
	// checks it as a file, relative paths resolved in the checkpoint — but never made assigned.
	existed, _ := a.store.Exists(src.ConfigMap)
	if err := a.store.Save(as); err != nil {
		if errors.Is(err, checkpoint.ErrRefused) {
			return nodeconfig.PreviewConfigRefused, fmt.Sprintf("the node refuses the payload of %s: %v", describe(src), err)
		}
		return nodeconfig.PreviewNotPredicted, fmt.Sprintf("cannot checkpoint %s to check it: %v", describe(src), err)
	}
	if !existed && a.preview.created == nil {
		a.preview.created = src.ConfigMap
	}
	if a.cfg.KubeletVersionRequired && a.checkVersion() == "" {
		return nodeconfig.PreviewNotPredicted, "the node kubelet's version is not known yet: the config cannot be " +
			"checked with its code"
	}
	flags, err := a.kubeletFlags(ctx)
	if err != nil {
		return nodeconfig.PreviewNotPredicted, "the kubelet's command line is unknown: " + err.Error()
	}
	target, err := a.checkConfig(ctx, src, flags)
	if err != nil {
		switch statusFor(err) {
		case nodeconfig.LoadError, nodeconfig.ValidateError:
			return nodeconfig.PreviewConfigRefused, err.Error()
		default: // the check could not run, or dkc has no code for this kubelet: nothing said of the config
			return nodeconfig.PreviewNotPredicted, "the config could not be checked: " + err.Error()
		}
	}
	// What the kubelet runs, found as run and planReset find it.
	current, err := a.env.Get()
	if current == "" && err == nil {
		current = a.cfg.LocalConfig
	}
	running, listening, err := a.runningFields(ctx, current, target)
	if err != nil {
		return nodeconfig.PreviewNotPredicted, "the config the kubelet runs is unknown (its /configz): " + err.Error()
	}
	if resets := disruption.Resets(running, target.config.Fields); len(resets) > 0 {
		return a.previewResets(target, resets)
	}
	return a.previewPods(ctx, listening, running, target)
}

// previewResets answers a revision the kubelet would refuse on the state its resource managers
// checkpointed: a drain lets the sidecar remove it, except where this restart mode cannot (planReset).
func (a *Agent) previewResets(target candidate, resets []disruption.Reset) (verdict, message string) {
	sr := stateReset{resets: resets}
	for _, r := range resets {
		sr.files = append(sr.files, r.File)
	}
	paths, err := statePaths(rootDir(target.flags), sr.files)
	if err == nil {
		sr.paths = paths
	}
	if _, ok := a.svc.(StateResetter); !ok {
		return nodeconfig.PreviewConfigRefused, a.cannotReset(target, sr).Error()
	}
	remove := strings.Join(sr.paths, " ")
	if remove == "" {
		remove = strings.Join(sr.files, " ") + " (" + err.Error() + ")"
	}
	return nodeconfig.PreviewDrainRequired, fmt.Sprintf("the kubelet would refuse to start with %s on the state its "+
		"resource managers checkpointed under the config it runs: %s. On a node drained for it, the sidecar stops "+
		"the kubelet, removes %s and starts it", describe(target.src), sr, remove)
}

// previewPods answers whether the kubelet restarted into target would stop running pods: those it would
// not admit again (admission) and those its new eviction thresholds would evict (evictions).
func (a *Agent) previewPods(ctx context.Context, listening *configcheck.Checked, running map[string]any,
	target candidate) (verdict, message string) {
	adm, admErr := a.predictAdmission(ctx, listening, running, target)
	if adm.notStarting != "" {
		return nodeconfig.PreviewConfigRefused, fmt.Sprintf("the kubelet would not start with %s on this node: %s",
			describe(target.src), adm.notStarting)
	}
	ev, evChanges, evErr := a.predictEvictions(ctx, listening, running, target)
	var stops []string
	if len(adm.stopping) > 0 {
		s := fmt.Sprintf("it admits the node's running pods again, oldest first, against less room, and would stop "+
			"%d of them: %s", len(adm.stopping), strings.Join(named(adm.stopping), "; "))
		if len(adm.kept) > 0 {
			s += fmt.Sprintf(" (%d of them even on a drained node: DaemonSet and static pods)", len(adm.kept))
		}
		stops = append(stops, s)
	}
	if evErr == nil && ev.Stops() {
		stops = append(stops, "it would evict or reject pods at once under its eviction thresholds: "+
			strings.Join(named(ev.Findings(a.nodeLabel())), "; "))
	}
	if len(stops) > 0 {
		return nodeconfig.PreviewPodsAffected, fmt.Sprintf("the kubelet, restarted with %s, honours no "+
			"PodDisruptionBudget: %s", describe(target.src), strings.Join(stops, "; and "))
	}
	var why []string
	switch {
	case errors.Is(admErr, errNoCapacity):
		why = append(why, "the config changes the node's allocatable, and the service sent no node capacity")
	case admErr != nil:
		why = append(why, "which pods it would admit again: "+admErr.Error())
	case adm.unpredicted != "":
		why = append(why, "which pods it would admit again: "+adm.unpredicted)
	}
	if evErr != nil {
		why = append(why, "what its eviction thresholds would evict: "+evErr.Error())
	}
	if len(why) > 0 {
		return nodeconfig.PreviewNotPredicted, fmt.Sprintf("whether the kubelet, restarted with %s, would stop "+
			"running pods is not known: %s", describe(target.src), strings.Join(why, "; "))
	}
	if !adm.changes && !evChanges {
		return nodeconfig.PreviewNoPodsAffected, fmt.Sprintf("%s changes neither the node's allocatable, nor its "+
			"eviction thresholds, nor its resource managers' state: the restarted kubelet stops no running pod",
			describe(target.src))
	}
	return nodeconfig.PreviewNoPodsAffected, fmt.Sprintf("the kubelet, restarted with %s, would admit every running "+
		"pod again and evict none at the node's current use", describe(target.src))
}

// truncateMessage cuts a preview answer's message to maxPreviewMessage bytes, at a UTF-8 boundary.
func truncateMessage(s string) string {
	const tail = " … (truncated; the full message is in the dkc-sidecar log)"
	if len(s) <= maxPreviewMessage {
		return s
	}
	cut := maxPreviewMessage - len(tail)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + tail
}
