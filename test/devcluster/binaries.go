// SPDX-License-Identifier: Apache-2.0

package devcluster

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/dkc-dev/dkc/test/reporoot"
)

// Binaries are the paths of the programs the cluster runs. ControllerManager, Scheduler, Proxy and CoreDNS
// are used by the installed form only (Config.Installed).
type Binaries struct {
	Etcd, APIServer, Kubelet            string
	ControllerManager, Scheduler, Proxy string
	CoreDNS                             string
}

// pinnedModule is a wrapper module in hack/ that pins one upstream program by version; building it from the
// Go module proxy is the only supply chain the dev cluster needs.
type pinnedModule struct {
	dir      string   // relative to the repository root
	packages []string // main packages to build
	outputs  []string // binary names go build produces, in order
	// versionOf names the required module whose version is stamped into the binaries as Kubernetes does in
	// its release builds (otherwise they report v0.0.0-master and version-gated behaviour is off).
	versionOf string
	// buildTime is what a first build takes on 2 cores, for the progress line.
	buildTime string
}

// buildRecipe is part of the cache key: bump it when the way binaries are built changes.
const buildRecipe = "3"

var (
	// kubeModule has one row per Kubernetes minor the dev cluster can run, each a wrapper module made by
	// hack/kube/add-release.sh. Every other list of supported versions (errors, help texts) is derived
	// from it.
	kubeModule = map[string]pinnedModule{
		"1.34": kubeRelease("1.34"),
		"1.35": kubeRelease("1.35"),
		"1.36": kubeRelease("1.36"),
		"1.37": kubeRelease("1.37"),
	}
	// kubeEndOfLife are the minors of kubeModule that upstream no longer supports. They never run the
	// control plane; their kubelet runs beside a newer one (Config.KubeletVersions), as on a cluster whose
	// control plane was upgraded first, which the version skew policy allows for three minors.
	kubeEndOfLife = map[string]bool{"1.34": true}
	etcdModule    = pinnedModule{dir: "hack/etcd", packages: []string{"go.etcd.io/etcd/server/v3"},
		outputs: []string{"etcd"}, buildTime: "~1 minute"}
	// corednsModule is the cluster DNS of the installed form: CoreDNS with the plugins a cluster needs.
	corednsModule = pinnedModule{dir: "hack/coredns", packages: []string{"."}, outputs: []string{"coredns"},
		buildTime: "~2 minutes"}
)

// DefaultKubeVersion is the control plane's minor when Config.KubeVersion (KUBE_VERSION) is empty.
const DefaultKubeVersion = "1.37"

// maxKubeletSkew is how many minors a kubelet may be older than kube-apiserver (the version skew policy).
const maxKubeletSkew = 3

// kubeRelease is the row of kubeModule for minor: every program of the cluster from hack/kube/v<minor>.
func kubeRelease(minor string) pinnedModule {
	return pinnedModule{dir: "hack/kube/v" + minor, packages: []string{
		"k8s.io/kubernetes/cmd/kube-apiserver", "k8s.io/kubernetes/cmd/kubelet",
		"k8s.io/kubernetes/cmd/kube-controller-manager", "k8s.io/kubernetes/cmd/kube-scheduler",
		"k8s.io/kubernetes/cmd/kube-proxy",
	}, outputs: []string{"kube-apiserver", "kubelet", "kube-controller-manager", "kube-scheduler", "kube-proxy"},
		versionOf: "k8s.io/kubernetes", buildTime: "~9 minutes"}
}

// kubeletOnly is mod reduced to the kubelet: what a node older than the control plane needs, a third of the
// whole build.
func kubeletOnly(mod pinnedModule) pinnedModule {
	mod.packages, mod.outputs, mod.buildTime = []string{"k8s.io/kubernetes/cmd/kubelet"}, []string{"kubelet"}, "~4 minutes"
	return mod
}

// KubeVersions are the Kubernetes minors with a wrapper module, oldest first: the kubelets a node can run.
func KubeVersions() []string {
	vs := make([]string, 0, len(kubeModule))
	for v := range kubeModule {
		vs = append(vs, v)
	}
	sortMinors(vs)
	return vs
}

// ControlPlaneVersions are the minors Config.KubeVersion accepts, oldest first: KubeVersions without the
// end-of-life ones.
func ControlPlaneVersions() []string {
	var vs []string
	for _, v := range KubeVersions() {
		if !kubeEndOfLife[v] {
			vs = append(vs, v)
		}
	}
	return vs
}

// EndOfLifeKubeVersions are the minors kept for old kubelets only, oldest first.
func EndOfLifeKubeVersions() []string {
	var vs []string
	for _, v := range KubeVersions() {
		if kubeEndOfLife[v] {
			vs = append(vs, v)
		}
	}
	return vs
}

