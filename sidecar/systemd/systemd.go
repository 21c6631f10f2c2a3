// Package systemd is where the kubelet is restarted: through the node's service manager over D-Bus
// (github.com/coreos/go-systemd/v22/dbus), restarting the kubelet's unit and waiting for the job's result,
// as gardener's node agent does. Package-level Signal offers the same for hosts without systemd.
package systemd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	godbus "github.com/godbus/dbus/v5"
	"k8s.io/utils/clock"

	"github.com/dkc-dev/dkc/sidecar/configcheck"
	"github.com/dkc-dev/dkc/sidecar/kubeletunit"
)

// DefaultAddress is the system bus.
const DefaultAddress = "unix:path=/run/dbus/system_bus_socket"

// Manager controls one unit.
type Manager struct {
	address string
	unit    string
	pacer   startPacer

	mu   sync.Mutex
	conn *sddbus.Conn // nil or closed: dialled again at the next call
}

// Dial connects to systemd on the bus at address (DefaultAddress if empty) with EXTERNAL authentication.
// A connection that closes later (dbus-daemon restarted, e.g. by a package upgrade) is dialled again at the
// next call: the sidecar outlives the bus daemon it talks through.
func Dial(ctx context.Context, address, unit string) (*Manager, error) {
	if address == "" {
		address = DefaultAddress
	}
	m := &Manager{address: address, unit: unit, pacer: startPacer{clock: clock.RealClock{}}}
	if _, err := m.bus(ctx); err != nil {
		return nil, err
	}
	return m, nil
}

// bus returns the live connection, dialling a new one when there is none or it has closed.
func (m *Manager) bus(ctx context.Context) (*sddbus.Conn, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.conn != nil && m.conn.Connected() {
		return m.conn, nil
	}
	if m.conn != nil {
		m.conn.Close()
		m.conn = nil
	}
	conn, err := sddbus.NewConnection(func() (*godbus.Conn, error) {
		c, err := godbus.Dial(m.address, godbus.WithContext(context.WithoutCancel(ctx)))
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
		return nil, fmt.Errorf("connect to systemd on %s: %w", m.address, err)
	}
	m.conn = conn
	return conn, nil
}

// Close closes the bus connection.
func (m *Manager) Close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.conn != nil {
		m.conn.Close()
		m.conn = nil
	}
}

// Unit is the controlled unit's name.
func (m *Manager) Unit() string { return m.unit }

// ErrNoUnit: the controlled unit is not a unit systemd has loaded on this node.
var ErrNoUnit = errors.New("not a systemd unit on this node")

// CheckUnit refuses a node whose kubelet is not the unit dkc restarts: `systemctl show -p LoadState UNIT`
// must say "loaded". Otherwise every restart would fail later, one config at a time, for a reason no
// config could fix.
func (m *Manager) CheckUnit(ctx context.Context) error {
	p, err := m.unitProperty(ctx, "LoadState")
	if err != nil {
		return fmt.Errorf("read LoadState of %s: %w", m.unit, err)
	}
	if state, _ := p.Value.Value().(string); state != "loaded" {
		return fmt.Errorf("%w: %s is %q; dkc-sidecar switches configs by restarting the kubelet's unit (--kubelet-unit), "+
			"so the kubelet must run under this node's systemd (a kubelet supervised otherwise: --restart-mode=signal)", ErrNoUnit, m.unit, state)
	}
	return nil
}

// ErrJobFailed: systemd ran the job and it did not end "done" (failed, timeout, dependency, ...).
var ErrJobFailed = errors.New("job did not complete")

// StartFailedError: the job failed because the kubelet's own process failed while starting — it exited,
// was killed, or did not report ready in time (a unit of Type=notify: the kubelet sends READY=1, so its
// start job waits for it and fails when the process dies first). Restarted into a new config, that is the
// config's doing, as much as a kubelet that starts but never becomes healthy; a job that failed for any
// other reason (start limit, a dependency, canceled, resources) is not.
type StartFailedError struct {
	Unit   string
	Result string // the service's Result: exit-code, signal, core-dump, timeout, watchdog
	Err    error
}

func (e *StartFailedError) Error() string {
	return fmt.Sprintf("%v (the kubelet's process failed starting: %s Result=%s)", e.Err, e.Unit, e.Result)
}

