// SPDX-License-Identifier: Apache-2.0

package main

import (
	"crypto/sha256"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

func TestWriteChecksums(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		"kubectl-dkc_v0.2.0_linux_amd64.tar.gz":  "linux",
		"kubectl-dkc_v0.2.0_darwin_arm64.tar.gz": "darwin",
	}
	paths := writeFiles(t, dir, 0o644, files)
	sums := filepath.Join(dir, checksumsName("v0.2.0"))
	if filepath.Base(sums) != "kubectl-dkc_v0.2.0_checksums.txt" {
		t.Errorf("checksums file %s", filepath.Base(sums))
	}
	// Linux first: the file must be sorted by name whatever the order the platforms were built in.
	if err := writeChecksums(sums, []string{paths["kubectl-dkc_v0.2.0_linux_amd64.tar.gz"], paths["kubectl-dkc_v0.2.0_darwin_arm64.tar.gz"]}); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(sums)
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("%x  kubectl-dkc_v0.2.0_darwin_arm64.tar.gz\n%x  kubectl-dkc_v0.2.0_linux_amd64.tar.gz\n",
		sha256.Sum256([]byte("darwin")), sha256.Sum256([]byte("linux")))
	if string(got) != want {
		t.Errorf("checksums file:\n%s\nwant:\n%s", got, want)
	}

	// The tool people check downloads with agrees, and notices a corrupted download.
	sha256sum, err := exec.LookPath("sha256sum")
	if err != nil {
		t.Skip("no sha256sum on $PATH (coreutils): format checked above only")
	}
	check := exec.Command(sha256sum, "--check", "--strict", filepath.Base(sums))
	check.Dir = dir
	if out, err := check.CombinedOutput(); err != nil {
		t.Errorf("sha256sum --check --strict: %v\n%s", err, out)
	}
	if err := os.WriteFile(paths["kubectl-dkc_v0.2.0_linux_amd64.tar.gz"], []byte("tampered"), 0o644); err != nil {
		t.Fatal(err)
	}
	check = exec.Command(sha256sum, "--check", "--strict", filepath.Base(sums))
	check.Dir = dir
	if out, err := check.CombinedOutput(); err == nil {
		t.Errorf("sha256sum --check passed a changed archive:\n%s", out)
	}
}

func TestWriteChecksumsRefusesFilesElsewhere(t *testing.T) {
	dir := t.TempDir()
	paths := writeFiles(t, dir, 0o644, map[string]string{"a": "a"})
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := writeChecksums(filepath.Join(dir, "sub", "sums.txt"), []string{paths["a"]}); err == nil {
		t.Error("a file outside the checksums file's directory was listed")
	}
}
