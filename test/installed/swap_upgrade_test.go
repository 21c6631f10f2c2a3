// SPDX-License-Identifier: Apache-2.0

//go:build integration

package installed

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/dkc-dev/dkc/internal/ciskip"
	"github.com/dkc-dev/dkc/test/devcluster"
)

// previousReleaseFile names the release an install upgrades from (docs/releases.md says who bumps it).
const previousReleaseFile = "hack/release/previous-release"

// TestUpgrade is docs/install.md's "Upgrade" on the installed form: the previous release (hack/release/
// previous-release), built from git history, installed and running node-1 on an assigned config and node-2
// on its local one, is upgraded to this checkout by applying this revision's manifests (the suite's
// deploy/overlays/dev). The sidecars and dkc-server roll; no kubelet restarts; neither node's status or
// ConfigOK changes at any moment of the rollout; and on the upgraded install an assignment becomes active.
// A manifest change that `kubectl apply` cannot take (an immutable field, such as a selector) fails the
// apply; an object the previous release installs and this one no longer does (a rename) is reported, since
// apply leaves it running.
//
// It takes dkc away and installs it again (it swaps the install), as TestUninstall does, so its file, swap_*,
// sorts after the tests that only need dkc installed (a failed reinstall would break them) and before
// uninstall_test.go; it leaves dkc installed as found.
// The previous release's images come from its own `make images` in a worktree of its commit, built once per
// machine (buildReleaseImages keeps them).
func TestUpgrade(t *testing.T) {
	diagnoseOnFailure(t)
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	root, err := devcluster.RepoRoot(mustWd(t))
	if err != nil {
		t.Fatal(err)
	}
	prev := previousRelease(t, root)
	src := checkoutRelease(t, ctx, root, prev)
	images := buildReleaseImages(t, ctx, src, prev)
	prevDir := releaseInstallDir(t, src, prev)
	// Compared before anything changes: a release that dropped or renamed an object fails here first.
	removed := objectsRemoved(t, ctx, prevDir, cluster.InstallDir())
	for _, o := range removed {
		t.Errorf("%s installs %s, which this revision does not: `kubectl apply -k` leaves it in the cluster. The release "+
			"notes must name it, and docs/install.md (Upgrade) says to delete it after the apply", prev.version, o)
	}
	if err := cluster.ImportImages(ctx, filepath.Join(images, "dkc-server.tar"), filepath.Join(images, "dkc-sidecar.tar")); err != nil {
		t.Fatal(err)
	}

	// From here the cluster changes: whatever happens, it ends with this revision installed, as found.
	t.Cleanup(func() {
		for _, o := range removed {
			_, _ = runKubectl(context.Background(), o.deleteArgs()...)
		}
		if out, err := runKubectl(context.Background(), "apply", "-k", cluster.InstallDir()); err != nil {
			t.Errorf("cleanup: kubectl apply -k %s: %v\n%s", cluster.InstallDir(), err, out)
		}
		waitRolledOut(t, "deployment/dkc-server")
		waitRolledOut(t, "daemonset/dkc-sidecar")
		resetAll(t)
	})

	// dkc taken away, as TestUninstall does it (every node is on its local config: no kubelet restarts).
	for _, n := range nodes {
		waitRunning(t, n, nil, 2*time.Minute)
	}
	if out, err := kubectlDKC(ctx, "uninstall", "--yes", "--timeout=5m"); err != nil {
		t.Fatalf("kubectl dkc uninstall --yes: %v\n%s", err, out)
	}
	if out, err := runKubectl(ctx, "delete", "-k", cluster.InstallDir(), "--wait=true", "--timeout=5m"); err != nil {
		t.Fatalf("kubectl delete -k: %v\n%s", err, out)
	}

	// The previous release installed, node-1 on an assigned config past its trial, node-2 local.
	if out, err := runKubectl(ctx, "apply", "-k", prevDir); err != nil {
		t.Fatalf("install %s: kubectl apply -k %s: %v\n%s", prev.version, prevDir, err, out)
	}
	waitRolledOut(t, "deployment/dkc-server")
	waitRolledOut(t, "daemonset/dkc-sidecar")
	waitServerSettled(t)
	oldPods := checkImages(t, prev.version)
	for _, n := range nodes {
		waitRunning(t, n, nil, 2*time.Minute)
	}
	cm := createConfig(t, "upgrade-node-1", "node-1", 71)
	assign(t, "node-1", cm)
	waitRunning(t, "node-1", cm, 2*time.Minute)
	// Past the trial, so that nothing the upgrade does not cause changes the status meanwhile.
	waitLastKnownGood(t, "node-1", cm, 2*time.Minute)
	before := map[string]int{}
	for _, n := range nodes {
		before[n] = kubeletStarts(t, n)
	}
	watch := watchStatus(t)

	// The upgrade: this revision's manifests applied over the previous release's, nothing else.
	out, err := runKubectl(ctx, "apply", "-k", cluster.InstallDir())
	if err != nil {
		hint := ""
		if strings.Contains(out, "immutable") {
			hint = "\nan immutable field changed since " + prev.version + ": the release notes must say which object to delete " +
				"and re-create, and docs/install.md (Upgrade) how"
		}
		t.Fatalf("upgrade from %s: kubectl apply -k %s: %v\n%s%s", prev.version, cluster.InstallDir(), err, out, hint)
	}
	t.Logf("upgrade from %s: kubectl apply -k:\n%s", prev.version, out)
	waitRolledOut(t, "deployment/dkc-server")
	waitRolledOut(t, "daemonset/dkc-sidecar")
	waitServerSettled(t)
	for _, o := range removed {
		if out, err := runKubectl(ctx, o.deleteArgs()...); err != nil {
			t.Errorf("delete %s, which %s left: %v\n%s", o, prev.version, err, out)
		}
	}
	newPods := checkImages(t, devcluster.ImageTag)
	// What an operator checks (docs/install.md, Upgrade): kubectl dkc version names the new images, every
	// pod updated and ready.
	if out, err := kubectlDKC(ctx, "version"); err != nil {
		t.Errorf("kubectl dkc version: %v\n%s", err, out)
	} else {
		for _, want := range []string{
			"deployment/dkc-server: " + devcluster.ImageRepo + "/dkc-server:" + devcluster.ImageTag + " (2 desired, 2 updated, 2 ready)",
			"daemonset/dkc-sidecar: " + devcluster.ImageRepo + "/dkc-sidecar:" + devcluster.ImageTag + " (2 desired, 2 updated, 2 ready)",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("kubectl dkc version after the upgrade lacks %q:\n%s", want, out)
			}
		}
	}
	for name := range newPods {
		if oldPods[name] {
			t.Errorf("pod %s of %s still runs after the upgrade", name, prev.version)
		}
	}
	// The new sidecars have connected and heard their nodes' state; a restart they decide on would come now.
	time.Sleep(15 * time.Second)
	seen := watch()

	starts := map[string]int{}
	for _, n := range nodes {
		starts[n] = kubeletStarts(t, n)
		if d := starts[n] - before[n]; d != 0 {
			t.Errorf("%s: kubelet started %d times during the upgrade, want 0", n, d)
		}
		if len(seen[n]) != 1 {
			t.Errorf("%s: status changed during the upgrade, want it unchanged; seen in order:\n  %s", n, strings.Join(seen[n], "\n  "))
		}
	}
	waitRunning(t, "node-1", cm, time.Minute)
	if got := configzQPS(t, "node-1"); got != 71 {
		t.Errorf("node-1 configz eventRecordQPS = %v after the upgrade, want 71", got)
	}
	if v := view(t, "node-2"); v.status.Assigned != nil || v.status.Active != nil || v.status.Error != "" ||
		v.configOK == nil || v.configOK.Status != corev1.ConditionTrue {
		t.Errorf("node-2 was never assigned anything but shows %s after the upgrade", v)
	}

	// The upgraded install works: an assignment to node-2 becomes active, with one kubelet restart.
	cm2 := createConfig(t, "upgrade-node-2", "node-2", 72)
	assign(t, "node-2", cm2)
	waitRunning(t, "node-2", cm2, 2*time.Minute)
	if got := configzQPS(t, "node-2"); got != 72 {
		t.Errorf("node-2 configz eventRecordQPS = %v, want 72", got)
	}
	if d := kubeletStarts(t, "node-2") - starts["node-2"]; d != 1 {
		t.Errorf("node-2: kubelet started %d times for one assignment after the upgrade, want 1", d)
	}
	if d := kubeletStarts(t, "node-1") - starts["node-1"]; d != 0 {
		t.Errorf("node-1: kubelet started %d times for node-2's assignment, want 0", d)
	}
}

