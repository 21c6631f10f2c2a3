// SPDX-License-Identifier: Apache-2.0

package systemd

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	godbus "github.com/godbus/dbus/v5"
)

// VersionUnitPrefix starts the name of every transient unit BinaryVersion runs: the node's journal and
// `systemctl list-units 'dkc-kubelet-version-*'` show them.
const VersionUnitPrefix = "dkc-kubelet-version-"

// VersionFileName is the file, in the sidecar's dynamic config dir, that BinaryVersion's unit writes the
// binary's `--version` to.
const VersionFileName = "kubelet-version"

// maxVersionOutput bounds what is read of the binary's --version output.
const maxVersionOutput = 4 << 10

// versionTimeout bounds the version unit: `kubelet --version` prints and exits at once. Well within the
// caller's bound (the agent's drift check, 30s), so the unit never outlives the call.
const versionTimeout = 10 * time.Second

// BinaryVersion is `systemd-run --wait --collect --unit dkc-kubelet-version-<random> --property Type=oneshot
// --property StandardOutput=file:OUT --property PrivateNetwork=yes --property NoNewPrivileges=yes BIN
// --version`, BIN the program of the unit's (first) ExecStart: the binary the unit starts now, which after
// an upgrade in place is not the one that last ran. It returns what
// the binary printed (e.g. "Kubernetes v1.37.2\n") once it exited 0. The sidecar sees neither the node's
// binaries nor its processes' mounts, so the node's systemd runs the binary, as it runs RemoveFiles's rm.
func (m *Manager) BinaryVersion(ctx context.Context, out string) (string, error) {
	bin, err := m.ExecPath(ctx)
	if err != nil {
		return "", err
	}
	props, err := VersionUnitProperties(bin, out)
	if err != nil {
		return "", err
	}
	// Never a previous run's answer: the unit truncates the file, and it is gone if the unit never runs.
	if err := os.Remove(out); err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("remove %s: %w", out, err)
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := VersionUnitPrefix + hex.EncodeToString(b) + ".service"
	err = m.jobOn(ctx, "start", name, func(c *sddbus.Conn, done chan<- string) (int, error) {
		return c.StartTransientUnitContext(ctx, name, "fail", props, done)
	})
	if err != nil {
		return "", fmt.Errorf("run %s --version: %w", bin, err)
	}
	f, err := os.Open(out)
	if err != nil {
		return "", fmt.Errorf("run %s --version: read its output: %w", bin, err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxVersionOutput)) // a version is one short line
	if err != nil {
		return "", fmt.Errorf("run %s --version: read its output: %w", bin, err)
	}
	return string(data), nil
}

// ExecPath is the program of the unit's first ExecStart (`systemctl show --property ExecStart UNIT`),
// refused unless an absolute, clean path of portable characters.
func (m *Manager) ExecPath(ctx context.Context) (string, error) {
	p, err := m.serviceProperty(ctx, "ExecStart")
	if err != nil {
		return "", fmt.Errorf("read ExecStart of %s: %w", m.unit, err)
	}
	bin, err := execPath(p.Value)
	if err != nil {
		return "", fmt.Errorf("ExecStart of %s: %w", m.unit, err)
	}
	return bin, nil
}

// execPath is the program of the first command of an ExecStart property's value (signature
// a(sasbttttuii)).
func execPath(v godbus.Variant) (string, error) {
	cmds, ok := v.Value().([][]any)
	if !ok || len(cmds) == 0 || len(cmds[0]) == 0 {
		return "", fmt.Errorf("no command (%s)", v.Signature())
	}
	bin, ok := cmds[0][0].(string)
	if !ok {
		return "", fmt.Errorf("the command's program is a %T", cmds[0][0])
	}
	if err := portablePath(bin); err != nil {
		return "", err
	}
	return bin, nil
}

// VersionUnitProperties are the properties of the transient service that runs `BIN --version` with its
// standard output truncating OUT: a oneshot whose start job ends when the binary has exited ("done" only if
// it exited 0), collected afterwards whether it failed or not, and stopped after versionTimeout.
//
// Both paths must be absolute and clean, made only of the POSIX portable file name characters and '/', and
// OUT a file named VersionFileName: the unit runs the binary the kubelet's own unit starts, with the one fixed
// argument, and writes no other file.
func VersionUnitProperties(bin, out string) ([]sddbus.Property, error) {
	for _, p := range []string{bin, out} {
		if err := portablePath(p); err != nil {
			return nil, err
		}
	}
	if filepath.Base(out) != VersionFileName {
		return nil, fmt.Errorf("%w %q: not a file named %s", ErrUnsafePath, out, VersionFileName)
	}
	return []sddbus.Property{
		sddbus.PropDescription("dkc: ask the kubelet binary its version"),
		sddbus.PropType("oneshot"),
		{Name: "ExecStart", Value: godbus.MakeVariant([]execCommand{{Path: bin, Args: []string{bin, "--version"},
			UncleanIsFailure: true}})},
		// StandardOutput=file: (systemd 236; file:truncate needs 248): BinaryVersion removes the file first.
		{Name: "StandardOutputFile", Value: godbus.MakeVariant(out)},
		// Whatever ExecStart names (a wrapper script, too) gets no network and cannot gain privileges.
		{Name: "PrivateNetwork", Value: godbus.MakeVariant(true)},
		{Name: "NoNewPrivileges", Value: godbus.MakeVariant(true)},
		{Name: "TimeoutStartUSec", Value: godbus.MakeVariant(uint64(versionTimeout / time.Microsecond))},
		{Name: "CollectMode", Value: godbus.MakeVariant("inactive-or-failed")},
	}, nil
}
