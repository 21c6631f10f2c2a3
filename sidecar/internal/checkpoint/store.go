// SPDX-License-Identifier: Apache-2.0

// Package checkpoint is where a node's configs are checkpointed: the original kubelet's on-disk layout
// (docs/design.md, "Node-side layout"), under --dynamic-config-dir:
//
//	meta/assigned          SerializedNodeConfigSource (kubelet.config.k8s.io/v1beta1) YAML; empty file = local
//	meta/last-known-good   same format; empty = local
//	checkpoints/<uid>/<resourceVersion>/<one file per ConfigMap data key>
//
// Every write goes through package durable (atomic and durable). Checkpoints are immutable once written: a
// ConfigMap version never changes content. Payloads from the wire are checked before anything is written:
// the content hash must match, UID, ResourceVersion and file names must use only the characters the API
// allows them (so each is one plain path segment and the checkpoint path is one kubelet argument), and sizes
// are bounded — nothing is ever written outside the directory.
package checkpoint

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	kubeletv1beta1 "k8s.io/kubelet/config/v1beta1"
	"sigs.k8s.io/yaml"

	"github.com/dkc-dev/dkc/internal/durable"
	"github.com/dkc-dev/dkc/internal/nodeconfig/wire"
	"github.com/dkc-dev/dkc/internal/payload"
	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
)

// Limits on a payload from the wire. A ConfigMap holds at most 1 MiB, so these only stop hostile input.
const (
	MaxFiles      = 1024
	MaxTotalBytes = 2 << 20
)

// ErrRefused wraps Save's refusal of a payload that fails CheckPayload: the service sent something no node
// writes, as opposed to a disk that failed the write.
var ErrRefused = errors.New("refuse payload")

// Store is the checkpoint directory of one node. It must be the only writer of its meta files: it keeps
// what it last read or wrote of them in memory, because the agent consults them on every decision and
// every trial check (decoding YAML from disk each time was most of an idle node's work).
type Store struct {
	dir                   string
	assignedFile, lkgFile string // meta/assigned, meta/last-known-good: asked for every second (CheckTrial)

	mu      sync.Mutex
	records map[string]*corev1.NodeConfigSource // path → record; absent: read from disk
}

// New returns the store rooted at dir (the --dynamic-config-dir).
func New(dir string) *Store {
	return &Store{dir: dir, records: map[string]*corev1.NodeConfigSource{},
		assignedFile: filepath.Join(dir, "meta", "assigned"), lkgFile: filepath.Join(dir, "meta", "last-known-good")}
}

// Dir is the store's root.
func (s *Store) Dir() string { return s.dir }

func (s *Store) metaDir() string        { return filepath.Join(s.dir, "meta") }
func (s *Store) checkpointsDir() string { return filepath.Join(s.dir, "checkpoints") }
func (s *Store) assignedPath() string   { return s.assignedFile }
func (s *Store) lkgPath() string        { return s.lkgFile }

// Initialize creates the layout where missing (empty meta files mean local config) and removes leftovers of
// interrupted writes. It returns what it removed.
func (s *Store) Initialize() ([]string, error) {
	s.mu.Lock()
	s.records = map[string]*corev1.NodeConfigSource{}
	s.mu.Unlock()
	for _, d := range []string{s.dir, s.metaDir(), s.checkpointsDir()} {
		if err := durable.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("initialize checkpoint store: %w", err)
		}
	}
	// MkdirAll syncs only what it creates. A predecessor killed between creating a directory and syncing its
	// parent left an entry that exists but may not survive a power loss; one sync of each parent at start
	// settles those (checkpoints/<uid> included).
	for _, d := range []string{filepath.Dir(s.dir), s.dir, s.checkpointsDir()} {
		if err := durable.SyncDir(d); err != nil {
			return nil, fmt.Errorf("initialize checkpoint store: %w", err)
		}
	}
	for _, f := range []string{s.assignedPath(), s.lkgPath()} {
		if _, err := os.Stat(f); errors.Is(err, os.ErrNotExist) {
			if err := durable.WriteFile(f, nil, 0o644); err != nil {
				return nil, err
			}
		} else if err != nil {
			return nil, fmt.Errorf("stat %s: %w", f, err)
		}
	}
	var removed []string
	dirs := []string{s.dir, s.metaDir(), s.checkpointsDir()}
	uids, err := os.ReadDir(s.checkpointsDir())
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", s.checkpointsDir(), err)
	}
	for _, u := range uids {
		if u.IsDir() {
			dirs = append(dirs, filepath.Join(s.checkpointsDir(), u.Name()))
		}
	}
	for _, d := range dirs {
		r, err := durable.CleanTemp(d)
		if err != nil {
			return removed, err
		}
		for _, name := range r {
			removed = append(removed, filepath.Join(d, name))
		}
	}
	return removed, nil
}

