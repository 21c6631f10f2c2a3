// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dkc-dev/dkc/internal/durable"
	"github.com/dkc-dev/dkc/internal/nodeconfig"
)

// StateFileName is the sidecar's own record in the dynamic config dir, next to the original's meta/ (which
// keeps exactly the original's format). It holds what the original kept nowhere or in a file's mtime.
const StateFileName = "dkc-sidecar-state.json"

type persisted struct {
	// KubeletFlags last seen on the running kubelet, for when it is not running.
	KubeletFlags []string `json:"kubeletFlags,omitempty"`
	// KubeletVersion is the node kubelet's version as the service last sent it. The agent never checks with
	// it (it waits for the service's, which may be newer); the cleanup mode, which talks to no service,
	// validates the local config with its minor's code.
	KubeletVersion string `json:"kubeletVersion,omitempty"`
	// TrialSource became active at TrialStart (wall clock: for people, and for older sidecars, which read
	// it); it becomes last-known-good once its trial has run TrialElapsed of the trial duration. The original
	// used the mtime of meta/assigned, which every sync rewrote, so trials restarted at random.
	TrialSource *corev1.NodeConfigSource `json:"trialSource,omitempty"`
	TrialStart  *time.Time               `json:"trialStart,omitempty"`
	// TrialElapsed is how long the trial has run, as this node's sidecars measured it on the monotonic clock
	// (see trialElapsed): a step of the wall clock neither shortens nor extends a trial. Absent with a
	// TrialStart: an older sidecar's file, whose trial is taken up once from the wall clock.
	TrialElapsed *metav1.Duration `json:"trialElapsed,omitempty"`
	// Active is the config the kubelet was last proven (through /configz) to run; nil: never proven. A
	// restarted sidecar reports it until it proves again, rather than "local" while it cannot tell.
	Active *activeRecord `json:"active,omitempty"`
	// Failed configs passed validation but the kubelet did not run healthy with them; they are not tried
	// again until something else is assigned (no restart loops).
	Failed []failure `json:"failed,omitempty"`
	// Incarnation numbers the sidecar's starts (see NextIncarnation); it orders the node's status reports.
	Incarnation uint64 `json:"incarnation,omitempty"`
	// NodeUID is the Node object the service's last update was resolved from: a restarted sidecar's first
	// reports name it, so that the service drops them if that Node was deleted and registered again
	// meanwhile, instead of showing the old object's assignment on the new one.
	NodeUID string `json:"nodeUID,omitempty"`
	// Phase is where the node stood in the rollback rules when it last changed (a Phase); absent in the
	// files of older sidecars, which read past it.
	Phase string `json:"phase,omitempty"`
	// Reset names the kubelet state files a sidecar set out to remove (written before the kubelet is
	// stopped) while the node was drained for Reset.Source, its assignment then. It never allows a removal
	// by itself — only the service's word that the node is drained for that assignment now does, the drain
	// it was made under may be over — but while the node is drained for it, a fallback (or a sidecar
	// restarted in the middle of the reset) removes these files too. Cleared by a healthy config and by a
	// new assignment.
	Reset *resetRecord `json:"reset,omitempty"`
	// DriftRepairs are the drift repairs made for the node's assignment, each written before it is made
	// (repair.go): a cause repaired once for a ConfigMap version is not repaired again for it, whichever
	// request asks, and a request is acted on once. Dropped with a new assignment.
	DriftRepairs []driftRepairRecord `json:"driftRepairs,omitempty"`
	// DriftRepairIDs are the requests acted on for earlier assignments (the last maxRepairIDs): a request
	// is never acted on twice, also if the node is assigned its ConfigMap version again.
	DriftRepairIDs []string `json:"driftRepairIDs,omitempty"`
}

// resetRecord is a kubelet state reset made for an assignment.
type resetRecord struct {
	Source *corev1.NodeConfigSource `json:"source,omitempty"`
	// Files are names from package disruption's list, in the kubelet's root directory.
	Files []string `json:"files"`
}

// recordReset durably records that files are being removed for assignment src, with the files recorded
// for it before. The state in memory changes only once it is on disk; on error nothing changed.
func (f *stateFile) recordReset(src *corev1.NodeConfigSource, files []string) error {
	next := f.s
	rec := &resetRecord{Source: src, Files: files}
	if old := f.s.Reset; old != nil && nodeconfig.SameSource(old.Source, src) {
		rec.Files = union(old.Files, files)
	}
	if old := f.s.Reset; old != nil && nodeconfig.SameSource(old.Source, src) && equalStrings(old.Files, rec.Files) {
		return nil
	}
	next.Reset = rec
	if err := saveState(f.path, next); err != nil {
		return err
	}
	f.s = next
	return nil
}

