// SPDX-License-Identifier: Apache-2.0

package devcluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// An in-place kubelet upgrade, as a node's package manager makes one (`apt upgrade kubelet`): the file the
// kubelet unit runs, /usr/local/bin/kubelet in the node, becomes the other minor's binary while the node,
// its systemd and the running kubelet carry on; the running kubelet keeps the binary it was started from
// until someone restarts it (RestartUnit), as after a package upgrade.
//
// A real node's kubelet is a read-only bind mount of the host's binary (nspawnArgs, installedNspawnArgs),
// fixed when the node boots. Restarting the node with another bind would be a reboot, not an upgrade, and
// would lose its pods, containerd and systemd state; so the new binary is bind-mounted over the path inside
// the node's own mount namespace instead (nsenter on the node's init, the container's leader), from a copy
// in the node's directory, which every real node sees at the same path (the cluster directory is bound
// into it). Undoing it detaches that one mount: the path shows the node's own binary again.

// kubeletInNode is where a real node's kubelet.service finds its binary (kubeletUnit's ExecStart).
const kubeletInNode = "/usr/local/bin/kubelet"

// ReplaceKubelet makes node's /usr/local/bin/kubelet the kubelet of minor ("1.37"), in place, as a package
// upgrade of a running node does; it restarts nothing (restart the kubelet with RestartUnit, as an operator
// does after the upgrade) and returns once the node's path runs as minor's kubelet (`kubelet --version`
// inside the node). undo puts the node's own binary back, again without a restart, and removes the copy;
// several replacements of one node are undone in the reverse order. The binary of minor is one the cluster
// runs on another node, else the dev cluster's pinned build (EnsureKubelet, built on first use).
func (c *Cluster) ReplaceKubelet(ctx context.Context, node, minor string) (
	undo func(context.Context) error, err error) {
	n, ok := c.realNode(node)
	if !ok || !(n.Systemd || c.state.Installed) {
		return nil, fmt.Errorf("replace the kubelet of %s: not a real node of this cluster booted under its own systemd",
			node)
	}
	bin, err := c.kubeletBinary(ctx, minor)
	if err != nil {
		return nil, fmt.Errorf("replace the kubelet of %s with %s: %w", node, minor, err)
	}
	leader, err := c.nodeLeader(n)
	if err != nil {
		return nil, fmt.Errorf("replace the kubelet of %s with %s: %w", node, minor, err)
	}
	// A directory of this replacement's own under the cluster directory, which the node has at the same
	// path: the host's cache, where the binary is built, is not visible in the node.
	if err := os.MkdirAll(c.NodeDir(node), 0o755); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(c.NodeDir(node), "kubelet-upgrade-")
	if err != nil {
		return nil, fmt.Errorf("replace the kubelet of %s: %w", node, err)
	}
	staged := filepath.Join(dir, "kubelet-"+minor)
	mounted := false
	undo = func(ctx context.Context) error {
		var errs []error
		if mounted {
			if err := c.unmountInNode(ctx, n, kubeletInNode); err != nil {
				errs = append(errs, err)
			} else {
				mounted = false
			}
		}
		if !mounted {
			if err := os.RemoveAll(dir); err != nil {
				errs = append(errs, fmt.Errorf("node %s: remove the replaced kubelet's copy %s: %w", node, dir, err))
			}
		}
		return errors.Join(errs...)
	}
	defer func() {
		if err != nil {
			if uerr := undo(context.WithoutCancel(ctx)); uerr != nil {
				err = fmt.Errorf("%w (and undoing it: %w)", err, uerr)
			}
		}
	}()
	if err := linkOrCopy(bin, staged); err != nil {
		return undo, fmt.Errorf("replace the kubelet of %s: stage %s: %w", node, bin, err)
	}
	// Read-only, as the node's own kubelet is bound; the copy lies on the cluster directory, which the
	// installed form binds read-only anyway.
	if out, err := nsenterMount(ctx, leader, "mount", "--bind", "-o", "ro", staged, kubeletInNode); err != nil {
		return undo, fmt.Errorf("node %s: bind %s over %s in the node: %w: %s", node, staged, kubeletInNode, err, out)
	}
	mounted = true
	if got, err := c.kubeletVersionInNode(ctx, n); err != nil {
		return undo, err
	} else if !strings.HasPrefix(got, "v"+minor+".") {
		return undo, fmt.Errorf("node %s: %s reports %s after the replacement, want %s", node, kubeletInNode, got, minor)
	}
	return undo, nil
}

