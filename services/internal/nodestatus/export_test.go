// SPDX-License-Identifier: Apache-2.0

package nodestatus

import (
	"context"

	"k8s.io/client-go/util/workqueue"
)

// What protocol_test.go (package nodestatus_test, which also links the rpc service) needs to run a Writer
// one step at a time.

// NewPendingFrom is a Pending over q: the protocol test's queue, whose delays run when the test says.
func NewPendingFrom(q workqueue.TypedRateLimitingInterface[string]) *Pending {
	return &Pending{queue: q}
}

// ProcessNext is one step of a queue worker (Run's workers loop on it).
func (w *Writer) ProcessNext(ctx context.Context) bool { return w.processNext(ctx) }

// TakeInlineWrite takes one of the MaxInlineWrites tokens, as a report whose write is in flight does, and
// returns its release; false when all are taken or there is no bound.
func (w *Writer) TakeInlineWrite() (release func(), ok bool) {
	if w.inline == nil || !w.acquireInline() {
		return nil, false
	}
	return w.releaseInline, true
}
