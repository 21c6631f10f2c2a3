// SPDX-License-Identifier: Apache-2.0

// Package durable is the one way the sidecar writes to disk: every file and directory is written under a
// temporary name in the same directory, fsynced, renamed into place, and then the parent directory is
// fsynced, so that a crash or power loss at any instant leaves either the old or the new content — never an
// empty or partial file (the original kubelet's bug #52222) and never a rename lost from the directory
// (renameio alone does not fsync the directory).
//
// Temporary names start with TempPrefix; CleanTemp removes leftovers of a crash.
package durable

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
)

// TempPrefix starts the name of every temporary file or directory.
const TempPrefix = ".tmp-"

// FaultFunc is called at each step of a write with a name for the step ("write", "fsync", "rename",
// "fsync-dir"); a non-nil error aborts the write there. Tests inject crashes with it (a FaultFunc that never
// returns is a kill -9 at that instant). Production code never sets one.
type FaultFunc func(step, path string) error

var faultHook atomic.Pointer[FaultFunc]

// SetFault installs f (nil removes it).
func SetFault(f FaultFunc) {
	if f == nil {
		faultHook.Store(nil)
		return
	}
	faultHook.Store(&f)
}

func fault(step, path string) error {
	if f := faultHook.Load(); f != nil {
		return (*f)(step, path)
	}
	return nil
}

// writers bounds concurrent writes in this process when set (SetMaxConcurrent).
var writers atomic.Pointer[chan struct{}]

// SetMaxConcurrent bounds how many writes run at once in this process; 0 removes the bound. A sidecar writes
// one thing at a time and never needs it. A process that runs thousands of nodes' stores on one disk (the
// benchmark) does: otherwise every write blocks an OS thread in the same filesystem journal and the kernel
// spends the CPU on contention that the nodes' network code needs.
func SetMaxConcurrent(n int) {
	if n <= 0 {
		writers.Store(nil)
		return
	}
	ch := make(chan struct{}, n)
	writers.Store(&ch)
}

func acquire() func() {
	ch := writers.Load()
	if ch == nil {
		return func() {}
	}
	*ch <- struct{}{}
	return func() { <-*ch }
}

// WriteFile atomically and durably replaces path with data.
func WriteFile(path string, data []byte, perm os.FileMode) error {
	defer acquire()()
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	f, err := os.CreateTemp(dir, TempPrefix+base+"-")
	if err != nil {
		return fmt.Errorf("create temp file for %s: %w", path, err)
	}
	tmp := f.Name()
	ok := false
	defer func() {
		if !ok {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if err := fault("write", path); err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("write %s: %w", tmp, err)
	}
	if err := f.Chmod(perm); err != nil {
		return fmt.Errorf("chmod %s: %w", tmp, err)
	}
	if err := fault("fsync", path); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", tmp, err)
	}
	if err := fault("rename", path); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("rename %s to %s: %w", tmp, path, err)
	}
	ok = true
	if err := fault("fsync-dir", path); err != nil {
		return err
	}
	return SyncDir(dir)
}

// WriteDir atomically and durably creates directory path holding files (name → content). path must not
// exist; each name must be a plain file name (the caller validates untrusted names).
func WriteDir(path string, files map[string][]byte, perm os.FileMode) error {
	defer acquire()()
	parent, base := filepath.Split(path)
	tmp, err := os.MkdirTemp(parent, TempPrefix+base+"-")
	if err != nil {
		return fmt.Errorf("create temp dir for %s: %w", path, err)
	}
	ok := false
	defer func() {
		if !ok {
			os.RemoveAll(tmp)
		}
	}()
	for name, data := range files {
		if name == "" || name != filepath.Base(name) || name == "." || name == ".." {
			return fmt.Errorf("write %s: %q is not a plain file name", path, name)
		}
		if err := fault("write", filepath.Join(path, name)); err != nil {
			return err
		}
		if err := writeSynced(filepath.Join(tmp, name), data, perm); err != nil {
			return err
		}
	}
	if err := fault("fsync", path); err != nil {
		return err
	}
	if err := SyncDir(tmp); err != nil {
		return err
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return fmt.Errorf("chmod %s: %w", tmp, err)
	}
	if err := fault("rename", path); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("rename %s to %s: %w", tmp, path, err)
	}
	ok = true
	if err := fault("fsync-dir", path); err != nil {
		return err
	}
	return SyncDir(parent)
}

func writeSynced(path string, data []byte, perm os.FileMode) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, perm)
	if err != nil {
		return fmt.Errorf("create %s: %w", path, err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("fsync %s: %w", path, err)
	}
	return f.Close()
}

// MkdirAll creates path and any missing parents, as os.MkdirAll, and makes each creation durable: a new
// directory is only an entry in its parent until the parent is fsynced, and a power loss before that loses
// it with everything durably written inside it. The fault step is "fsync-dir" with the created directory
// as path, as for a file, whose "fsync-dir" also syncs its parent.
func MkdirAll(path string, perm os.FileMode) error {
	path = filepath.Clean(path)
	st, err := os.Stat(path)
	if err == nil {
		if st.IsDir() {
			return nil
		}
		return fmt.Errorf("create dir %s: %w", path, syscall.ENOTDIR)
	}
	if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("create dir %s: %w", path, err)
	}
	parent := filepath.Dir(path)
	if parent != path {
		if err := MkdirAll(parent, perm); err != nil {
			return err
		}
	}
	// EEXIST: another writer created it in the meantime; syncing the parent again is harmless and does not
	// depend on that writer having got to its own sync.
	if err := os.Mkdir(path, perm); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("create dir %s: %w", path, err)
	}
	if err := fault("fsync-dir", path); err != nil {
		return err
	}
	return SyncDir(parent)
}

// SyncDir fsyncs a directory, making renames and creations in it durable.
func SyncDir(dir string) error {
	if dir == "" {
		dir = "."
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open dir %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync dir %s: %w", dir, err)
	}
	return nil
}

// RemoveAll removes path durably: it is first renamed to a temporary name (one atomic step, so a crash
// never leaves a half-deleted directory under its real name), the parent is fsynced, then it is deleted.
func RemoveAll(path string) error {
	parent, base := filepath.Split(path)
	if _, err := os.Lstat(path); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	tmp, err := os.MkdirTemp(parent, TempPrefix+"rm-"+base+"-")
	if err != nil {
		return fmt.Errorf("remove %s: %w", path, err)
	}
	victim := filepath.Join(tmp, base)
	if err := os.Rename(path, victim); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("remove %s: %w", path, err)
	}
	if err := SyncDir(parent); err != nil {
		return err
	}
	return os.RemoveAll(tmp)
}

// CleanTemp removes leftovers of interrupted writes directly inside dir and returns their names.
func CleanTemp(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read dir %s: %w", dir, err)
	}
	var removed []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), TempPrefix) {
			if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
				return removed, fmt.Errorf("remove leftover %s: %w", e.Name(), err)
			}
			removed = append(removed, e.Name())
		}
	}
	if len(removed) > 0 {
		return removed, SyncDir(dir)
	}
	return nil, nil
}
