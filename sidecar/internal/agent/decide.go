// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"errors"

	corev1 "k8s.io/api/core/v1"

	"github.com/dkc-dev/dkc/internal/configcheck"
	"github.com/dkc-dev/dkc/internal/nodeconfig"
	"github.com/dkc-dev/dkc/sidecar/internal/probe"
)

// This file holds the rollback rules (docs/design.md, "The rollback rules") as pure functions: what a
// reconcile does next is decided from the saved state and what the round learned so far, never from how an
// error was wrapped. reconcile.go carries the decisions out; decide_test.go holds the rules as a table.

// Phase is where the node stands in the rollback rules. It is saved in the state file, logged when it
// changes, and exported as the dkc_sidecar_phase metric.
type Phase string

const (
	// PhaseUnknown: this process has not decided yet, and the state file recorded no phase (an older
	// sidecar's, or none).
	PhaseUnknown Phase = "Unknown"
	// PhaseWaitingForKubeletVersion: this process cannot check configs before the service sends the node
	// kubelet's version (the checker runs that minor's code), so it leaves the kubelet alone until then.
	// Unlike the others it is not saved: the kubelet still runs what the saved phase says, and a sidecar
	// restarted meanwhile waits again anyway (a remembered version may be stale).
	PhaseWaitingForKubeletVersion Phase = "WaitingForKubeletVersion"
	// PhaseLocal: nothing is assigned; the kubelet runs the node's local config.
	PhaseLocal Phase = "Local"
	// PhaseTrial: the kubelet runs the assigned config, not yet last-known-good.
	PhaseTrial Phase = "Trial"
	// PhaseGood: the kubelet runs the assigned config, which is also last-known-good.
	PhaseGood Phase = "Good"
	// PhaseRolledBack: the assigned config is unusable; the kubelet runs last-known-good.
	PhaseRolledBack Phase = "RolledBack"
	// PhaseLocalFallback: the assigned config is unusable and so is last-known-good (or there is none); the
	// kubelet runs the local config.
	PhaseLocalFallback Phase = "LocalFallback"
	// PhaseRetrying: the kubelet could not be brought to the chosen config, or what it runs could not be
	// verified, for reasons that do not blame the config; retried at every trial tick.
	PhaseRetrying Phase = "Retrying"
	// PhaseWaitingForDrain: the kubelet would refuse the chosen config on the state its resource managers
	// checkpointed under the config it runs, and the node is not drained for its assignment: the kubelet is
	// left running what it runs, nothing is blamed, and nothing is retried at the ticks — the next round
	// comes with the service's next word (the node drained for this assignment, or another assignment).
	PhaseWaitingForDrain Phase = "WaitingForDrain"
	// PhaseHeld: no config dkc could choose is safe (the local config does not check, or dkc has no code for
	// this kubelet): the kubelet is left alone.
	PhaseHeld Phase = "Held"
	// PhaseFailed: even the local config did not run healthy; nothing is left to roll back to, and no more
	// restarts are made until something else is assigned.
	PhaseFailed Phase = "Failed"
)

// Phases lists every phase, for the metric.
var Phases = []Phase{PhaseUnknown, PhaseWaitingForKubeletVersion, PhaseLocal, PhaseTrial, PhaseGood, PhaseRolledBack,
	PhaseLocalFallback, PhaseRetrying, PhaseWaitingForDrain, PhaseHeld, PhaseFailed}

// Outcome is what making the kubelet run a config came to. Only OutcomeConfigFault blames the config (it
// is marked failed and rolled back); every other failure is retried with the config unblamed.
type Outcome int

const (
	// OutcomeHealthy: the kubelet runs the config, healthy, and /configz shows it.
	OutcomeHealthy Outcome = iota + 1
	// OutcomeConfigFault: the kubelet, running the config, did not become healthy (or exited at start, or
	// refused /configz with auth settings other than the local config's).
	OutcomeConfigFault
	// OutcomeUnverifiable: the kubelet is healthy but refused or did not answer /configz, with the same auth
	// settings as the local config: what it runs is unknown, and the config is not to blame.
	OutcomeUnverifiable
	// OutcomeTransient: the service manager or the env file failed; nothing is known about the config.
	OutcomeTransient
	// OutcomeStopped: the sidecar is stopping; the next start picks up from what is on disk.
	OutcomeStopped
	// OutcomeNeedsDrain: the kubelet would refuse the config on the state its resource managers checkpointed
	// under the config it runs, or would evict pods under its new eviction thresholds (evict.go), and the
	// node is not drained for its assignment; the kubelet was not touched. The config is not to blame: it
	// may run on a drained node (that state removed).
	OutcomeNeedsDrain
	// OutcomeCannotReset: the kubelet would refuse the config on the state its resource managers checkpointed
	// under the config it runs, and this node's service manager cannot remove that state (--restart-mode=
	// signal); the kubelet was not touched. Final, as a config fault is: no drain or retry would change it
	// (reset.go, cannotReset).
	OutcomeCannotReset
)

