// SPDX-License-Identifier: Apache-2.0

// The per-node state: what this replica holds about one node between its reports and its writes.

package nodestatus

import (
	"time"

	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
)

// nodeState is what the writer holds about one node, under Writer.mu. Its parts live apart: the report and
// the last write go together (a report dropped — its Node gone, the node served elsewhere — takes the last
// write with it: a later report is written afresh), while the queued Events outlive both, because an
// acknowledged restart is this replica's promise whichever replica writes the node's status now.
type nodeState struct {
	// report is the latest report accepted (nil: none, or dropped). A new report replaces the pointer; a
	// write marks its own report paid in place, so a check made on one report (dropIfGone) can tell by
	// identity whether a newer one came meanwhile.
	report *report
	// written is what this replica last patched onto the node's Node (nil: nothing since the report
	// was last dropped).
	written *lastWrite
	// events are the kubelet restarts of reports acknowledged as queued whose Event is not created yet:
	// the queue creates them, oldest first, before it writes the node's status.
	events []queuedEvent
	// recorded are the restarts whose Events this replica created, or found created, within eventGiveUp,
	// oldest first: a restart sent again (a sidecar confirming one acknowledged as queued, a retried
	// report) is acknowledged as recorded without asking the apiserver again. They live as long as the
	// state does, and do not keep it.
	recorded []recordedEvent
}

// recordedEvent is a restart whose Event exists, and when this replica learnt it.
type recordedEvent struct {
	id string
	at time.Time
}

// maxRecordedEvents bounds the recorded restarts kept per node: a sidecar confirms its restarts in
// order, seconds to minutes after each, so only the last few can come again.
const maxRecordedEvents = 8

// accept makes r the node's latest report, unless it is older than the one held (false: r is stale). A
// restart in progress is held from the first report of it: a node whose restarts keep being replaced by
// newer assignments still shows one after RestartingDelay.
func (s *nodeState) accept(r *report, now time.Time) bool {
	prev := s.report
	if prev != nil && r.order.before(prev.order) {
		return false
	}
	if restarting(r.status) {
		r.restarting = now
		if prev != nil && !prev.restarting.IsZero() {
			r.restarting = prev.restarting
		}
	}
	s.report = r
	return true
}

// paid records that report seq is on the Node (or needs no write), if it is still the latest.
func (s *nodeState) paid(seq uint64) {
	if s.report != nil && s.report.seq == seq {
		s.report.owed = false
	}
}

// dropReport forgets the report and what was written for it; queued Events stay.
func (s *nodeState) dropReport() {
	s.report, s.written = nil, nil
}

// addEvent queues restart rs's Event, unless the restart is queued already (a re-sent report); past
// maxPendingEvents the oldest goes, and is returned.
func (s *nodeState) addEvent(rs *dkcv1.KubeletRestart, now time.Time) (dropped *dkcv1.KubeletRestart) {
	for _, p := range s.events {
		if p.restart.GetId() == rs.GetId() {
			return nil
		}
	}
	if len(s.events) == maxPendingEvents {
		dropped, s.events = s.events[0].restart, s.events[1:]
	}
	s.events = append(s.events, queuedEvent{restart: rs, since: now})
	return dropped
}

// eventCreated removes restart rs from the head of the queued Events, if it is still there.
func (s *nodeState) eventCreated(rs *dkcv1.KubeletRestart) {
	if len(s.events) > 0 && s.events[0].restart == rs {
		s.events = s.events[1:]
	}
	if len(s.events) == 0 {
		s.events = nil
	}
}

// eventRecorded says whether restart id's Event was recorded by this replica within eventGiveUp.
func (s *nodeState) eventRecorded(id string, now time.Time) bool {
	for _, r := range s.recorded {
		if r.id == id && now.Sub(r.at) <= eventGiveUp {
			return true
		}
	}
	return false
}

// noteRecorded records that restart id's Event exists, forgetting what is older than eventGiveUp and,
// past maxRecordedEvents, the oldest.
func (s *nodeState) noteRecorded(id string, now time.Time) {
	kept := make([]recordedEvent, 0, min(len(s.recorded)+1, maxRecordedEvents))
	for _, r := range s.recorded {
		if r.id != id && now.Sub(r.at) <= eventGiveUp {
			kept = append(kept, r)
		}
	}
	if len(kept) == maxRecordedEvents {
		kept = kept[1:]
	}
	kept = append(kept, recordedEvent{id: id, at: now})
	s.recorded = kept
}

// empty says whether nothing is held: the entry can go.
func (s *nodeState) empty() bool {
	return s.report == nil && s.written == nil && len(s.events) == 0
}

// stateLocked is the node's state, made if missing; w.mu is held.
func (w *Writer) stateLocked(node string) *nodeState {
	s := w.state[node]
	if s == nil {
		s = &nodeState{}
		w.state[node] = s
	}
	return s
}

// latestLocked is the node's latest report, nil if none; w.mu is held.
func (w *Writer) latestLocked(node string) *report {
	if s := w.state[node]; s != nil {
		return s.report
	}
	return nil
}

// tidyLocked removes the node's state once it holds nothing; w.mu is held.
func (w *Writer) tidyLocked(node string) {
	if s := w.state[node]; s != nil && s.empty() {
		delete(w.state, node)
	}
}
