// SPDX-License-Identifier: Apache-2.0

package systemd

import (
	"context"
	"time"

	"k8s.io/utils/clock"
)

// startPacer spaces the starts one caller makes of a unit so that they stay inside the unit's start limit
// (StartLimitBurst starts per StartLimitIntervalSec). It keeps one start of every window free for the
// unit's own Restart= after a crash, which counts against the same limit: dkc makes at most burst-1 starts
// per interval (at least one), and waits for the oldest to leave the window before making another. A burst
// of reassignments therefore slows down to the unit's pace instead of leaving the kubelet dead.
type startPacer struct {
	clock  clock.Clock
	starts []time.Time // this caller's starts, oldest first
}

// wait returns when one more start keeps the caller under burst-1 starts per interval, or when ctx ends.
// interval or burst 0: the unit has no limit.
func (p *startPacer) wait(ctx context.Context, interval time.Duration, burst int) error {
	if interval <= 0 || burst <= 0 {
		return nil
	}
	allowed := max(burst-1, 1)
	for {
		now := p.clock.Now()
		for len(p.starts) > 0 && !p.starts[0].After(now.Add(-interval)) {
			p.starts = p.starts[1:]
		}
		if len(p.starts) < allowed {
			return nil
		}
		// A little past the moment the oldest start leaves systemd's window, whose clock is not ours.
		wait := p.starts[0].Add(interval).Sub(now) + 100*time.Millisecond
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-p.clock.After(wait):
		}
	}
}

// record notes a start made now.
func (p *startPacer) record() { p.starts = append(p.starts, p.clock.Now()) }
