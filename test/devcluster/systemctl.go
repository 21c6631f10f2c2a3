// SPDX-License-Identifier: Apache-2.0

package devcluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	godbus "github.com/godbus/dbus/v5"
	"k8s.io/apimachinery/pkg/util/wait"
)

// systemctl is `systemctl` on a node's own systemd, over the bus address the node exposes: what an operator
// does on the node. The harness keeps its own few lines of go-systemd instead of the sidecar's manager, whose
// rules (start limits, settling a lost job) are what the tests examine, not something to lean on.
type systemctl struct{ conn *sddbus.Conn }

// dialSystemctl connects to the node's systemd. The bus may refuse connections for a moment after its socket
// appears (a node starting, dbus.socket restarted), so connecting is retried for up to 10s.
func dialSystemctl(ctx context.Context, address string) (*systemctl, error) {
	var s *systemctl
	var lastErr error
	tries := wait.Backoff{Duration: 200 * time.Millisecond, Steps: 50} // 50, 200ms apart
	err := wait.ExponentialBackoffWithContext(ctx, tries, func(context.Context) (bool, error) {
		conn, err := sddbus.NewConnection(func() (*godbus.Conn, error) {
			c, err := godbus.Dial(address, godbus.WithContext(ctx))
			if err != nil {
				return nil, err
			}
			if err = c.Auth([]godbus.Auth{godbus.AuthExternal(strconv.Itoa(os.Getuid()))}); err == nil {
				err = c.Hello()
			}
			if err != nil {
				c.Close()
				return nil, err
			}
			return c, nil
		})
		if err != nil {
			lastErr = err
			return false, nil
		}
		s = &systemctl{conn: conn}
		return true, nil
	})
	switch {
	case err == nil:
		return s, nil
	case ctx.Err() != nil && lastErr == nil: // ended before the first dial
		return nil, fmt.Errorf("connect to systemd on %s: %w", address, ctx.Err())
	case ctx.Err() != nil:
		return nil, fmt.Errorf("connect to systemd on %s: %w (last: %w)", address, ctx.Err(), lastErr)
	}
	return nil, fmt.Errorf("connect to systemd on %s: %w", address, lastErr)
}

func (s *systemctl) Close() { s.conn.Close() }

// job runs a start or restart job and waits for its result.
func (s *systemctl) job(ctx context.Context, verb, unit string,
	call func(context.Context, string, string, chan<- string) (int, error)) error {
	done := make(chan string, 1)
	if _, err := call(ctx, unit, "replace", done); err != nil {
		return fmt.Errorf("%s %s: %w", verb, unit, err)
	}
	select {
	case <-ctx.Done():
		return fmt.Errorf("%s %s: %w", verb, unit, ctx.Err())
	case result := <-done:
		if result != "done" {
			return fmt.Errorf("%s %s: job %s", verb, unit, result)
		}
		return nil
	}
}

// Start is `systemctl start UNIT`.
func (s *systemctl) Start(ctx context.Context, unit string) error {
	return s.job(ctx, "start", unit, s.conn.StartUnitContext)
}

// Restart is `systemctl restart UNIT`.
func (s *systemctl) Restart(ctx context.Context, unit string) error {
	return s.job(ctx, "restart", unit, s.conn.RestartUnitContext)
}

// DaemonReload is `systemctl daemon-reload`.
func (s *systemctl) DaemonReload(ctx context.Context) error {
	if err := s.conn.ReloadContext(ctx); err != nil {
		return fmt.Errorf("daemon-reload: %w", err)
	}
	return nil
}

// MainPID is `systemctl show -p MainPID UNIT` (0: not running).
func (s *systemctl) MainPID(ctx context.Context, unit string) (int, error) {
	p, err := s.conn.GetUnitTypePropertyContext(ctx, unit, "Service", "MainPID")
	if err != nil {
		return 0, fmt.Errorf("read MainPID of %s: %w", unit, err)
	}
	pid, _ := p.Value.Value().(uint32)
	return int(pid), nil
}

// State is `systemctl show -p ActiveState,Result UNIT`.
func (s *systemctl) State(ctx context.Context, unit string) (activeState, result string, err error) {
	p, err := s.conn.GetUnitPropertyContext(ctx, unit, "ActiveState")
	if err != nil {
		return "", "", fmt.Errorf("read ActiveState of %s: %w", unit, err)
	}
	activeState, _ = p.Value.Value().(string)
	r, err := s.conn.GetUnitTypePropertyContext(ctx, unit, "Service", "Result")
	if err != nil {
		return "", "", fmt.Errorf("read Result of %s: %w", unit, err)
	}
	result, _ = r.Value.Value().(string)
	return activeState, result, nil
}

// withSystemctl runs f with `systemctl` on node's own systemd.
func (c *Cluster) withSystemctl(ctx context.Context, node string, f func(*systemctl) error) error {
	s, err := dialSystemctl(ctx, c.BusAddress(node))
	if err != nil {
		return fmt.Errorf("node %s: %w", node, err)
	}
	defer s.Close()
	if err := f(s); err != nil {
		return fmt.Errorf("node %s: %w", node, err)
	}
	return nil
}

// DaemonReload is `systemctl daemon-reload` on a real node: what an operator or a package upgrade does after
// changing unit files.
func (c *Cluster) DaemonReload(ctx context.Context, node string) error {
	return c.withSystemctl(ctx, node, func(s *systemctl) error { return s.DaemonReload(ctx) })
}

// KubeletDropInDir is, on the host, the directory a node of the installed form has as
// /etc/systemd/system/kubelet.service.d, where the sidecar's init container installs dkc's drop-in.
func (c *Cluster) KubeletDropInDir(node string) string {
	return filepath.Join(c.NodeDir(node), "systemd", "kubelet.service.d")
}

// RestartUnit is `systemctl restart UNIT` on a real node.
func (c *Cluster) RestartUnit(ctx context.Context, node, unit string) error {
	return c.withSystemctl(ctx, node, func(s *systemctl) error { return s.Restart(ctx, unit) })
}
