// SPDX-License-Identifier: Apache-2.0

package main

import (
	"slices"
	"syscall"
	"testing"

	"github.com/dkc-dev/dkc/internal/ciskip"
	"github.com/dkc-dev/dkc/internal/poll"
)

func TestReapCollectsExitedChildren(t *testing.T) {
	for _, tc := range []struct {
		name     string
		children int
	}{
		{"no child", 0},
		{"one child", 1},
		{"several children behind one SIGCHLD", 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var want []int
			for range tc.children {
				// ForkExec, not os/exec: nothing may wait for the child but reap.
				pid, err := syscall.ForkExec("/bin/true", []string{"true"}, nil)
				if err != nil {
					ciskip.Skipf(t, "cannot start /bin/true: %v", err)
				}
				want = append(want, pid)
			}
			var got []int
			poll.Until(t, "the children to exit and be reaped", func() bool {
				got = append(got, reap()...)
				return len(got) >= len(want)
			})
			got = append(got, reap()...) // and nothing more
			slices.Sort(got)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Errorf("reaped %v, want %v", got, want)
			}
		})
	}
}