// union is a's names, then those of b not in a.
func union(a, b []string) []string {
	out := append([]string(nil), a...)
	for _, x := range b {
		if !slices.Contains(out, x) {
			out = append(out, x)
		}
	}
	return out
}

// NextIncarnation records and returns this start's incarnation: one more than the last start's, or the
// current Unix time in seconds if that is larger. Status reports are ordered by (incarnation, sequence)
// rather than by the node's clock, which may step back (dkc-server drops a report older than the last one
// it accepted). The clock only helps when the record is lost (a wiped dynamic config dir): a new node's
// first incarnation is then still above what its predecessor reached, unless the clock is also far behind.
// Call it before the agent loads the state file; the agent keeps the field.
func NextIncarnation(dynamicConfigDir string, now time.Time) (uint64, error) {
	if err := durable.MkdirAll(dynamicConfigDir, 0o755); err != nil {
		return 0, fmt.Errorf("record sidecar incarnation: %w", err)
	}
	f := &stateFile{path: filepath.Join(dynamicConfigDir, StateFileName)}
	if err := f.load(); err != nil {
		f.s = persisted{} // unreadable: Init starts fresh too (and says so); the clock takes over
	}
	next := f.s.Incarnation + 1
	if t := now.Unix(); t > 0 && uint64(t) > next {
		next = uint64(t)
	}
	f.s.Incarnation = next
	if err := f.save(); err != nil {
		return 0, fmt.Errorf("record sidecar incarnation: %w", err)
	}
	return next, nil
}

// Recorded is what the sidecar last recorded in dynamicConfigDir of the node's kubelet: its version and its
// flags (without --config); empty when never recorded, or the state file is unreadable (err says why).
func Recorded(dynamicConfigDir string) (kubeletVersion string, kubeletFlags []string, err error) {
	f := &stateFile{path: filepath.Join(dynamicConfigDir, StateFileName)}
	if err := f.load(); err != nil {
		return "", nil, err
	}
	return f.s.KubeletVersion, f.s.KubeletFlags, nil
}

// activeRecord wraps the active source so that local (nil Source) differs from unknown (no record).
type activeRecord struct {
	Source *corev1.NodeConfigSource `json:"source,omitempty"`
}

// setActive records src as the proven active config; it reports a change.
func (f *stateFile) setActive(src *corev1.NodeConfigSource) bool {
	if f.s.Active != nil && nodeconfig.SameSource(f.s.Active.Source, src) {
		return false
	}
	if src != nil && src.ConfigMap == nil {
		src = nil
	}
	f.s.Active = &activeRecord{Source: src}
	return true
}

type failure struct {
	Source *corev1.NodeConfigSource `json:"source"`
	Reason string                   `json:"reason"`
}

type stateFile struct {
	path string
	s    persisted
	// trialMark is the trial clock's reading when s.TrialElapsed was last read or written: the trial has run
	// s.TrialElapsed plus the time since. Taken from the real clock, it carries Go's monotonic reading, and
	// the difference is measured on that.
	trialMark time.Time
}

func (f *stateFile) load() error {
	data, err := os.ReadFile(f.path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", f.path, err)
	}
	if err := json.Unmarshal(data, &f.s); err != nil {
		return fmt.Errorf("decode %s: %w", f.path, err)
	}
	return nil
}

func (f *stateFile) save() error { return saveState(f.path, f.s) }

func saveState(path string, s persisted) error {
	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return fmt.Errorf("encode sidecar state: %w", err)
	}
	if err := durable.WriteFile(path, data, 0o644); err != nil {
		return fmt.Errorf("write sidecar state: %w", err)
	}
	return nil
}

func (f *stateFile) failure(src *corev1.NodeConfigSource) string {
	for _, x := range f.s.Failed {
		if nodeconfig.SameSource(x.Source, src) {
			return x.Reason
		}
	}
	return ""
}

func (f *stateFile) markFailed(src *corev1.NodeConfigSource, reason string) {
	if f.failure(src) == "" {
		f.s.Failed = append(f.s.Failed, failure{Source: src, Reason: reason})
	}
}