// unmountInNode detaches the mount on path inside node's mount namespace. Lazily: the kubelet started from
// the replacement keeps its binary busy, as a running program keeps the file a package upgrade replaced;
// it runs on until restarted, and new starts find the path's previous file. A node that no longer runs
// took its mounts with it.
func (c *Cluster) unmountInNode(ctx context.Context, n NodeState, path string) error {
	leader, err := c.nodeLeader(n)
	if errors.Is(err, errNodeNotRunning) {
		return nil
	}
	if err != nil {
		return err
	}
	if out, err := nsenterMount(ctx, leader, "umount", "--lazy", path); err != nil {
		return fmt.Errorf("node %s: unmount %s in the node: %w: %s", n.Name, path, err, out)
	}
	return nil
}

// KubeletVersionInNode is `kubelet --version` of the binary node's kubelet.service starts
// (/usr/local/bin/kubelet in the node), e.g. "v1.37.2": what the next kubelet start runs, which the running
// kubelet need not be (its Node's status.nodeInfo.kubeletVersion says that).
func (c *Cluster) KubeletVersionInNode(ctx context.Context, node string) (string, error) {
	n, ok := c.realNode(node)
	if !ok {
		return "", fmt.Errorf("no real node %s in this cluster", node)
	}
	return c.kubeletVersionInNode(ctx, n)
}

func (c *Cluster) kubeletVersionInNode(ctx context.Context, n NodeState) (string, error) {
	leader, err := c.nodeLeader(n)
	if err != nil {
		return "", err
	}
	out, err := nsenterMount(ctx, leader, kubeletInNode, "--version")
	if err != nil {
		return "", fmt.Errorf("node %s: %s --version: %w: %s", n.Name, kubeletInNode, err, out)
	}
	// "Kubernetes v1.37.2"
	f := strings.Fields(out)
	if len(f) != 2 || !strings.HasPrefix(f[1], "v") {
		return "", fmt.Errorf("node %s: %s --version printed %q", n.Name, kubeletInNode, out)
	}
	return f[1], nil
}