func (o Outcome) String() string {
	switch o {
	case OutcomeHealthy:
		return "healthy"
	case OutcomeConfigFault:
		return "config fault"
	case OutcomeUnverifiable:
		return "unverifiable"
	case OutcomeTransient:
		return "transient"
	case OutcomeStopped:
		return "stopped"
	case OutcomeNeedsDrain:
		return "needs drain"
	case OutcomeCannotReset:
		return "cannot reset"
	default:
		return "none"
	}
}

// slot is one of the configs a round may choose, in the order it tries them.
type slot int

const (
	slotAssigned slot = iota
	slotLastKnownGood
	slotLocal
	numSlots
)

func (s slot) String() string {
	return [...]string{"assigned", "last-known-good", "local"}[s]
}

// action is what a round does next.
type action int

const (
	// actCheck: load and validate the slot's config with the kubelet's code; round.checked records it.
	actCheck action = iota + 1
	// actRun: make the kubelet run the slot's config (restarting it only if needed); round.ran records it.
	actRun
	// actMarkFailed: record in the state file that the slot's config failed to run (never tried again
	// until something else is assigned); round.failed records it.
	actMarkFailed
	// actDone: the round is over.
	actDone
)

func (a action) String() string {
	switch a {
	case actCheck:
		return "check"
	case actRun:
		return "run"
	case actMarkFailed:
		return "mark failed"
	case actDone:
		return "done"
	default:
		return "none"
	}
}

// run is what happened when a round ran a slot's config.
type ranResult struct {
	outcome Outcome
	err     error // nil when healthy
}

// round is what one reconcile knows: the saved state it started from, and the checks and runs it made.
type round struct {
	assigned, lkg *corev1.NodeConfigSource
	// failed holds, by slot, why a config failed to run ("" for not failed): the state file's record, and
	// what this round marked. The local config is never marked.
	failed  [numSlots]string
	checked [numSlots]*error // nil: not checked yet; else the check's result
	ran     [numSlots]*ranResult
}

// decision is a round's next step and, once done, its result.
type decision struct {
	action action
	slot   slot
	// status and detail are the node's config error so far (the round's result once done): the assigned
	// config's problem, overridden by a problem of running what was chosen instead.
	status nodeconfig.StatusError
	detail string
	// retry: decide again at the next tick (something not the config's fault stood in the way).
	retry bool
	// activeUnknown: what the kubelet runs is not proven any more (until a round proves it).
	activeUnknown bool
	// phase, once done; "" keeps the current one (stopped).
	phase Phase
	// healthy, once done: the slot's config runs healthy (a trial starts if it is the assigned one).
	healthy bool
}

func (r *round) source(s slot) *corev1.NodeConfigSource {
	switch s {
	case slotAssigned:
		return r.assigned
	case slotLastKnownGood:
		return r.lkg
	default:
		return nil
	}
}

// markFailed records that slot s's config failed to run, in every slot that holds the same config: when
// the assigned config is also last-known-good, rolling back to "last-known-good" would restart the kubelet
// into the config that just failed (a second restart and Event, and a node left on a config marked failed).
func (r *round) markFailed(s slot, why string) {
	failed := r.source(s)
	for x := slotAssigned; x < slotLocal; x++ {
		if src := r.source(x); src != nil && nodeconfig.SameSource(src, failed) {
			r.failed[x] = why
		}
	}
}

