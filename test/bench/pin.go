// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"fmt"
	"os"
	"runtime"
	"strconv"

	"golang.org/x/sys/unix"
)

// The fleet phase's two windows (dkc's status at fleet speed, then the bare client's) compare how long the
// same writes take through dkc and from a bare client against the same apiserver. On a machine of a few
// cores the 10,000 simulated nodes — 10,000 machines in a real cluster, which take none of the control
// plane's CPU — and dkc-server share the cores with the apiserver, and a window's length became the CPU the
// simulation took from the apiserver (fleet_*_cpu_seconds_*). The benchmark therefore gives the control
// plane (kube-apiserver, etcd) the lower half of the CPUs and everything else (dkc-server, the simulated
// nodes, the bare client) the upper half for both windows: the apiserver's capacity is the same in both,
// and a longer dkc window means dkc and its nodes could not keep the apiserver as busy as a bare client
// does — which the goal is about.

// controlPlane are the processes pinned to the lower half of the CPUs.
var controlPlane = []string{"kube-apiserver", "etcd"}

// cpuHalves splits CPUs 0..n-1 into the control plane's (the lower half) and the rest's; with one CPU
// there is nothing to split.
func cpuHalves(n int) (control, rest unix.CPUSet, ok bool) {
	if n < 2 {
		return control, rest, false
	}
	for i := range n {
		if i < n/2 {
			control.Set(i)
		} else {
			rest.Set(i)
		}
	}
	return control, rest, true
}

// pinCPUs pins the control plane's processes to the lower half of the CPUs and dkc-server and this process
// to the upper half; the returned func lets every one of them use every CPU again. It says what it did.
func (r *run) pinCPUs() (unpin func(), err error) {
	control, rest, ok := cpuHalves(runtime.NumCPU())
	if !ok {
		return func() {}, nil
	}
	var all unix.CPUSet
	for i := range runtime.NumCPU() {
		all.Set(i)
	}
	pids := map[int]*unix.CPUSet{os.Getpid(): &rest}
	for _, name := range append(controlPlane, "dkc-server") {
		pid, err := r.cluster.PID(name)
		if err != nil || pid == 0 {
			return func() {}, fmt.Errorf("pin %s to its CPUs: not running (%w)", name, err)
		}
		if name == "dkc-server" {
			pids[pid] = &rest
		} else {
			pids[pid] = &control
		}
	}
	unpin = func() {
		for pid := range pids {
			if err := setAffinity(pid, &all); err != nil {
				r.progress("unpin pid %d: %v", pid, err)
			}
		}
	}
	for pid, set := range pids {
		if err := setAffinity(pid, set); err != nil {
			unpin()
			return func() {}, err
		}
	}
	return unpin, nil
}

// setAffinity sets the CPU affinity of every thread of process pid (affinity is per thread; threads
// created later inherit their creator's).
func setAffinity(pid int, set *unix.CPUSet) error {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return fmt.Errorf("threads of pid %d: %w", pid, err)
	}
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		// A thread that exited meanwhile is not an error.
		if err := unix.SchedSetaffinity(tid, set); err != nil && err != unix.ESRCH {
			return fmt.Errorf("set CPU affinity of thread %d of pid %d: %w", tid, pid, err)
		}
	}
	return nil
}
