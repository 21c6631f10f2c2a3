// Package devclustertest runs integration tests against a real dev cluster: one cluster per test binary,
// started in TestMain and stopped (by PID, with mounts cleaned up) when the tests end.
//
//	var cluster *devcluster.Cluster
//
//	func TestMain(m *testing.M) { os.Exit(devclustertest.Main(m, "mypkg", &cluster)) }
package devclustertest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/dkc-dev/dkc/internal/devcluster"
)

// Dir is where the cluster of the test binary called name lives: _output/test/<name> in the repository, so
// that its logs survive a failing run for reading.
func Dir(name string) (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	root, err := devcluster.RepoRoot(wd)
	if err != nil {
		return "", err
	}
	return filepath.Join(root, "_output", "test", name), nil
}

// Main starts a cluster for the test binary, runs the tests, stops the cluster and returns the exit code.
// A cluster left behind by an earlier run of the same binary that was killed is stopped first.
func Main(m *testing.M, name string, out **devcluster.Cluster) int {
	dir, err := Dir(name)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if old, err := devcluster.Open(dir); err == nil {
		if err := old.Stop(context.Background()); err != nil {
			fmt.Fprintf(os.Stderr, "stop leftover cluster in %s: %v\n", dir, err)
			return 1
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute) // includes a cold binary build
	defer cancel()
	bin, err := BuildService(ctx, dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	c, err := devcluster.Start(ctx, devcluster.Config{Dir: dir, ServiceBinary: bin, Progress: os.Stderr})
	if err != nil {
		fmt.Fprintf(os.Stderr, "start dev cluster: %v\nlogs: %s\n", err, filepath.Join(dir, "logs"))
		return 1
	}
	*out = c
	code := m.Run()
	if code != 0 {
		fmt.Fprintf(os.Stderr, "tests failed; process logs are in %s\n", c.LogDir())
	}
	if err := c.Stop(context.Background()); err != nil {
		fmt.Fprintf(os.Stderr, "stop dev cluster: %v\n", err)
		return 1
	}
	return code
}

// BuildService builds dkc-server from this checkout into dir/bin, so that integration tests always run the
// code under test (and need no `make build` first).
func BuildService(ctx context.Context, dir string) (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	root, err := devcluster.RepoRoot(wd)
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, "bin", "dkc-server")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, "./services/cmd/dkc-server")
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build dkc-server: %w\n%s", err, b)
	}
	return out, nil
}
