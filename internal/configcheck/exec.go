package configcheck

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"time"
)

// Request is what the helper reads from stdin.
type Request struct {
	File  string   `json:"file"`
	Flags []string `json:"flags"`
}

// Response is what the helper writes to stdout: Checked, or the kind of failure and its message.
type Response struct {
	Checked *Checked `json:"checked,omitempty"`
	// Kind is "load", "flags" or "validate" when the config is at fault, "" when it passed.
	Kind  string `json:"kind,omitempty"`
	Error string `json:"error,omitempty"`
}

var kinds = map[string]error{"load": ErrLoad, "flags": ErrFlags, "validate": ErrValidate}

// Split gives err's kind for a Response and its message without the kind's text (the client wraps it in
// the kind again); kind is "" if err is not the config's fault.
func Split(err error) (kind, message string) {
	for k, e := range kinds {
		if errors.Is(err, e) {
			return k, strings.TrimPrefix(err.Error(), e.Error()+": ")
		}
	}
	return "", ""
}

// Exec runs the helper binary (dkc-kubelet-check) for each check.
type Exec struct {
	Binary string
	// Timeout bounds one check; default 30s.
	Timeout time.Duration
}

// Check implements Checker.
func (e Exec) Check(ctx context.Context, path string, flags []string) (*Checked, error) {
	timeout := e.Timeout
	if timeout == 0 {
		timeout = 30 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	in, err := json.Marshal(Request{File: path, Flags: flags})
	if err != nil {
		return nil, err
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, e.Binary)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = bytes.NewReader(in), &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("run %s on %s: %w: %s", e.Binary, path, err, strings.TrimSpace(lastLine(stderr.String())))
	}
	var resp Response
	if err := json.Unmarshal(stdout.Bytes(), &resp); err != nil {
		return nil, fmt.Errorf("decode %s output for %s: %w", e.Binary, path, err)
	}
	if resp.Kind != "" {
		kind, ok := kinds[resp.Kind]
		if !ok {
			return nil, fmt.Errorf("%s: unknown failure kind %q: %s", e.Binary, resp.Kind, resp.Error)
		}
		return nil, fmt.Errorf("%w: %s", kind, resp.Error)
	}
	if resp.Checked == nil {
		return nil, fmt.Errorf("%s returned neither a config nor an error for %s", e.Binary, path)
	}
	return resp.Checked, nil
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}
