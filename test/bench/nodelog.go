// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// nodeLogLines is how many of its last lines each simulated node keeps for a diagnosis.
const nodeLogLines = 60

// nodeLogs keeps each simulated node's last lines in memory, so that a node found stuck can be explained
// by its own sidecar's log without writing every node's every line to disk while the machine is measured.
type nodeLogs struct {
	mu    sync.Mutex
	lines map[string][]string
	// level is Info, or Debug while a phase wants the sidecars' reports and acknowledgements kept too.
	level zap.AtomicLevel
}

func newNodeLogs() *nodeLogs {
	return &nodeLogs{lines: map[string][]string{}, level: zap.NewAtomicLevelAt(zapcore.InfoLevel)}
}

func (l *nodeLogs) add(node, line string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines[node] = append(l.lines[node], line)
	if s := l.lines[node]; len(s) > nodeLogLines {
		l.lines[node] = s[len(s)-nodeLogLines:]
	}
}

func (l *nodeLogs) last(node string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.lines[node]...)
}

// core is a zapcore.Core that files each entry under the node its logger was given (the sidecar names its
// node with zap.String("node", …) on its root logger) and passes it on to next.
type nodeLogCore struct {
	zapcore.LevelEnabler
	logs   *nodeLogs
	node   string
	fields []zapcore.Field
	enc    zapcore.Encoder
}

func (c *nodeLogCore) With(fields []zapcore.Field) zapcore.Core {
	n := *c
	n.fields = append(append([]zapcore.Field(nil), c.fields...), fields...)
	for _, f := range fields {
		if f.Key == "node" && f.Type == zapcore.StringType {
			n.node = f.String
		}
	}
	return &n
}

func (c *nodeLogCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *nodeLogCore) Write(e zapcore.Entry, fields []zapcore.Field) error {
	node := c.node
	for _, f := range fields {
		if f.Key == "node" && f.Type == zapcore.StringType {
			node = f.String
		}
	}
	if node == "" {
		return nil
	}
	buf, err := c.enc.EncodeEntry(e, append(append([]zapcore.Field(nil), c.fields...), fields...))
	if err != nil {
		return err
	}
	c.logs.add(node, strings.TrimRight(buf.String(), "\n"))
	buf.Free()
	return nil
}

func (c *nodeLogCore) Sync() error { return nil }

// withNodeLogs tees log's entries of logs.level and above into logs, per node.
func withNodeLogs(log *zap.Logger, logs *nodeLogs) *zap.Logger {
	enc := zapcore.NewConsoleEncoder(zap.NewDevelopmentEncoderConfig())
	return log.WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
		return zapcore.NewTee(c, &nodeLogCore{LevelEnabler: logs.level, logs: logs, enc: enc})
	}))
}

// describeNode says what a simulated node's sidecar left on disk and logged last: for a node that never got
// where the benchmark waited for it.
func (r *run) describeNode(name string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "--- %s (sidecar running: %v)\n", name, r.simRunning(name))
	dir := filepath.Join(r.nodeDir(name), "dynamic-config")
	var files []string
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			files = append(files, p)
		}
		return nil
	})
	sort.Strings(files)
	for _, p := range files {
		rel, _ := filepath.Rel(dir, p)
		if strings.HasPrefix(rel, "checkpoints"+string(filepath.Separator)) {
			fmt.Fprintf(&b, "  %s\n", rel)
			continue
		}
		data, err := os.ReadFile(p)
		if err != nil || len(data) > 2048 {
			fmt.Fprintf(&b, "  %s (%d bytes, %v)\n", rel, len(data), err)
			continue
		}
		fmt.Fprintf(&b, "  %s: %s\n", rel, strings.TrimSpace(string(data)))
	}
	for _, l := range r.nodeLogs.last(name) {
		fmt.Fprintf(&b, "  | %s\n", l)
	}
	return b.String()
}

func (r *run) simRunning(name string) bool {
	r.simsMu.Lock()
	defer r.simsMu.Unlock()
	_, ok := r.sims[name]
	return ok
}