// nsenterMount runs argv in the mount and PID namespaces of the process leader (a node's init): paths are
// the node's, the program too; the other namespaces stay the host's. The PID namespace too because the
// node's /proc is the procfs of its PID namespace: a process of the host's has no /proc/self there, and
// umount reads /proc/self/mountinfo. It returns the combined output.
func nsenterMount(ctx context.Context, leader int, argv ...string) (string, error) {
	args := append([]string{"--target", strconv.Itoa(leader), "--mount", "--pid", "--"}, argv...)
	out, err := exec.CommandContext(ctx, "nsenter", args...).CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

func (c *Cluster) realNode(node string) (NodeState, bool) {
	for _, n := range c.state.Nodes {
		if n.Name == node {
			return n, true
		}
	}
	return NodeState{}, false
}

// kubeletBinary is the host's kubelet binary of minor: the one a node of the cluster booted with (its
// recorded nspawn command line binds it), else the dev cluster's pinned build of minor.
func (c *Cluster) kubeletBinary(ctx context.Context, minor string) (string, error) {
	for _, n := range c.state.Nodes {
		if c.KubeletVersion(n.Name) != minor {
			continue
		}
		if bin, err := c.bootKubelet(n); err == nil {
			return bin, nil
		}
	}
	root := c.cfg.RepoRoot
	if root == "" {
		wd, _ := os.Getwd()
		var err error
		if root, err = RepoRoot(wd); err != nil {
			return "", fmt.Errorf("no node runs kubelet %s and the dev cluster's build of it needs the repository: %w",
				minor, err)
		}
	}
	return EnsureKubelet(ctx, root, minor, c.cfg.Progress)
}

// bootKubelet is the host's binary node n booted with as its kubelet, from its recorded command line.
func (c *Cluster) bootKubelet(n NodeState) (string, error) {
	raw, err := os.ReadFile(filepath.Join(c.runDir(), "node-"+n.Name+".argv"))
	if err != nil {
		return "", err
	}
	var rec processRecord
	if err := json.Unmarshal(raw, &rec); err != nil {
		return "", fmt.Errorf("node %s's recorded command line: %w", n.Name, err)
	}
	for _, a := range rec.Argv {
		if src, ok := strings.CutPrefix(a, "--bind-ro="); ok && strings.HasSuffix(src, ":"+kubeletInNode) {
			return strings.TrimSuffix(src, ":"+kubeletInNode), nil
		}
	}
	return "", fmt.Errorf("node %s's recorded command line binds no %s", n.Name, kubeletInNode)
}

var errNodeNotRunning = errors.New("node not running")

// nodeLeader is the host PID of node n's init (systemd, PID 1 in the node): the process systemd-nspawn
// started in the node's namespaces, found below the node's recorded nspawn process.
func (c *Cluster) nodeLeader(n NodeState) (int, error) {
	p, err := loadProcess("node-"+n.Name, c.runDir())
	if err != nil {
		return 0, err
	}
	if p == nil || p.pid() == 0 {
		return 0, fmt.Errorf("node %s: %w", n.Name, errNodeNotRunning)
	}
	nspawn := p.pid()
	// The node's init is one PID namespace below nspawn's; the node's pods (their pause processes) are PID 1
	// of namespaces further below, and descend from nspawn too.
	_, outer, err := procParentAndNSpid(nspawn)
	if err != nil {
		return 0, fmt.Errorf("node %s: %w", n.Name, err)
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		ppid, nspid, err := procParentAndNSpid(pid)
		if err != nil || len(nspid) != len(outer)+1 || nspid[len(nspid)-1] != "1" {
			continue // gone meanwhile, or not the init of a PID namespace right below nspawn's
		}
		if descendsFrom(ppid, nspawn) {
			return pid, nil
		}
	}
	return 0, fmt.Errorf("node %s: no init process below its systemd-nspawn (pid %d)", n.Name, nspawn)
}

// descendsFrom says whether pid is ancestor or one of its descendants (nspawn may run the node's init
// through an intermediate child).
func descendsFrom(pid, ancestor int) bool {
	for range 8 {
		if pid == ancestor {
			return true
		}
		if pid <= 1 {
			return false
		}
		ppid, _, err := procParentAndNSpid(pid)
		if err != nil {
			return false
		}
		pid = ppid
	}
	return false
}

// procParentAndNSpid reads PPid and NSpid (the PID in each nested PID namespace, the innermost last) from
// /proc/PID/status.
func procParentAndNSpid(pid int) (ppid int, nspid []string, err error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, nil, err
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "PPid:"); ok {
			if ppid, err = strconv.Atoi(strings.TrimSpace(v)); err != nil {
				return 0, nil, fmt.Errorf("/proc/%d/status: PPid %q: %w", pid, v, err)
			}
		} else if v, ok := strings.CutPrefix(line, "NSpid:"); ok {
			nspid = strings.Fields(v)
		}
	}
	return ppid, nspid, nil
}

// linkOrCopy makes dst the file src, by a hard link where both are on one filesystem, else a copy.
func linkOrCopy(src, dst string) error {
	if err := os.Link(src, dst); err == nil {
		return nil
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