// release is a published release of dkc: its version (the image tag) and full commit hash.
type release struct{ version, commit string }

// previousRelease reads previousReleaseFile: shell assignments PREVIOUS_VERSION and PREVIOUS_COMMIT.
func previousRelease(t *testing.T, root string) release {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(root, previousReleaseFile))
	if err != nil {
		t.Fatal(err)
	}
	var r release
	for line := range strings.Lines(string(raw)) {
		k, v, ok := strings.Cut(strings.TrimSpace(line), "=")
		switch {
		case !ok || strings.HasPrefix(k, "#"):
		case k == "PREVIOUS_VERSION":
			r.version = v
		case k == "PREVIOUS_COMMIT":
			r.commit = v
		}
	}
	if !strings.HasPrefix(r.version, "v") || len(r.commit) != 40 {
		t.Fatalf("%s: want PREVIOUS_VERSION=v<semver> and PREVIOUS_COMMIT=<40 hex digits>, read version %q commit %q", previousReleaseFile, r.version, r.commit)
	}
	return r
}

// checkoutRelease returns a worktree of r's commit in a temporary directory, removed when t ends. A
// checkout without the commit (a shallow clone, a fork's CI) fetches it from origin once.
func checkoutRelease(t *testing.T, ctx context.Context, root string, r release) string {
	t.Helper()
	git := func(args ...string) (string, error) {
		out, err := exec.CommandContext(ctx, "git", append([]string{"-C", root}, args...)...).CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	if _, err := git("cat-file", "-e", r.commit+"^{commit}"); err != nil {
		out, ferr := git("fetch", "--no-tags", "origin", r.commit)
		if _, err := git("cat-file", "-e", r.commit+"^{commit}"); err != nil {
			// A shallow clone whose origin will not serve the commit has no history to build a release
			// from. Outside CI that is the checkout's limit and the test skips; in CI the upgrade would go
			// untested while the run stays green, so it fails (ciskip). A full clone that lacks the commit
			// is a wrong previous-release file: that fails everywhere.
			if shallow, _ := git("rev-parse", "--is-shallow-repository"); shallow == "true" {
				ciskip.Skipf(t, "the previous release %s is commit %s, which this shallow clone lacks and `git fetch origin %s` did not "+
					"bring (%v: %s): the upgrade cannot be tested without history; clone with history (fetch-depth: 0)",
					r.version, r.commit, r.commit, ferr, out)
			}
			t.Fatalf("the previous release %s (%s) is commit %s, which this checkout lacks, and `git fetch origin %s` did not "+
				"bring it (%v: %s). The upgrade test builds that release's images and manifests from git history: check out "+
				"with history (actions/checkout fetch-depth: 0), or fetch the commit before the test", r.version,
				previousReleaseFile, r.commit, r.commit, ferr, out)
		}
	}
	dir := filepath.Join(t.TempDir(), r.version)
	if out, err := git("worktree", "add", "--detach", dir, r.commit); err != nil {
		t.Fatalf("git worktree add %s %s: %v\n%s", dir, r.commit, err, out)
	}
	// Not ctx: the test's deferred cancel has run by the time cleanups do.
	t.Cleanup(func() {
		git := func(args ...string) (string, error) {
			out, err := exec.Command("git", append([]string{"-C", root}, args...)...).CombinedOutput()
			return strings.TrimSpace(string(out)), err
		}
		if out, err := git("worktree", "remove", "--force", dir); err != nil {
			t.Logf("git worktree remove %s: %v: %s", dir, err, out)
			if out, err := git("worktree", "prune"); err != nil {
				t.Errorf("git worktree prune: %v: %s", err, out)
			}
		}
	})
	return dir
}

// releaseImageFiles are the image tarballs of a release that TestUpgrade imports.
var releaseImageFiles = []string{"dkc-server.tar", "dkc-sidecar.tar"}

// buildReleaseImages runs the release's own `make images` in its worktree src, for the host's platform and
// without the release overlay (as its `make up` does), tagged with its version; it returns the directory of
// the image tarballs. A release is a fixed commit whose images build reproducibly (its `make images`:
// timestamps from the commit, static -trimpath binaries), so the tarballs are kept in this machine's cache
// (devcluster.CacheDir, per release, Go toolchain and platform) and a later run imports the same bytes
// without building them again.
func buildReleaseImages(t *testing.T, ctx context.Context, src string, r release) string {
	t.Helper()
	cached := filepath.Join(devcluster.CacheDir(), "release-images",
		fmt.Sprintf("%s-%s-%s-%s_%s", r.version, r.commit, runtime.Version(), runtime.GOOS, runtime.GOARCH))
	if _, err := os.Stat(cached); err == nil {
		t.Logf("%s: images built earlier on this machine, from %s", r.version, cached)
		return cached
	}
	start := time.Now()
	cmd := exec.CommandContext(ctx, "make", "-C", src, "images", "IMAGE_TAG="+r.version, "VERSION="+r.version, "IMAGE_PLATFORMS=", "RELEASE_OVERLAY=")
	// Not the variables of the `make test-integration` this may run under: they would reach the release's make.
	cmd.Env = slices.DeleteFunc(os.Environ(), func(e string) bool {
		return strings.HasPrefix(e, "MAKEFLAGS=") || strings.HasPrefix(e, "MFLAGS=") || strings.HasPrefix(e, "MAKELEVEL=")
	})
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: make images: %v\n%s", r.version, err, out)
	}
	t.Logf("%s: make images IMAGE_TAG=%s in %s (%s)", r.version, r.version, time.Since(start).Round(time.Second), src)
	built := filepath.Join(src, "_output", "images")
	// Kept whole or not at all: the directory appears by a rename once every tarball is in it.
	tmp := ""
	err = os.MkdirAll(filepath.Dir(cached), 0o755)
	if err == nil {
		tmp, err = os.MkdirTemp(filepath.Dir(cached), ".tmp-")
	}
	for _, f := range releaseImageFiles {
		if err == nil {
			err = copyFile(filepath.Join(built, f), filepath.Join(tmp, f))
		}
	}
	if err == nil {
		err = os.Rename(tmp, cached)
	}
	if err != nil {
		t.Logf("%s: images not kept for later runs: %v", r.version, err)
		_ = os.RemoveAll(tmp)
	}
	return built
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(to)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// tlsFiles are what gen-certs.sh writes into overlays/self-signed (its .gitignore), those an install keeps.
var tlsFiles = []string{"ca.crt", "ca.key", "tls.crt", "tls.key", "next-ca.crt", "next-ca.key", "old-ca.crt"}

// releaseInstallDir is the install the suite's would have been under release r: r's deploy/, the suite's
// certificates (an upgrade keeps them), and the suite's kustomization (the sidecars' test timeouts) with
// the images at r's tag.
func releaseInstallDir(t *testing.T, src string, r release) string {
	t.Helper()
	dir := t.TempDir()
	if out, err := exec.Command("cp", "-r", filepath.Join(src, "deploy"), filepath.Join(dir, "deploy")).CombinedOutput(); err != nil {
		t.Fatalf("copy %s's deploy/: %v: %s", r.version, err, out)
	}
	const signed = "deploy/overlays/self-signed"
	for _, f := range tlsFiles {
		raw, err := os.ReadFile(filepath.Join(cluster.InstallDir(), signed, f))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, signed, f), raw, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	k, err := os.ReadFile(filepath.Join(cluster.InstallDir(), "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	// The images as overlays/dev names them; this kustomization's images apply after its own.
	var b strings.Builder
	b.WriteString(strings.TrimRight(string(k), "\n") + "\nimages:\n")
	for _, image := range []string{"dkc-server", "dkc-sidecar"} {
		fmt.Fprintf(&b, "  - name: %s/%s\n    newTag: %s\n", devcluster.ImageRepo, image, r.version)
	}
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// object identifies a manifest's object as the apiserver does.
type object struct{ group, kind, namespace, name string }

func (o object) String() string {
	s := o.kind
	if o.group != "" {
		s += "." + o.group
	}
	if o.namespace != "" {
		return s + " " + o.namespace + "/" + o.name
	}
	return s + " " + o.name
}

// deleteArgs are the kubectl arguments that delete o.
func (o object) deleteArgs() []string {
	kind := o.kind
	if o.group != "" {
		kind += "." + o.group
	}
	args := []string{"delete", "--ignore-not-found", kind, o.name}
	if o.namespace != "" {
		args = append(args, "-n", o.namespace)
	}
	return args
}

// objectsRemoved lists the objects kustomization dir from installs and dir to does not.
func objectsRemoved(t *testing.T, ctx context.Context, from, to string) []object {
	t.Helper()
	want := map[object]bool{}
	for _, o := range renderedObjects(t, ctx, to) {
		want[o] = true
	}
	var removed []object
	for _, o := range renderedObjects(t, ctx, from) {
		if !want[o] {
			removed = append(removed, o)
		}
	}
	return removed
}

// renderedObjects are the objects `kubectl kustomize dir` renders.
func renderedObjects(t *testing.T, ctx context.Context, dir string) []object {
	t.Helper()
	out, err := exec.CommandContext(ctx, "kubectl", "kustomize", dir).Output()
	if err != nil {
		t.Fatalf("kubectl kustomize %s: %v", dir, err)
	}
	var objs []object
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(out)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objs
		}
		if err != nil {
			t.Fatalf("kubectl kustomize %s: %v", dir, err)
		}
		var m struct {
			APIVersion string            `json:"apiVersion"`
			Kind       string            `json:"kind"`
			Metadata   metav1.ObjectMeta `json:"metadata"`
		}
		if err := yaml.Unmarshal(doc, &m); err != nil {
			t.Fatalf("kubectl kustomize %s: %v", dir, err)
		}
		if m.Kind == "" {
			continue
		}
		group, _, _ := strings.Cut(m.APIVersion, "/")
		if !strings.Contains(m.APIVersion, "/") {
			group = "" // the core group: apiVersion v1
		}
		objs = append(objs, object{group: group, kind: m.Kind, namespace: m.Metadata.Namespace, name: m.Metadata.Name})
	}
}

// checkImages asserts that every dkc pod not terminating runs dkc's images at tag, and returns their names.
func checkImages(t *testing.T, tag string) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	for _, app := range []string{"dkc-server", "dkc-sidecar"} {
		pods, err := admin(t).CoreV1().Pods("kube-system").List(ctxFor(t), metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + app})
		if err != nil {
			t.Fatal(err)
		}
		want := devcluster.ImageRepo + "/" + app + ":" + tag
		for _, p := range pods.Items {
			if p.DeletionTimestamp != nil {
				continue
			}
			names[p.Name] = true
			for _, c := range append(p.Spec.InitContainers, p.Spec.Containers...) {
				if c.Image != want {
					t.Errorf("pod %s container %s runs %s, want %s", p.Name, c.Name, c.Image, want)
				}
			}
		}
	}
	return names
}

