// SPDX-License-Identifier: Apache-2.0

// Package ociimage assembles dkc's container images from files on disk without a container daemon or a
// remote base image: every layer is a tar written here byte for byte the same on every run, so the same
// sources and the same timestamp give the same image digest.
package ociimage

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// File is one entry of a layer. Exactly one of Data, Source or Dir says what it holds.
type File struct {
	// Path is absolute inside the image, e.g. /usr/local/bin/dkc-server.
	Path string
	// Mode holds the permission bits (and sticky bit); the type comes from Dir.
	Mode     fs.FileMode
	UID, GID int
	Dir      bool
	Data     []byte
	// Source is a file on the build host whose content (not its owner, mode or time) goes into the layer.
	Source string
}

// Layer writes files into one gzip-compressed OCI layer. Entries are sorted by path, missing parent
// directories are added as root-owned 0755, every time is mtime, and no user or group names are recorded,
// so the host's clock, umask and /etc/passwd cannot change the digest.
func Layer(files []File, mtime time.Time) (v1.Layer, error) {
	entries, err := withParents(files)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range entries {
		if err := writeEntry(tw, f, mtime.UTC().Truncate(time.Second)); err != nil {
			return nil, fmt.Errorf("layer entry %s: %w", f.Path, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("close layer tar: %w", err)
	}
	raw := buf.Bytes()
	// Compressed caching: the layer is read for its digest, the docker archive and the OCI layout; gzip once.
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(raw)), nil
	}, tarball.WithMediaType(types.OCILayer), tarball.WithCompressedCaching)
}

func withParents(files []File) ([]File, error) {
	byPath := map[string]File{}
	for _, f := range files {
		if !path.IsAbs(f.Path) || path.Clean(f.Path) != f.Path || f.Path == "/" {
			return nil, fmt.Errorf("layer entry %q: want a clean absolute path below /", f.Path)
		}
		if _, dup := byPath[f.Path]; dup {
			return nil, fmt.Errorf("layer entry %s: listed twice", f.Path)
		}
		byPath[f.Path] = f
	}
	for _, f := range files {
		for dir := path.Dir(f.Path); dir != "/"; dir = path.Dir(dir) {
			if _, ok := byPath[dir]; !ok {
				byPath[dir] = File{Path: dir, Dir: true, Mode: 0o755}
			}
		}
	}
	out := make([]File, 0, len(byPath))
	for _, f := range byPath {
		out = append(out, f)
	}
	slices.SortFunc(out, func(a, b File) int { return strings.Compare(a.Path, b.Path) })
	return out, nil
}

func writeEntry(tw *tar.Writer, f File, mtime time.Time) error {
	hdr := &tar.Header{
		Name:    strings.TrimPrefix(f.Path, "/"),
		Mode:    int64(f.Mode.Perm()),
		Uid:     f.UID,
		Gid:     f.GID,
		ModTime: mtime,
		// USTAR when the names fit: no PAX records with access or change times.
		Format: tar.FormatUSTAR,
	}
	if f.Mode&fs.ModeSticky != 0 {
		hdr.Mode |= 0o1000
	}
	if f.Dir {
		hdr.Typeflag = tar.TypeDir
		hdr.Name += "/"
		return tw.WriteHeader(hdr)
	}
	data := f.Data
	if f.Source != "" {
		var err error
		if data, err = os.ReadFile(f.Source); err != nil {
			return err
		}
	}
	hdr.Typeflag = tar.TypeReg
	hdr.Size = int64(len(data))
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	_, err := tw.Write(data)
	return err
}