// checkSource validates a resolved ConfigMap source for use as a checkpoint location. UID, resourceVersion
// and key end up in the kubelet's --config flag (package kubeletunit), so they are held to the characters
// the API gives them (package payload), not merely to "one path segment": a tab in any of them would split
// that flag in two. Having no ".", a UID or resourceVersion can be neither "." nor ".." nor start with
// durable's temp prefix, which Initialize would take for a leftover.
func checkSource(cm *corev1.ConfigMapNodeConfigSource) error {
	if cm == nil {
		return errors.New("no ConfigMap source")
	}
	if err := payload.ValidateUID(string(cm.UID)); err != nil {
		return err
	}
	if err := payload.ValidateResourceVersion(cm.ResourceVersion); err != nil {
		return err
	}
	if err := payload.ValidateFileName(cm.KubeletConfigKey); err != nil {
		return fmt.Errorf("kubeletConfigKey: %w", err)
	}
	return nil
}

// CheckpointDir is where the source's files are.
func (s *Store) CheckpointDir(cm *corev1.ConfigMapNodeConfigSource) string {
	return filepath.Join(s.checkpointsDir(), string(cm.UID), cm.ResourceVersion)
}

// ConfigFile is the KubeletConfiguration file of the source — what the kubelet's --config points at, so that
// relative paths in it resolve inside the checkpoint, as in the original.
func (s *Store) ConfigFile(cm *corev1.ConfigMapNodeConfigSource) string {
	return filepath.Join(s.CheckpointDir(cm), cm.KubeletConfigKey)
}

// Exists reports whether the source's checkpoint is on disk.
func (s *Store) Exists(cm *corev1.ConfigMapNodeConfigSource) (bool, error) {
	if err := checkSource(cm); err != nil {
		return false, err
	}
	st, err := os.Stat(s.CheckpointDir(cm))
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return st.IsDir(), nil
}

// CheckPayload validates an assignment from the wire without writing anything.
func CheckPayload(a *dkcv1.Assignment) error {
	cm := wire.SourceToCore(a.GetSource())
	if cm == nil {
		return errors.New("assignment has no ConfigMap source")
	}
	if err := checkSource(cm.ConfigMap); err != nil {
		return err
	}
	files := a.GetFiles()
	if len(files) > MaxFiles {
		return fmt.Errorf("payload has %d files, more than %d", len(files), MaxFiles)
	}
	total := 0
	for name, data := range files {
		if err := payload.ValidateFileName(name); err != nil {
			return err
		}
		total += len(name) + len(data)
	}
	if total > MaxTotalBytes {
		return fmt.Errorf("payload of %d bytes is larger than %d", total, MaxTotalBytes)
	}
	if want := payload.Hash(a.GetSource().GetConfigMap(), files); a.GetContentHash() != want {
		return fmt.Errorf("content hash %q does not match the payload (%s)", a.GetContentHash(), want)
	}
	return nil
}

// Save checkpoints an assignment's files unless the checkpoint exists. The payload is checked first.
func (s *Store) Save(a *dkcv1.Assignment) error {
	if err := CheckPayload(a); err != nil {
		return fmt.Errorf("%w: %w", ErrRefused, err)
	}
	cm := wire.SourceToCore(a.GetSource()).ConfigMap
	if ok, err := s.Exists(cm); err != nil || ok {
		return err
	}
	if err := durable.MkdirAll(filepath.Join(s.checkpointsDir(), string(cm.UID)), 0o755); err != nil {
		return fmt.Errorf("create checkpoint dir for %s: %w", cm.UID, err)
	}
	files := make(map[string][]byte, len(a.GetFiles()))
	for name, data := range a.GetFiles() {
		files[name] = []byte(data)
	}
	if err := durable.WriteDir(s.CheckpointDir(cm), files, 0o644); err != nil {
		return fmt.Errorf("write checkpoint %s/%s: %w", cm.UID, cm.ResourceVersion, err)
	}
	return nil
}

