// SPDX-License-Identifier: Apache-2.0

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

	"github.com/dkc-dev/dkc/internal/configcheck"
	"github.com/dkc-dev/dkc/sidecar/internal/kubeletunit"
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
	conn, err := sddbus.NewConnection(func() (*godbus.Conn, error) { return dialBus(ctx, m.address) })
	if err != nil {
		return nil, fmt.Errorf("connect to systemd on %s: %w", m.address, err)
	}
	m.conn = conn
	return conn, nil
}

// dialBus connects and authenticates within ctx: the handshake waits on a socket-activated bus whose daemon
// is not back yet, and a SIGTERM must still end it. The connection then lives until closed, whatever ctx does.
func dialBus(ctx context.Context, address string) (*godbus.Conn, error) {
	life, cancel := context.WithCancel(context.Background())
	c, err := godbus.Dial(address, godbus.WithContext(life))
	if err != nil {
		cancel()
		return nil, err
	}
	stop := context.AfterFunc(ctx, cancel) // cancelling life closes c
	err = c.Auth([]godbus.Auth{godbus.AuthExternal(strconv.Itoa(os.Getuid()))})
	if err == nil {
		err = c.Hello()
	}
	if !stop() && err == nil {
		err = ctx.Err()
	}
	if err != nil {
		c.Close()
		cancel()
		return nil, err
	}
	return c, nil
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
			"so the kubelet must run under this node's systemd (a kubelet supervised otherwise: --restart-mode=signal, "+
			"with the host's PID namespace)", ErrNoUnit, m.unit, state)
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
var processFailures = map[string]bool{"exit-code": true, "signal": true, "core-dump": true, "timeout": true,
	"watchdog": true}

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
	before, _ := m.invocationID(ctx)
	m.pacer.record()
	err = m.job(ctx, "restart", (*sddbus.Conn).RestartUnitContext)
	if errors.Is(err, ErrBusLost) {
		return m.afterBusLoss(ctx, before, err)
	}
	if !errors.Is(err, ErrJobFailed) {
		return err
	}
	result, rerr := m.serviceResult(ctx)
	if rerr != nil {
		return err
	}
	if processFailures[result] {
		// The Result may be an earlier process's: a restart job that catches a unit crash-looping under its
		// Restart= (the config before this one failing) between two starts can fail before any process of
		// its own runs. Only a process started since the job began ran the config the env file names now.
		if after, ierr := m.invocationID(ctx); ierr == nil && before != "" && after == before {
			return fmt.Errorf("%w (no kubelet process of this restart ran: %s Result=%s is an earlier one's)",
				err, m.unit, result)
		}
		return &StartFailedError{Unit: m.unit, Result: result, Err: err}
	}
	if result != "start-limit-hit" {
		return err
	}
	if rerr := m.resetFailed(ctx); rerr != nil {
		//nolint:errorlint // the restart's error decides; reset-failed's is for the reader
		return fmt.Errorf("%w; reset-failed: %v", err, rerr)
	}
	m.pacer.record()
	if err := m.job(ctx, "start", (*sddbus.Conn).StartUnitContext); err != nil {
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
// result comes as a bus signal: a connection that closes before it (or before the call's reply) ends the
// wait with ErrBusLost, and the job itself may or may not have run (see afterBusLoss).
func (m *Manager) job(ctx context.Context, verb string,
	queue func(*sddbus.Conn, context.Context, string, string, chan<- string) (int, error)) error {
	return m.jobOn(ctx, verb, m.unit, func(c *sddbus.Conn, done chan<- string) (int, error) {
		return queue(c, ctx, m.unit, "replace", done)
	})
}

// jobOn queues a job on unit with queue and waits for its result, as job does.
func (m *Manager) jobOn(ctx context.Context, verb, unit string,
	queue func(c *sddbus.Conn, done chan<- string) (int, error)) error {
	c, err := m.bus(ctx)
	if err != nil {
		return fmt.Errorf("%s %s: %w", verb, unit, err)
	}
	done := make(chan string, 1)
	if _, err := queue(c, done); err != nil {
		if !c.Connected() {
			//nolint:errorlint // callers decide on ErrBusLost alone
			return fmt.Errorf("%s %s: %w: %v", verb, unit, ErrBusLost, err)
		}
		return fmt.Errorf("%s %s: %w", verb, unit, err)
	}
	for {
		select {
		case result := <-done:
			if result != "done" {
				return fmt.Errorf("%s %s: %w: %s", verb, unit, ErrJobFailed, result)
			}
			return nil
		case <-m.pacer.clock.After(time.Second):
			if !c.Connected() {
				return fmt.Errorf("%s %s: %w", verb, unit, ErrBusLost)
			}
		case <-ctx.Done():
			return fmt.Errorf("%s %s: %w", verb, unit, ctx.Err())
		}
	}
}

// afterBusLoss finds out what became of a restart whose result went with the bus connection (dbus-daemon
// restarted meanwhile): on a new connection it waits until the unit has no job queued, then compares the
// unit's invocation ID with the one from before. Unchanged, the restart never ran: a plain error, and the
// caller tries again later. Changed, the kubelet was restarted, and the unit's state says how that went, as a
// job result would have: nil, StartFailedError, or ErrJobFailed.
func (m *Manager) afterBusLoss(ctx context.Context, before string, lost error) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute) // systemd's default stop plus start timeouts, with room
	defer cancel()
	for {
		p, err := m.unitProperty(ctx, "Job")
		if err == nil {
			if job, ok := p.Value.Value().([]any); ok && len(job) == 2 && job[0] == uint32(0) {
				break
			}
		}
		select {
		case <-ctx.Done():
			//nolint:errorlint // the lost bus decides, not the context that ended the wait
			return fmt.Errorf("%w; then the unit's job could not be followed: %v", lost, ctx.Err())
		case <-m.pacer.clock.After(500 * time.Millisecond):
		}
	}
	after, err := m.invocationID(ctx)
	if err != nil {
		//nolint:errorlint // the lost bus decides; what followed is for the reader
		return fmt.Errorf("%w; then: %v", lost, err)
	}
	if before != "" && after == before {
		return fmt.Errorf("%w; %s was not restarted", lost, m.unit)
	}
	state, result, err := m.State(ctx)
	switch {
	case err != nil:
		//nolint:errorlint // the lost bus decides; what followed is for the reader
		return fmt.Errorf("%w; then: %v", lost, err)
	case state == "active":
		return nil
	case processFailures[result]:
		return &StartFailedError{Unit: m.unit, Result: result, Err: lost}
	default:
		return fmt.Errorf("restart %s: %w: %s is %s (Result=%s) after the bus came back", m.unit, ErrJobFailed, m.unit, state,
			result)
	}
}

