// SPDX-License-Identifier: Apache-2.0

// Reports: how a node's reports are ordered, held while a restart is in progress, and accepted —
// written inline or queued (docs/design.md, "What a status acknowledgement means").

package nodestatus

import (
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/dkc-dev/dkc/internal/nodeconfig/wire"
	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
)

// report is the latest status a node's sidecar reported.
type report struct {
	status  *dkcv1.NodeConfigStatus
	message string
	order   reportOrder
	// restarting is when the node's reports began to say "assigned, not yet running" (restarting); zero
	// while they do not.
	restarting time.Time
	// nodeUID is the Node object the status is about ("" if the sidecar did not say): it is written onto
	// that object only, never onto a Node registered again under the name.
	nodeUID string
	// seq numbers the reports this replica accepted, so that a write can tell whether the report it wrote
	// is still the latest.
	seq uint64
	// preview is the node's answer to a pool's preview, if the report carried one. It is written (the
	// ConfigPreview condition) only while it answers the node's current preview (desired).
	preview *dkcv1.PreviewResult
	// drift is what the sidecar's last check found the kubelet running differently (nil: nothing, or no
	// check yet, or an older sidecar), written as the ConfigDrift condition.
	drift *dkcv1.Drift
	// owed: the report was acknowledged as queued (the inline writes were all taken) and is not on the
	// Node yet (tests read it; the queue writes it only while the node streams here, see processNext).
	owed bool
}

// restarting says whether a reported status is a restart in progress: a config assigned and not yet
// running, with no error. Its outcome (running, or an error and the rollback) follows within seconds.
func restarting(st *dkcv1.NodeConfigStatus) bool {
	return st.GetError() == "" && !wire.SameSource(st.GetAssigned(), st.GetActive())
}

// reportOrder places a report among its node's reports: by the sidecar's incarnation and sequence, which
// the node's clock cannot upset; by observed time only between reports of sidecars that send no
// incarnation (older versions).
type reportOrder struct {
	incarnation, sequence uint64
	observed              time.Time
}

// before says whether o is older than p. Reports of an up- or downgraded sidecar (one numbered, one not)
// cannot be compared: the newcomer is taken as news.
func (o reportOrder) before(p reportOrder) bool {
	switch {
	case o.incarnation != 0 && p.incarnation != 0:
		return o.incarnation < p.incarnation || (o.incarnation == p.incarnation && o.sequence < p.sequence)
	case o.incarnation == 0 && p.incarnation == 0:
		return o.observed.Before(p.observed)
	default:
		return false
	}
}

// Report accepts a node's status report: it records the kubelet restart's Event, if any, and writes the
// node's status before returning, so that an acknowledged report is on the Node (the sidecar retries until
// acknowledged) — except a restart in progress, which is held for RestartingDelay (Config), a report of a
// Node not in the cache yet, and a report that finds MaxInlineWrites writes in flight: these are queued
// (docs/design.md, "What a status acknowledgement means"). A report older than the last accepted one is
// ignored.
//
// A held status is written when the delay has passed only if the node still streams from this replica
// (Config.Serving); a node that moved meanwhile is served by the other replica, which its sidecar re-sends
// the report to. A replica that has not yet seen a half-dead stream end (keepalive) can still write the
// held status after the other wrote a newer one, until the node's next report corrects it.
func (w *Writer) Report(ctx context.Context, node string, req *dkcv1.ReportStatusRequest) (Receipt, error) {
	order := reportOrder{incarnation: req.GetIncarnation(), sequence: req.GetSequence(),
		observed: req.GetObservedTime().AsTime()}
	if req.GetObservedTime() == nil {
		order.observed = w.clock.Now()
	}
	r := report{status: req.GetStatus(), message: req.GetMessage(), order: order, nodeUID: req.GetNodeUid(),
		preview: req.GetPreview(), drift: req.GetDrift()}
	if res := r.preview; res != nil {
		if st, _, _ := w.table.Get(node); !answers(res, st.Preview) {
			w.log.Debug("preview result does not answer the node's current preview; not written",
				zap.String("node", node), zap.String("pool", res.GetPool()), zap.String("revision", res.GetRevision()),
				zap.Time("requestTime", res.GetRequestTime().AsTime()), zap.String("previewPool", st.Preview.GetPool()),
				zap.String("previewRevision", st.Preview.GetRevision()))
		}
	}
	// Past MaxInlineWrites the report is queued instead, unless this replica's cache lacks the Node: only
	// the inline path can refuse a report of a Node that does not exist (ErrNodeGone), and such reports
	// are rare.
	acquired := w.acquireInline()
	if acquired && w.inline != nil {
		defer w.releaseInline()
	}
	// A replica shutting down writes inline: its queue may not get to a report acknowledged now.
	inline := acquired || w.draining.Load()
	if !inline {
		if _, err := w.nodes.Get(node); err != nil {
			inline = true
		}
	}
	w.mu.Lock()
	if !w.stateLocked(node).accept(&r, w.clock.Now()) {
		w.mu.Unlock()
		return Receipt{}, ErrStale
	}
	w.seq++
	r.seq, r.owed = w.seq, !inline
	if !inline {
		eventQueued := w.queueEventLocked(node, req.GetRestart())
		w.mu.Unlock()
		// Acknowledged as queued: the queue coalesces the node's reports into one write of the latest.
		w.queue.Add(node)
		w.metrics.write("queued")
		return Receipt{EventQueued: eventQueued}, nil
	}
	w.mu.Unlock()
	eventErr := w.inlineEvent(ctx, node, req.GetRestart())
	out, err := w.write(ctx, node)
	if err != nil {
		return Receipt{}, err
	}
	return w.receipt(node, out, eventErr)
}

