// SPDX-License-Identifier: Apache-2.0

package devcluster

import (
	"fmt"
	"io"
	"strings"

	"k8s.io/component-helpers/node/util/sysctl"
)

// The kubelet's container manager requires these kernel settings. At every start it compares them with the
// running kernel and writes the ones that differ; where /proc/sys is read-only (inside systemd-nspawn, the
// real nodes' container) the write fails and the kubelet refuses to start ("Failed to start
// ContainerManager ... open /proc/sys/kernel/panic: read-only file system"). A brand-new machine has
// kernel.panic=1, kernel.panic_on_oops=0 and vm.overcommit_memory=0.
//
// The dev nodes share the host's kernel: the host IS their kernel, so the settings are made on the host
// before a real node starts, the way node provisioning makes them on a production node (kubespray, for
// one, writes them to /etc/sysctl.d). Here they are set at run time only; make up sets them again after a
// reboot. The kubelet's own check stays as it is: no --protect-kernel-defaults, nothing hidden. The values
// come from the package the kubelet itself reads them from, so a kubelet that changes them changes them
// here too.
var kubeletKernelTunables = []KernelTunable{
	{Name: sysctl.VMOvercommitMemory, Value: sysctl.VMOvercommitMemoryAlways},
	{Name: sysctl.VMPanicOnOOM, Value: sysctl.VMPanicOnOOMInvokeOOMKiller},
	{Name: sysctl.KernelPanic, Value: sysctl.KernelPanicRebootTimeout},
	{Name: sysctl.KernelPanicOnOops, Value: sysctl.KernelPanicOnOopsAlways},
	{Name: sysctl.RootMaxKeys, Value: sysctl.RootMaxKeysSetting},
	{Name: sysctl.RootMaxBytes, Value: sysctl.RootMaxBytesSetting},
}

// KernelTunable is one sysctl, named as under /proc/sys ("kernel/panic"), and its value.
type KernelTunable struct {
	Name  string
	Value int
}

// String is the sysctl(8) form, kernel.panic=10.
func (t KernelTunable) String() string {
	return fmt.Sprintf("%s=%d", strings.ReplaceAll(t.Name, "/", "."), t.Value)
}

// KubeletKernelTunables returns the kernel settings a kubelet requires of its node.
func KubeletKernelTunables() []KernelTunable {
	return append([]KernelTunable(nil), kubeletKernelTunables...)
}

// KernelChange is a tunable that was set, and the value it had before.
type KernelChange struct {
	KernelTunable
	Was int
}

// ProvisionKernel sets every kernel tunable the kubelet requires that the running kernel does not have yet,
// says so on progress, and returns what it changed. Nothing is changed back when the cluster stops: like
// node provisioning, the settings belong to the machine, and a second cluster may be running on it.
func ProvisionKernel(sys sysctl.Interface, progress io.Writer) ([]KernelChange, error) {
	var changes []KernelChange
	for _, t := range kubeletKernelTunables {
		v, err := sys.GetSysctl(t.Name)
		if err != nil {
			return changes, fmt.Errorf("read kernel setting %s the kubelet requires: %w", t, err)
		}
		if v == t.Value {
			continue
		}
		if err := sys.SetSysctl(t.Name, t.Value); err != nil {
			return changes, fmt.Errorf("set kernel setting %s the kubelet requires (was %d): %w", t, v, err)
		}
		changes = append(changes, KernelChange{KernelTunable: t, Was: v})
	}
	if len(changes) > 0 {
		var b strings.Builder
		for i, c := range changes {
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "%s (was %d)", c.KernelTunable, c.Was)
		}
		fmt.Fprintf(progress, "node provisioning: set %s on this host, as node provisioning does: the kubelet "+
			"requires them and the dev nodes share this kernel (they stay set after make down; see "+
			"docs/development.md, \"The local cluster\")\n", b.String())
	}
	return changes, nil
}

// inotifyMinimums are the inotify limits a machine running several dev clusters needs. The limits count per
// user, and every process of every cluster runs as root: each node's systemd, journald, dbus-daemon,
// containerd and kubelet, and each control plane, hold inotify instances of their own, so clusters side by
// side (the cluster suites, the installed suite's shards) outgrow the kernel's default of 128 instances
// together. What fails then is far from the cause: a node's systemd stops booting before its D-Bus socket,
// or containerd starts without its CRI plugin ("failed to create fsnotify watcher: too many open files")
// and the kubelet finds no runtime. The values are those kind documents for clusters on one host.
var inotifyMinimums = []KernelTunable{
	{Name: "fs/inotify/max_user_instances", Value: 512},
	{Name: "fs/inotify/max_user_watches", Value: 524288},
}

// ProvisionInotify raises each inotify limit below inotifyMinimums to it, says so on progress, and returns
// what it changed. A higher limit is kept; nothing is changed back when the cluster stops.
func ProvisionInotify(sys sysctl.Interface, progress io.Writer) ([]KernelChange, error) {
	var changes []KernelChange
	for _, t := range inotifyMinimums {
		v, err := sys.GetSysctl(t.Name)
		if err != nil {
			return changes, fmt.Errorf("read kernel setting %s: %w", t.Name, err)
		}
		if v >= t.Value {
			continue
		}
		if err := sys.SetSysctl(t.Name, t.Value); err != nil {
			return changes, fmt.Errorf("raise kernel setting %s (was %d): %w", t, v, err)
		}
		changes = append(changes, KernelChange{KernelTunable: t, Was: v})
		fmt.Fprintf(progress, "node provisioning: set %s on this host (was %d): dev clusters side by side outgrow "+
			"the default inotify limits\n", t, v)
	}
	return changes, nil
}
