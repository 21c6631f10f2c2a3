package configcheck

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/dkc-dev/dkc/sidecar/kubeletcheck/checkapi"
)

// HelperPrefix names the helpers: dkc-kubelet-check-<minor>, e.g. dkc-kubelet-check-1.37.
const HelperPrefix = "dkc-kubelet-check-"

// Exec runs one helper binary for each check.
type Exec struct {
	Binary string
	// Timeout bounds one check; default 30s.
	Timeout time.Duration
}

// Check implements Checker.
func (e Exec) Check(ctx context.Context, req Request) (*Checked, error) {
	timeout := e.Timeout
	if timeout == 0 {
		timeout = 30 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	in, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, e.Binary)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = bytes.NewReader(in), &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("run %s on %s: %w: %s", e.Binary, req.File, err, strings.TrimSpace(lastLine(stderr.String())))
	}
	var resp checkapi.Response
	if err := json.Unmarshal(stdout.Bytes(), &resp); err != nil {
		return nil, fmt.Errorf("decode %s output for %s: %w", e.Binary, req.File, err)
	}
	if resp.Kind != "" {
		kind, ok := checkapi.Kinds[resp.Kind]
		if !ok {
			return nil, fmt.Errorf("%s: unknown failure kind %q: %s", e.Binary, resp.Kind, resp.Error)
		}
		return nil, fmt.Errorf("%w: %s", kind, resp.Error)
	}
	if resp.Checked == nil {
		return nil, fmt.Errorf("%s returned neither a config nor an error for %s", e.Binary, req.File)
	}
	return resp.Checked, nil
}

// Helpers is a Checker that runs the helper of the requested kubelet's minor: dkc-kubelet-check-<minor> in
// Dir. A kubelet of a minor no helper speaks is refused (ErrUnsupportedKubelet, naming the version and the
// range there is), never checked with another minor's code.
type Helpers struct {
	Dir string
	// Minors are the helpers found in Dir, oldest first.
	Minors  []string
	Timeout time.Duration
}

// FindHelpers lists the helpers in dir; it fails when there is none.
func FindHelpers(dir string) (Helpers, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return Helpers{}, fmt.Errorf("kubelet config checkers: %w", err)
	}
	h := Helpers{Dir: dir}
	for _, e := range entries {
		if minor, ok := strings.CutPrefix(e.Name(), HelperPrefix); ok && checkapi.Minor(minor) == minor && !e.IsDir() {
			h.Minors = append(h.Minors, minor)
		}
	}
	if len(h.Minors) == 0 {
		return Helpers{}, fmt.Errorf("kubelet config checkers: no %s<minor> in %s", HelperPrefix, dir)
	}
	slices.SortFunc(h.Minors, checkapi.CompareMinors)
	return h, nil
}

// Range is the kubelet minors the helpers speak, e.g. "1.34–1.37".
func (h Helpers) Range() string {
	if len(h.Minors) == 0 {
		return "none"
	}
	return h.Minors[0] + "–" + h.Minors[len(h.Minors)-1]
}

// Check implements Checker.
func (h Helpers) Check(ctx context.Context, req Request) (*Checked, error) {
	minor := checkapi.Minor(req.KubeletVersion)
	switch {
	case req.KubeletVersion == "":
		return nil, fmt.Errorf("%w: the kubelet's version is not known yet (the Node's status.nodeInfo.kubeletVersion, "+
			"which dkc-server sends): not checked with a guess", ErrUnsupportedKubelet)
	case !slices.Contains(h.Minors, minor):
		return nil, fmt.Errorf("%w: kubelet %s is not supported by this dkc (kubelet minors %s)", ErrUnsupportedKubelet, req.KubeletVersion, h.Range())
	}
	return Exec{Binary: filepath.Join(h.Dir, HelperPrefix+minor), Timeout: h.Timeout}.Check(ctx, req)
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}
