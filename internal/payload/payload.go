// SPDX-License-Identifier: Apache-2.0

// Package payload defines what a delivered config is made of on both sides of the wire: the content hash
// the service stamps on an assignment and the sidecar verifies, and the rules a ConfigMap's data keys, UID
// and resourceVersion must follow to become path elements of a checkpoint.
package payload

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
)

// HashPrefix marks the hash algorithm so that it can change without ambiguity.
const HashPrefix = "sha256:"

// Hash is the content hash of a resolved ConfigMap source and its files: sha256 over the source fields and
// the files sorted by name, each length-prefixed so that no two different inputs share an encoding.
func Hash(src *dkcv1.ConfigMapNodeConfigSource, files map[string]string) string {
	h := sha256.New()
	write := func(s string) {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(s)))
		h.Write(n[:])
		h.Write([]byte(s))
	}
	write(src.GetNamespace())
	write(src.GetName())
	write(src.GetUid())
	write(src.GetResourceVersion())
	write(src.GetKubeletConfigKey())
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		write(name)
		write(files[name])
	}
	return HashPrefix + hex.EncodeToString(h.Sum(nil))
}

// The names below arrive from the wire and become path elements of checkpoints/<uid>/<resourceVersion>/<key>,
// and that path becomes the value of the kubelet's --config flag in an environment file that systemd splits
// into arguments. So each is held to the characters the Kubernetes API itself gives such a name and nothing
// more: a name with a tab, a quote or a "$" would otherwise add kubelet flags that were never validated. The
// apiserver already enforces these rules; a node checks again because it must not trust the wire.

// MaxResourceVersionLength bounds a resourceVersion. etcd3 revisions are int64 (at most 19 digits); the rest
// is headroom for other storage, not an invitation to long names.
const MaxResourceVersionLength = 64

// maxQuoted is how much of an offending name an error repeats, so that a hostile 1 MiB name does not end up
// in a Node's status.
const maxQuoted = 64

// quote is %q of s, shortened when s is long.
func quote(s string) string {
	if len(s) > maxQuoted {
		return fmt.Sprintf("%q... (%d bytes)", s[:maxQuoted], len(s))
	}
	return fmt.Sprintf("%q", s)
}

// ValidateFileName checks that a ConfigMap data key (and so the kubeletConfigKey) is one the apiserver
// accepts — [-._a-zA-Z0-9]+, at most 253 bytes, not "." or "..", not starting with ".." — which makes it
// exactly one plain file name inside a checkpoint directory and one shell- and systemd-inert word.
func ValidateFileName(name string) error {
	if errs := validation.IsConfigMapKey(name); len(errs) > 0 {
		return fmt.Errorf("file name %s is not a valid ConfigMap key: %s", quote(name), strings.Join(errs, "; "))
	}
	return nil
}

// ValidateUID checks a ConfigMap UID. The apiserver generates UIDs itself (RFC 4122 text: lowercase hex and
// "-", 36 bytes) and ignores any a client sends, so a lowercase RFC 1123 label (a-z, 0-9, "-", at most 63
// bytes, alphanumeric at both ends) takes every real UID while refusing ".", "..", separators, whitespace
// and the temp-file prefix of package durable.
func ValidateUID(uid string) error {
	if errs := validation.IsDNS1123Label(uid); len(errs) > 0 {
		return fmt.Errorf("uid %s is not a UID the apiserver generates (lowercase letters, digits and '-', at most %d bytes)",
			quote(uid), validation.DNS1123LabelMaxLength)
	}
	return nil
}

// ValidateResourceVersion checks a ConfigMap resourceVersion. The API calls it opaque, but on etcd3 it is
// the decimal revision; accepting only ASCII letters, digits and "-" (at most MaxResourceVersionLength
// bytes) leaves room for other storage while keeping ".", "..", separators and anything systemd or a shell
// would interpret out.
func ValidateResourceVersion(rv string) error {
	ok := rv != "" && len(rv) <= MaxResourceVersionLength
	for i := 0; ok && i < len(rv); i++ {
		c := rv[i]
		ok = c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '-'
	}
	if !ok {
		return fmt.Errorf("resourceVersion %s is not ASCII letters, digits and '-' of at most %d bytes",
			quote(rv), MaxResourceVersionLength)
	}
	return nil
}
