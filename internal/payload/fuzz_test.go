// SPDX-License-Identifier: Apache-2.0

package payload

import (
	"path/filepath"
	"strings"
	"testing"
)

// FuzzValidateFileName: an accepted name joins to a path directly inside the directory, never elsewhere, and
// holds no byte that systemd or a shell would split on or interpret.
func FuzzValidateFileName(f *testing.F) {
	for _, s := range []string{"kubelet", "", ".", "..", "../x", "/etc/passwd", "a/b", `a\b`, "a\x00b", strings.Repeat("x", 300), "..kubelet", "\xff\xfe", "kubelet\t--authorization-mode=AlwaysAllow", "a$b", "a%nb"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		if ValidateFileName(name) != nil {
			return
		}
		dir := "/var/lib/kubelet/dynamic-config/checkpoints/u/1"
		if got := filepath.Dir(filepath.Join(dir, name)); got != dir {
			t.Fatalf("accepted %q escapes to %s", name, got)
		}
		if filepath.Base(name) != name || strings.ContainsRune(name, 0) {
			t.Fatalf("accepted %q is not a plain file name", name)
		}
		if i := strings.IndexFunc(name, func(r rune) bool {
			return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-._", r))
		}); i >= 0 {
			t.Fatalf("accepted %q has %q at byte %d", name, name[i], i)
		}
	})
}
