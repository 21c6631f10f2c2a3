// SPDX-License-Identifier: Apache-2.0

package devcluster

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// process is one program the cluster runs. Its identity is written to <runDir>/<name>.pid as "PID STARTTIME"
// so that a later `make down` in another process stops exactly what `make up` started: the start time (field
// 22 of /proc/PID/stat) guards against a recycled PID. Nothing is ever looked up or killed by name.
type process struct {
	name    string
	pidFile string
	logFile string
	cmd     *exec.Cmd     // set when this process started it; nil when loaded from a pid file
	waited  chan struct{} // closed when cmd.Wait returned
}

// startProcess starts argv[0] with the given args, stdout and stderr appended to logFile, in a session of
// its own so that a terminal's Ctrl-C reaches the cluster only through Stop.
func startProcess(name, runDir, logFile string, env []string, argv ...string) (*process, error) {
	if err := os.MkdirAll(filepath.Dir(logFile), 0o755); err != nil {
		return nil, fmt.Errorf("create log dir for %s: %w", name, err)
	}
	if err := os.MkdirAll(runDir, 0o755); err != nil {
		return nil, fmt.Errorf("create run dir for %s: %w", name, err)
	}
	log, err := os.OpenFile(logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open log of %s: %w", name, err)
	}
	defer log.Close() // the child holds its own descriptor
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s (%s): %w", name, argv[0], err)
	}
	p := &process{name: name, pidFile: filepath.Join(runDir, name+".pid"), logFile: logFile, cmd: cmd,
		waited: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.waited) }()
	start, err := procStartTime(cmd.Process.Pid)
	if err != nil {
		_ = cmd.Process.Kill()
		return nil, fmt.Errorf("read start time of %s: %w", name, err)
	}
	if err := os.WriteFile(p.pidFile, fmt.Appendf(nil, "%d %d\n", cmd.Process.Pid, start), 0o644); err != nil {
		_ = cmd.Process.Kill()
		return nil, fmt.Errorf("write pid file of %s: %w", name, err)
	}
	// The command line too, so that Restart can start the same process again.
	rec, _ := json.Marshal(processRecord{Argv: argv, Env: env, LogFile: logFile})
	if err := os.WriteFile(filepath.Join(runDir, name+".argv"), rec, 0o644); err != nil {
		_ = cmd.Process.Kill()
		return nil, fmt.Errorf("write argv of %s: %w", name, err)
	}
	return p, nil
}

type processRecord struct {
	Argv    []string `json:"argv"`
	Env     []string `json:"env,omitempty"`
	LogFile string   `json:"logFile"`
}

// restartProcess stops the recorded process by PID and starts its recorded command line again.
func restartProcess(name, runDir string, grace time.Duration) (*process, error) {
	data, err := os.ReadFile(filepath.Join(runDir, name+".argv"))
	if err != nil {
		return nil, fmt.Errorf("restart %s: %w", name, err)
	}
	var rec processRecord
	if err := json.Unmarshal(data, &rec); err != nil {
		return nil, fmt.Errorf("restart %s: %w", name, err)
	}
	if p, err := loadProcess(name, runDir); err != nil {
		return nil, err
	} else if p != nil {
		if err := p.stop(grace); err != nil {
			return nil, err
		}
	}
	return startProcess(name, runDir, rec.LogFile, rec.Env, rec.Argv...)
}

// loadProcess returns the process recorded in pidFile, or nil if the file is missing.
func loadProcess(name, runDir string) (*process, error) {
	p := &process{name: name, pidFile: filepath.Join(runDir, name+".pid")}
	if _, err := os.Stat(p.pidFile); errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	return p, nil
}

// pid returns the recorded PID if that process still runs (same PID and start time), else 0.
func (p *process) pid() int {
	data, err := os.ReadFile(p.pidFile)
	if err != nil {
		return 0
	}
	var pid int
	var start uint64
	if _, err := fmt.Sscanf(string(data), "%d %d", &pid, &start); err != nil || pid <= 0 {
		return 0
	}
	got, err := procStartTime(pid)
	if err != nil || got != start {
		return 0
	}
	return pid
}

// exited reports whether the process is gone (or a zombie nobody reaped, as happens after `make up` exits).
func (p *process) exited() bool {
	if p.waited != nil {
		select {
		case <-p.waited:
			return true
		default:
			return false
		}
	}
	pid := p.pid()
	return pid == 0 || procState(pid) == 'Z'
}

// stop sends SIGTERM, waits up to grace, then SIGKILLs the process and its process group (kubelet and
// containerd leave helpers in their session), and removes the pid file.
func (p *process) stop(grace time.Duration) error {
	pid := p.pid()
	if pid == 0 {
		_ = os.Remove(p.pidFile)
		return nil
	}
	_ = syscall.Kill(pid, syscall.SIGTERM)
	if !p.waitExit(grace) {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		_ = syscall.Kill(pid, syscall.SIGKILL)
		if !p.waitExit(10 * time.Second) {
			return fmt.Errorf("stop %s (pid %d): still running after SIGKILL", p.name, pid)
		}
	}
	// Helpers left in the process's session (pgid == pid) go too.
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	return os.Remove(p.pidFile)
}

func (p *process) waitExit(d time.Duration) bool {
	exited := func(context.Context) (bool, error) { return p.exited(), nil }
	_ = wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, d, true, exited)
	return p.exited()
}

// waitFor polls ready until it succeeds, the process exits, or ctx ends; the error names the log to read.
func (p *process) waitFor(ctx context.Context, what string, ready func(context.Context) error) error {
	var last error
	errExited := errors.New("exited")
	err := wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		if last = ready(ctx); last == nil {
			return true, nil
		}
		if p.exited() {
			return false, errExited
		}
		return false, nil
	})
	switch {
	case err == nil:
		return nil
	case errors.Is(err, errExited):
		return fmt.Errorf("%s exited before %s; see %s (%s)", p.name, what, p.logFile, tail(p.logFile, 5))
	}
	return fmt.Errorf("%s not %s: %w (last error: %w); see %s", p.name, what, err, last, p.logFile)
}

// procStartTime is field 22 of /proc/PID/stat, the start time in clock ticks since boot.
func procStartTime(pid int) (uint64, error) {
	fields, err := procStat(pid)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(fields[19], 10, 64) // fields after "(comm)": index 0 is field 3
}

func procState(pid int) byte {
	fields, err := procStat(pid)
	if err != nil || len(fields[0]) == 0 {
		return 0
	}
	return fields[0][0]
}

// procStat returns the fields of /proc/PID/stat after the command name, which may itself hold spaces.
func procStat(pid int) ([]string, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil, err
	}
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return nil, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	fields := strings.Fields(string(data[i+1:]))
	if len(fields) < 20 {
		return nil, fmt.Errorf("short /proc/%d/stat", pid)
	}
	return fields, nil
}

// tail returns the last n lines of a file, for error messages.
func tail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}
