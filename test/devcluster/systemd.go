// SPDX-License-Identifier: Apache-2.0

package devcluster

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/dkc-dev/dkc/sidecar/app"
)

// A real node runs its kubelet as a unit of a real systemd: a Debian rootfs (debootstrapped once into the
// cache) booted by systemd-nspawn inside the node's network namespace. The kubelet unit carries dkc's
// drop-in, and the dkc sidecar runs as a second unit in the same container, restarting the kubelet over
// that systemd's D-Bus — the shape of a production node with the DaemonSet pod (the host's /proc, the host's bus).
//
// Measured requirements (reference/local-cluster-facts.md and this package's history): --keep-unit and
// --register=no (no host systemd), --capability=all (the kubelet needs CAP_SYSLOG for /dev/kmsg, above
// nspawn's default bounding set), /dev/kmsg bound in, and each container started inside a cgroup of its own
// so that the payload/supervisor cgroups nspawn leaves behind can be removed without touching another.

const rootfsRecipe = "bookworm-minbase-systemd-2"

// DynamicConfigDirInNode is the sidecar's --dynamic-config-dir inside the node (the production default).
const DynamicConfigDirInNode = "/var/lib/kubelet/dynamic-config"

var systemdPackages = map[string]string{"systemd-nspawn": "systemd-container", "debootstrap": "debootstrap"}

// EnsureRootfs returns a Debian rootfs with systemd and dbus, building it on first use (about a minute).
func EnsureRootfs(ctx context.Context, progress io.Writer) (string, error) {
	if err := ensurePackages(ctx, systemdPackages, progress); err != nil {
		return "", err
	}
	cache := CacheDir()
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return "", err
	}
	unlock, err := lockFile(filepath.Join(cache, ".rootfs.lock"))
	if err != nil {
		return "", err
	}
	defer unlock()
	dir := filepath.Join(cache, "rootfs-"+rootfsRecipe)
	if _, err := os.Stat(filepath.Join(dir, "usr/lib/systemd/systemd")); err == nil {
		return dir, nil
	}
	tmp := dir + ".tmp"
	_ = os.RemoveAll(tmp)
	fmt.Fprintf(progress, "debootstrapping a Debian rootfs with systemd into %s (first time only, ~1 minute)\n", dir)
	cmd := exec.CommandContext(ctx, "debootstrap", "--variant=minbase", "--include=systemd,systemd-sysv,dbus,iptables",
		"bookworm", tmp, debianMirror())
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("debootstrap: %w\n%s", err, tail2(string(out), 20))
	}
	for _, p := range []string{"var/cache/apt/archives", "usr/share/doc", "usr/share/man", "usr/share/locale"} {
		_ = os.RemoveAll(filepath.Join(tmp, p))
	}
	if err := os.Rename(tmp, dir); err != nil {
		return "", err
	}
	return dir, nil
}

// debianMirror is the machine's own Debian mirror (the only one reachable), else deb.debian.org.
func debianMirror() string {
	for _, f := range []string{"/etc/apt/sources.list.d/debian.sources", "/etc/apt/sources.list"} {
		fh, err := os.Open(f)
		if err != nil {
			continue
		}
		s := bufio.NewScanner(fh)
		for s.Scan() {
			fields := strings.Fields(s.Text())
			if len(fields) >= 2 && fields[0] == "URIs:" && !strings.Contains(fields[1], "security") {
				fh.Close()
				return fields[1]
			}
			if len(fields) >= 3 && fields[0] == "deb" && !strings.Contains(fields[1], "security") {
				fh.Close()
				return fields[1]
			}
		}
		fh.Close()
	}
	return "http://deb.debian.org/debian"
}

