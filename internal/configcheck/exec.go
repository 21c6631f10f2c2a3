// SPDX-License-Identifier: Apache-2.0

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

	"github.com/dkc-dev/dkc/internal/kubeletcheck/checkapi"
)

// HelperPrefix names the helpers: dkc-kubelet-check-<minor>, e.g. dkc-kubelet-check-1.37.
const HelperPrefix = "dkc-kubelet-check-"

// Exec runs one helper binary for each check.
type Exec struct {
	Binary string
	// Timeout bounds one check; default 30s.
	Timeout time.Duration
	// MemoryLimit is the helper's soft memory limit (GOMEMLIMIT, e.g. "64MiB"); "": DefaultMemoryLimit. The
	// helper runs inside its caller's container, under that container's memory limit, beside the caller:
	// the caller sizes it against what the container leaves it. Without one it would inherit the caller's
	// GOMEMLIMIT, or none, and its garbage collector would let the heap grow to twice what it holds live.
	MemoryLimit string
}

// SidecarMemoryLimit is the helpers' GOMEMLIMIT in dkc-sidecar. Its container's 128Mi limit
// (deploy/base/sidecar.yaml) holds the daemon, whose heap is a node's few checkpoints and one gRPC stream,
// and one helper at a time. GOMEMLIMIT only makes the helper's garbage collector keep its heap near its
// live size; what bounds that live size is MaxConfigBytes.
const SidecarMemoryLimit = "64MiB"

// SidecarHelperMaxRSS is the most a helper may take in dkc-sidecar's container: 128Mi less what the daemon
// and the page cache charged to the container need (TestHelperMemoryIsBounded holds a helper on a config of
// MaxConfigBytes under it).
const SidecarHelperMaxRSS = 88 << 20

// MaxConfigBytes is the largest config file a helper is given, half of what one ConfigMap holds in all (a
// kubelet config is a few KiB). A larger one is refused as a load error before any helper runs, whatever
// its source (a forged payload may be 2 MiB: checkpoint.MaxTotalBytes): the kubelet's decoder takes many
// times a config's size in memory, which GOMEMLIMIT, a soft limit, cannot bound, and the helper must stay
// within dkc-sidecar's container beside the daemon (SidecarHelperMaxRSS).
const MaxConfigBytes = 512 << 10

// checkSize refuses a config larger than MaxConfigBytes: data's, if not nil, else file's.
func checkSize(file string, data *[]byte) error {
	size := int64(0)
	if data != nil {
		size = int64(len(*data))
	} else if st, err := os.Stat(file); err == nil {
		size = st.Size()
	}
	if size > MaxConfigBytes {
		return fmt.Errorf("%w: the config is %d bytes, more than dkc checks (%d; a kubelet config is a few KiB): not checked",
			ErrLoad, size, MaxConfigBytes)
	}
	return nil
}

// DefaultMemoryLimit is the helpers' GOMEMLIMIT unless the caller sets one: dkc-server's, within its
// container's limit. A config of MaxConfigBytes, the largest a helper is given, peaks below it
// (TestHelperMemoryIsBounded).
const DefaultMemoryLimit = "96MiB"

// Check implements Checker.
func (e Exec) Check(ctx context.Context, req Request) (*Checked, error) {
	return e.run(ctx, req, nil)
}

// dataFile is where a helper finds the config CheckData hands it: the read end of a pipe, its fd 3
// (exec.Cmd.ExtraFiles). The kubelet's loader reads a path with os.ReadFile, which reads a pipe to its
// end, so the config needs no file: dkc-server, which checks pool configs, has a read-only root and no
// directory to write one to.
const dataFile = "/dev/fd/3"

// CheckData checks a config held in memory (a ConfigMap's key) as the kubelet of kubeletVersion would load
// it from a file of its own, without any node's flags or --config-dir drop-ins, which a server does not
// know: what fails here fails on every node whose kubelet has no flag (a feature gate among them) or
// drop-in that sets the failing field. Errors as Check's.
func (e Exec) CheckData(ctx context.Context, kubeletVersion string, data []byte) (*Checked, error) {
	return e.run(ctx, Request{File: dataFile, KubeletVersion: kubeletVersion}, &data)
}

