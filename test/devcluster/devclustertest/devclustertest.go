// SPDX-License-Identifier: Apache-2.0

// Package devclustertest runs integration tests against a real dev cluster: one cluster per test binary,
// started in TestMain and stopped (by PID, with mounts cleaned up) when the tests end.
//
//	var cluster *devcluster.Cluster
//
//	func TestMain(m *testing.M) { os.Exit(devclustertest.Main(m, "mypkg", bySlowest, &cluster)) }
package devclustertest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/dkc-dev/dkc/test/devcluster"
)

// heldLock keeps this process's cluster lock (see freshDir) open, hence held, until the process exits.
//
//nolint:unused // never read: it keeps the file reachable, whose finalizer would close it and release the lock
var heldLock *os.File

// Dir is where the cluster of the test binary called name lives: _output/test/<name> in the repository, so
// that its logs survive a failing run for reading. $DKC_TEST_CLUSTER_SUFFIX, when set, is appended to name,
// so that two runs of the same test binary from one checkout (two developers' -run selections) each get a
// cluster of their own instead of stopping each other's as a leftover.
func Dir(name string) (string, error) {
	name += os.Getenv("DKC_TEST_CLUSTER_SUFFIX")
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
// A cluster left behind by an earlier run of the same binary that was killed is stopped first. $KUBE_VERSION
// and $KUBELET_VERSIONS choose the control plane and the real nodes' kubelets as for `make up` (default:
// devcluster.DefaultKubeVersion everywhere); tests read them back from Cluster.KubeletVersion.
//
// With $DKC_TEST_SHARD=<i>/<n> the binary runs shard i of its tests as Deal deals them over bySlowest (the
// suite's tests, slowest first), on a cluster of its own in Dir(name-<i>); a shard whose tests -run leaves
// out starts no cluster.
func Main(m *testing.M, name string, bySlowest []string, out **devcluster.Cluster) int {
	name, run, err := shardCluster(name, bySlowest)
	if err != nil || !run {
		return exitCode(err)
	}
	versions, err := devcluster.ParseKubeletVersions(os.Getenv("KUBELET_VERSIONS"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	dir, err := freshDir(name)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute) // includes a cold binary build
	defer cancel()
	bins, err := Build(ctx, dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	c, err := devcluster.Start(ctx, devcluster.Config{Dir: dir, KubeVersion: os.Getenv("KUBE_VERSION"),
		KubeletVersions: versions, ServiceBinary: bins["dkc-server"], SidecarBinary: bins["dkc-sidecar"],
		FakeKubeletBinary: bins["fake-kubelet"], SimNodes: SimNodes, TrialDuration: TrialDuration,
		SimTrialDuration: SimTrialDuration, HealthTimeout: HealthTimeout, Progress: os.Stderr})
	if err != nil {
		fmt.Fprintf(os.Stderr, "start dev cluster: %v\nlogs: %s\n", err, filepath.Join(dir, "logs"))
		return 1
	}
	*out = c
	return runAndStop(m, c)
}

// freshDir is Dir(name), emptied: a cluster left behind by an earlier run of the same binary that was
// killed is stopped first. A run that is still alive holds <dir>.lock (flock, released by the kernel when
// its process dies, however it dies): its cluster is not a leftover, and this run refuses to start rather
// than stop it under its feet.
func freshDir(name string) (string, error) {
	dir, err := Dir(name)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return "", err
	}
	lock, err := os.OpenFile(dir+".lock", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", err
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		lock.Close()
		return "", fmt.Errorf("another run of this test binary is using the cluster in %s (%s is locked): "+
			"set DKC_TEST_CLUSTER_SUFFIX to run beside it: %w", dir, dir+".lock", err)
	}
	heldLock = lock // held until the process exits
	if old, err := devcluster.Open(dir); err == nil {
		if err := old.Stop(context.Background()); err != nil {
			return "", fmt.Errorf("stop leftover cluster in %s: %w", dir, err)
		}
	}
	return dir, os.RemoveAll(dir)
}

// shardCluster applies $DKC_TEST_SHARD (selectShard) and returns the name of this shard's cluster (name-<i>
// when the suite runs as shards) and whether any of its tests is to run.
func shardCluster(name string, bySlowest []string) (string, bool, error) {
	shard, run, err := selectShard(bySlowest)
	if err != nil {
		return "", false, err
	}
	if !run {
		fmt.Fprintf(os.Stderr, "shard %d/%d: no test of this shard matches -run; no cluster started\n", shard.I, shard.N)
		return "", false, nil
	}
	if shard.N > 1 {
		name += "-" + strconv.Itoa(shard.I)
	}
	return name, true, nil
}

// exitCode is a test binary's exit code when TestMain ends before the tests: 1 after err (printed), else 0.
func exitCode(err error) int {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// runAndStop runs the tests against c, then stops c; it returns the exit code.
func runAndStop(m *testing.M, c *devcluster.Cluster) int {
	code := runRecapped(m.Run)
	if code != 0 {
		fmt.Fprintf(os.Stderr, "tests failed; logs are in %s (a node's units and pods: %s)\n", c.LogDir(),
			c.NodeLogDir("<node>"))
	}
	if err := c.Stop(context.Background()); err != nil {
		fmt.Fprintf(os.Stderr, "stop dev cluster: %v\n", err)
		return 1
	}
	if left := c.Leftovers(); len(left) > 0 {
		fmt.Fprintf(os.Stderr, "stopping the dev cluster left cgroups behind: %v\n", left)
		return 1
	}
	return code
}

// MainInstalled is Main for the installed form (devcluster.Config.Installed): images built from this
// checkout (hack/images) into the cluster's directory, or taken from $DKC_TEST_IMAGES_DIR, two real nodes
// of different kubelet minors (InstalledKubeletVersions), dkc applied with kubectl apply -k.
//
// Sharded as Main is.
func MainInstalled(m *testing.M, name string, bySlowest []string, out **devcluster.Cluster) int {
	name, run, err := shardCluster(name, bySlowest)
	if err != nil || !run {
		return exitCode(err)
	}
	versions, err := InstalledKubeletVersions(os.Getenv("KUBE_VERSION"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	dir, err := freshDir(name)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute) // includes cold builds
	defer cancel()
	images := os.Getenv(ImagesDirEnv)
	if images == "" {
		images = filepath.Join(dir, "images")
		if err := BuildImages(ctx, images); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	} else if !filepath.IsAbs(images) {
		fmt.Fprintf(os.Stderr, "%s=%s: want an absolute path (the test binary runs in its package's directory)\n",
			ImagesDirEnv, images)
		return 1
	}
	// dkc-dev's forward command serves DKC_SERVER, as `make up INSTALLED=1` does (CONTRACT §6).
	devBin := filepath.Join(dir, "bin", "dkc-dev")
	if err := goBuild(ctx, devBin, "./hack/dkc-dev"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	c, err := devcluster.Start(ctx, devcluster.Config{Dir: dir, KubeVersion: os.Getenv("KUBE_VERSION"),
		KubeletVersions: versions, Installed: true, ImagesDir: images, DevBinary: devBin,
		TrialDuration: TrialDuration, HealthTimeout: HealthTimeout, Progress: os.Stderr})
	if err != nil {
		fmt.Fprintf(os.Stderr, "start dev cluster (installed form): %v\nlogs: %s\n", err, filepath.Join(dir, "logs"))
		return 1
	}
	*out = c
	return runAndStop(m, c)
}

// InstalledKubeletVersions are the installed suite's kubelets: $KUBELET_VERSIONS when set (empty: every
// node runs the control plane's), else a skew cluster — node-1 runs the oldest kubelet minor the control
// plane kubeVersion ("" for the default) supports, node-2 the control plane's own — so that every installed
// test runs beside a kubelet of another minor, as clusters do during node upgrades. Derived from the
// dev cluster's table, it moves with the supported versions.
func InstalledKubeletVersions(kubeVersion string) (map[string]string, error) {
	if s, ok := os.LookupEnv("KUBELET_VERSIONS"); ok {
		return devcluster.ParseKubeletVersions(s)
	}
	if kubeVersion == "" {
		kubeVersion = devcluster.DefaultKubeVersion
	}
	vs := devcluster.KubeletVersionsFor(kubeVersion)
	if len(vs) == 0 || vs[0] == kubeVersion {
		return nil, nil
	}
	return map[string]string{"node-1": vs[0]}, nil
}

// BuildImages builds dkc's images from this checkout into dir with hack/images (as `make images` does),
// plus any extra arguments (e.g. -tag).
func BuildImages(ctx context.Context, dir string, args ...string) error {
	wd, err := os.Getwd()
	if err != nil {
		return err
	}
	root, err := devcluster.RepoRoot(wd)
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "go", append([]string{"run", "./hack/images", "-out", dir}, args...)...)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build images: %w\n%s", err, b)
	}
	return nil
}

// goBuild builds the main package pkg of this checkout into out, linking only when its code changed since
// the last build on this machine (hack/gobuild.sh).
func goBuild(ctx context.Context, out, pkg string) error {
	wd, err := os.Getwd()
	if err != nil {
		return err
	}
	root, err := devcluster.RepoRoot(wd)
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "bash", "hack/gobuild.sh", filepath.Dir(out), "-buildvcs=false", pkg)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build %s: %w\n%s", pkg, err, b)
	}
	if got := filepath.Join(filepath.Dir(out), filepath.Base(pkg)); got != out {
		return os.Rename(got, out)
	}
	return nil
}

// SimNodes is the number of simulated nodes in test clusters (sim-1 ... sim-N).
const SimNodes = 5

// TrialDuration is the sidecars' trial in test clusters: short, so that promotion can be tested.
const TrialDuration = 20 * time.Second

// SimTrialDuration is the simulated nodes' trial: shorter still, as the pool tests roll out over them and
// wait a trial per batch; a stand-in kubelet starts in milliseconds.
const SimTrialDuration = 10 * time.Second

// HealthTimeout is the sidecars' health timeout in test clusters (a dev kubelet is healthy in ~2s).
const HealthTimeout = 20 * time.Second

// Build builds dkc-server, dkc-sidecar and fake-kubelet from this checkout into dir/bin, and beside them
// the sidecar's helpers, one dkc-kubelet-check-<minor> per kubelet minor (internal/kubeletcheck/build.sh),
// so that integration tests always run the code under test (and need no `make build` first). It returns
// name → path; the helpers' directory is the sidecar's (devcluster.Cluster.KubeletCheckDir).
func Build(ctx context.Context, dir string) (map[string]string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return nil, err
	}
	root, err := devcluster.RepoRoot(wd)
	if err != nil {
		return nil, err
	}
	out := filepath.Join(dir, "bin")
	// Built as the images build them (hack/images): static and path-free, sharing their compile cache, and
	// linked only when their code changed since the last build on this machine (hack/gobuild.sh): the
	// suites' shards and the fresh-kernel test each build the same binaries.
	cmd := exec.CommandContext(ctx, "bash", "hack/gobuild.sh", out, "-buildvcs=false",
		"./services/cmd/dkc-server", "./sidecar/cmd/dkc-sidecar", "./hack/fake-kubelet")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build binaries: %w\n%s", err, b)
	}
	// The helpers link k8s.io/kubernetes of each minor, so each is its own module; the script knows them.
	cmd = exec.CommandContext(ctx, "bash", "internal/kubeletcheck/build.sh", out)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build the kubelet config checkers (internal/kubeletcheck/build.sh %s): %w\n%s", out, err, b)
	}
	bins := map[string]string{}
	for _, name := range []string{"dkc-server", "dkc-sidecar", "fake-kubelet"} {
		bins[name] = filepath.Join(out, name)
	}
	return bins, nil
}