func tail2(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// nodeUnits writes the node's systemd units into <nodeDir>/systemd: kubelet.service (kubeadm-style, its
// --config in $KUBELET_CONFIG_ARGS), the dkc drop-in, and dkc-sidecar.service.
func (c *Cluster) nodeUnits(n NodeState, sidecarArgs []string) (map[string]string, error) {
	dir := filepath.Join(c.NodeDir(n.Name), "systemd")
	if err := os.MkdirAll(filepath.Join(dir, "kubelet.service.d"), 0o755); err != nil {
		return nil, err
	}
	var args []string
	for _, a := range c.KubeletArgs(n) {
		if !strings.HasPrefix(a, "--config=") {
			args = append(args, a)
		}
	}
	files := map[string]string{
		"kubelet.service": kubeletUnit(n.Name, "", c.KubeletConfigPath(n.Name), args,
			c.cfg.NoKubeletStartLimit),
		"kubelet.service.d/20-dkc.conf": app.KubeletDropIn(DynamicConfigDirInNode),
		"dkc-sidecar.service": fmt.Sprintf(`[Unit]
Description=dkc sidecar of dev node %s
[Service]
ExecStart=/usr/local/bin/dkc-sidecar %s
Restart=always
RestartSec=1
StandardOutput=append:/var/log/dkc/dkc-sidecar.log
StandardError=inherit
`, n.Name, strings.Join(sidecarArgs, " ")),
	}
	return writeFiles(dir, files)
}

// nodeCgroup is the cgroup (in the name=systemd and unified hierarchies) the node's nspawn runs in.
func nodeCgroup(n NodeState) string { return "dkc-" + n.Netns }

var cgroupHierarchies = []string{"/sys/fs/cgroup/systemd", "/sys/fs/cgroup/unified"}

// removeNodeCgroups removes the node's cgroups, deepest first, wherever they are: nspawn's at the roots of the
// name=systemd and unified hierarchies, and in the installed form the node's --cgroup-root, which the node
// creates inside its cgroup namespace, so below whatever cgroup the cluster's starter ran in (on these
// machines a per-session memory cgroup, e.g. /process_api/<id>).
func removeNodeCgroups(n NodeState) error {
	var errs []string
	for _, root := range nodeCgroupDirs(n) {
		var dirs []string
		_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			if err := os.Remove(dirs[i]); err != nil && !os.IsNotExist(err) {
				errs = append(errs, err.Error())
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("remove cgroups of node %s: %s", n.Name, strings.Join(errs, "; "))
	}
	return nil
}

// nodeCgroupDirs finds every cgroup directory named after node n in every mounted hierarchy, searching a few
// levels deep.
func nodeCgroupDirs(n NodeState) []string {
	const maxDepth = 4
	var found []string
	hierarchies, _ := filepath.Glob("/sys/fs/cgroup/*")
	for _, h := range hierarchies {
		if fi, err := os.Lstat(h); err != nil || !fi.IsDir() {
			continue // cpu -> cpu,cpuacct style links
		}
		base := strings.Count(h, "/")
		_ = filepath.WalkDir(h, func(p string, d os.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return nil
			}
			if d.Name() == nodeCgroup(n) {
				found = append(found, p)
				return filepath.SkipDir
			}
			if strings.Count(p, "/")-base >= maxDepth {
				return filepath.SkipDir
			}
			return nil
		})
	}
	return found
}

// Leftovers lists what of the cluster's nodes is still on the machine after Stop (cgroups), for tests.
func (c *Cluster) Leftovers() []string {
	var out []string
	for _, n := range c.state.Nodes {
		out = append(out, nodeCgroupDirs(n)...)
	}
	return out
}

// BusAddress is the D-Bus address of the node's systemd as seen from the host.
func (c *Cluster) BusAddress(node string) string {
	return "unix:path=" + filepath.Join(c.NodeDir(node), "bus", "system_bus_socket")
}

// NodeLogDir holds the logs of the units inside node (kubelet.log, dkc-sidecar.log).
func (c *Cluster) NodeLogDir(node string) string { return filepath.Join(c.LogDir(), node) }

// DynamicConfigDir is node's --dynamic-config-dir on the host (docs/design.md, "Local cluster").
func (c *Cluster) DynamicConfigDir(node string) string {
	return filepath.Join(c.NodeDir(node), "dynamic-config")
}

// nspawnArgs boots the node's container: its own cgroup, the node's netns, the binaries, the cluster's
// files at the same paths, the dynamic config dir where production has it, the units, and the bus socket
// exported to the host. The sidecar runs the kubelet's config code from its helpers, one per kubelet minor,
// which ship next to it (as in its image): every dkc-kubelet-check-<minor> beside sidecarBin is bound into
// /usr/local/bin, and the one of the node's kubelet minor must be there.
func (c *Cluster) nspawnArgs(n NodeState, rootfs, kubeletBin, sidecarBin string,
	units map[string]string) ([]string, error) {
	checks, err := kubeletChecks(filepath.Dir(sidecarBin))
	if err != nil {
		return nil, err
	}
	if checks[n.KubeletVersion] == "" {
		return nil, fmt.Errorf("node %s runs kubelet %s but %s has no %s%s beside dkc-sidecar (build them with "+
			"internal/kubeletcheck/build.sh %s)",
			n.Name, n.KubeletVersion, filepath.Dir(sidecarBin), kubeletCheckPrefix, n.KubeletVersion, filepath.Dir(sidecarBin))
	}
	minors := make([]string, 0, len(checks))
	for m := range checks {
		minors = append(minors, m)
	}
	sortMinors(minors)
	nspawn := []string{"systemd-nspawn", "--boot", "--directory=" + rootfs, "--volatile=overlay", "--machine=" + n.Netns,
		"--register=no", "--keep-unit", "--console=pipe", "--capability=all",
		"--network-namespace-path=/run/netns/" + n.Netns,
		"--bind=" + filepath.Join(c.NodeDir(n.Name), "bus") + ":/run/dbus",
		"--bind-ro=" + kubeletBin + ":/usr/local/bin/kubelet",
		"--bind-ro=" + sidecarBin + ":/usr/local/bin/dkc-sidecar",
		"--bind=/dev/kmsg",
		"--bind=" + c.cfg.Dir,
		"--bind=" + c.state.RuntimeDir,
		"--bind=" + c.DynamicConfigDir(n.Name) + ":" + DynamicConfigDirInNode,
		"--bind=" + c.NodeLogDir(n.Name) + ":/var/log/dkc",
		"--bind-ro=" + units["kubelet.service"] + ":/etc/systemd/system/kubelet.service",
		"--bind-ro=" + units["kubelet.service.d/20-dkc.conf"] + ":/etc/systemd/system/kubelet.service.d/20-dkc.conf",
		"--bind-ro=" + units["dkc-sidecar.service"] + ":/etc/systemd/system/dkc-sidecar.service",
	}
	for _, m := range minors {
		nspawn = append(nspawn, "--bind-ro="+checks[m]+":/usr/local/bin/"+kubeletCheckPrefix+m)
	}
	return inNodeCgroup(n, nspawn), nil
}

// inNodeCgroup runs argv in a cgroup of the node's own (name=systemd and unified hierarchies), so that what
// nspawn leaves there can be removed without touching another node's.
func inNodeCgroup(n NodeState, argv []string) []string {
	var join strings.Builder
	for _, h := range cgroupHierarchies {
		fmt.Fprintf(&join, "mkdir -p %[1]s/%[2]s && echo $$ > %[1]s/%[2]s/cgroup.procs && ", h, nodeCgroup(n))
	}
	return append([]string{"sh", "-c", join.String() + "exec \"$@\"", "nspawn"}, argv...)
}

// kubeletUnit is a node's kubelet.service, kubeadm-style: its --config in $KUBELET_CONFIG_ARGS (which dkc's
// drop-in overrides), systemd's default start limit unless noStartLimit (kubeadm's unit sets none).
func kubeletUnit(node, after, configPath string, args []string, noStartLimit bool) string {
	var unit strings.Builder
	fmt.Fprintf(&unit, "[Unit]\nDescription=kubelet of dkc dev node %s\n", node)
	if after != "" {
		fmt.Fprintf(&unit, "After=%s\n", after)
	}
	if noStartLimit {
		unit.WriteString("StartLimitIntervalSec=0\n")
	}
	fmt.Fprintf(&unit, `[Service]
Environment="%[1]s=--config=%[2]s"
ExecStart=/usr/local/bin/kubelet $%[1]s %[3]s
Restart=always
RestartSec=1
StandardOutput=append:/var/log/dkc/kubelet.log
StandardError=inherit
`, app.KubeletConfigVariable, configPath, strings.Join(args, " "))
	return unit.String()
}

// waitBus waits for the node's systemd to answer on its bus.
func waitBus(ctx context.Context, socket string) error {
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		_, err := os.Stat(socket)
		return err == nil, nil
	})
	if err != nil && ctx.Err() == nil {
		return fmt.Errorf("no D-Bus socket at %s after a minute", socket)
	}
	return err
}

