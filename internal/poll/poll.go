// SPDX-License-Identifier: Apache-2.0

// Package poll is how tests wait for what the code under test does on goroutines of its own: they name a
// condition and poll it (Until), and where the code waits on a fake clock they move that clock instead of
// sleeping real time — by a step before every look (Stepping), or whenever the code waits on it (Drive).
// The ...Nil forms take a condition that says what it sees while it does not hold, for the failure. The
// For forms take a timeout and an interval of the caller's: the cluster suites wait minutes for a kubelet
// restart or a rollout, and look at a real apiserver far less often than every Interval.
//
// A test never sleeps to let something happen: a fixed sleep is too short on a loaded machine (a flake)
// and too long everywhere else. The only sleeps left in tests are those that prove something does not
// happen within a period, or that make a period pass which the code under test counts (a cache's expiry,
// a partition's length, the pace of a burst), each with a comment saying so.
package poll

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	clocktesting "k8s.io/utils/clock/testing"
)

// Timeout is how long Until and Stepping wait before they fail the test: Kubernetes' ForeverTestTimeout,
// long enough for -race on a loaded 2-core machine; a passing test never waits it out.
const Timeout = 30 * time.Second

// Interval is the real time between two looks at a condition, and between two looks at a driven clock's
// waiters.
const Interval = time.Millisecond

// Until polls cond every Interval until it holds, and fails the test after Timeout; what says what was
// waited for ("the node's stream to register"). Call it from the test's goroutine: it calls t.Fatalf.
func Until(t testing.TB, what string, cond func() bool) {
	t.Helper()
	UntilNil(t, what, notYet(cond))
}

// errNotYet is what a condition without words sees while it does not hold.
var errNotYet = errors.New("not yet")

func notYet(cond func() bool) func() error {
	return func() error {
		if !cond() {
			return errNotYet
		}
		return nil
	}
}

// UntilNil is Until for a condition that says what it sees while it does not hold: cond returns nil once
// it holds, else what it found ("2 of 3 reports acknowledged"), which the test's failure shows.
func UntilNil(t testing.TB, what string, cond func() error) {
	t.Helper()
	ForNil(t, Timeout, Interval, what, cond)
}

// For is Until with a timeout and an interval of the caller's, for the suites on a real cluster: a kubelet
// restart or a rollout takes minutes, and a real apiserver is asked every second or so, not every Interval.
// Code that must not fail the test at the timeout (a helper that returns an error, a goroutine other than
// the test's) polls with wait.PollUntilContextTimeout instead.
func For(t testing.TB, timeout, interval time.Duration, what string, cond func() bool) {
	t.Helper()
	ForNil(t, timeout, interval, what, notYet(cond))
}

// ForNil is For for a condition that says what it sees while it does not hold (UntilNil).
func ForNil(t testing.TB, timeout, interval time.Duration, what string, cond func() error) {
	t.Helper()
	last := errNotYet
	// The context is not t.Context(): that one ends before the test's Cleanup functions, which may wait too.
	if wait.PollUntilContextTimeout(context.Background(), interval, timeout, true, func(context.Context) (bool, error) {
		last = cond()
		return last == nil, nil
	}) != nil {
		msg := fmt.Sprintf("waited %v for %s", timeout, what)
		if !errors.Is(last, errNotYet) {
			msg += ": " + last.Error()
		}
		t.Fatal(msg)
	}
}

// Stepping is Until for code that acts when a fake clock reaches a time: after every look that finds cond
// false it steps clk by step. A timer the code sets after the clock's last step (a rate-limited requeue, a
// held write, the next tick) still fires, however the test's steps and the code's goroutines interleave.
func Stepping(t testing.TB, what string, clk *clocktesting.FakeClock, step time.Duration, cond func() bool) {
	t.Helper()
	SteppingNil(t, what, clk, step, notYet(cond))
}

// SteppingNil is Stepping for a condition that says what it sees while it does not hold (UntilNil).
func SteppingNil(t testing.TB, what string, clk *clocktesting.FakeClock, step time.Duration, cond func() error) {
	t.Helper()
	first := true
	UntilNil(t, what, func() error {
		if !first {
			clk.Step(step)
		}
		first = false
		return cond()
	})
}

// Drive steps clk by step whenever something waits on it (clk.HasWaiters), until the returned stop is
// called or the test ends. It is for calls that sleep on a fake clock at moments the test cannot name — a
// health wait's pauses, a pacer's — so that they pass at once: the clock moves only while the code waits
// on it, never under a computation that reads it twice (unless something else waits on it all along, as
// a ticker does). Stop returns once the clock is no longer stepped.
func Drive(t testing.TB, clk *clocktesting.FakeClock, step time.Duration) (stop func()) {
	t.Helper()
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		tick := time.NewTicker(Interval)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				if clk.HasWaiters() {
					clk.Step(step)
				}
			}
		}
	}()
	end := sync.OnceFunc(func() { close(done) })
	stop = func() { end(); <-stopped }
	t.Cleanup(stop)
	return stop
}