// checkControlPlaneVersion refuses a control-plane minor without a module or at end of life.
func checkControlPlaneVersion(v string) error {
	supported := strings.Join(ControlPlaneVersions(), ", ")
	if _, ok := kubeModule[v]; !ok {
		return fmt.Errorf("kube version %q is not supported by the dev cluster (control planes: %s)", v, supported)
	}
	if kubeEndOfLife[v] {
		return fmt.Errorf("kube version %s is end of life: the dev cluster runs it only as a kubelet older than the "+
			"control plane (e.g. KUBELET_VERSIONS=node-1=%s), not as the control plane (control planes: %s)", v, v, supported)
	}
	return nil
}

// CacheDir is where built binaries are kept between runs: $DKC_CACHE_DIR, else $XDG_CACHE_HOME/dkc, else
// ~/.cache/dkc. It is outside the repository so that a fresh clone reuses a warm cache.
func CacheDir() string {
	if d := os.Getenv("DKC_CACHE_DIR"); d != "" {
		return d
	}
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "dkc")
	}
	return filepath.Join(os.TempDir(), "dkc-cache")
}

// EnsureBinaries returns etcd and the Kubernetes programs of kubeVersion ("1.37"), building them from the
// pinned wrapper modules into CacheDir on first use (about 9 minutes on 2 cores; seconds afterwards). When
// binDir is non-empty (KUBE_BIN_DIR) kube-apiserver and kubelet, and etcd if present, are taken from there.
// Concurrent callers (parallel test packages, `make up`) serialise on a lock file.
func EnsureBinaries(ctx context.Context, repoRoot, kubeVersion, binDir string, progress io.Writer) (Binaries, error) {
	mod, ok := kubeModule[kubeVersion]
	if !ok {
		return Binaries{}, fmt.Errorf("kube version %q is not supported by the dev cluster (supported: %s)", kubeVersion,
			strings.Join(KubeVersions(), ", "))
	}
	cache, unlock, err := lockCache()
	if err != nil {
		return Binaries{}, err
	}
	defer unlock()

	etcdDir, err := buildPinned(ctx, repoRoot, cache, "etcd", etcdModule, progress)
	if err != nil {
		return Binaries{}, err
	}
	b := Binaries{Etcd: filepath.Join(etcdDir, "etcd")}
	if binDir != "" {
		b.APIServer, b.Kubelet = filepath.Join(binDir, "kube-apiserver"), filepath.Join(binDir, "kubelet")
		// Checked where the installed form uses them.
		b.ControllerManager, b.Scheduler, b.Proxy =
			filepath.Join(binDir, "kube-controller-manager"), filepath.Join(binDir, "kube-scheduler"),
			filepath.Join(binDir, "kube-proxy")
		if _, err := os.Stat(filepath.Join(binDir, "etcd")); err == nil {
			b.Etcd = filepath.Join(binDir, "etcd")
		}
		for _, p := range []string{b.APIServer, b.Kubelet} {
			if _, err := os.Stat(p); err != nil {
				return Binaries{}, fmt.Errorf("KUBE_BIN_DIR %s: %w", binDir, err)
			}
		}
		return b, nil
	}
	kubeDir, err := buildPinned(ctx, repoRoot, cache, "kube-"+kubeVersion, mod, progress)
	if err != nil {
		return Binaries{}, err
	}
	b.APIServer, b.Kubelet = filepath.Join(kubeDir, "kube-apiserver"), filepath.Join(kubeDir, "kubelet")
	b.ControllerManager, b.Scheduler, b.Proxy =
		filepath.Join(kubeDir, "kube-controller-manager"), filepath.Join(kubeDir, "kube-scheduler"),
		filepath.Join(kubeDir, "kube-proxy")
	return b, nil
}

// EnsureKubelet returns the kubelet of minor for a node older than the control plane. A complete build of
// minor's whole module (a cluster that ran it as its control plane) already has one; otherwise only the
// kubelet is built, into CacheDir/kubelet-<minor>-<hash> (~4 minutes the first time), so that a skew
// cluster never pays for an apiserver it does not run.
func EnsureKubelet(ctx context.Context, repoRoot, minor string, progress io.Writer) (string, error) {
	mod, ok := kubeModule[minor]
	if !ok {
		return "", fmt.Errorf("no kubelet %q in the dev cluster (kubelets: %s)", minor, strings.Join(KubeVersions(), ", "))
	}
	cache, unlock, err := lockCache()
	if err != nil {
		return "", err
	}
	defer unlock()
	full, err := pinnedDir(repoRoot, cache, "kube-"+minor, mod)
	if err != nil {
		return "", err
	}
	if built(full, mod.outputs) {
		return filepath.Join(full, "kubelet"), nil
	}
	dir, err := buildPinned(ctx, repoRoot, cache, "kubelet-"+minor, kubeletOnly(mod), progress)
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, "kubelet"), nil
}

// EnsureCoreDNS returns the CoreDNS binary, building it from its pinned module on first use (~2 minutes).
func EnsureCoreDNS(ctx context.Context, repoRoot string, progress io.Writer) (string, error) {
	cache, unlock, err := lockCache()
	if err != nil {
		return "", err
	}
	defer unlock()
	dir, err := buildPinned(ctx, repoRoot, cache, "coredns", corednsModule, progress)
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, "coredns"), nil
}

