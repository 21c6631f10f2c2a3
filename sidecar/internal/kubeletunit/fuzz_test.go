// SPDX-License-Identifier: Apache-2.0

package kubeletunit

import (
	"bytes"
	"os"
	"strings"
	"testing"
	"unicode"
)

// FuzzEnvFileSet: for any string, Set either refuses it — leaving the file as it was — or writes a file that
// gives the kubelet exactly one argument, --config=<the string>, by systemd's rules and by Get.
func FuzzEnvFileSet(f *testing.F) {
	for _, s := range []string{
		"/var/lib/kubelet/config.yaml",
		"/var/lib/kubelet/dynamic-config/checkpoints/0f8e5c1a-8d4b-4c1e-9a3e-6f2b7d9c1e42/1326/kubelet",
		"/a\t--authorization-mode=AlwaysAllow",
		"/a --authorization-mode=AlwaysAllow",
		"/a\nKUBELET_EXTRA_ARGS=--x",
		"/a\r--x", "/a\v--x", "/a\f--x", "/a\u00a0--x", "/a\u2028--x",
		`/a" --x "`, "/a' --x '", `/a\ --x`, "/a\\", "/a${X}", "/a$X", "/a%n", "/a`id`", "/a\x00--x", "/a\xff",
		"", "relative", "-", "/",
	} {
		f.Add(s)
	}
	// One file for the whole run, as on a node: a refused Set must leave whatever an earlier one wrote.
	e := New(f.TempDir())
	f.Fuzz(func(t *testing.T, path string) {
		before, _ := os.ReadFile(e.Path)
		if err := e.Set(path); err != nil {
			if after, _ := os.ReadFile(e.Path); !bytes.Equal(before, after) {
				t.Fatalf("refused Set(%q) changed the file from %q to %q", path, before, after)
			}
			return
		}
		data, err := os.ReadFile(e.Path)
		if err != nil {
			t.Fatal(err)
		}
		if args := systemdArgs(t, data); len(args) != 1 || args[0] != "--config="+path {
			t.Fatalf("Set(%q) gives the kubelet %q", path, args)
		}
		if got, err := e.Get(); err != nil || got != path {
			t.Fatalf("Get after Set(%q) = %q, %v", path, got, err)
		}
	})
}

// systemdArgs is what `ExecStart=kubelet $KUBELET_CONFIG_ARGS` becomes with the env file data, modelled
// independently of the code under test and conservatively: lines end at "\n", "\r" or NUL (systemd's
// read_line); a value systemd would unquote, unescape, continue, expand or refuse (quotes, backslash, "$",
// "%", control or non-ASCII bytes) fails the test instead of being modelled; the value is split on systemd's
// WHITESPACE (" \t\n\r") and, stricter, on every other Unicode space.
func systemdArgs(t *testing.T, data []byte) []string {
	t.Helper()
	var values []string
	for _, line := range strings.FieldsFunc(string(data), func(r rune) bool { return r == '\n' || r == '\r' || r == 0 }) {
		line = strings.TrimLeftFunc(line, unicode.IsSpace)
		if line == "" || line[0] == '#' || line[0] == ';' {
			continue
		}
		key, value, ok := strings.Cut(line, "=")
		if !ok || strings.TrimSpace(key) != Variable {
			t.Fatalf("env file line %q sets something other than %s", line, Variable)
		}
		for i := 0; i < len(value); i++ {
			if c := value[i]; c < 0x20 && c != '\t' || c >= 0x7f || strings.IndexByte("\"'\\$%`", c) >= 0 {
				t.Fatalf("systemd would reinterpret %q (byte %d)", value, i)
			}
		}
		values = append(values, value)
	}
	if len(values) != 1 {
		t.Fatalf("env file sets %s %d times:\n%s", Variable, len(values), data)
	}
	return strings.FieldsFunc(values[0], func(r rune) bool { return strings.ContainsRune(" \t\n\r", r) || unicode.IsSpace(r) })
}
