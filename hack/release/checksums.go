// SPDX-License-Identifier: Apache-2.0

package main

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// checksumsName is the checksums file of a release, named like its archives so that two releases' files
// never collide in one download directory.
func checksumsName(version string) string {
	return fmt.Sprintf("%s_%s_checksums.txt", cliBin, version)
}

// sha256File returns the hex SHA-256 of a file's content.
func sha256File(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("checksum: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("checksum %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// writeChecksums writes the SHA-256 of each file (by path) into path as GNU sha256sum writes them: one
// "<hex>  <name>" line each (two spaces: text mode), names relative to path's directory, sorted. So
// `sha256sum -c` (and `shasum -a 256 -c` on macOS) checks a download directory holding both.
func writeChecksums(path string, files []string) error {
	var lines []string
	for _, f := range files {
		rel, err := filepath.Rel(filepath.Dir(path), f)
		if err != nil || strings.ContainsAny(rel, "\n\\") || strings.HasPrefix(rel, "..") {
			return fmt.Errorf("checksums %s: %s is not a plain file beside it", path, f)
		}
		sum, err := sha256File(f)
		if err != nil {
			return err
		}
		lines = append(lines, sum+"  "+filepath.ToSlash(rel)+"\n")
	}
	// Sorted by name: the file's bytes do not depend on the order the platforms were built in.
	slices.SortFunc(lines, func(a, b string) int { return strings.Compare(a[66:], b[66:]) })
	if err := os.WriteFile(path, []byte(strings.Join(lines, "")), 0o644); err != nil {
		return fmt.Errorf("checksums: %w", err)
	}
	return nil
}
