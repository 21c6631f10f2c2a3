// SPDX-License-Identifier: Apache-2.0

package systemd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Signal restarts a kubelet that some other supervisor keeps running (runit, s6, a shell loop, a simulated
// node): Restart sends SIGTERM to the process in PIDFile and waits until the supervisor has started a new one.
type Signal struct {
	PIDFile string
	// Timeout bounds the wait for the supervisor; default one minute.
	Timeout time.Duration
}

// MainPID reads PIDFile; 0 when the file is missing or the process is gone.
func (s Signal) MainPID(context.Context) (int, error) {
	data, err := os.ReadFile(s.PIDFile)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read kubelet pid file: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("kubelet pid file %s: %q is not a PID", s.PIDFile, data)
	}
	if err := syscall.Kill(pid, 0); err != nil {
		return 0, nil
	}
	return pid, nil
}

// Restart is `kill -TERM $(cat PIDFile)` followed by waiting for a new PID in PIDFile.
func (s Signal) Restart(ctx context.Context) error {
	timeout := s.Timeout
	if timeout == 0 {
		timeout = time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	old, err := s.MainPID(ctx)
	if err != nil {
		return err
	}
	if old != 0 {
		if err := syscall.Kill(old, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("signal kubelet %d: %w", old, err)
		}
	}
	for {
		pid, err := s.MainPID(ctx)
		if err == nil && pid != 0 && pid != old {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kubelet not restarted by its supervisor (pid file %s): %w", s.PIDFile, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}
