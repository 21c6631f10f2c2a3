// Package systemd is where the kubelet is restarted: through the node's service manager over D-Bus
// (github.com/coreos/go-systemd/v22/dbus), restarting the kubelet's unit and waiting for the job's result,
// as gardener's node agent does. Package-level Signal offers the same for hosts without systemd.
package systemd

import (
	"context"
	"fmt"
	"os"
	"strconv"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	godbus "github.com/godbus/dbus/v5"
)

// DefaultAddress is the system bus.
const DefaultAddress = "unix:path=/run/dbus/system_bus_socket"

// Manager controls one unit.
type Manager struct {
	conn *sddbus.Conn
	unit string
}

// Dial connects to systemd on the bus at address (DefaultAddress if empty) with EXTERNAL authentication.
func Dial(ctx context.Context, address, unit string) (*Manager, error) {
	if address == "" {
		address = DefaultAddress
	}
	conn, err := sddbus.NewConnection(func() (*godbus.Conn, error) {
		c, err := godbus.Dial(address, godbus.WithContext(ctx))
		if err != nil {
			return nil, err
		}
		if err := c.Auth([]godbus.Auth{godbus.AuthExternal(strconv.Itoa(os.Getuid()))}); err != nil {
			c.Close()
			return nil, err
		}
		if err := c.Hello(); err != nil {
			c.Close()
			return nil, err
		}
		return c, nil
	})
	if err != nil {
		return nil, fmt.Errorf("connect to systemd on %s: %w", address, err)
	}
	return &Manager{conn: conn, unit: unit}, nil
}

// Close closes the bus connection.
func (m *Manager) Close() { m.conn.Close() }

// Unit is the controlled unit's name.
func (m *Manager) Unit() string { return m.unit }

// Restart is `systemctl restart UNIT`: it queues a restart job (mode "replace") and returns when the job
// has finished; an outcome other than "done" is an error.
func (m *Manager) Restart(ctx context.Context) error {
	return m.job(ctx, "restart", m.conn.RestartUnitContext)
}

// job queues a unit job (mode "replace") and waits for its result; anything but "done" is an error.
func (m *Manager) job(ctx context.Context, verb string, queue func(context.Context, string, string, chan<- string) (int, error)) error {
	done := make(chan string, 1)
	if _, err := queue(ctx, m.unit, "replace", done); err != nil {
		return fmt.Errorf("%s %s: %w", verb, m.unit, err)
	}
	select {
	case result := <-done:
		if result != "done" {
			return fmt.Errorf("%s %s: job %s", verb, m.unit, result)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%s %s: %w", verb, m.unit, ctx.Err())
	}
}

// MainPID is `systemctl show --property MainPID UNIT`: 0 when the unit runs no process.
func (m *Manager) MainPID(ctx context.Context) (int, error) {
	p, err := m.conn.GetServicePropertyContext(ctx, m.unit, "MainPID")
	if err != nil {
		return 0, fmt.Errorf("read MainPID of %s: %w", m.unit, err)
	}
	pid, ok := p.Value.Value().(uint32)
	if !ok {
		return 0, fmt.Errorf("MainPID of %s is a %T", m.unit, p.Value.Value())
	}
	return int(pid), nil
}

// Start is `systemctl start UNIT`: it returns when the start job has finished.
func (m *Manager) Start(ctx context.Context) error {
	return m.job(ctx, "start", m.conn.StartUnitContext)
}

// Reload is `systemctl daemon-reload`: systemd re-reads unit files and drop-ins.
func (m *Manager) Reload(ctx context.Context) error {
	if err := m.conn.ReloadContext(ctx); err != nil {
		return fmt.Errorf("daemon-reload: %w", err)
	}
	return nil
}