// watchStatus samples every node's dkc status and ConfigOK condition (with its last transition) until the
// returned function is called, which returns per node the distinct values seen, in order.
func watchStatus(t *testing.T) func() map[string][]string {
	t.Helper()
	client := admin(t)
	ctx, cancel := context.WithCancel(context.Background())
	seen := map[string][]string{}
	samples := 0
	record := func() {
		list, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return // the apiserver is not what is tested; a missed sample is made up by the next
		}
		samples++
		for i := range list.Items {
			n := &list.Items[i]
			if s := statusOf(n); len(seen[n.Name]) == 0 || seen[n.Name][len(seen[n.Name])-1] != s {
				seen[n.Name] = append(seen[n.Name], s)
			}
		}
	}
	record()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			select {
			case <-ctx.Done():
			case <-time.After(250 * time.Millisecond):
				record()
			}
		}
	}()
	start := time.Now()
	return func() map[string][]string {
		cancel()
		wg.Wait()
		// A watch that saw (nearly) nothing proves nothing: one sample a second at least.
		if want := int(time.Since(start).Seconds()); samples < want {
			t.Errorf("the status watch read the Nodes %d times in %s, want %d at least: the no-change check is void", samples, time.Since(start).Round(time.Second), want)
		}
		return seen
	}
}

// statusOf is n's status as view reads it, with the ConfigOK condition's last transition, in one line.
func statusOf(n *corev1.Node) string {
	var v nodeView
	if raw := n.Annotations["dkc.dev/config-status"]; raw != "" {
		if err := json.Unmarshal([]byte(raw), &v.status); err != nil {
			return fmt.Sprintf("unreadable status annotation %q: %v", raw, err)
		}
	}
	since := ""
	for i := range n.Status.Conditions {
		if c := &n.Status.Conditions[i]; c.Type == "ConfigOK" {
			v.configOK = c
			since = " since " + c.LastTransitionTime.UTC().Format(time.RFC3339)
		}
	}
	return v.String() + since
}
