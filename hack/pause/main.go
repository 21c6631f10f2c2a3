// SPDX-License-Identifier: Apache-2.0

// Command pause is the sandbox ("pause") container of a local cluster's pods, built here because no
// registry is reachable to pull registry.k8s.io/pause. Like upstream's pause.c it holds the pod's
// namespaces by doing nothing: it blocks until SIGINT or SIGTERM and exits 0. When the pod shares one PID
// namespace it is PID 1 there, so orphaned processes of the pod's containers are re-parented to it; it reaps
// them on SIGCHLD, or they would stay zombies until the pod dies. Standard library only, to stay small.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	// -v prints a version and exits 0, as upstream's pause does: the installed suite's workloads use it as
	// an exec readiness probe that passes.
	if len(os.Args) > 1 && os.Args[1] == "-v" {
		_, _ = os.Stdout.WriteString("pause (dkc)\n")
		return
	}
	sigs := make(chan os.Signal, 8)
	// A handler for SIGTERM is required, not just tidy: PID 1 ignores signals it has no handler for.
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range sigs {
		if sig == syscall.SIGCHLD {
			reap()
			continue
		}
		os.Exit(0)
	}
}

// reap collects every child that has exited and returns their PIDs. Signals coalesce, so one SIGCHLD may
// stand for several children: loop until none is left.
func reap() []int {
	var pids []int
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if pid <= 0 || err != nil {
			return pids
		}
		pids = append(pids, pid)
	}
}
