// SPDX-License-Identifier: Apache-2.0

package kubeletunit

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

func TestEnvFile(t *testing.T) {
	dir := t.TempDir()
	e := New(dir)
	if got, err := e.Get(); err != nil || got != "" {
		t.Fatalf("missing file: %q, %v", got, err)
	}
	for _, p := range []string{"/var/lib/kubelet/config.yaml", dir + "/checkpoints/u/1/kubelet"} {
		if err := e.Set(p); err != nil {
			t.Fatal(err)
		}
		if got, err := e.Get(); err != nil || got != p {
			t.Fatalf("Get = %q, %v; want %q", got, err, p)
		}
	}
	data, _ := os.ReadFile(e.Path)
	if !strings.Contains(string(data), "KUBELET_CONFIG_ARGS=--config="+dir+"/checkpoints/u/1/kubelet\n") {
		t.Errorf("env file:\n%s", data)
	}
	if !strings.Contains(DropIn("/var/lib/kubelet/dynamic-config"), "EnvironmentFile=-/var/lib/kubelet/dynamic-config/kubelet.env") {
		t.Error("drop-in does not read the env file")
	}
}

// TestSetRefuses: a path that systemd (or sh) would split, unquote or expand is never written, the error
// names it, and the file keeps what it had.
func TestSetRefuses(t *testing.T) {
	const good = "/var/lib/kubelet/dynamic-config/checkpoints/u/1/kubelet"
	for _, tc := range []struct {
		name, path string
	}{
		{"empty", ""},
		{"relative", "config.yaml"},
		{"tab", good + "\t--authorization-mode=AlwaysAllow"},
		{"space", good + " --authorization-mode=AlwaysAllow"},
		{"newline", good + "\nKUBELET_EXTRA_ARGS=--x"},
		{"carriage return", good + "\r--x"},
		{"vertical tab", good + "\v--x"},
		{"form feed", good + "\f--x"},
		{"no-break space", good + "\u00a0--x"},
		{"NUL", good + "\x00"},
		{"double quote", good + `"`},
		{"single quote", good + "'"},
		{"backslash", good + `\`},
		{"dollar", good + "$KUBELET_EXTRA_ARGS"},
		{"specifier", good + "%n"},
		{"backquote", good + "`id`"},
		{"semicolon", good + ";id"},
		{"glob", good + "*"},
		{"non-ASCII", good + "é"},
		{"invalid UTF-8", good + "\xff"},
		{"DEL", good + "\x7f"},
		{"too long", "/" + strings.Repeat("a", MaxPathLength)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := New(t.TempDir())
			if err := e.Set(good); err != nil {
				t.Fatal(err)
			}
			err := e.Set(tc.path)
			if err == nil {
				t.Fatalf("Set(%q) accepted", tc.path)
			}
			if want := fmt.Sprintf("%q", tc.path); len(tc.path) <= MaxPathLength && !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not name %s", err, want)
			}
			if got, err := e.Get(); err != nil || got != good {
				t.Errorf("after a refused Set, Get = %q, %v; want %q", got, err, good)
			}
		})
	}
}

// TestGetRefuses: an env file that would not give the kubelet exactly one --config argument, whoever wrote
// it, is an error rather than a path.
func TestGetRefuses(t *testing.T) {
	for _, tc := range []struct {
		name, content string
	}{
		{"no variable", "# nothing\n"},
		{"set twice", Variable + "=--config=/a\n" + Variable + "=--config=/b\n"},
		{"not --config", Variable + "=--kubeconfig=/a\n"},
		{"second flag after a tab", Variable + "=--config=/a\t--authorization-mode=AlwaysAllow\n"},
		{"second flag after a space", Variable + "=--config=/a --authorization-mode=AlwaysAllow\n"},
		{"quoted", Variable + `="--config=/a"` + "\n"},
		{"line continuation", Variable + "=--config=/a\\\n--x\n"},
		{"expansion", Variable + "=--config=/a${EXTRA}\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := New(t.TempDir())
			if err := os.WriteFile(e.Path, []byte(tc.content), 0o644); err != nil {
				t.Fatal(err)
			}
			if got, err := e.Get(); err == nil {
				t.Errorf("Get = %q from %q, want an error", got, tc.content)
			} else if !strings.Contains(err.Error(), filepath.Base(e.Path)) {
				t.Errorf("error %q does not name the file", err)
			}
		})
	}
}

func TestCommandLine(t *testing.T) {
	proc := t.TempDir()
	for _, tc := range []struct {
		name string
		raw  string
		want []string
	}{
		{"flags", "/usr/bin/kubelet\x00--config=/var/lib/kubelet/config.yaml\x00--v=2\x00", []string{"/usr/bin/kubelet", "--config=/var/lib/kubelet/config.yaml", "--v=2"}},
		{"empty argument kept", "/usr/bin/kubelet\x00\x00--v=2\x00", []string{"/usr/bin/kubelet", "", "--v=2"}},
		{"exited", "", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pid := len(tc.raw) + 100
			if err := os.MkdirAll(filepath.Join(proc, strconv.Itoa(pid)), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(proc, strconv.Itoa(pid), "cmdline"), []byte(tc.raw), 0o644); err != nil {
				t.Fatal(err)
			}
			got, err := CommandLine(proc, pid)
			if err != nil || !slices.Equal(got, tc.want) || (got == nil) != (tc.want == nil) {
				t.Errorf("CommandLine = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
	if _, err := CommandLine(proc, 1); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("no such process: %v, want ErrNotExist", err)
	}
}