// writeFiles writes name → content into dir and returns name → path.
func writeFiles(dir string, files map[string]string) (map[string]string, error) {
	paths := map[string]string{}
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			return nil, fmt.Errorf("write %s: %w", p, err)
		}
		paths[name] = p
	}
	return paths, nil
}

// runtimeRoot holds every dev cluster's runtime dir (kubelet and containerd state), one per cluster dir.
const runtimeRoot = "/var/lib/dkc-dev"

// LiveRuntimeDirs lists the runtime dirs under /var/lib/dkc-dev whose real nodes have a process running:
// some process sits in one of their node cgroups. A dir whose cluster was killed rather than stopped (a test
// binary or CI job cut off at its deadline) stays behind with nothing in it alive; it is not listed, so that
// the leftover of a killed run does not count as a cluster that host-wide changes would break.
func LiveRuntimeDirs() ([]string, error) { return liveRuntimeDirs(runtimeRoot, "/proc") }

func liveRuntimeDirs(root, proc string) ([]string, error) {
	entries, err := os.ReadDir(root)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list dev cluster runtime dirs in %s: %w", root, err)
	}
	procs, err := filepath.Glob(filepath.Join(proc, "[0-9]*", "cgroup"))
	if err != nil {
		return nil, err
	}
	var cgroups strings.Builder
	for _, p := range procs {
		// A process may exit between the glob and the read: skip it.
		if b, err := os.ReadFile(p); err == nil {
			cgroups.Write(b)
		}
	}
	var live []string
	for _, e := range entries {
		if !e.IsDir() || len(e.Name()) < 8 {
			continue
		}
		// A node's cgroup is nodeCgroup: "dkc-" + its netns, "dkc-<id[:8]>-<node>".
		if strings.Contains(cgroups.String(), "/dkc-dkc-"+e.Name()[:8]+"-") {
			live = append(live, filepath.Join(root, e.Name()))
		}
	}
	return live, nil
}
