// SPDX-License-Identifier: Apache-2.0

package systemd

import (
	"context"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/dkc-dev/dkc/internal/poll"
)

func TestStartPacer(t *testing.T) {
	for _, tc := range []struct {
		name     string
		interval time.Duration
		burst    int
		starts   int
		// want: how long the last start had to wait, in total, after the starts before it were made at once
		wantWait time.Duration
	}{
		{name: "no start limit (kubeadm's unit): never waits", interval: 0, burst: 0, starts: 50},
		{name: "systemd's default, within burst-1: no wait", interval: 10 * time.Second, burst: 5, starts: 4},
		{name: "systemd's default, the 5th start waits for the 1st to leave the window", interval: 10 * time.Second, burst: 5, starts: 5,
			wantWait: 10*time.Second + 100*time.Millisecond},
		{name: "burst 1 still allows one start per interval", interval: 2 * time.Second, burst: 1, starts: 2,
			wantWait: 2*time.Second + 100*time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
			p := startPacer{clock: clk}
			ctx := context.Background()
			for i := 0; i < tc.starts-1; i++ {
				if err := p.wait(ctx, tc.interval, tc.burst); err != nil {
					t.Fatal(err)
				}
				p.record()
			}
			begin := clk.Now()
			stop := poll.Drive(t, clk, 100*time.Millisecond)
			done := make(chan error, 1)
			go func() { done <- p.wait(ctx, tc.interval, tc.burst) }()
			var err error
			poll.Until(t, "the last start's wait to end", func() bool {
				select {
				case err = <-done:
					return true
				default:
					return false
				}
			})
			stop()
			if err != nil {
				t.Fatal(err)
			}
			if got := clk.Since(begin); got != tc.wantWait {
				t.Fatalf("last start waited %v, want %v", got, tc.wantWait)
			}
		})
	}
}

func TestStartPacerGivesUpWithItsContext(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	p := startPacer{clock: clk}
	p.record()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := p.wait(ctx, time.Minute, 2); err == nil {
		t.Fatal("wait with a cancelled context and no room returned nil")
	}
}
