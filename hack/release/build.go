// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"

	"github.com/dkc-dev/dkc/internal/configcheck"
	dkcversion "github.com/dkc-dev/dkc/internal/version"
)

const (
	// cliPkg by import path, so the build works from any directory of the module (the tests run in theirs).
	cliPkg = "github.com/dkc-dev/dkc/cli/cmd/kubectl-dkc"
	cliBin = "kubectl-dkc"
	// kubeletCheckBuild builds every dkc-kubelet-check-<minor>, relative to the repository's root.
	kubeletCheckBuild = "internal/kubeletcheck/build.sh"
)

// ldflags: -s -w drop the symbol table and DWARF, which stack traces do not need.
const ldflags = "-ldflags=-s -w"

// shipsKubeletChecks says whether p's archive carries the dkc-kubelet-check-<minor> helpers. Only linux:
// built for darwin they would link the kubelet's non-Linux code paths and so check configs as no real
// kubelet does (k8s.io/kubernetes: pkg/kubelet/eviction/defaults_others.go has no inodesFree eviction
// defaults; pkg/kubelet/apis/config/validation/validation_others.go refuses singleProcessOOMKill,
// userNamespaces and defaultPodSysctls as "only supported on linux" and skips the cgroup v1 check), which
// would break the promise that diff loads a config exactly as the node's kubelet would.
func shipsKubeletChecks(p platform) bool { return p.os == "linux" }

// buildCLI cross-builds kubectl-dkc for p into dir, as `make build` and the images build (static,
// -trimpath, -buildvcs=false: the checkout's path and state stay out of the binary, so a commit compiles
// to the same bytes anywhere), stamped with version (what `kubectl dkc version` prints), and returns the
// binary's path.
func buildCLI(ctx context.Context, dir string, p platform, version string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("create binary directory: %w", err)
	}
	bin, err := filepath.Abs(filepath.Join(dir, cliBin))
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-buildvcs=false",
		ldflags+" "+dkcversion.LinkerFlag(version), "-o", bin, cliPkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+p.os, "GOARCH="+p.arch)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go build %s for %s: %w", cliPkg, p, err)
	}
	return bin, nil
}

// buildKubeletChecks cross-builds the dkc-kubelet-check-<minor> helpers, one per supported kubelet minor,
// for p into dir with the script `make build` and the images use, and returns their paths, sorted.
func buildKubeletChecks(ctx context.Context, root, dir string, p platform) ([]string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, filepath.Join(root, kubeletCheckBuild), abs, ldflags)
	cmd.Env = append(os.Environ(), "GOOS="+p.os, "GOARCH="+p.arch)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("build the kubelet config checkers for %s: %w", p, err)
	}
	built, err := filepath.Glob(filepath.Join(abs, configcheck.HelperPrefix+"*"))
	if err != nil || len(built) == 0 {
		return nil, fmt.Errorf("build the kubelet config checkers for %s: none in %s", p, abs)
	}
	slices.Sort(built)
	return built, nil
}
