// SPDX-License-Identifier: Apache-2.0

package main

import (
	"archive/tar"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// entry is one file of an archive.
type entry struct {
	// name is its path in the archive: the archive is flat, so a base name ("kubectl-dkc", "LICENSE").
	name string
	// mode holds the permission bits: 0755 for programs, 0644 for documents.
	mode fs.FileMode
	// source is the file on the build host whose content (not its owner, mode or time) is archived.
	source string
}

// archiveName is the file a platform's archive is published as: kubectl-dkc_v0.2.0_linux_amd64.tar.gz.
func archiveName(version string, p platform) string {
	return fmt.Sprintf("%s_%s_%s_%s.tar.gz", cliBin, version, p.os, p.arch)
}

// writeArchive writes entries as a gzip-compressed tar to path. Its bytes depend only on the entries'
// names, modes and contents and on mtime: entries sorted by name, owner 0 with no user or group names,
// every time mtime (whole seconds), USTAR headers (no PAX access or change times), and a gzip header with
// neither a time nor a file name. The file appears complete or not at all (temp file, then rename).
func writeArchive(path string, entries []entry, mtime time.Time) (err error) {
	sorted := slices.Clone(entries)
	slices.SortFunc(sorted, func(a, b entry) int { return strings.Compare(a.name, b.name) })
	for i, e := range sorted {
		if e.name == "" || strings.ContainsAny(e.name, `/\`) || e.name == "." || e.name == ".." {
			return fmt.Errorf("archive %s: entry %q: want a plain file name", path, e.name)
		}
		if i > 0 && sorted[i-1].name == e.name {
			return fmt.Errorf("archive %s: entry %s listed twice", path, e.name)
		}
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("archive %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	zw, err := gzip.NewWriterLevel(tmp, gzip.BestCompression)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(zw)
	mtime = mtime.UTC().Truncate(time.Second)
	for _, e := range sorted {
		if err := writeEntry(tw, e, mtime); err != nil {
			return fmt.Errorf("archive %s: entry %s: %w", path, e.name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("archive %s: close tar: %w", path, err)
	}
	if err := zw.Close(); err != nil {
		return fmt.Errorf("archive %s: close gzip: %w", path, err)
	}
	// Published files are read by others: 0644 whatever the umask or CreateTemp's 0600 say.
	if err := tmp.Chmod(0o644); err != nil {
		return fmt.Errorf("archive %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("archive %s: %w", path, err)
	}
	return os.Rename(tmp.Name(), path)
}

func writeEntry(tw *tar.Writer, e entry, mtime time.Time) error {
	f, err := os.Open(e.source)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file", e.source)
	}
	hdr := &tar.Header{
		Typeflag: tar.TypeReg,
		Name:     e.name,
		Mode:     int64(e.mode.Perm()),
		Size:     st.Size(),
		ModTime:  mtime,
		Format:   tar.FormatUSTAR,
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	// A file that changes size while it is copied fails here (tar: write too long, or short on Close).
	if _, err := io.Copy(tw, f); err != nil {
		return fmt.Errorf("copy %s: %w", e.source, err)
	}
	return nil
}

// archivedFile is what an archive holds under one name.
type archivedFile struct {
	name string
	mode fs.FileMode
	size int64
}

// readArchive lists the files of a gzip-compressed tar in their order: what the krew manifest and the
// tests learn from the archive as published, not from what was meant to go in.
func readArchive(path string) ([]archivedFile, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read archive: %w", err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return nil, fmt.Errorf("read archive %s: %w", path, err)
	}
	tr := tar.NewReader(zr)
	var files []archivedFile
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			// The rest of the gzip stream (zero padding), then its trailer's CRC and size are checked.
			if _, err := io.Copy(io.Discard, zr); err != nil {
				return nil, fmt.Errorf("read archive %s: %w", path, err)
			}
			return files, nil
		}
		if err != nil {
			return nil, fmt.Errorf("read archive %s: %w", path, err)
		}
		if hdr.Typeflag != tar.TypeReg {
			return nil, fmt.Errorf("read archive %s: %s is not a regular file (type %q)", path, hdr.Name, hdr.Typeflag)
		}
		// Read through, so a truncated archive fails here rather than at someone's install.
		if _, err := io.Copy(io.Discard, tr); err != nil {
			return nil, fmt.Errorf("read archive %s: %s: %w", path, hdr.Name, err)
		}
		files = append(files, archivedFile{name: hdr.Name, mode: fs.FileMode(hdr.Mode).Perm(), size: hdr.Size})
	}
}
