// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
)

// loadPhase takes the phase the state file recorded (empty in files of older sidecars: unknown).
func (a *Agent) loadPhase() {
	a.phase = PhaseUnknown
	for _, p := range Phases {
		if string(p) == a.state.s.Phase {
			a.phase = p
		}
	}
	a.metrics.setPhase(a.phase)
	if a.phase != PhaseUnknown {
		a.log.Info("resuming", zap.Stringer("phase", a.phase))
	}
}

// waitForKubeletVersion records that this process waits for the service to send the kubelet's version
// before it checks anything: in memory and in the metric, not in the state file (see
// PhaseWaitingForKubeletVersion). The first round after the version arrives decides the next phase.
func (a *Agent) waitForKubeletVersion() {
	a.log.Info("kubelet version not known yet: configs are checked, and the kubelet touched, once the service sends it",
		zap.Stringer("phase", PhaseWaitingForKubeletVersion), zap.Stringer("was", a.phase))
	a.phase = PhaseWaitingForKubeletVersion
	a.metrics.setPhase(a.phase)
}

// setPhase records the round's phase: in memory, in the metric, and in the state file when it changed. It
// logs one line per outcome — a new phase, target or error — at Info, as the node's record of what each
// assignment came to; rounds that change nothing stay quiet. target is the config the outcome is about: the
// one the kubelet was brought to (nil: local), or, for a round that could not start, the assigned config it
// retries, read from meta/assigned as Status reads it — never local as a stand-in.
func (a *Agent) setPhase(p Phase, target *corev1.NodeConfigSource) {
	a.recordPhase(p, sourceKey(target), sourceFields(target))
}

// setPhaseUnknownSource is setPhase for a round that could not even read meta/assigned: what it retries is
// unknown, and its log line says so instead of naming the local config. (The status has no "unknown" for
// assigned: it shows none, with the internal failure.)
func (a *Agent) setPhaseUnknownSource(p Phase) {
	a.recordPhase(p, "unknown", []zap.Field{zap.String("source", "unknown")})
}

func (a *Agent) recordPhase(p Phase, targetKey string, targetFields []zap.Field) {
	errText, _ := statusError(a.syncError, a.localSyncError, a.localSyncWhy, a.configError, a.detail)
	key := string(p) + "\x00" + targetKey + "\x00" + string(errText)
	if key != a.outcome {
		a.outcome = key
		a.log.Info("kubelet config outcome", append(targetFields, zap.Stringer("phase", p), zap.Stringer("was", a.phase),
			zap.Stringer("error", errText))...)
	}
	a.phase = p
	a.metrics.setPhase(p)
	if a.state.s.Phase != string(p) {
		a.state.s.Phase = string(p)
		if err := a.state.save(); err != nil {
			// Only what a restarted sidecar logs first depends on it.
			a.log.Warn("persist phase", zap.Stringer("phase", p), zap.Error(err))
		}
	}
}

func (p Phase) String() string { return string(p) }

func sourceKey(src *corev1.NodeConfigSource) string {
	if src == nil || src.ConfigMap == nil {
		return "local"
	}
	cm := src.ConfigMap
	return cm.Namespace + "/" + cm.Name + "/" + string(cm.UID) + "/" + cm.ResourceVersion + "/" + cm.KubeletConfigKey
}
