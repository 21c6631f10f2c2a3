// SPDX-License-Identifier: Apache-2.0

package checkpoint

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dkc-dev/dkc/internal/durable"
	"github.com/dkc-dev/dkc/internal/nodeconfig/wire"
	"github.com/dkc-dev/dkc/internal/payload"
	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
)

func assignment(uid, rv string, files map[string]string) *dkcv1.Assignment {
	src := &dkcv1.ConfigMapNodeConfigSource{Namespace: "kube-system", Name: "c", Uid: uid, ResourceVersion: rv, KubeletConfigKey: "kubelet"}
	return &dkcv1.Assignment{Source: &dkcv1.NodeConfigSource{ConfigMap: src}, Files: files, ContentHash: payload.Hash(src, files)}
}

func newStore(t *testing.T) *Store {
	t.Helper()
	s := New(filepath.Join(t.TempDir(), "dynamic-config"))
	if _, err := s.Initialize(); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestInitializeLayout(t *testing.T) {
	s := newStore(t)
	for _, p := range []string{"meta/assigned", "meta/last-known-good"} {
		data, err := os.ReadFile(filepath.Join(s.Dir(), p))
		if err != nil || len(data) != 0 {
			t.Errorf("%s: %q, %v; want an empty file (local)", p, data, err)
		}
	}
	if st, err := os.Stat(filepath.Join(s.Dir(), "checkpoints")); err != nil || !st.IsDir() {
		t.Errorf("checkpoints dir: %v", err)
	}
	a, err := s.Assigned()
	if err != nil || a != nil {
		t.Errorf("Assigned() = %v, %v; want local", a, err)
	}
}

func TestSaveAndRecords(t *testing.T) {
	s := newStore(t)
	a := assignment("uid-1", "42", map[string]string{"kubelet": "kind: KubeletConfiguration\n", "ca.crt": "pem"})
	if err := s.Save(a); err != nil {
		t.Fatal(err)
	}
	src := SourceOf(a)
	for name, want := range map[string]string{"kubelet": "kind: KubeletConfiguration\n", "ca.crt": "pem"} {
		got, err := os.ReadFile(filepath.Join(s.Dir(), "checkpoints", "uid-1", "42", name))
		if err != nil || string(got) != want {
			t.Errorf("checkpoint file %s = %q, %v", name, got, err)
		}
	}
	if s.ConfigFile(src.ConfigMap) != filepath.Join(s.Dir(), "checkpoints/uid-1/42/kubelet") {
		t.Errorf("ConfigFile = %s", s.ConfigFile(src.ConfigMap))
	}
	if h, err := s.ContentHash(src); err != nil || h != a.GetContentHash() {
		t.Errorf("ContentHash = %q, %v; want %q", h, err, a.GetContentHash())
	}
	// Saving again is a no-op (checkpoints are immutable).
	if err := s.Save(a); err != nil {
		t.Fatal(err)
	}
	if err := s.SetAssigned(src); err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(filepath.Join(s.Dir(), "meta/assigned"))
	for _, want := range []string{"apiVersion: kubelet.config.k8s.io/v1beta1", "kind: SerializedNodeConfigSource", "uid: uid-1", `resourceVersion: "42"`, "kubeletConfigKey: kubelet"} {
		if !strings.Contains(string(raw), want) {
			t.Errorf("meta/assigned lacks %q:\n%s", want, raw)
		}
	}
	got, err := s.Assigned()
	if err != nil || got == nil || got.ConfigMap.UID != "uid-1" || got.ConfigMap.ResourceVersion != "42" || got.ConfigMap.Name != "c" {
		t.Errorf("Assigned() = %+v, %v", got, err)
	}
	if err := s.SetAssigned(nil); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Assigned(); got != nil {
		t.Errorf("after SetAssigned(nil): %+v", got)
	}
}

func TestDecodeRecordOfTheOriginal(t *testing.T) {
	// The 1.12+ kubelet's meta file, verbatim, plus a field a newer writer might add.
	data := []byte(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: SerializedNodeConfigSource
futureField: ignored
source:
  configMap:
    kubeletConfigKey: kubelet
    name: my-node-config-9mbkccg2cc
    namespace: kube-system
    resourceVersion: "1326"
    uid: 705ab4f5-6393-11e8-b7cc-42010a800002
`)
	src, err := DecodeRecord(data)
	if err != nil || src.ConfigMap.ResourceVersion != "1326" || src.ConfigMap.Name != "my-node-config-9mbkccg2cc" {
		t.Fatalf("DecodeRecord = %+v, %v", src, err)
	}
	for _, bad := range []string{"kind: Other\napiVersion: v1\n", "{", "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: SerializedNodeConfigSource\n",
		"apiVersion: kubelet.config.k8s.io/v1beta1\nkind: SerializedNodeConfigSource\nsource:\n  configMap:\n    uid: ../..\n    resourceVersion: '1'\n    kubeletConfigKey: k\n"} {
		if _, err := DecodeRecord([]byte(bad)); err == nil {
			t.Errorf("DecodeRecord(%q) accepted", bad)
		}
	}
}

func TestHostilePayloadsAreRefused(t *testing.T) {
	s := newStore(t)
	big := strings.Repeat("x", MaxTotalBytes+1)
	many := map[string]string{}
	for i := 0; i <= MaxFiles; i++ {
		many[fmt.Sprintf("f%d", i)] = ""
	}
	badHash := assignment("u", "1", map[string]string{"kubelet": "x"})
	badHash.ContentHash = "sha256:0000"
	for name, a := range map[string]*dkcv1.Assignment{
		"slash in name":  assignment("u", "1", map[string]string{"../escape": "x"}),
		"absolute name":  assignment("u", "1", map[string]string{"/etc/passwd": "x"}),
		"dotdot":         assignment("u", "1", map[string]string{"..": "x"}),
		"NUL":            assignment("u", "1", map[string]string{"a\x00b": "x"}),
		"uid traversal":  assignment("../..", "1", map[string]string{"kubelet": "x"}),
		"rv traversal":   assignment("u", "..", map[string]string{"kubelet": "x"}),
		"rv with slash":  assignment("u", "1/2", map[string]string{"kubelet": "x"}),
		"too big":        assignment("u", "1", map[string]string{"kubelet": big}),
		"too many files": assignment("u", "1", many),
		"hash mismatch":  badHash,
		"no source":      {Files: map[string]string{"kubelet": "x"}},
		"key with slash": {Source: &dkcv1.NodeConfigSource{ConfigMap: &dkcv1.ConfigMapNodeConfigSource{Uid: "u", ResourceVersion: "1", KubeletConfigKey: "a/b"}}},
	} {
		if err := s.Save(a); err == nil {
			t.Errorf("%s: Save accepted a hostile payload", name)
		}
	}
	// Nothing was written anywhere.
	var found []string
	_ = filepath.Walk(filepath.Dir(s.Dir()), func(p string, info os.FileInfo, _ error) error {
		if !info.IsDir() && !strings.HasSuffix(p, "meta/assigned") && !strings.HasSuffix(p, "meta/last-known-good") {
			found = append(found, p)
		}
		return nil
	})
	if len(found) > 0 {
		t.Errorf("files written by refused payloads: %v", found)
	}
}

// TestFlagInjectionIsRefused: the checkpoint path becomes the value of the kubelet's --config flag, which
// systemd splits on tabs as well as spaces, so a tab in the key, the UID or the resourceVersion would add
// kubelet flags nobody validated. Every way a name enters the store refuses it, naming the value.
func TestFlagInjectionIsRefused(t *testing.T) {
	const injected = "\t--authorization-mode=AlwaysAllow"
	source := func(uid, rv, key string) *corev1.NodeConfigSource {
		return &corev1.NodeConfigSource{ConfigMap: &corev1.ConfigMapNodeConfigSource{Namespace: "kube-system", Name: "c", UID: types.UID(uid), ResourceVersion: rv, KubeletConfigKey: key}}
	}
	for _, tc := range []struct {
		name       string
		src        *corev1.NodeConfigSource
		files      map[string]string
		offender   string
		goodSource bool
	}{
		{"tab in key", source("u", "1", "kubelet"+injected), map[string]string{"kubelet" + injected: "x"}, "kubelet" + injected, false},
		{"tab in uid", source("u"+injected, "1", "kubelet"), map[string]string{"kubelet": "x"}, "u" + injected, false},
		{"tab in resourceVersion", source("u", "1"+injected, "kubelet"), map[string]string{"kubelet": "x"}, "1" + injected, false},
		{"tab in another file", source("u", "1", "kubelet"), map[string]string{"kubelet": "x", "ca" + injected: "x"}, "ca" + injected, true},
		{"vertical tab in key", source("u", "1", "kubelet\v--x"), map[string]string{"kubelet\v--x": "x"}, "kubelet\v--x", false},
		{"dollar in resourceVersion", source("u", "$X", "kubelet"), map[string]string{"kubelet": "x"}, "$X", false},
		{"uppercase uid", source("U", "1", "kubelet"), map[string]string{"kubelet": "x"}, "U", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t)
			want := fmt.Sprintf("%q", tc.offender)
			check := func(op string, err error) {
				t.Helper()
				if err == nil {
					t.Errorf("%s accepted %q", op, tc.offender)
				} else if !strings.Contains(err.Error(), want) {
					t.Errorf("%s: error %q does not name %s", op, err, want)
				}
			}
			src := tc.src
			wire := &dkcv1.Assignment{Source: &dkcv1.NodeConfigSource{ConfigMap: &dkcv1.ConfigMapNodeConfigSource{
				Namespace: "kube-system", Name: "c", Uid: string(src.ConfigMap.UID), ResourceVersion: src.ConfigMap.ResourceVersion, KubeletConfigKey: src.ConfigMap.KubeletConfigKey}},
				Files: tc.files}
			wire.ContentHash = payload.Hash(wire.Source.ConfigMap, tc.files)
			check("Save", s.Save(wire))
			if _, err := os.ReadDir(filepath.Join(s.Dir(), "checkpoints", string(src.ConfigMap.UID))); err == nil {
				t.Errorf("Save created a checkpoint directory for a refused payload")
			}
			if tc.goodSource {
				return // only one of the payload's other files is bad
			}
			check("SetAssigned", s.SetAssigned(src))
			check("SetLastKnownGood", s.SetLastKnownGood(src))
			_, err := s.Exists(src.ConfigMap)
			check("Exists", err)
			// A meta file with such a name (written by hand, or by an older sidecar) is not trusted either.
			rec := fmt.Sprintf("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: SerializedNodeConfigSource\nsource:\n  configMap:\n    uid: %q\n    resourceVersion: %q\n    kubeletConfigKey: %q\n",
				src.ConfigMap.UID, src.ConfigMap.ResourceVersion, src.ConfigMap.KubeletConfigKey)
			_, err = DecodeRecord([]byte(rec))
			check("DecodeRecord", err)
			if a, err := s.Assigned(); err != nil || a != nil {
				t.Errorf("meta/assigned = %v, %v after refused writes; want local", a, err)
			}
		})
	}
}

func TestGC(t *testing.T) {
	s := newStore(t)
	var srcs []*corev1.NodeConfigSource
	for i, rv := range []string{"1", "2", "3", "4", "5"} {
		a := assignment("uid-a", rv, map[string]string{"kubelet": rv})
		if err := s.Save(a); err != nil {
			t.Fatal(err)
		}
		srcs = append(srcs, SourceOf(a))
		// distinct mtimes, oldest first
		ts := time.Now().Add(time.Duration(i-10) * time.Minute)
		_ = os.Chtimes(s.CheckpointDir(srcs[i].ConfigMap), ts, ts)
	}
	other := assignment("uid-b", "9", map[string]string{"kubelet": "b"})
	if err := s.Save(other); err != nil {
		t.Fatal(err)
	}
	ts := time.Now().Add(-time.Hour)
	_ = os.Chtimes(s.CheckpointDir(SourceOf(other).ConfigMap), ts, ts)
	// Keep rv 1 (e.g. last-known-good) and rv 5 (assigned), plus the newest other one (rv 4).
	removed, err := s.GC([]*corev1.NodeConfigSource{srcs[0], srcs[4], nil}, 1)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"uid-a/3": true, "uid-a/2": true, "uid-b/9": true}
	if len(removed) != len(want) {
		t.Fatalf("removed %v, want %v", removed, want)
	}
	for _, r := range removed {
		if !want[r] {
			t.Errorf("removed %s unexpectedly", r)
		}
	}
	for _, keep := range []*corev1.NodeConfigSource{srcs[0], srcs[3], srcs[4]} {
		if ok, _ := s.Exists(keep.ConfigMap); !ok {
			t.Errorf("checkpoint %s removed", keep.ConfigMap.ResourceVersion)
		}
	}
	if _, err := os.Stat(filepath.Join(s.Dir(), "checkpoints", "uid-b")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("empty uid dir left: %v", err)
	}
}

// TestCrashAtEveryStep fails each write at each durable step, as a crash would, then restarts the store:
// the old state must be intact, the new one absent or complete, and no temp file may survive Initialize.
func TestCrashAtEveryStep(t *testing.T) {
	steps := []string{"write", "fsync", "rename", "fsync-dir"}
	crash := errors.New("injected crash")
	t.Cleanup(func() { durable.SetFault(nil) })
	kills := 0
	for _, step := range steps {
		for _, op := range []string{"save", "assign"} {
			s := newStore(t)
			old := assignment("uid-old", "1", map[string]string{"kubelet": "old"})
			if err := s.Save(old); err != nil {
				t.Fatal(err)
			}
			if err := s.SetAssigned(SourceOf(old)); err != nil {
				t.Fatal(err)
			}
			next := assignment("uid-new", "2", map[string]string{"kubelet": "new", "extra": "e"})
			if op == "assign" {
				if err := s.Save(next); err != nil {
					t.Fatal(err)
				}
			}
			durable.SetFault(func(st, _ string) error {
				if st == step {
					return crash
				}
				return nil
			})
			var err error
			if op == "save" {
				err = s.Save(next)
			} else {
				err = s.SetAssigned(SourceOf(next))
			}
			durable.SetFault(nil)
			if !errors.Is(err, crash) {
				t.Fatalf("%s at %s: err = %v, want the injected crash", op, step, err)
			}
			kills++
			// "Restart".
			s2 := New(s.Dir())
			if _, err := s2.Initialize(); err != nil {
				t.Fatal(err)
			}
			assigned, err := s2.Assigned()
			if err != nil {
				t.Fatalf("%s at %s: meta/assigned unreadable after crash: %v", op, step, err)
			}
			uid := string(UIDOf(assigned))
			if uid != "uid-old" && uid != "uid-new" {
				t.Fatalf("%s at %s: assigned = %q", op, step, uid)
			}
			if files, err := s2.Files(assigned.ConfigMap); err != nil || len(files) == 0 {
				t.Fatalf("%s at %s: assigned points at an incomplete checkpoint: %v %v", op, step, files, err)
			}
			if ok, _ := s2.Exists(SourceOf(next).ConfigMap); ok {
				if files, _ := s2.Files(SourceOf(next).ConfigMap); len(files) != 2 {
					t.Fatalf("%s at %s: new checkpoint present but incomplete: %v", op, step, files)
				}
			}
			_ = filepath.Walk(s.Dir(), func(p string, _ os.FileInfo, _ error) error {
				if strings.HasPrefix(filepath.Base(p), durable.TempPrefix) {
					t.Errorf("%s at %s: temp file survived Initialize: %s", op, step, p)
				}
				return nil
			})
		}
	}
	t.Logf("%d injected crashes at %d distinct points", kills, len(steps)*2)
}

// The store caches meta records; what it returns must always be what is on disk, including after a write
// that failed half-way, and callers must not be able to change the cache through a returned record.
func TestRecordCacheFollowsDisk(t *testing.T) {
	s := newStore(t)
	a := SourceOf(assignment("uid-1", "1", map[string]string{"kubelet": "x"}))
	b := SourceOf(assignment("uid-2", "2", map[string]string{"kubelet": "y"}))
	if err := s.SetAssigned(a); err != nil {
		t.Fatal(err)
	}
	got, _ := s.Assigned()
	got.ConfigMap.Name = "changed-by-caller"
	if again, _ := s.Assigned(); again.ConfigMap.Name != "c" {
		t.Errorf("a caller changed the cached record: %+v", again.ConfigMap)
	}
	// A write that fails after its rename (the directory fsync) leaves the new record on disk.
	durable.SetFault(func(step, _ string) error {
		if step == "fsync-dir" {
			return errors.New("injected")
		}
		return nil
	})
	err := s.SetAssigned(b)
	durable.SetFault(nil)
	if err == nil {
		t.Fatal("no error from the failed write")
	}
	onDisk, err := New(s.Dir()).Assigned()
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Assigned(); !reflect.DeepEqual(got, onDisk) {
		t.Errorf("after a failed write Assigned() = %+v; disk has %+v", got, onDisk)
	}
	if err := s.SetLastKnownGood(nil); err != nil {
		t.Fatal(err)
	}
	if got, err := s.LastKnownGood(); got != nil || err != nil {
		t.Errorf("LastKnownGood() after setting local = %+v, %v", got, err)
	}
}

// TestNewDirectoriesAreSyncedIntoTheirParents: the directories the store creates (its layout at
// Initialize, checkpoints/<uid> at the first Save of a ConfigMap) are synced into their parents, or a power
// loss could lose them together with the checkpoints durably written inside.
func TestNewDirectoriesAreSyncedIntoTheirParents(t *testing.T) {
	root := t.TempDir()
	s := New(filepath.Join(root, "dynamic-config"))
	synced := map[string]bool{}
	durable.SetFault(func(step, path string) error {
		if step == "fsync-dir" {
			rel, _ := filepath.Rel(root, path)
			synced[rel] = true
		}
		return nil
	})
	t.Cleanup(func() { durable.SetFault(nil) })
	if _, err := s.Initialize(); err != nil {
		t.Fatal(err)
	}
	if err := s.Save(assignment("uid-1", "1", map[string]string{"kubelet": "x"})); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"dynamic-config", "dynamic-config/meta", "dynamic-config/checkpoints", "dynamic-config/checkpoints/uid-1"} {
		if !synced[d] {
			t.Errorf("%s created without syncing its parent (synced: %v)", d, synced)
		}
	}
}

// TestRemove: Remove takes one checkpoint away (its UID directory once empty), leaves the UID's others,
// is a no-op for one not there, and refuses a source that is not one path segment each.
func TestRemove(t *testing.T) {
	cm := func(uid, rv string) *corev1.ConfigMapNodeConfigSource {
		return wire.SourceToCore(assignment(uid, rv, nil).GetSource()).ConfigMap
	}
	for _, tc := range []struct {
		name     string
		saved    [][2]string // uid, resourceVersion
		remove   *corev1.ConfigMapNodeConfigSource
		wantErr  bool
		wantLeft []string // the checkpoints left, "uid/rv", and UID directories, "uid"
	}{
		{name: "the only checkpoint of its UID", saved: [][2]string{{"u", "1"}}, remove: cm("u", "1")},
		{name: "one of two of its UID", saved: [][2]string{{"u", "1"}, {"u", "2"}}, remove: cm("u", "1"),
			wantLeft: []string{"u", "u/2"}},
		{name: "one not there", saved: [][2]string{{"u", "1"}}, remove: cm("v", "1"), wantLeft: []string{"u", "u/1"}},
		{name: "a resourceVersion that is no path segment", saved: [][2]string{{"u", "1"}}, remove: cm("u", ".."),
			wantErr: true, wantLeft: []string{"u", "u/1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t)
			for _, sv := range tc.saved {
				if err := s.Save(assignment(sv[0], sv[1], map[string]string{"kubelet": "x"})); err != nil {
					t.Fatal(err)
				}
			}
			if err := s.Remove(tc.remove); (err != nil) != tc.wantErr {
				t.Errorf("Remove: %v, want error %v", err, tc.wantErr)
			}
			var left []string
			root := filepath.Join(s.Dir(), "checkpoints")
			_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
				if err != nil || !d.IsDir() || p == root {
					return err
				}
				rel, _ := filepath.Rel(root, p)
				left = append(left, filepath.ToSlash(rel))
				if strings.Count(rel, string(filepath.Separator)) == 1 {
					return filepath.SkipDir
				}
				return nil
			})
			if !reflect.DeepEqual(left, tc.wantLeft) {
				t.Errorf("left %v, want %v", left, tc.wantLeft)
			}
		})
	}
}
