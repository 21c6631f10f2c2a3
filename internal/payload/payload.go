// Package payload defines what a delivered config is made of on both sides of the wire: the content hash
// the service stamps on an assignment and the sidecar verifies, and the rules a ConfigMap data key must
// follow to become a file name in a checkpoint.
package payload

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"sort"
	"strings"

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

// MaxFileNameLength is the longest file name most Linux filesystems take.
const MaxFileNameLength = 255

// ValidateFileName checks that a ConfigMap data key can be written as one file inside a checkpoint
// directory and nowhere else: not empty, not "." or "..", no path separator, no NUL, at most 255 bytes.
// (The apiserver already restricts keys to [-._a-zA-Z0-9]+; a node still checks, because it must not trust
// the wire.)
func ValidateFileName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("empty file name")
	case name == "." || name == "..":
		return fmt.Errorf("file name %q is not allowed", name)
	case len(name) > MaxFileNameLength:
		return fmt.Errorf("file name of %d bytes is longer than %d", len(name), MaxFileNameLength)
	case strings.ContainsAny(name, "/\\\x00"):
		return fmt.Errorf("file name %q contains a path separator or NUL", name)
	}
	return nil
}
