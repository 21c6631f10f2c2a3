// SPDX-License-Identifier: Apache-2.0

package checkpoint

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dkc-dev/dkc/internal/payload"
	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
)

// FuzzSave feeds hostile payloads (as a malicious service could) to a real store: whatever is accepted is
// written completely and only inside the dynamic config dir; nothing else is ever created.
func FuzzSave(f *testing.F) {
	f.Add("uid-1", "1", "kubelet", "kubelet", "kind: KubeletConfiguration", true)
	f.Add("../..", "1", "kubelet", "kubelet", "x", true)
	f.Add("u", "..", "kubelet", "kubelet", "x", true)
	f.Add("u", "1", "kubelet", "../../etc/passwd", "x", true)
	f.Add("u", "1", "/abs", "/abs", "x", true)
	f.Add("u", "1", "k", "a\x00b", "x", true)
	f.Add("u", "1", "k", "k", "x", false)
	f.Fuzz(func(t *testing.T, uid, rv, key, name, content string, goodHash bool) {
		root := t.TempDir()
		dir := filepath.Join(root, "dc")
		s := New(dir)
		if _, err := s.Initialize(); err != nil {
			t.Fatal(err)
		}
		src := &dkcv1.ConfigMapNodeConfigSource{Namespace: "ns", Name: "n", Uid: uid, ResourceVersion: rv, KubeletConfigKey: key}
		files := map[string]string{name: content}
		hash := payload.Hash(src, files)
		if !goodHash {
			hash = "sha256:bad"
		}
		err := s.Save(&dkcv1.Assignment{Source: &dkcv1.NodeConfigSource{ConfigMap: src}, Files: files, ContentHash: hash})
		// Nothing outside dir, ever.
		entries, _ := os.ReadDir(root)
		if len(entries) != 1 || entries[0].Name() != "dc" {
			t.Fatalf("payload (%q,%q,%q) wrote outside the dir: %v", uid, rv, name, entries)
		}
		if err != nil {
			return
		}
		cm := SourceOf(&dkcv1.Assignment{Source: &dkcv1.NodeConfigSource{ConfigMap: src}}).ConfigMap
		got, err := s.Files(cm)
		if err != nil || got[name] != content || len(got) != 1 {
			t.Fatalf("accepted payload not stored completely: %v %v", got, err)
		}
		if !strings.HasPrefix(s.CheckpointDir(cm), filepath.Join(dir, "checkpoints")+string(filepath.Separator)) {
			t.Fatalf("checkpoint dir %s outside the store", s.CheckpointDir(cm))
		}
	})
}

// FuzzDecodeRecord: a corrupt or hostile meta file is an error, never a panic, and never names a path
// outside the store.
func FuzzDecodeRecord(f *testing.F) {
	f.Add([]byte("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: SerializedNodeConfigSource\nsource:\n  configMap:\n    uid: u\n    resourceVersion: \"1\"\n    kubeletConfigKey: k\n"))
	f.Add([]byte(""))
	f.Add([]byte("{{{"))
	f.Add([]byte("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: SerializedNodeConfigSource\nsource:\n  configMap:\n    uid: ../..\n    resourceVersion: \"1\"\n    kubeletConfigKey: k\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		src, err := DecodeRecord(data)
		if err != nil || src == nil {
			return
		}
		s := New("/store")
		if !strings.HasPrefix(s.ConfigFile(src.ConfigMap), "/store/checkpoints/") || strings.Contains(s.ConfigFile(src.ConfigMap), "/../") {
			t.Fatalf("record names %s", s.ConfigFile(src.ConfigMap))
		}
	})
}
