// SPDX-License-Identifier: Apache-2.0

package devclustertest

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
)

func TestRecap(t *testing.T) {
	for _, tc := range []struct {
		name, output, want string
	}{{
		name: "-v: the failing test's lines before its diagnosis",
		output: `=== RUN   TestA
    a_test.go:1: a said
--- PASS: TestA (1.00s)
=== RUN   TestB
    b_test.go:7: kubelets: map[node-1:1.34]
=== RUN   TestB/sub
    b_test.go:9: sub said
    --- FAIL: TestB/sub (0.10s)
    b_test.go:12: node node-1: active local
    diagnose_test.go:49: ` + DiagnosisMarker + `
    diagnose_test.go:55: --- nodes
--- FAIL: TestB (0.96s)
=== RUN   TestC
    c_test.go:3: c failed too
--- FAIL: TestC (0.01s)
FAIL
`,
		want: `first failure: TestB; its last 4 lines before any diagnosis:
    b_test.go:7: kubelets: map[node-1:1.34]
    b_test.go:9: sub said
    --- FAIL: TestB/sub (0.10s)
    b_test.go:12: node node-1: active local
`,
	}, {
		name: "without -v: the lines after the FAIL line",
		output: `--- FAIL: TestB (0.96s)
    b_test.go:12: node node-1: active local
    diagnose_test.go:49: ` + DiagnosisMarker + `
    diagnose_test.go:55: --- nodes
--- FAIL: TestC (0.01s)
    c_test.go:3: c failed too
FAIL
`,
		want: `first failure: TestB; its last 1 lines before any diagnosis:
    b_test.go:12: node node-1: active local
`,
	}, {
		name:   "all passed",
		output: "=== RUN   TestA\n    a_test.go:1: a said\n--- PASS: TestA (1.00s)\nPASS\n",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			var r recap
			// Written in uneven pieces, as a pipe delivers them.
			for out := tc.output; out != ""; {
				n := min(len(out), 7)
				_, _ = r.Write([]byte(out[:n]))
				out = out[n:]
			}
			var got bytes.Buffer
			r.print(&got)
			if got.String() != tc.want {
				t.Errorf("recap:\n%s\nwant:\n%s", got.String(), tc.want)
			}
		})
	}
}

func TestRecapKeepsTheLastLinesCut(t *testing.T) {
	var r recap
	_, _ = r.Write([]byte("=== RUN   TestA\n"))
	for i := 0; i < 3*recapLines; i++ {
		_, _ = r.Write([]byte("    " + strings.Repeat("x", 2*recapLineSize) + "\n"))
	}
	_, _ = r.Write([]byte("--- FAIL: TestA (1s)\n"))
	if len(r.lines) != recapLines {
		t.Fatalf("kept %d lines, want %d", len(r.lines), recapLines)
	}
	if l := r.lines[0]; len(l) > recapLineSize+len(" …") {
		t.Errorf("a line of %d bytes kept, want at most %d", len(l), recapLineSize)
	}
}

// TestRunRecapped: what the tests write to os.Stdout still reaches it, and the recap follows on os.Stderr.
func TestRunRecapped(t *testing.T) {
	stdout, stderr := os.Stdout, os.Stderr
	t.Cleanup(func() { os.Stdout, os.Stderr = stdout, stderr })
	outR, outW, _ := os.Pipe()
	errR, errW, _ := os.Pipe()
	os.Stdout, os.Stderr = outW, errW
	code := runRecapped(func() int {
		fmt.Fprint(os.Stdout, "--- FAIL: TestX (1.00s)\n    x_test.go:1: boom\nFAIL\n")
		return 1
	})
	os.Stdout, os.Stderr = stdout, stderr
	_ = outW.Close()
	_ = errW.Close()
	out, _ := io.ReadAll(outR)
	rec, _ := io.ReadAll(errR)
	if code != 1 {
		t.Errorf("code %d, want the run's 1", code)
	}
	if want := "--- FAIL: TestX (1.00s)\n    x_test.go:1: boom\nFAIL\n"; string(out) != want {
		t.Errorf("stdout %q, want the run's output %q", out, want)
	}
	if want := "first failure: TestX; its last 1 lines before any diagnosis:\n    x_test.go:1: boom\n"; string(rec) != want {
		t.Errorf("stderr %q, want %q", rec, want)
	}
}