// run runs the helper on req; data, if not nil, is written to the helper's fd 3 (dataFile).
func (e Exec) run(ctx context.Context, req Request, data *[]byte) (*Checked, error) {
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
	// A helper is killed at the timeout; a child of its own holding its output open must not keep Wait
	// beyond it.
	cmd.WaitDelay = 5 * time.Second
	if err := checkSize(req.File, data); err != nil {
		return nil, err
	}
	limit := e.MemoryLimit
	if limit == "" {
		limit = DefaultMemoryLimit
	}
	cmd.Env = append(os.Environ(), "GOMEMLIMIT="+limit)
	what := req.File
	if data != nil {
		what = fmt.Sprintf("a config of %d bytes", len(*data))
		r, w, err := os.Pipe()
		if err != nil {
			return nil, fmt.Errorf("pipe for %s: %w", e.Binary, err)
		}
		defer r.Close()
		cmd.ExtraFiles = []*os.File{r}
		if err := cmd.Start(); err != nil {
			w.Close()
			return nil, fmt.Errorf("run %s: %w", e.Binary, err)
		}
		r.Close() // the child has its own copy; ours would keep the pipe open for writing's EPIPE
		// The pipe holds 64 KiB and a config may be 1 MiB: write while the helper reads. A helper that exits
		// without reading all of it fails the write with EPIPE, which its own answer explains better.
		go func() {
			_, _ = w.Write(*data)
			w.Close()
		}()
		if err := cmd.Wait(); err != nil {
			return nil, fmt.Errorf("run %s on %s: %w: %s", e.Binary, what, err, strings.TrimSpace(lastLine(stderr.String())))
		}
	} else if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("run %s on %s: %w: %s", e.Binary, what, err, strings.TrimSpace(lastLine(stderr.String())))
	}
	var resp checkapi.Response
	if err := json.Unmarshal(stdout.Bytes(), &resp); err != nil {
		return nil, fmt.Errorf("decode %s output for %s: %w", e.Binary, what, err)
	}
	if resp.Kind != "" {
		kind, ok := checkapi.Kinds[resp.Kind]
		if !ok {
			return nil, fmt.Errorf("%s: unknown failure kind %q: %s", e.Binary, resp.Kind, resp.Error)
		}
		return nil, fmt.Errorf("%w: %s", kind, resp.Error)
	}
	if resp.Checked == nil {
		return nil, fmt.Errorf("%s returned neither a config nor an error for %s", e.Binary, what)
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
	// MemoryLimit is each helper's GOMEMLIMIT (Exec.MemoryLimit).
	MemoryLimit string
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
	e, err := h.helper(req.KubeletVersion)
	if err != nil {
		return nil, err
	}
	return e.Check(ctx, req)
}

// CheckData is Exec.CheckData with the helper of kubeletVersion's minor.
func (h Helpers) CheckData(ctx context.Context, kubeletVersion string, data []byte) (*Checked, error) {
	e, err := h.helper(kubeletVersion)
	if err != nil {
		return nil, err
	}
	return e.CheckData(ctx, kubeletVersion, data)
}

// helper is the Exec of kubeletVersion's minor.
func (h Helpers) helper(kubeletVersion string) (Exec, error) {
	minor := checkapi.Minor(kubeletVersion)
	switch {
	case kubeletVersion == "":
		return Exec{}, fmt.Errorf("%w: the kubelet's version is not known yet (the Node's status.nodeInfo.kubeletVersion, "+
			"which dkc-server sends): not checked with a guess", ErrUnsupportedKubelet)
	case !slices.Contains(h.Minors, minor):
		return Exec{}, fmt.Errorf("%w: kubelet %s is not supported by this dkc (kubelet minors %s)", ErrUnsupportedKubelet,
			kubeletVersion, h.Range())
	}
	return Exec{Binary: filepath.Join(h.Dir, HelperPrefix+minor), Timeout: h.Timeout, MemoryLimit: h.MemoryLimit}, nil
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}