// Files reads a checkpoint back.
func (s *Store) Files(cm *corev1.ConfigMapNodeConfigSource) (map[string]string, error) {
	if err := checkSource(cm); err != nil {
		return nil, err
	}
	dir := s.CheckpointDir(cm)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read checkpoint %s/%s: %w", cm.UID, cm.ResourceVersion, err)
	}
	files := make(map[string]string, len(entries))
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("read checkpoint file %s: %w", e.Name(), err)
		}
		files[e.Name()] = string(data)
	}
	return files, nil
}

// ContentHash recomputes the content hash of a checkpoint, so that a resuming node can say what it has.
func (s *Store) ContentHash(src *corev1.NodeConfigSource) (string, error) {
	if src == nil || src.ConfigMap == nil {
		return "", nil
	}
	files, err := s.Files(src.ConfigMap)
	if err != nil {
		return "", err
	}
	return payload.Hash(wire.SourceFromCore(src).GetConfigMap(), files), nil
}

// Assigned reads meta/assigned; nil means local config.
func (s *Store) Assigned() (*corev1.NodeConfigSource, error) { return s.readRecord(s.assignedPath()) }

// LastKnownGood reads meta/last-known-good; nil means local config.
func (s *Store) LastKnownGood() (*corev1.NodeConfigSource, error) { return s.readRecord(s.lkgPath()) }

// SetAssigned writes meta/assigned (nil: local).
func (s *Store) SetAssigned(src *corev1.NodeConfigSource) error {
	return s.writeRecord(s.assignedPath(), src)
}

// SetLastKnownGood writes meta/last-known-good (nil: local).
func (s *Store) SetLastKnownGood(src *corev1.NodeConfigSource) error {
	return s.writeRecord(s.lkgPath(), src)
}

const (
	recordAPIVersion = "kubelet.config.k8s.io/v1beta1"
	recordKind       = "SerializedNodeConfigSource"
)

// EncodeRecord is the original's meta file content for a source; nil encodes as empty (local).
func EncodeRecord(src *corev1.NodeConfigSource) ([]byte, error) {
	if src == nil || src.ConfigMap == nil {
		return nil, nil
	}
	if err := checkSource(src.ConfigMap); err != nil {
		return nil, fmt.Errorf("write record: %w", err)
	}
	rec := kubeletv1beta1.SerializedNodeConfigSource{Source: *src}
	rec.APIVersion, rec.Kind = recordAPIVersion, recordKind
	return yaml.Marshal(rec)
}

// DecodeRecord parses a meta file; empty means local. Unknown fields are ignored (newer writers), as the
// original decoded these records non-strictly.
func DecodeRecord(data []byte) (*corev1.NodeConfigSource, error) {
	if len(strings.TrimSpace(string(data))) == 0 {
		return nil, nil
	}
	var rec kubeletv1beta1.SerializedNodeConfigSource
	if err := yaml.Unmarshal(data, &rec); err != nil {
		return nil, fmt.Errorf("decode SerializedNodeConfigSource: %w", err)
	}
	if rec.APIVersion != recordAPIVersion || rec.Kind != recordKind {
		return nil, fmt.Errorf("record is %s %s, want %s %s", rec.APIVersion, rec.Kind, recordAPIVersion, recordKind)
	}
	if rec.Source.ConfigMap == nil {
		return nil, errors.New("record has no ConfigMap source")
	}
	if err := checkSource(rec.Source.ConfigMap); err != nil {
		return nil, err
	}
	return &rec.Source, nil
}