// clearAssigned forgets, when src is newly assigned, the trial and the failures: each assignment gets a
// fresh trial and every config a fresh chance. Failures of lkg (the current last-known-good) are kept: it
// is the fallback of the new assignment, and a fallback already seen failing must not be restarted into
// again. The one trial kept is one that ended in lkg's promotion (unless lkg itself is assigned again): it
// can promote nothing that is not already last-known-good. Any other trial goes, even though trialStart
// reads a trial only for its own config: meta/assigned is written before this, and a sidecar that crashes
// in between never comes back here for the same source, so a trial left behind would promote a config
// assigned again without a fresh one. The file is written only when something changed, which in the common
// case (the last assignment promoted, nothing failed) saves a new assignment two of its checkpoint's
// eight fsyncs. The state in memory changes only once it is on disk; on error nothing changed.
func (f *stateFile) clearAssigned(src, lkg *corev1.NodeConfigSource) error {
	next := f.s
	changed := false
	promoted := lkg != nil && nodeconfig.SameSource(f.s.TrialSource, lkg) && !nodeconfig.SameSource(src, lkg)
	if f.s.TrialStart != nil && !promoted {
		next.TrialSource, next.TrialStart, next.TrialElapsed = nil, nil, nil
		changed = true
	}
	next.Failed = nil
	for _, x := range f.s.Failed {
		if lkg != nil && nodeconfig.SameSource(x.Source, lkg) {
			next.Failed = append(next.Failed, x)
		}
	}
	if len(next.Failed) != len(f.s.Failed) {
		changed = true
	}
	// A reset was made under the previous assignment's drain: the new one needs its own.
	if next.Reset != nil {
		next.Reset = nil
		changed = true
	}
	// Repairs were for the previous assignment's ConfigMap version: the new one may be repaired again.
	if dropRepairs(&next, src) {
		changed = true
	}
	if !changed {
		return nil
	}
	if err := saveState(f.path, next); err != nil {
		return err
	}
	f.s = next
	return nil
}

// startTrial records the trial start unless this source's trial already runs; it reports a change. wall is
// the wall clock's time (recorded for people), mono the trial clock's (the trial is measured on it).
func (f *stateFile) startTrial(src *corev1.NodeConfigSource, wall, mono time.Time) bool {
	if f.s.TrialStart != nil && nodeconfig.SameSource(f.s.TrialSource, src) {
		return false
	}
	f.s.TrialSource, f.s.TrialStart, f.s.TrialElapsed, f.trialMark = src, &wall, &metav1.Duration{}, mono
	return true
}

// trialElapsed is how long src's trial has run at the trial clock's mono; ok is false when no trial is
// recorded for src. Only the time this process measured counts besides what is on disk: time while no
// sidecar ran is not counted (nobody watched the kubelet then), and neither is what the last sidecar
// measured after its last save (at most trialSaveInterval, unless it stopped gracefully: Run saves then).
func (f *stateFile) trialElapsed(src *corev1.NodeConfigSource, mono time.Time) (elapsed time.Duration, ok bool) {
	if f.s.TrialStart == nil || !nodeconfig.SameSource(f.s.TrialSource, src) {
		return 0, false
	}
	if f.s.TrialElapsed != nil {
		elapsed = f.s.TrialElapsed.Duration
	}
	return elapsed + max(mono.Sub(f.trialMark), 0), true
}

// takeUpTrial starts measuring the recorded trial from the trial clock's mono, after the file was loaded. A
// file of an older sidecar has the trial's wall-clock start only: its elapsed time is taken from the wall
// clock this once (at least zero: a start in the future is a clock that stepped back), and measured on the
// trial clock from then on.
func (f *stateFile) takeUpTrial(wall, mono time.Time) {
	f.trialMark = mono
	if f.s.TrialStart != nil && f.s.TrialElapsed == nil {
		f.s.TrialElapsed = &metav1.Duration{Duration: max(wall.Sub(*f.s.TrialStart), 0)}
	}
}

// saveTrial writes the trial's elapsed time at mono (nothing when no trial is recorded). The state in
// memory changes only once it is on disk; on error nothing changed.
func (f *stateFile) saveTrial(mono time.Time) error {
	elapsed, ok := f.trialElapsed(f.s.TrialSource, mono)
	if !ok {
		return nil
	}
	next := f.s
	next.TrialElapsed = &metav1.Duration{Duration: elapsed}
	if err := saveState(f.path, next); err != nil {
		return err
	}
	f.s, f.trialMark = next, mono
	return nil
}

// trialUnsaved is how much of the trial's elapsed time at mono is not on disk yet.
func (f *stateFile) trialUnsaved(mono time.Time) time.Duration {
	if f.s.TrialStart == nil {
		return 0
	}
	return max(mono.Sub(f.trialMark), 0)
}

func (f *stateFile) setFlags(flags []string) bool {
	if equalStrings(f.s.KubeletFlags, flags) && f.s.KubeletFlags != nil {
		return false
	}
	f.s.KubeletFlags = flags
	return true
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func timestamp(t time.Time) *timestamppb.Timestamp { return timestamppb.New(t) }
