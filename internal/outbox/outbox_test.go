// SPDX-License-Identifier: Apache-2.0

package outbox

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
)

// TestOutbox drives an outbox through the protocol's steps, each row a script of operations, and checks
// what Next would send after it: "-" for nothing, else "<error>#<sequence>@<node uid>+<restart id>".
//
// Operations: "follow:U" (Follow), "status:E" (Enqueue a status with error E), "restart:E:R" (Enqueue with
// restart R), "send" (Next, remembered as in flight), "ack" (Ack of the report in flight), "queued" (its
// Ack with the restart queued by the service), "hour" (an hour and a second pass), "half" (half an hour
// and a second), "confirm" (Confirm, as the sidecar's reporter does when NextConfirm comes), "wait:S" (S
// seconds pass), "reconnect".
func TestOutbox(t *testing.T) {
	for _, tc := range []struct {
		name   string
		script string
		want   string
	}{
		{"nothing enqueued", "", "-"},
		{"a status is sent", "status:a", "a#1@"},
		{"acknowledged, nothing more", "status:a send ack", "-"},
		{"a newer status replaces one not sent", "status:a status:b", "b#2@"},
		{"a status enqueued while one is in flight stays after its ack", "status:a send status:b ack", "b#2@"},
		{"the last acknowledged is re-sent after a reconnect, same number", "status:a send ack reconnect", "a#1@"},
		{"a pending one is not replaced by a reconnect", "status:a send ack status:b reconnect", "b#2@"},
		{"nothing was ever acknowledged: a reconnect sends nothing", "reconnect", "-"},
		{"a restart rides on the status", "restart:a:r1", "a#1@+r1"},
		{"restarts go one per report, oldest first, on the latest status", "restart:a:r1 restart:b:r2 send ack", "b#2@+r2"},
		{"the status stays pending until the last restart is acknowledged", "restart:a:r1 restart:a:r2 send ack send ack", "-"},
		{"an ack of an older report leaves the restart it did not carry", "restart:a:r1 send restart:b:r2 ack", "b#2@+r2"},
		{"reports name the Node object followed when they were made", "follow:u1 status:a follow:u2", "a#1@u1"},
		{"re-sent after a reconnect, still the object it was made for", "follow:u1 status:a send ack follow:u2 reconnect", "a#1@u1"},
		{"the same content about another object is sent after the first's ack",
			"follow:u1 status:x send follow:u2 status:x ack", "x#2@u2"},
		{"a lost ack: the report is sent again", "status:a send send", "a#1@"},
		{"a stream opened while a report was in flight: sent again after its ack", "status:a send reconnect ack", "a#1@"},
		{"... unless it was sent again over the new stream", "status:a send reconnect send ack", "-"},
		{"a stream opened before the report was handed out: no resend", "status:a reconnect send ack", "-"},
		{"a restart the service queued is done with for this stream", "restart:a:r1 send queued", "-"},
		{"... and rides again on the next stream", "restart:a:r1 send queued reconnect", "a#1@+r1"},
		{"... until acknowledged as created", "restart:a:r1 send queued reconnect send ack", "-"},
		{"... or queued again, then again on the stream after", "restart:a:r1 send queued reconnect send queued reconnect", "a#1@+r1"},
		{"parked restarts go before those not yet sent", "restart:a:r1 send queued restart:b:r2 reconnect", "b#2@+r1"},
		{"... then the newer one", "restart:a:r1 send queued restart:b:r2 reconnect send ack", "b#2@+r2"},
		{"queued by a replica whose stream ended meanwhile: sent again at once", "restart:a:r1 send reconnect queued", "a#1@+r1"},
		{"a restart parked for over an hour is not sent again", "restart:a:r1 send queued hour reconnect", "a#1@"},
		{"... counted from its first parking, also when queued again meanwhile",
			"restart:a:r1 send queued half reconnect send queued half reconnect", "a#1@"},
		{"a parked restart is not confirmed before ConfirmAfter", "restart:a:r1 send queued wait:4 confirm", "-"},
		{"... then it rides again on the same stream", "restart:a:r1 send queued wait:5 confirm", "a#1@+r1"},
		{"... until acknowledged as recorded", "restart:a:r1 send queued wait:5 confirm send ack wait:3600 confirm reconnect",
			"a#1@"},
		{"queued still: the next round waits as long as it has been parked, ConfirmAfter at the least",
			"restart:a:r1 send queued wait:5 confirm send queued wait:4 confirm", "-"},
		{"... twice as long the round after",
			"restart:a:r1 send queued wait:5 confirm send queued wait:5 confirm send queued wait:9 confirm", "-"},
		{"... and then it rides again",
			"restart:a:r1 send queued wait:5 confirm send queued wait:5 confirm send queued wait:10 confirm", "a#1@+r1"},
		{"a confirmation rides on a status not yet sent", "restart:a:r1 send queued status:b wait:5 confirm", "b#2@+r1"},
		{"a confirmation leaves restarts parked later for their own time",
			"restart:a:r1 send queued wait:3 restart:b:r2 send queued wait:2 confirm send ack", "-"},
		{"... which then come", "restart:a:r1 send queued wait:3 restart:b:r2 send queued wait:2 confirm send ack wait:3 confirm",
			"b#2@+r2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clocktesting.NewFakePassiveClock(time.Unix(1000, 0))
			o := New(Config{Node: "n1", Incarnation: 7, Clock: clk})
			var inFlight *dkcv1.ReportStatusRequest
			for _, op := range strings.Fields(tc.script) {
				f := strings.Split(op, ":")
				switch f[0] {
				case "follow":
					o.Follow(f[1])
				case "status":
					o.Enqueue(&dkcv1.NodeConfigStatus{Error: f[1]}, "", nil)
				case "restart":
					o.Enqueue(&dkcv1.NodeConfigStatus{Error: f[1]}, "", &dkcv1.KubeletRestart{Id: f[2]})
				case "send":
					inFlight = o.Next()
				case "ack":
					o.Ack(inFlight, false)
				case "queued":
					o.Ack(inFlight, true)
				case "hour":
					clk.SetTime(clk.Now().Add(ParkedRestartTTL + time.Second))
				case "half":
					clk.SetTime(clk.Now().Add(ParkedRestartTTL/2 + time.Second))
				case "wait":
					secs, err := strconv.Atoi(f[1])
					if err != nil {
						t.Fatal(err)
					}
					clk.SetTime(clk.Now().Add(time.Duration(secs) * time.Second))
				case "confirm":
					o.Confirm()
				case "reconnect":
					o.Reconnected()
				default:
					t.Fatalf("unknown operation %q", op)
				}
			}
			got := "-"
			if r := o.Next(); r != nil {
				got = fmt.Sprintf("%s#%d@%s", r.GetStatus().GetError(), r.GetSequence(), r.GetNodeUid())
				if id := r.GetRestart().GetId(); id != "" {
					got += "+" + id
				}
				if r.GetIncarnation() != 7 || r.GetNodeName() != "n1" {
					t.Errorf("report of node %q incarnation %d, want n1 and 7", r.GetNodeName(), r.GetIncarnation())
				}
			}
			if got != tc.want {
				t.Errorf("after %q Next is %s, want %s", tc.script, got, tc.want)
			}
			if o.Pending() != (got != "-") {
				t.Errorf("Pending() = %v with Next %s", o.Pending(), got)
			}
			// firstParked only remembers restarts still kept.
			kept := map[*dkcv1.KubeletRestart]bool{}
			for _, r := range o.restarts {
				kept[r] = true
			}
			for _, p := range o.parked {
				kept[p.restart] = true
			}
			for r := range o.firstParked {
				if !kept[r] {
					t.Errorf("firstParked remembers restart %s, which is no longer kept", r.GetId())
				}
			}
		})
	}
}

// TestOutboxResendIsFresh: a report re-sent after a reconnect carries a new observed time (older replicas
// order by it), and Next hands out copies: what the caller does with one does not change the outbox.
func TestOutboxResendIsFresh(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Unix(1000, 0))
	o := New(Config{Node: "n1", Clock: clk})
	o.Enqueue(&dkcv1.NodeConfigStatus{Error: "a"}, "", nil)
	r := o.Next()
	r.Sequence = 99
	o.Ack(o.Next(), false)
	clk.SetTime(time.Unix(2000, 0))
	o.Reconnected()
	again := o.Next()
	if again.GetSequence() != 1 {
		t.Errorf("re-sent report has sequence %d, want 1", again.GetSequence())
	}
	if got := again.GetObservedTime().AsTime().Unix(); got != 2000 {
		t.Errorf("re-sent report observed at %d, want 2000 (the reconnect)", got)
	}
}