func (s *Store) readRecord(path string) (*corev1.NodeConfigSource, error) {
	s.mu.Lock()
	cached, ok := s.records[path]
	s.mu.Unlock()
	if ok {
		if cached.ConfigMap == nil {
			return nil, nil // local
		}
		return cached.DeepCopy(), nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	src, err := DecodeRecord(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	s.remember(path, src)
	return src, nil
}

// remember caches a record (nil: local).
func (s *Store) remember(path string, src *corev1.NodeConfigSource) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if src == nil || src.ConfigMap == nil {
		s.records[path] = &corev1.NodeConfigSource{} // local, distinct from "not cached"
		return
	}
	s.records[path] = src.DeepCopy()
}

// forget drops a cached record: after a failed write its state on disk is unknown.
func (s *Store) forget(path string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.records, path)
}

func (s *Store) writeRecord(path string, src *corev1.NodeConfigSource) error {
	data, err := EncodeRecord(src)
	if err != nil {
		return err
	}
	s.forget(path)
	if err := durable.WriteFile(path, data, 0o644); err != nil {
		return err
	}
	s.remember(path, src)
	return nil
}

// GC removes checkpoints that none of keep references, except the newest extra of them (by directory
// modification time), which stay for a quick rollback. It returns the removed "<uid>/<resourceVersion>".
func (s *Store) GC(keep []*corev1.NodeConfigSource, extra int) ([]string, error) {
	kept := map[string]bool{}
	for _, k := range keep {
		if k != nil && k.ConfigMap != nil {
			kept[string(k.ConfigMap.UID)+"/"+k.ConfigMap.ResourceVersion] = true
		}
	}
	type cp struct {
		id    string
		mtime int64
	}
	var candidates []cp
	uids, err := os.ReadDir(s.checkpointsDir())
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", s.checkpointsDir(), err)
	}
	for _, u := range uids {
		if !u.IsDir() || strings.HasPrefix(u.Name(), durable.TempPrefix) {
			continue
		}
		rvs, err := os.ReadDir(filepath.Join(s.checkpointsDir(), u.Name()))
		if err != nil {
			return nil, err
		}
		for _, rv := range rvs {
			id := u.Name() + "/" + rv.Name()
			if kept[id] || !rv.IsDir() || strings.HasPrefix(rv.Name(), durable.TempPrefix) {
				continue
			}
			info, err := rv.Info()
			if err != nil {
				return nil, err
			}
			candidates = append(candidates, cp{id, info.ModTime().UnixNano()})
		}
	}
	sort.Slice(candidates, func(i, j int) bool { return candidates[i].mtime > candidates[j].mtime })
	var removed []string
	for i, c := range candidates {
		if i < extra {
			continue
		}
		if err := durable.RemoveAll(filepath.Join(s.checkpointsDir(), filepath.FromSlash(c.id))); err != nil {
			return removed, err
		}
		removed = append(removed, c.id)
	}
	// Drop UID directories left empty.
	for _, u := range uids {
		d := filepath.Join(s.checkpointsDir(), u.Name())
		if rest, err := os.ReadDir(d); err == nil && len(rest) == 0 {
			_ = os.Remove(d)
		}
	}
	return removed, nil
}

// Remove removes the source's checkpoint, if there is one, and its UID directory once empty. Nothing may
// reference it: the agent removes only the checkpoint a preview wrote, once the preview stands no more and
// nothing assigned, last-known-good or active is that config.
func (s *Store) Remove(cm *corev1.ConfigMapNodeConfigSource) error {
	if err := checkSource(cm); err != nil {
		return fmt.Errorf("remove checkpoint: %w", err)
	}
	if err := durable.RemoveAll(s.CheckpointDir(cm)); err != nil {
		return fmt.Errorf("remove checkpoint %s/%s: %w", cm.UID, cm.ResourceVersion, err)
	}
	d := filepath.Join(s.checkpointsDir(), string(cm.UID))
	if rest, err := os.ReadDir(d); err == nil && len(rest) == 0 {
		_ = os.Remove(d)
	}
	return nil
}

// SourceOf returns the core source of an assignment (nil: local).
func SourceOf(a *dkcv1.Assignment) *corev1.NodeConfigSource {
	return wire.SourceToCore(a.GetSource())
}

// UIDOf is a convenience for logs.
func UIDOf(src *corev1.NodeConfigSource) types.UID {
	if src == nil || src.ConfigMap == nil {
		return ""
	}
	return src.ConfigMap.UID
}
