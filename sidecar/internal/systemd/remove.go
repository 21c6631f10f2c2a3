// SPDX-License-Identifier: Apache-2.0

package systemd

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"unicode"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	godbus "github.com/godbus/dbus/v5"
)

// Stop is `systemctl stop UNIT`: it returns when the stop job has finished, the kubelet's processes gone.
func (m *Manager) Stop(ctx context.Context) error {
	return m.job(ctx, "stop", (*sddbus.Conn).StopUnitContext)
}

// RemoveUnitPrefix starts the name of every transient unit RemoveFiles runs: the node's journal and
// `systemctl list-units 'dkc-remove-kubelet-state-*'` show them.
const RemoveUnitPrefix = "dkc-remove-kubelet-state-"

// RemoveCommand is the program RemoveFiles runs; -f makes a file already gone no failure, and without -r it
// removes no directory, whatever a path names.
var RemoveCommand = []string{"/bin/rm", "-f", "--"}

// RemoveFiles is `systemd-run --wait --collect --unit dkc-remove-kubelet-state-<random> --property Type=oneshot
// /bin/rm -f -- PATHS`: the node's systemd removes the files in a transient service, and RemoveFiles returns
// once that has exited, with an error unless rm succeeded. The sidecar has no mount of the kubelet's root
// directory, where the files are (it holds the kubelet's keys: docs/security.md), so the service manager that
// already restarts the kubelet does it. A file that does not exist is no error.
func (m *Manager) RemoveFiles(ctx context.Context, paths []string) error {
	props, err := RemoveUnitProperties(paths)
	if err != nil {
		return err
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	// A fresh name each time: a unit left from an earlier attempt (a systemd that keeps failed transient
	// units despite CollectMode) never blocks the next.
	name := RemoveUnitPrefix + hex.EncodeToString(b) + ".service"
	err = m.jobOn(ctx, "start", name, func(c *sddbus.Conn, done chan<- string) (int, error) {
		return c.StartTransientUnitContext(ctx, name, "fail", props, done)
	})
	if err != nil {
		return fmt.Errorf("remove %s: %w", strings.Join(paths, " "), err)
	}
	return nil
}

// ErrUnsafePath: a path RemoveFiles refuses to hand to systemd.
var ErrUnsafePath = errors.New("refused path")

// RemoveUnitProperties are the properties of the transient service that removes paths: a oneshot whose start
// job ends when rm has exited ("done" only if it exited 0), collected afterwards whether it failed or not.
// Every path must be absolute and clean, and free of what systemd would expand in a command line ('$': its
// environment variables; '%': specifiers) or what no file name of the kubelet has (control characters).
func RemoveUnitProperties(paths []string) ([]sddbus.Property, error) {
	if len(paths) == 0 {
		return nil, fmt.Errorf("%w: no file to remove", ErrUnsafePath)
	}
	for _, p := range paths {
		switch {
		case !filepath.IsAbs(p) || filepath.Clean(p) != p || p == "/":
			return nil, fmt.Errorf("%w %q: not an absolute, clean path of a file", ErrUnsafePath, p)
		case strings.ContainsAny(p, "$%"), strings.IndexFunc(p, unicode.IsControl) >= 0:
			return nil, fmt.Errorf("%w %q: systemd would expand '$' or '%%' in it, or it has control characters",
				ErrUnsafePath, p)
		}
	}
	command := append(append([]string(nil), RemoveCommand...), paths...)
	return []sddbus.Property{
		sddbus.PropDescription("dkc: remove kubelet state a config change invalidates"),
		sddbus.PropType("oneshot"),
		sddbus.PropExecStart(command, true),
		{Name: "CollectMode", Value: godbus.MakeVariant("inactive-or-failed")},
	}, nil
}
