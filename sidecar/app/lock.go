// SPDX-License-Identifier: Apache-2.0

package app

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/dkc-dev/dkc/internal/durable"
)

// LockFileName is the node's sidecar lock in the dynamic config dir (next to the state file).
const LockFileName = "dkc-sidecar.lock"

// lockNode takes the node's sidecar lock (flock on <dynamic-config-dir>/dkc-sidecar.lock) so that one
// sidecar acts on a node at a time: a DaemonSet creates a deleted pod's replacement while the old pod is
// still terminating, and two sidecars restarting one kubelet would each take the other's restart for a
// failure. The newcomer waits until the old one has exited; the kernel releases the lock however a process
// exits. release closes the lock file.
func lockNode(ctx context.Context, dir string, log *zap.Logger) (release func(), err error) {
	if err := durable.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("take the node's sidecar lock: %w", err)
	}
	path := filepath.Join(dir, LockFileName)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("take the node's sidecar lock: %w", err)
	}
	waiting := false
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			if waiting {
				log.Info("took the node's sidecar lock", zap.String("lock", path))
			}
			return func() { f.Close() }, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("take the node's sidecar lock %s: %w", path, err)
		}
		if !waiting {
			waiting = true
			log.Info("another dkc-sidecar holds the node's lock (a pod being replaced); waiting for it to exit",
				zap.String("lock", path))
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("take the node's sidecar lock %s: %w", path, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}