// pinnedDir is where mod's build lives: cache/<prefix>-<hash of the build recipe, go.mod and go.sum>, so
// that changing a pin rebuilds and an unchanged pin never does.
func pinnedDir(repoRoot, cache, prefix string, mod pinnedModule) (string, error) {
	src := filepath.Join(repoRoot, mod.dir)
	h := sha256.New()
	h.Write([]byte(buildRecipe))
	for _, f := range []string{"go.mod", "go.sum"} {
		data, err := os.ReadFile(filepath.Join(src, f))
		if err != nil {
			return "", fmt.Errorf("read pinned module %s: %w", mod.dir, err)
		}
		h.Write(data)
	}
	return filepath.Join(cache, prefix+"-"+hex.EncodeToString(h.Sum(nil))[:12]), nil
}

// built reports whether every output is in dir.
func built(dir string, outputs []string) bool {
	for _, o := range outputs {
		if _, err := os.Stat(filepath.Join(dir, o)); err != nil {
			return false
		}
	}
	return true
}

// buildPinned builds mod into its pinnedDir unless already there.
func buildPinned(ctx context.Context, repoRoot, cache, prefix string, mod pinnedModule,
	progress io.Writer) (string, error) {
	src := filepath.Join(repoRoot, mod.dir)
	out, err := pinnedDir(repoRoot, cache, prefix, mod)
	if err != nil {
		return "", err
	}
	if built(out, mod.outputs) {
		return out, nil
	}
	tmp := out + ".tmp"
	_ = os.RemoveAll(tmp)
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return "", fmt.Errorf("create build dir %s: %w", tmp, err)
	}
	if progress != nil {
		fmt.Fprintf(progress, "building %v from %s into %s (first time only, %s on 2 cores)\n", mod.outputs, mod.dir, out,
			mod.buildTime)
	}
	start := time.Now()
	args := []string{"build", "-trimpath", "-o", tmp + "/"}
	if mod.versionOf != "" {
		ldflags, err := kubeVersionLDFlags(filepath.Join(src, "go.mod"), mod.versionOf)
		if err != nil {
			return "", err
		}
		args = append(args, "-ldflags="+ldflags)
	}
	args = append(args, mod.packages...)
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-mod=readonly")
	if outb, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build %v in %s: %w\n%s", mod.packages, mod.dir, err, outb)
	}
	// etcd's main package is named after its module path's last element ("v3"); give it its real name.
	if len(mod.packages) == 1 {
		entries, err := os.ReadDir(tmp)
		if err != nil || len(entries) != 1 {
			return "", fmt.Errorf("build %s: expected one binary in %s", mod.dir, tmp)
		}
		if err := os.Rename(filepath.Join(tmp, entries[0].Name()), filepath.Join(tmp, mod.outputs[0])); err != nil {
			return "", err
		}
	}
	_ = os.RemoveAll(out)
	if err := os.Rename(tmp, out); err != nil {
		return "", fmt.Errorf("publish build %s: %w", out, err)
	}
	if progress != nil {
		fmt.Fprintf(progress, "built %v in %s\n", mod.outputs, time.Since(start).Round(time.Second))
	}
	return out, nil
}

// lockCache creates CacheDir and takes its build lock: concurrent callers (parallel test packages, `make up`)
// build one at a time.
func lockCache() (cache string, unlock func(), err error) {
	cache = CacheDir()
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return "", nil, fmt.Errorf("create cache dir %s: %w", cache, err)
	}
	unlock, err = lockFile(filepath.Join(cache, ".build.lock"))
	if err != nil {
		return "", nil, err
	}
	return cache, unlock, nil
}

func lockFile(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open lock %s: %w", path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return func() { _ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN); f.Close() }, nil
}

// RepoRoot finds the dkc repository root (the directory with the main go.mod) from dir upwards.
func RepoRoot(dir string) (string, error) { return reporoot.Find(dir) }

// kubeVersionLDFlags reads the pinned version of module from a go.mod and returns the -X flags Kubernetes'
// own build (hack/lib/version.sh) sets.
func kubeVersionLDFlags(goMod, module string) (string, error) {
	version, err := requiredVersion(goMod, module)
	if err != nil {
		return "", err
	}
	parts := strings.SplitN(strings.TrimPrefix(version, "v"), ".", 3)
	if len(parts) < 2 {
		return "", fmt.Errorf("no version of %s in %s", module, goMod)
	}
	var flags []string
	for _, pkg := range []string{"k8s.io/component-base/version", "k8s.io/client-go/pkg/version"} {
		flags = append(flags,
			"-X "+pkg+".gitVersion="+version,
			"-X "+pkg+".gitMajor="+parts[0],
			"-X "+pkg+".gitMinor="+parts[1],
			"-X "+pkg+".gitTreeState=clean",
		)
	}
	return strings.Join(flags, " "), nil
}

// requiredVersion is the version of module a go.mod requires ("" if none).
func requiredVersion(goMod, module string) (string, error) {
	data, err := os.ReadFile(goMod)
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(strings.TrimPrefix(strings.TrimSpace(line), "require "))
		if len(f) >= 2 && f[0] == module {
			return f[1], nil
		}
	}
	return "", nil
}
