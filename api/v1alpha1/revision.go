// SPDX-License-Identifier: Apache-2.0

package v1alpha1

import (
	"crypto/sha256"
	"encoding/binary"
	"sort"
	"strings"
)

// A pool's config is rolled out as revisions: the content of its ConfigMap at one moment, frozen into an
// immutable snapshot ConfigMap named SnapshotName(pool, revision). dkc-server creates them; kubectl-dkc
// computes the revision of a ConfigMap to know which one a rollout waits for, and names snapshots for undo.

// RevisionNameLength is the length of a revision's name.
const RevisionNameLength = 10

// alphabet is the one Kubernetes uses for generated names (k8s.io/apimachinery/pkg/util/rand): lower-case
// consonants and digits without vowels or look-alikes (0, 1, 3), so a name is a DNS label and never a word.
const alphabet = "bcdfghjklmnpqrstvwxz2456789"

// RevisionName is the revision of a config: a hash of the ConfigMap's namespace, the kubelet config key and every
// data entry. Equal content gives the same name on every replica and after every restart (so a snapshot is
// created once, and an undo to earlier content finds the earlier snapshot); the ConfigMap's name, UID and
// ResourceVersion are not part of it, so an edit that restores earlier content is the earlier revision.
// The namespace is, as the snapshot lives there: a pool moved to equal content in another namespace gets
// a new revision with its own snapshot, instead of keeping the old revision's name (and its failures)
// for a source that is not the one its nodes run. binaryData is left out,
// as dkc leaves it out of what a node receives (resolve.Assignment).
//
// Ten characters of a 27-letter alphabet are 47 bits: a collision between two of one pool's revisions is
// out of reach (a Deployment's pod-template-hash has 32).
func RevisionName(namespace, kubeletConfigKey string, data map[string]string) string {
	h := sha256.New()
	// Length prefixes keep ("ab","c") and ("a","bc") apart.
	write := func(s string) {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(s)))
		h.Write(n[:])
		h.Write([]byte(s))
	}
	write(namespace)
	write(kubeletConfigKey)
	keys := make([]string, 0, len(data))
	for k := range data {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		write(k)
		write(data[k])
	}
	sum := h.Sum(nil)
	var b strings.Builder
	for _, c := range sum[:RevisionNameLength] {
		b.WriteByte(alphabet[int(c)%len(alphabet)])
	}
	return b.String()
}

// SnapshotName is the name of pool's snapshot ConfigMap of revision: "<pool>-<revision>". A pool's name
// is at most 63 characters (the CRD's rule), so this is a valid ConfigMap name of at most 74.
func SnapshotName(pool, revision string) string { return pool + "-" + revision }