// InvocationID is `systemctl show --property InvocationID UNIT`: it identifies the unit's current run,
// systemd draws a new one at every start (the agent tells the kubelet's starts it did not make by it).
func (m *Manager) InvocationID(ctx context.Context) (string, error) { return m.invocationID(ctx) }

// DropInPaths is `systemctl show --property DropInPaths UNIT`: the drop-ins systemd loaded for the unit at
// its last daemon-reload.
func (m *Manager) DropInPaths(ctx context.Context) ([]string, error) {
	p, err := m.unitProperty(ctx, "DropInPaths")
	if err != nil {
		return nil, fmt.Errorf("read DropInPaths of %s: %w", m.unit, err)
	}
	paths, _ := p.Value.Value().([]string)
	return paths, nil
}

// invocationID identifies the unit's current run: systemd draws a new one at every start.
func (m *Manager) invocationID(ctx context.Context) (string, error) {
	p, err := m.unitProperty(ctx, "InvocationID")
	if err != nil {
		return "", fmt.Errorf("read InvocationID of %s: %w", m.unit, err)
	}
	id, _ := p.Value.Value().([]byte)
	return fmt.Sprintf("%x", id), nil
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

// LoadsEnvironmentFile says whether the unit reads path as an EnvironmentFile= (`systemctl show --property
// EnvironmentFiles UNIT`), as it does with dkc's drop-in loaded.
func (m *Manager) LoadsEnvironmentFile(ctx context.Context, path string) (bool, error) {
	p, err := m.serviceProperty(ctx, "EnvironmentFiles")
	if err != nil {
		return false, fmt.Errorf("read EnvironmentFiles of %s: %w", m.unit, err)
	}
	files, _ := p.Value.Value().([][]any)
	for _, f := range files {
		if len(f) > 0 && f[0] == path {
			return true, nil
		}
	}
	return false, nil
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
	return m.job(ctx, "start", (*sddbus.Conn).StartUnitContext)
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
