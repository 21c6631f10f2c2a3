package poll

import (
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
