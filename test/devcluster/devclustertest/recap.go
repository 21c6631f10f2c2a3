// SPDX-License-Identifier: Apache-2.0

package devclustertest

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
)

// DiagnosisMarker starts a suite's diagnosis in a failing test's output (see test/installed). The recap
// ends that test's lines there: what the test itself said is the part to repeat.
const DiagnosisMarker = "diagnosis at the run's first failure"

const (
	recapLines    = 20  // lines of the first failing test repeated at the end
	recapLineSize = 400 // bytes kept of each
)

// recap reads a test binary's output (go test -v or not) as it is written and keeps the lines the first
// failing test wrote before its diagnosis. CI keeps only the tail of a run's output, and a suite's
// diagnosis, logged in the test's cleanup after its failure messages, pushes them out of that tail: the
// recap prints them again after the run, last.
type recap struct {
	mu      sync.Mutex
	partial string
	current []string // the running top-level test's lines so far, up to its diagnosis
	cut     bool     // the running test's diagnosis has begun
	failed  string   // the first failing test's name
	lines   []string // and its lines
	after   bool     // without -v: the first failing test's lines come after its "--- FAIL" line
}

func (r *recap) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.partial += string(p)
	for {
		i := strings.IndexByte(r.partial, '\n')
		if i < 0 {
			break
		}
		r.line(r.partial[:i])
		r.partial = r.partial[i+1:]
	}
	return len(p), nil
}

func (r *recap) line(l string) {
	if r.failed != "" {
		// Without -v a test's lines follow its "--- FAIL" line, indented.
		switch {
		case !strings.HasPrefix(l, " "):
			r.after = false
		case strings.Contains(l, DiagnosisMarker):
			r.cut = true
		case r.after && !r.cut:
			r.keep(&r.lines, l)
		}
		return
	}
	switch {
	case strings.HasPrefix(l, "=== RUN ") && !strings.Contains(l, "/"):
		r.current, r.cut = nil, false
	case strings.HasPrefix(l, "=== "): // a subtest's RUN, PAUSE, CONT, NAME
	case strings.HasPrefix(l, "--- FAIL: "):
		r.failed = strings.Fields(strings.TrimPrefix(l, "--- FAIL: "))[0]
		r.lines, r.after = r.current, len(r.current) == 0
	case strings.HasPrefix(l, "--- PASS: "), strings.HasPrefix(l, "--- SKIP: "):
		r.current, r.cut = nil, false
	case strings.Contains(l, DiagnosisMarker):
		r.cut = true
	case !r.cut:
		r.keep(&r.current, l)
	}
}

// keep appends l, cut to recapLineSize, to *lines, of which it keeps the last recapLines.
func (r *recap) keep(lines *[]string, l string) {
	if len(l) > recapLineSize {
		l = l[:recapLineSize] + " …"
	}
	*lines = append(*lines, l)
	if len(*lines) > recapLines {
		*lines = (*lines)[len(*lines)-recapLines:]
	}
}

// print writes the recap of the first failing test, if any, to w.
func (r *recap) print(w io.Writer) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failed == "" {
		return
	}
	fmt.Fprintf(w, "first failure: %s; its last %d lines before any diagnosis:\n", r.failed, len(r.lines))
	for _, l := range r.lines {
		fmt.Fprintln(w, l)
	}
}

// runRecapped runs the tests with os.Stdout (where package testing writes) copied through a recap, and
// prints the recap after them on os.Stderr.
func runRecapped(run func() int) int {
	pr, pw, err := os.Pipe()
	if err != nil {
		return run()
	}
	stdout := os.Stdout
	var r recap
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.Copy(io.MultiWriter(stdout, &r), pr)
	}()
	os.Stdout = pw
	code := run()
	os.Stdout = stdout
	_ = pw.Close()
	<-done
	_ = pr.Close()
	r.print(os.Stderr)
	return code
}
