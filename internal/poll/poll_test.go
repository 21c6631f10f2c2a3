// SPDX-License-Identifier: Apache-2.0

package poll

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

func TestUntilReturnsOnceTheConditionHolds(t *testing.T) {
	var done atomic.Bool
	go func() { done.Store(true) }()
	looks := 0
	Until(t, "the goroutine to run", func() bool { looks++; return done.Load() })
	if looks == 0 {
		t.Error("no look at the condition")
	}
}

// TestSteppingStepsBetweenLooks: the first look is at the clock as it was; each later one follows a step.
func TestSteppingStepsBetweenLooks(t *testing.T) {
	start := time.Unix(1000, 0)
	clk := clocktesting.NewFakeClock(start)
	fired := clk.After(3 * time.Second)
	var first time.Time
	Stepping(t, "the timer to fire", clk, time.Second, func() bool {
		if first.IsZero() {
			first = clk.Now()
		}
		select {
		case <-fired:
			return true
		default:
			return false
		}
	})
	if !first.Equal(start) {
		t.Errorf("first look at %v, want the clock unstepped (%v)", first, start)
	}
	if got := clk.Since(start); got != 3*time.Second {
		t.Errorf("stepped %v, want 3s: no step after the look that found the timer fired", got)
	}
}

// TestDriveStepsOnlyWhileSomethingWaits: a wait on the clock passes at once; with nothing waiting, the clock
// stays where it is.
func TestDriveStepsOnlyWhileSomethingWaits(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	stop := Drive(t, clk, 600*time.Millisecond)
	<-clk.After(3 * time.Second) // five steps
	stop()
	at := clk.Now()
	stop() // twice is fine (and the test's Cleanup calls it again)
	if got := clk.Now(); !got.Equal(at) {
		t.Errorf("the clock moved from %v to %v after stop", at, got)
	}

	idle := clocktesting.NewFakeClock(time.Unix(1000, 0))
	defer Drive(t, idle, time.Second)()
	time.Sleep(20 * Interval) // proves a negative: nothing waits, so nothing may move the clock meanwhile
	if got := idle.Now(); !got.Equal(time.Unix(1000, 0)) {
		t.Errorf("an idle clock was stepped to %v", got)
	}
}

// failures is a testing.TB whose Fatal records the failure and returns, so that a test can see one.
type failures struct {
	testing.TB
	got []string
}

func (f *failures) Helper() {}

func (f *failures) Fatal(args ...any) { f.got = append(f.got, fmt.Sprint(args...)) }

// TestForLooksAtOnceThenEveryInterval: the first look comes before any interval has passed; once the
// condition holds, For returns.
func TestForLooksAtOnceThenEveryInterval(t *testing.T) {
	f := &failures{TB: t}
	looks := 0
	For(f, Timeout, time.Hour, "the condition", func() bool { looks++; return true })
	if looks != 1 || len(f.got) != 0 {
		t.Errorf("%d looks, failures %q; want one look at once, no failure", looks, f.got)
	}

	looks = 0
	For(f, Timeout, time.Millisecond, "the third look", func() bool { looks++; return looks == 3 })
	if looks != 3 || len(f.got) != 0 {
		t.Errorf("%d looks, failures %q; want 3, no failure", looks, f.got)
	}
}

// TestForNilFailsAtItsTimeoutWithWhatItSaw: the timeout and the interval are the caller's, not Timeout and
// Interval, and the failure says what the last look saw.
func TestForNilFailsAtItsTimeoutWithWhatItSaw(t *testing.T) {
	f := &failures{TB: t}
	const timeout, interval = 100 * time.Millisecond, 25 * time.Millisecond
	looks := 0
	ForNil(f, timeout, interval, "the rollout", func() error { looks++; return fmt.Errorf("%d of 3 nodes updated", looks%3) })
	if want := fmt.Sprintf("waited 100ms for the rollout: %d of 3 nodes updated", looks%3); len(f.got) != 1 || f.got[0] != want {
		t.Errorf("failures %q, want [%q]", f.got, want)
	}
	// A look at once, then one per interval: about 5, where every Interval would make about 100. The bound is
	// loose, for a loaded machine.
	if looks < 1 || looks >= 20 {
		t.Errorf("%d looks in %v every %v", looks, timeout, interval)
	}

	f.got = nil
	For(f, timeout, interval, "a condition that never holds", func() bool { return false })
	if want := "waited 100ms for a condition that never holds"; len(f.got) != 1 || f.got[0] != want {
		t.Errorf("failures %q, want [%q]", f.got, want)
	}
}
