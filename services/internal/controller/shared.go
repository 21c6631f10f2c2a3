// SPDX-License-Identifier: Apache-2.0

package controller

import (
	"sync"

	corev1 "k8s.io/api/core/v1"

	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
	"github.com/dkc-dev/dkc/services/internal/resolve"
)

// shared holds one resolved Assignment per ConfigMap source in use, so that 2,000 nodes on one ConfigMap
// version hold one copy of its data (up to 1 MiB) and one hash computation. It holds a source only while
// some node's source names it: with hash-suffixed ConfigMaps (kubectl --append-hash, kustomize) every edit
// is a new name, and keeping every name ever used would grow without end. Only the latest version of a
// source is kept, and none once its ConfigMap is gone: nodes still on an older version hold it through the
// assignment table until they are resolved again.
type shared struct {
	mu     sync.Mutex
	byNode map[string]string       // node → the source key its source names
	byKey  map[string]*sharedEntry // by source key
}

type sharedEntry struct {
	assignment *dkcv1.Assignment // nil until resolved, and again once the ConfigMap is gone
	nodes      int
	// checked is what the snapshot check last ran on (ConfigMap version and pool record), checkErr its result.
	checked  string
	checkErr error
}

func newShared() *shared {
	return &shared{byNode: map[string]string{}, byKey: map[string]*sharedEntry{}}
}

// sourceKey names a ConfigMap source as "namespace/name/kubeletConfigKey".
func sourceKey(ref *corev1.ConfigMapNodeConfigSource) string {
	return ref.Namespace + "/" + ref.Name + "/" + ref.KubeletConfigKey
}

// use records that node's source names key ("" for none: local config, invalid source, node deleted), and
// drops a source no node names any more.
func (s *shared) use(node, key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	old, ok := s.byNode[node]
	if ok && old == key {
		return
	}
	if ok {
		if e := s.byKey[old]; e != nil {
			e.nodes--
			if e.nodes <= 0 {
				delete(s.byKey, old)
			}
		}
		delete(s.byNode, node)
	}
	if key == "" {
		return
	}
	s.byNode[node] = key
	e := s.byKey[key]
	if e == nil {
		e = &sharedEntry{}
		s.byKey[key] = e
	}
	e.nodes++
}

// resolve returns the shared Assignment of the ConfigMap's current version, resolving it on first use
// and replacing the one of an older version. A source no node uses (released meanwhile) is resolved but
// not kept.
func (s *shared) resolve(ref *corev1.ConfigMapNodeConfigSource, cm *corev1.ConfigMap) (*dkcv1.Assignment, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.byKey[sourceKey(ref)]
	if e != nil && e.assignment != nil {
		got := e.assignment.GetSource().GetConfigMap()
		if got.GetUid() == string(cm.UID) && got.GetResourceVersion() == cm.ResourceVersion {
			return e.assignment, nil
		}
	}
	a, err := resolve.Assignment(ref, cm)
	if err != nil {
		return nil, err
	}
	if e != nil {
		e.assignment = a
	}
	return a, nil
}

// check returns verify's result, run once per memo (what the result depends on) while a node uses the
// source; a source no node uses is checked every time.
func (s *shared) check(ref *corev1.ConfigMapNodeConfigSource, memo string, verify func() error) error {
	s.mu.Lock()
	if e := s.byKey[sourceKey(ref)]; e != nil && e.checked == memo {
		err := e.checkErr
		s.mu.Unlock()
		return err
	}
	s.mu.Unlock()
	err := verify()
	s.mu.Lock()
	if e := s.byKey[sourceKey(ref)]; e != nil {
		e.checked, e.checkErr = memo, err
	}
	s.mu.Unlock()
	return err
}

// gone drops the resolved data of a source whose ConfigMap no longer exists; the nodes naming it still count.
func (s *shared) gone(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.byKey[key]; e != nil {
		e.assignment = nil
	}
}

// size is the number of ConfigMap versions held resolved.
func (s *shared) size() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, e := range s.byKey {
		if e.assignment != nil {
			n++
		}
	}
	return n
}
