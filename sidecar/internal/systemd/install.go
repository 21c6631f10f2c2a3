// SPDX-License-Identifier: Apache-2.0

package systemd

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"strings"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	godbus "github.com/godbus/dbus/v5"
)

// InstallUnitPrefix starts the name of every transient unit InstallFile runs: the node's journal and
// `systemctl list-units 'dkc-restore-kubelet-dropin-*'` show them.
const InstallUnitPrefix = "dkc-restore-kubelet-dropin-"

// InstallTempSuffix names the copy InstallFile renames onto the destination: in the same directory, so that
// the rename is atomic, and not ending in .conf, so that systemd never loads it as a drop-in.
const InstallTempSuffix = ".dkc-tmp"

// InstallFile is `systemd-run --wait --collect --unit dkc-restore-kubelet-dropin-<random> --property
// Type=oneshot` running, in order and stopping at the first failure:
//
//	/bin/cp -f -T -- SRC DST.dkc-tmp
//	/bin/sync -- DST.dkc-tmp
//	/bin/mv -f -T -- DST.dkc-tmp DST
//	/bin/sync -- DIR(DST)
//
// It returns once they have run, with an error unless all succeeded. The long-running sidecar has no mount
// of the unit directory (docs/security.md: the init container installs the drop-in and exits), so it puts a
// drop-in back the way it removes kubelet state (RemoveFiles): the node's systemd copies the file the
// sidecar wrote in its own directory, atomically (a rename in the destination's directory) and durably
// (both syncs). The caller makes systemd read it (Reload).
func (m *Manager) InstallFile(ctx context.Context, src, dst string) error {
	props, err := InstallUnitProperties(src, dst)
	if err != nil {
		return err
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	// A fresh name each time, as RemoveFiles's.
	name := InstallUnitPrefix + hex.EncodeToString(b) + ".service"
	err = m.jobOn(ctx, "start", name, func(c *sddbus.Conn, done chan<- string) (int, error) {
		return c.StartTransientUnitContext(ctx, name, "fail", props, done)
	})
	if err != nil {
		return fmt.Errorf("install %s as %s: %w", src, dst, err)
	}
	return nil
}

// execCommand is one entry of a service's ExecStart property (D-Bus signature (sasb)): the program, its
// argv (argv[0] the program again), and whether an unclean exit fails the unit.
type execCommand struct {
	Path             string
	Args             []string
	UncleanIsFailure bool
}

// InstallCommands are the commands InstallFile runs for src and dst, in order (see InstallFile).
func InstallCommands(src, dst string) [][]string {
	tmp := dst + InstallTempSuffix
	return [][]string{
		{"/bin/cp", "-f", "-T", "--", src, tmp},
		{"/bin/sync", "--", tmp},
		{"/bin/mv", "-f", "-T", "--", tmp, dst},
		{"/bin/sync", "--", filepath.Dir(dst)},
	}
}

// InstallUnitProperties are the properties of the transient service that installs src as dst: a oneshot
// running InstallCommands, whose start job ends when the last has exited ("done" only if every one exited
// 0; systemd runs none after one that failed), collected afterwards whether it failed or not.
//
// Both paths must be absolute and clean, made only of the POSIX portable file name characters and '/' (so
// nothing systemd expands, no option, no space), and different. dst must be a systemd drop-in: a .conf file
// directly in a directory named <unit>.service.d. That is all this ever writes: what a bug or a hostile
// caller could make of it is a drop-in's content, which the sidecar takes from its own directory.
func InstallUnitProperties(src, dst string) ([]sddbus.Property, error) {
	for _, p := range []string{src, dst} {
		if err := portablePath(p); err != nil {
			return nil, err
		}
	}
	switch {
	case src == dst:
		return nil, fmt.Errorf("%w %q: source and destination are the same file", ErrUnsafePath, dst)
	case !strings.HasSuffix(filepath.Base(dst), ".conf") || filepath.Base(dst) == ".conf":
		return nil, fmt.Errorf("%w %q: not a drop-in (a .conf file)", ErrUnsafePath, dst)
	case !strings.HasSuffix(filepath.Base(filepath.Dir(dst)), ".service.d") ||
		filepath.Base(filepath.Dir(dst)) == ".service.d":
		return nil, fmt.Errorf("%w %q: not in a service's drop-in directory (<unit>.service.d)", ErrUnsafePath, dst)
	}
	var cmds []execCommand
	for _, c := range InstallCommands(src, dst) {
		cmds = append(cmds, execCommand{Path: c[0], Args: c, UncleanIsFailure: true})
	}
	return []sddbus.Property{
		sddbus.PropDescription("dkc: restore the kubelet drop-in dkc installed"),
		sddbus.PropType("oneshot"),
		{Name: "ExecStart", Value: godbus.MakeVariant(cmds)},
		{Name: "CollectMode", Value: godbus.MakeVariant("inactive-or-failed")},
	}, nil
}

// portablePath refuses a path that is not absolute and clean, or has a byte outside [A-Za-z0-9._-/]: an
// allow-list, as kubeletunit.ValidatePath's, rather than RemoveUnitProperties's deny-list, since a path
// here is written to.
func portablePath(p string) error {
	if !filepath.IsAbs(p) || filepath.Clean(p) != p || p == "/" {
		return fmt.Errorf("%w %q: not an absolute, clean path of a file", ErrUnsafePath, p)
	}
	for i := 0; i < len(p); i++ {
		c := p[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' ||
			c == '-' || c == '/') {
			return fmt.Errorf("%w %q: byte %q at %d; only A-Z a-z 0-9 . _ - / are allowed", ErrUnsafePath, p, c, i)
		}
	}
	return nil
}
