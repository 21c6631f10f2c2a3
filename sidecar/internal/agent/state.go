package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"

	"github.com/dkc-dev/dkc/internal/durable"
	"github.com/dkc-dev/dkc/internal/nodeconfig"
)

// StateFileName is the sidecar's own record in the dynamic config dir, next to the original's meta/ (which
// keeps exactly the original's format). It holds what the original kept nowhere or in a file's mtime.
const StateFileName = "dkc-sidecar-state.json"

type persisted struct {
	// KubeletFlags last seen on the running kubelet, for when it is not running.
	KubeletFlags []string `json:"kubeletFlags,omitempty"`
	// TrialSource became active at TrialStart; it becomes last-known-good after the trial duration. The
	// original used the mtime of meta/assigned, which every sync rewrote, so trials restarted at random.
	TrialSource *corev1.NodeConfigSource `json:"trialSource,omitempty"`
	TrialStart  *time.Time               `json:"trialStart,omitempty"`
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
		next.TrialSource, next.TrialStart = nil, nil
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
	if !changed {
		return nil
	}
	if err := saveState(f.path, next); err != nil {
		return err
	}
	f.s = next
	return nil
}

// startTrial records the trial start unless this source's trial already runs; it reports a change.
func (f *stateFile) startTrial(src *corev1.NodeConfigSource, now time.Time) bool {
	if f.s.TrialStart != nil && nodeconfig.SameSource(f.s.TrialSource, src) {
		return false
	}
	f.s.TrialSource, f.s.TrialStart = src, &now
	return true
}

func (f *stateFile) trialStart(src *corev1.NodeConfigSource) time.Time {
	if f.s.TrialStart == nil || !nodeconfig.SameSource(f.s.TrialSource, src) {
		return time.Time{}
	}
	return *f.s.TrialStart
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