func (e *StartFailedError) Unwrap() error { return e.Err }

// KubeletFailed marks the error for the agent, which knows no systemd: the kubelet itself failed.
func (e *StartFailedError) KubeletFailed() bool { return true }

// processFailures are the service Results that mean the main process failed (systemd.exec(5), "$SERVICE_RESULT").
var processFailures = map[string]bool{"exit-code": true, "signal": true, "core-dump": true, "timeout": true, "watchdog": true}

// Restart is `systemctl restart UNIT`, made safe to call in bursts. Every start counts against the unit's
// start limit (systemd's default: 5 starts in 10 s; kubeadm's kubelet unit sets none), the kubelet's own
// crash restarts (Restart=always) included, and a unit over its limit is left "failed" with Result
// "start-limit-hit": the kubelet stays stopped until someone runs reset-failed. So Restart
//   - paces dkc's own starts to leave the limit room (startPacer), waiting if it must;
//   - first clears a unit that is already failed (`systemctl reset-failed UNIT`), whoever left it so;
//   - when the job still fails on the start limit, clears it and starts the unit once more.
//
// It returns when the job has finished; an outcome other than "done" wraps ErrJobFailed.
func (m *Manager) Restart(ctx context.Context) error {
	interval, burst, err := m.startLimit(ctx)
	if err != nil {
		return err
	}
	if err := m.pacer.wait(ctx, interval, burst); err != nil {
		return fmt.Errorf("restart %s: wait for room in its start limit: %w", m.unit, err)
	}
	if err := m.resetIfFailed(ctx); err != nil {
		return err
	}
	m.pacer.record()
	err = m.job(ctx, "restart")
	if !errors.Is(err, ErrJobFailed) {
		return err
	}
	result, rerr := m.serviceResult(ctx)
	if rerr != nil {
		return err
	}
	if processFailures[result] {
		return &StartFailedError{Unit: m.unit, Result: result, Err: err}
	}
	if result != "start-limit-hit" {
		return err
	}
	if rerr := m.resetFailed(ctx); rerr != nil {
		return fmt.Errorf("%w; reset-failed: %v", err, rerr)
	}
	m.pacer.record()
	if err := m.job(ctx, "start"); err != nil {
		if result, rerr := m.serviceResult(ctx); rerr == nil && processFailures[result] {
			return &StartFailedError{Unit: m.unit, Result: result, Err: err}
		}
		return err
	}
	return nil
}

// resetIfFailed is `systemctl reset-failed UNIT` when the unit is in state "failed" (e.g. it hit its start
// limit before dkc came along): a start job on a unit over its limit fails at once.
func (m *Manager) resetIfFailed(ctx context.Context) error {
	state, _, err := m.State(ctx)
	if err != nil {
		return err
	}
	if state != "failed" {
		return nil
	}
	if err := m.resetFailed(ctx); err != nil {
		return fmt.Errorf("reset-failed %s: %w", m.unit, err)
	}
	return nil
}

// State is `systemctl show --property ActiveState,Result UNIT`: e.g. "active" and "success", or "failed"
// and "start-limit-hit" for a unit systemd gave up on.
func (m *Manager) State(ctx context.Context) (activeState, result string, err error) {
	p, err := m.unitProperty(ctx, "ActiveState")
	if err != nil {
		return "", "", fmt.Errorf("read ActiveState of %s: %w", m.unit, err)
	}
	activeState, _ = p.Value.Value().(string)
	result, err = m.serviceResult(ctx)
	return activeState, result, err
}

// serviceResult is `systemctl show --property Result UNIT` ("success", "exit-code", "start-limit-hit", ...).
func (m *Manager) serviceResult(ctx context.Context) (string, error) {
	p, err := m.serviceProperty(ctx, "Result")
	if err != nil {
		return "", fmt.Errorf("read Result of %s: %w", m.unit, err)
	}
	r, _ := p.Value.Value().(string)
	return r, nil
}

