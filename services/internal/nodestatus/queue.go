// SPDX-License-Identifier: Apache-2.0

// The status queue's loop: workers that write queued reports, retries and held restarts, and the drain
// at shutdown.

package nodestatus

import (
	"context"
	"sync"
	"time"

	"go.uber.org/zap"
)

// Run processes enqueued nodes until ctx ends, then drains: reports that arrive while the server lets its
// calls finish are written inline (Report), and what this replica acknowledged as queued is written once
// more, for up to drain — an acknowledgement as queued must not be lost to a rolling update. What a failed
// write would retry is left to the node's next stream.
func (w *Writer) Run(ctx context.Context, workers int, drain time.Duration) error {
	// The workers' writes outlive ctx by the drain.
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for w.processNext(wctx) {
			}
		}()
	}
	<-ctx.Done()
	w.draining.Store(true)
	w.queue.ShutDown() // Get returns what is queued, then quit
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-w.clock.After(drain):
		w.log.Warn("status queue not drained in time; the nodes' next streams bring their reports again",
			zap.Duration("drain", drain), zap.Int("left", w.queue.Len()))
		cancel()
		<-done
	}
	return nil
}

func (w *Writer) processNext(ctx context.Context) bool {
	node, quit := w.queue.Get()
	if quit {
		return false
	}
	defer w.queue.Done(node)
	// Acknowledged restarts get their Events whether or not the node still streams from here. A failed
	// Event keeps the node in the queue with a growing backoff, also when its status is written: forgetting
	// the node there would retry the Event at the base delay for as long as the apiserver refuses it.
	eventErr := w.flushEvents(ctx, node)
	if eventErr != nil {
		w.log.Warn("create kubelet restart event failed; retrying", zap.String("node", node), zap.Error(eventErr))
	}
	settled := func() {
		if eventErr != nil {
			w.queue.AddRateLimited(node)
		} else {
			w.queue.Forget(node)
		}
	}
	// A node that streams from another replica now is that replica's to write, even for a report this one
	// acknowledged as queued: the sidecar sends its latest report again on every new stream, and writing the
	// queued one here could put an older status over the newer one the other replica wrote. Its Events are
	// still this replica's promise.
	// The report is taken before the stream is looked at: one that arrives after the look (its node's
	// new stream here resending it) is not released with the one the look was about.
	w.mu.Lock()
	checked := w.latestLocked(node)
	w.mu.Unlock()
	if w.serving != nil && !w.serving(node) {
		w.release(node, checked)
		settled()
		return true
	}
	switch out, err := w.write(ctx, node); {
	case err != nil:
		w.log.Warn("write node status failed; retrying", zap.String("node", node), zap.Error(err))
		w.queue.AddRateLimited(node)
	case out == notCached:
		w.queue.AddRateLimited(node) // until the cache catches up: not worth a warning
	default:
		// written, unchanged, held (requeued for the hold's end by write), or dropped with its Node.
		settled()
	}
	return true
}