// next decides the round's next step: try assigned, then last-known-good, then local; skip a config that
// failed to run before or does not check; run the first usable one; blame it only for a config fault.
func (r *round) next() decision {
	var d decision
	for s := slotAssigned; s < numSlots; s++ {
		if s != slotLocal && r.source(s) == nil {
			continue
		}
		if why := r.failed[s]; why != "" {
			if s == slotAssigned {
				d.status, d.detail = nodeconfig.HealthError, why
			}
			continue
		}
		if r.checked[s] == nil {
			d.action, d.slot = actCheck, s
			return d
		}
		if err := *r.checked[s]; err != nil {
			switch s {
			case slotAssigned:
				d.status, d.detail = statusFor(err), err.Error()
				// The check itself failed (the helper could not run): not the config's fault, so try again.
				d.retry = d.status == nodeconfig.InternalError
			case slotLocal:
				// The node's own config does not check: nothing dkc can pick is safe, so touch nothing.
				switch {
				case errors.Is(err, configcheck.ErrUnsupportedKubelet):
					// Not the local config's fault: dkc has no code for this kubelet and checks nothing;
					// that says more than whatever the assigned config's own error was.
					d.status, d.detail = nodeconfig.UnsupportedKubeletError, err.Error()
				case d.status == "":
					d.status, d.detail = nodeconfig.InternalError, "local config: "+err.Error()
				}
				d.action, d.slot, d.phase = actDone, s, PhaseHeld
				return d
			}
			continue
		}
		ran := r.ran[s]
		if ran == nil {
			d.action, d.slot = actRun, s
			return d
		}
		d.action, d.slot = actDone, s
		switch ran.outcome {
		case OutcomeHealthy:
			d.healthy, d.phase = true, r.running(s)
		case OutcomeConfigFault:
			// The detail (ConfigOK's cause, the saved failure) reads as it always has.
			why := "kubelet not healthy with config: " + ran.err.Error()
			if s == slotLocal {
				// Nothing left to roll back to; no more restarts.
				d.status, d.detail, d.phase = nodeconfig.HealthError, "local config: "+why, PhaseFailed
				return d
			}
			d.action, d.detail = actMarkFailed, why
		case OutcomeUnverifiable:
			d.status, d.detail, d.retry, d.activeUnknown, d.phase =
				nodeconfig.VerifyError, ran.err.Error(), true, true, PhaseRetrying
			if errors.Is(ran.err, probe.ErrNoAnswer) {
				d.status = nodeconfig.VerifyTimeoutError
			}
		case OutcomeTransient:
			d.status, d.detail, d.retry, d.activeUnknown, d.phase =
				nodeconfig.RestartError, ran.err.Error(), true, true, PhaseRetrying
		case OutcomeNeedsDrain:
			// Neither marked failed (it may run once the node is drained) nor retried at the ticks (a retry
			// would find the same state): the service's next message for the node starts the next round. The
			// kubelet was left alone, so what it runs stays as proven — unless this round restarted it into a
			// config before (one that then failed). A fallback that waits for the drain does not hide why the
			// assigned config was given up (it failed, or does not check): that stays the status, the
			// detail says what the fallback waits for.
			d.status, d.detail = fallbackStatus(d, s, nodeconfig.DrainRequiredError, ran.err.Error())
			d.phase = PhaseWaitingForDrain
			d.activeUnknown = r.restartedBefore(s)
		case OutcomeCannotReset:
			if s != slotLocal {
				// The kubelet would refuse it on this node, and nothing here can change that: marked failed
				// and rolled back from, as a config the kubelet does not run.
				d.action, d.detail = actMarkFailed, ran.err.Error()
				return d
			}
			// Nor can the node's own config run: nothing dkc can pick runs, so touch nothing more, as for a
			// local config that does not check.
			if d.status == "" {
				d.status, d.detail = nodeconfig.InternalError, "local config: "+ran.err.Error()
			} else {
				d.status, d.detail = fallbackStatus(d, s, nodeconfig.InternalError, ran.err.Error())
			}
			d.phase = PhaseHeld
			d.activeUnknown = r.restartedBefore(s)
		default: // OutcomeStopped: the status stays what the round found so far
			d.activeUnknown = true
		}
		return d
	}
	panic("unreachable: the local config is always checked, and then held, run, or failed")
}

// restartedBefore says whether the round ran a config before slot s: what the kubelet runs is then not the
// one proven before the round.
func (r *round) restartedBefore(s slot) bool {
	for x := slotAssigned; x < s; x++ {
		if r.ran[x] != nil {
			return true
		}
	}
	return false
}

// fallbackStatus is the status of a round that ends at slot s with own and detail (why it cannot run s's
// config): the assigned config's own problem when it has one (d.status: a pool or the CLI must see that the
// assigned config failed, not what its fallback needs), with detail after its own.
func fallbackStatus(d decision, s slot, own nodeconfig.StatusError, detail string) (nodeconfig.StatusError, string) {
	if d.status == "" || s == slotAssigned {
		return own, detail
	}
	return d.status, d.detail + "; the fallback to the " + s.String() + " config: " + detail
}

// running is the phase of a node whose kubelet runs slot s's config, healthy.
func (r *round) running(s slot) Phase {
	switch {
	case s != slotLocal && r.assigned != nil && nodeconfig.SameSource(r.assigned, r.lkg):
		// Also last-known-good run in its own slot: the assigned config's check failed for no fault of
		// its own (the helper), and the same config ran as the fallback.
		return PhaseGood
	case s == slotAssigned:
		return PhaseTrial
	case s == slotLastKnownGood:
		return PhaseRolledBack
	case r.assigned != nil:
		return PhaseLocalFallback
	default:
		return PhaseLocal
	}
}

// statusError is the node's one config error, by precedence: the service's sync error (the original
// kubelet's "error override"), then a failure to checkpoint here, then what the assigned config came to.
func statusError(sync, localSync nodeconfig.StatusError, localWhy string, config nodeconfig.StatusError,
	detail string) (nodeconfig.StatusError, string) {
	switch {
	case sync != "":
		if localSync != "" {
			return sync, localWhy
		}
		return sync, detail
	case localSync != "":
		return localSync, localWhy
	default:
		return config, detail
	}
}

func statusFor(err error) nodeconfig.StatusError {
	switch {
	case errors.Is(err, configcheck.ErrLoad):
		return nodeconfig.LoadError
	case errors.Is(err, configcheck.ErrValidate):
		return nodeconfig.ValidateError
	case errors.Is(err, configcheck.ErrUnsupportedKubelet):
		return nodeconfig.UnsupportedKubeletError
	default:
		return nodeconfig.InternalError
	}
}