// startLimit is `systemctl show --property StartLimitIntervalUSec,StartLimitBurst UNIT`; a zero interval or
// burst means the unit has no start limit.
func (m *Manager) startLimit(ctx context.Context) (time.Duration, int, error) {
	iv, err := m.unitProperty(ctx, "StartLimitIntervalUSec")
	if err != nil {
		return 0, 0, fmt.Errorf("read StartLimitIntervalUSec of %s: %w", m.unit, err)
	}
	bv, err := m.unitProperty(ctx, "StartLimitBurst")
	if err != nil {
		return 0, 0, fmt.Errorf("read StartLimitBurst of %s: %w", m.unit, err)
	}
	usec, _ := iv.Value.Value().(uint64)
	burst, _ := bv.Value.Value().(uint32)
	return time.Duration(usec) * time.Microsecond, int(burst), nil
}

// job queues a unit job (mode "replace") and waits for its result; anything but "done" wraps ErrJobFailed. The
// result comes as a bus signal: a connection that closes first ends the wait with ErrBusLost (the job itself
// may still run; the caller finds out by looking at the unit again).
func (m *Manager) job(ctx context.Context, verb string) error {
	c, err := m.bus(ctx)
	if err != nil {
		return fmt.Errorf("%s %s: %w", verb, m.unit, err)
	}
	queue := c.RestartUnitContext
	if verb == "start" {
		queue = c.StartUnitContext
	}
	done := make(chan string, 1)
	if _, err := queue(ctx, m.unit, "replace", done); err != nil {
		return fmt.Errorf("%s %s: %w", verb, m.unit, err)
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case result := <-done:
			if result != "done" {
				return fmt.Errorf("%s %s: %w: %s", verb, m.unit, ErrJobFailed, result)
			}
			return nil
		case <-tick.C:
			if !c.Connected() {
				return fmt.Errorf("%s %s: %w", verb, m.unit, ErrBusLost)
			}
		case <-ctx.Done():
			return fmt.Errorf("%s %s: %w", verb, m.unit, ctx.Err())
		}
	}
}

// ErrBusLost: the bus connection closed while a job's result was awaited.
var ErrBusLost = errors.New("the system bus connection closed before the job's result came (dbus-daemon restarted?)")

func (m *Manager) unitProperty(ctx context.Context, name string) (*sddbus.Property, error) {
	c, err := m.bus(ctx)
	if err != nil {
		return nil, err
	}
	return c.GetUnitPropertyContext(ctx, m.unit, name)
}

func (m *Manager) serviceProperty(ctx context.Context, name string) (*sddbus.Property, error) {
	c, err := m.bus(ctx)
	if err != nil {
		return nil, err
	}
	return c.GetServicePropertyContext(ctx, m.unit, name)
}

func (m *Manager) resetFailed(ctx context.Context) error {
	c, err := m.bus(ctx)
	if err != nil {
		return err
	}
	return c.ResetFailedUnitContext(ctx, m.unit)
}

// UnitConfigFlag is the --config the unit gives the kubelet by itself, before dkc's drop-in: the one in
// $KUBELET_CONFIG_ARGS of the unit's Environment= (dkc's drop-in overrides it through an EnvironmentFile=,
// which this property does not show). "" when the unit sets none there. It tells what a reset to the local
// config would run even while the kubelet runs a checkpoint.
func (m *Manager) UnitConfigFlag(ctx context.Context) (string, error) {
	p, err := m.serviceProperty(ctx, "Environment")
	if err != nil {
		return "", fmt.Errorf("read Environment of %s: %w", m.unit, err)
	}
	env, _ := p.Value.Value().([]string)
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, kubeletunit.Variable+"="); ok {
			config, _ := configcheck.ConfigFlag(strings.Fields(v))
			return config, nil
		}
	}
	return "", nil
}

// MainPID is `systemctl show --property MainPID UNIT`: 0 when the unit runs no process.
func (m *Manager) MainPID(ctx context.Context) (int, error) {
	p, err := m.serviceProperty(ctx, "MainPID")
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
	return m.job(ctx, "start")
}

// Reload is `systemctl daemon-reload`: systemd re-reads unit files and drop-ins.
func (m *Manager) Reload(ctx context.Context) error {
	c, err := m.bus(ctx)
	if err != nil {
		return fmt.Errorf("daemon-reload: %w", err)
	}
	if err := c.ReloadContext(ctx); err != nil {
		return fmt.Errorf("daemon-reload: %w", err)
	}
	return nil
}