// queueEventLocked queues restart rs's Event, if any, with its report; false when there is none or this
// replica recorded its Event already (the sidecar confirming it): acknowledged as recorded, the sidecar
// then stops carrying it. w.mu is held.
func (w *Writer) queueEventLocked(node string, rs *dkcv1.KubeletRestart) bool {
	if rs == nil || w.state[node].eventRecorded(rs.GetId(), w.clock.Now()) {
		return false
	}
	w.addEventLocked(node, rs)
	return true
}

// inlineEvent creates restart r's Event, if any, before its report is written inline; an error is a
// transient failure the sidecar's retry of the report is to repeat.
func (w *Writer) inlineEvent(ctx context.Context, node string, r *dkcv1.KubeletRestart) error {
	if r == nil {
		return nil
	}
	// A refused Event (quota, admission policy) would be refused again on every retry, and the sidecar
	// retries the whole report: failing here would freeze the node's status for good. The Event is news,
	// the status is the record, so the status wins (as in the original, which logged and went on). A
	// transient failure (timeout, 429, 5xx, connection) is retried, as the original's recorder did: the
	// status is written first, then the report fails so that the sidecar sends it again (the Event's name
	// is the restart's id, so a retry creates it once).
	err := w.recordRestart(ctx, node, r)
	if err == nil {
		return nil
	}
	w.metrics.event("error")
	if eventRefused(err) {
		w.log.Warn("kubelet restart event refused; dropping it", zap.String("node", node),
			zap.String("restartID", r.GetId()), zap.String("reason", string(apierrors.ReasonForError(err))), zap.Error(err))
		return nil
	}
	return err
}

// receipt is what an inline write's outcome, and its Event's transient failure, tell the sidecar.
func (w *Writer) receipt(node string, out outcome, eventErr error) (Receipt, error) {
	switch out {
	case noReport, nodeGone:
		return Receipt{}, ErrNodeGone // not kept: the Node was found gone (now, or meanwhile)
	case otherNode:
		if eventErr != nil {
			// The restart happened whatever object the report names; its Event is still owed. Acknowledged
			// as ErrOtherNode, the report would leave the sidecar with the Event never created (found by
			// TestProtocolAgainstTheService). Sent again, the report is dropped again and the Event retried.
			return Receipt{}, fmt.Errorf("%w (report about a deleted Node object dropped; send it again for its event)",
				eventErr)
		}
		return Receipt{}, ErrOtherNode
	}
	if eventErr != nil {
		return Receipt{}, fmt.Errorf("%w (status written or queued; send the report again for its event)", eventErr)
	}
	if out == notCached {
		// Acknowledged: the report is kept and written from the queue once this replica's cache has the Node.
		w.queue.AddRateLimited(node)
	}
	// written, unchanged, notCached (queued), held (written from the queue unless its outcome comes first).
	return Receipt{}, nil
}

// acquireInline takes one of the MaxInlineWrites tokens without waiting; always true without a bound.
func (w *Writer) acquireInline() bool {
	if w.inline == nil {
		return true
	}
	select {
	case w.inline <- struct{}{}:
		return true
	default:
		return false
	}
}

// releaseInline gives back a token taken by acquireInline.
func (w *Writer) releaseInline() { <-w.inline }

// owed says whether the node's latest report was acknowledged as queued and is not written yet.
func (w *Writer) owed(node string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	r := w.latestLocked(node)
	return r != nil && r.owed
}

// paid records that report seq of the node is on the Node (or needs no write).
func (w *Writer) paid(node string, seq uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if s := w.state[node]; s != nil {
		s.paid(seq)
	}
}

// Desired is the status the node should carry: the reported one, with the service's sync error in place of
// the reported error while there is one. ok is false when the node has not reported to this replica.
func (w *Writer) Desired(node string) (status *corev1.NodeConfigStatus, message string, ok bool) {
	d, ok := w.desired(node)
	return d.status, d.message, ok
}

// want is what a node's Node should show, from its latest report.
type want struct {
	status  *corev1.NodeConfigStatus
	message string
	// preview is the ConfigPreview condition to write (nil: none, the report answers no preview or not the
	// node's current one).
	preview *corev1.NodeCondition
	// drift is the report's drift finding (nil: none).
	drift *dkcv1.Drift
	// hold is how much longer the status waits for its restart's outcome (0: none).
	hold time.Duration
	// nodeUID is the Node object it is about ("": any); seq the report's number.
	nodeUID string
	seq     uint64
}

// desired is Desired with the rest of what the write needs; ok is false when the node has not reported to
// this replica.
func (w *Writer) desired(node string) (d want, ok bool) {
	w.mu.Lock()
	r := w.latestLocked(node)
	var cp report
	if r != nil {
		cp = *r // paid may mark it meanwhile
	}
	w.mu.Unlock()
	if r == nil {
		return want{}, false
	}
	r = &cp
	d = want{status: wire.StatusToCore(r.status), message: r.message, drift: r.drift, nodeUID: r.nodeUID, seq: r.seq}
	st, known, _ := w.table.Get(node)
	if known && st.SyncError != "" {
		d.status.Error = st.SyncError
		d.message = ""
	}
	// Matched at each write, not only when reported: an answer that reaches this replica before the
	// preview does (the pool's status on a lagging watch) is written once the preview is here.
	if known && answers(r.preview, st.Preview) {
		c := PreviewCondition(r.preview)
		d.preview = &c
	}
	if !r.restarting.IsZero() && d.status.Error == "" && w.restartDelay > 0 {
		d.hold = max(0, w.restartDelay-w.clock.Since(r.restarting))
	}
	return d, true
}
