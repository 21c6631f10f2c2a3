// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"context"
	"debug/elf"
	"debug/macho"
	"os"
	"testing"
	"time"
)

func TestShipsKubeletChecks(t *testing.T) {
	for _, p := range supportedPlatforms {
		if got, want := shipsKubeletChecks(p), p.os == "linux"; got != want {
			t.Errorf("shipsKubeletChecks(%s) = %v, want %v", p, got, want)
		}
	}
}

// TestCrossBuildKubectlDKC — SLOW (compiles): about 3 minutes per platform from a cold build cache on two
// cores, up to 10 at the lowest priority beside the cluster suites, seconds warm; skipped with -short. It
// is bounded by go test's -timeout alone: a fixed deadline of its own failed cold CI runs. It cross-builds kubectl-dkc as `make release` does for the two arm64
// platforms, which nothing here can run, and reads each binary's headers: the architecture is arm64, the
// linux one is static (no program interpreter) and both are stripped (-s -w). The helpers are left out:
// each links a kubelet and would take minutes.
func TestCrossBuildKubectlDKC(t *testing.T) {
	if testing.Short() {
		t.Skip("cross-compiles kubectl-dkc twice (-short)")
	}
	ctx := context.Background()
	if deadline, ok := t.Deadline(); ok {
		// Stop the compiler a little before go test's own timeout so that the failure names the build.
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline.Add(-30*time.Second))
		defer cancel()
	}
	dir := t.TempDir()

	start := time.Now()
	bin, err := buildCLI(ctx, dir+"/linux", platform{"linux", "arm64"}, "v0.2.0-stamped")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("linux/arm64 built in %s", time.Since(start).Round(time.Second))
	ef, err := elf.Open(bin)
	if err != nil {
		t.Fatalf("linux/arm64 kubectl-dkc is no ELF file: %v", err)
	}
	defer ef.Close()
	if ef.Machine != elf.EM_AARCH64 || ef.Class != elf.ELFCLASS64 {
		t.Errorf("linux/arm64 kubectl-dkc: machine %v class %v, want EM_AARCH64 ELFCLASS64", ef.Machine, ef.Class)
	}
	for _, p := range ef.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("linux/arm64 kubectl-dkc has a program interpreter: not static (CGO_ENABLED=0)")
		}
	}
	if ef.Section(".symtab") != nil {
		t.Error("linux/arm64 kubectl-dkc has a symbol table: not stripped (-s)")
	}
	// The linker ignores an -X that names no variable: the version must be in the binary.
	if data, err := os.ReadFile(bin); err != nil || !bytes.Contains(data, []byte("v0.2.0-stamped")) {
		t.Errorf("linux/arm64 kubectl-dkc does not carry its version v0.2.0-stamped (%v)", err)
	}

	start = time.Now()
	bin, err = buildCLI(ctx, dir+"/darwin", platform{"darwin", "arm64"}, "v0.2.0-stamped")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("darwin/arm64 built in %s", time.Since(start).Round(time.Second))
	mf, err := macho.Open(bin)
	if err != nil {
		t.Fatalf("darwin/arm64 kubectl-dkc is no Mach-O file: %v", err)
	}
	defer mf.Close()
	if mf.Cpu != macho.CpuArm64 || mf.Type != macho.TypeExec {
		t.Errorf("darwin/arm64 kubectl-dkc: cpu %v type %v, want CpuArm64 executable", mf.Cpu, mf.Type)
	}
	if mf.Section("__debug_info") != nil || mf.Section("__zdebug_info") != nil {
		t.Error("darwin/arm64 kubectl-dkc has DWARF: not stripped (-w)")
	}
}
