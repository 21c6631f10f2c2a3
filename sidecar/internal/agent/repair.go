// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"

	"github.com/dkc-dev/dkc/internal/durable"
	"github.com/dkc-dev/dkc/internal/nodeconfig"
	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
	"github.com/dkc-dev/dkc/sidecar/internal/checkpoint"
	"github.com/dkc-dev/dkc/sidecar/internal/kubeletunit"
)

// This file repairs drift when a pool asks (spec.drift.policy: Restore, WatchConfigResponse.drift_repair):
// dkc's wiring of the kubelet (the env file, dkc's drop-in) put back, and the kubelet restarted once into
// its assigned config through the restart path every assignment takes (run: the state reset and admission
// checks, the restart paced and reported as an Event, the health wait and /configz proof, the rollback if
// it does not run). Only the causes nodeconfig.RepairableDrift names: a kubelet flag or a --config-dir
// drop-in is the node owner's, a new kubelet minor an upgrade's.
//
// A request is acted on only when it is for the assignment the kubelet runs (proven), its cause is the
// drift the last check found on what the kubelet runs now, and the node is settled (driftCheckable). Loops
// are impossible by the state file: the repair is recorded there (request, cause, ConfigMap version) before
// anything is touched, and a cause recorded for the node's ConfigMap version is never repaired again for
// it, whichever request asks — the drift found again is reported, its message saying so. A new assignment
// drops the records. A sidecar that stops in the middle of a repair finds it recorded, and makes none again.

// DropInInstaller is a ServiceManager that can put dkc's kubelet drop-in back; implemented by
// systemd.Manager. The long-running sidecar has no mount of the unit directory.
type DropInInstaller interface {
	// InstallFile is `systemd-run --wait --collect --property Type=oneshot` running `/bin/cp -f -T -- SRC
	// DST.dkc-tmp`, `/bin/sync -- DST.dkc-tmp`, `/bin/mv -f -T -- DST.dkc-tmp DST` and `/bin/sync -- DIR`:
	// it returns when they have run, with an error unless all succeeded.
	InstallFile(ctx context.Context, src, dst string) error
	// Reload is `systemctl daemon-reload`.
	Reload(ctx context.Context) error
}

// maxRepairIDs bounds persisted.DriftRepairIDs.
const maxRepairIDs = 32

// repairState is the pool's drift repair request that stands, and what the agent did and said of it.
type repairState struct {
	// src is the assignment the request came with (without one: the one last received); req the request,
	// nil when none stands.
	src *corev1.NodeConfigSource
	req *dkcv1.DriftRepair
	// said is the request id and what was last logged of it: a request that waits is logged once per
	// reason, not at every tick.
	said string
	// restart is the config run restarts the kubelet into although it runs it (the repair's one restart);
	// set for the repair's round only.
	restart *corev1.NodeConfigSource
}

// driftRepairRecord is a repair the sidecar made (or set out to make) for a ConfigMap version.
type driftRepairRecord struct {
	ID              string    `json:"id"`
	Cause           string    `json:"cause"`
	UID             string    `json:"uid"`
	ResourceVersion string    `json:"resourceVersion"`
	Time            time.Time `json:"time"`
	// Result is repairRepaired or repairFailed once the repair ended; "" while it was under way (a sidecar
	// that stopped in it).
	Result string `json:"result,omitempty"`
	// Error is why it failed.
	Error string `json:"error,omitempty"`
}

func (r driftRepairRecord) of(src *corev1.NodeConfigSource) bool {
	return src != nil && src.ConfigMap != nil && string(src.ConfigMap.UID) == r.UID &&
		src.ConfigMap.ResourceVersion == r.ResourceVersion
}

// repairsFor are the records of src's ConfigMap version.
func repairsFor(records []driftRepairRecord, src *corev1.NodeConfigSource) []driftRepairRecord {
	var out []driftRepairRecord
	for _, r := range records {
		if r.of(src) {
			out = append(out, r)
		}
	}
	return out
}

// dropRepairs drops from s the records of other ConfigMap versions than src's, keeping their request ids
// (the last maxRepairIDs); it reports a change.
func dropRepairs(s *persisted, src *corev1.NodeConfigSource) bool {
	kept := repairsFor(s.DriftRepairs, src)
	if len(kept) == len(s.DriftRepairs) {
		return false
	}
	ids := slices.Clone(s.DriftRepairIDs)
	for _, r := range s.DriftRepairs {
		if !r.of(src) && !slices.Contains(ids, r.ID) {
			ids = append(ids, r.ID)
		}
	}
	if len(ids) > maxRepairIDs {
		ids = ids[len(ids)-maxRepairIDs:]
	}
	s.DriftRepairs, s.DriftRepairIDs = kept, ids
	return true
}

// repairOf is the record of a repair of cause for src's ConfigMap version; nil if none.
func (f *stateFile) repairOf(cause string, src *corev1.NodeConfigSource) *driftRepairRecord {
	for i, r := range f.s.DriftRepairs {
		if r.Cause == cause && r.of(src) {
			return &f.s.DriftRepairs[i]
		}
	}
	return nil
}

// repairedID says whether request id was acted on.
func (f *stateFile) repairedID(id string) bool {
	return slices.Contains(f.s.DriftRepairIDs, id) ||
		slices.ContainsFunc(f.s.DriftRepairs, func(r driftRepairRecord) bool { return r.ID == id })
}

// recordRepair durably records rec, dropping the records of other ConfigMap versions. The state in memory
// changes only once it is on disk; on error nothing changed.
func (f *stateFile) recordRepair(rec driftRepairRecord, src *corev1.NodeConfigSource) error {
	next := f.s
	dropRepairs(&next, src)
	next.DriftRepairs = append(slices.Clone(next.DriftRepairs), rec)
	if err := saveState(f.path, next); err != nil {
		return err
	}
	f.s = next
	return nil
}

// finishRepair records how repair id ended.
func (f *stateFile) finishRepair(id, result string, err error) error {
	next := f.s
	next.DriftRepairs = slices.Clone(f.s.DriftRepairs)
	for i := range next.DriftRepairs {
		if next.DriftRepairs[i].ID == id {
			next.DriftRepairs[i].Result = result
			if err != nil {
				next.DriftRepairs[i].Error = err.Error()
			}
		}
	}
	if err := saveState(f.path, next); err != nil {
		return err
	}
	f.s = next
	return nil
}

// takeRepair takes the drift repair request an update says: bound to the update's assignment, or without
// one to the assignment last received; nil withdraws it.
func (a *Agent) takeRepair(d Desired) {
	src := a.repair.src
	if d.Assignment != nil {
		src = checkpoint.SourceOf(d.Assignment)
	}
	req := d.DriftRepair
	if req.GetId() == "" || req.GetCause() == "" || src == nil {
		req = nil // names nothing, or no ConfigMap version to repair for
	}
	switch {
	case req != nil && (req.GetId() != a.repair.req.GetId() || !nodeconfig.SameSource(src, a.repair.src)):
		a.log.Info("drift repair requested", append(sourceFields(src), zap.String("node", a.cfg.NodeName),
			zap.String("requestID", req.GetId()), zap.String("cause", req.GetCause()))...)
	case req == nil && a.repair.req != nil:
		a.log.Info("drift repair request withdrawn", zap.String("node", a.cfg.NodeName),
			zap.String("requestID", a.repair.req.GetId()), zap.String("cause", a.repair.req.GetCause()))
	}
	a.repair.src, a.repair.req = src, req
}

// repairDrift acts on the request that stands, if it is due: see the file's comment.
func (a *Agent) repairDrift(ctx context.Context) {
	req := a.repair.req
	if req == nil || ctx.Err() != nil {
		return
	}
	// Settled, and the drift that stands found on what the kubelet runs now (a check is due after each
	// start of it): else the request waits, without a word.
	if !a.driftCheckable() || !a.drift.checked || a.drift.due {
		return
	}
	assigned, err := a.store.Assigned()
	switch {
	case err != nil || assigned == nil || !nodeconfig.SameSource(a.repair.src, assigned):
		a.ignoreRepair(req, "the request is not for the config the node is assigned")
		return
	case !nodeconfig.SameSource(a.active, assigned):
		a.ignoreRepair(req, "the kubelet does not run the node's assigned config")
		return
	case !nodeconfig.RepairableDrift(req.GetCause()):
		a.ignoreRepair(req, "not a cause the sidecar repairs: only dkc's wiring of the kubelet")
		return
	}
	acted := a.state.repairedID(req.GetId())
	if a.drift.current.GetCause() != req.GetCause() {
		if !acted { // acted on: the drift it named is gone, as it should be
			a.ignoreRepair(req, "no drift of this cause stands")
		}
		return
	}
	if rec := a.state.repairOf(req.GetCause(), assigned); rec != nil || acted {
		a.refuseRepair(req, rec)
		return
	}
	a.makeRepair(ctx, req, assigned)
}

// ignoreRepair logs, once per request and reason, that the request is not acted on now.
func (a *Agent) ignoreRepair(req *dkcv1.DriftRepair, why string) {
	if !a.sayOnce(req, why) {
		return
	}
	a.log.Info("drift repair request ignored", append(sourceFields(a.repair.src), zap.String("node", a.cfg.NodeName),
		zap.String("requestID", req.GetId()), zap.String("cause", req.GetCause()), zap.String("reason", why),
		zap.String("standingCause", a.drift.current.GetCause()))...)
}

// refuseRepair logs and counts, once per request, that its cause was repaired before for the assignment.
func (a *Agent) refuseRepair(req *dkcv1.DriftRepair, rec *driftRepairRecord) {
	if !a.sayOnce(req, "refused") {
		return
	}
	a.metrics.driftRepaired(repairRefusedRepeat)
	fields := append(sourceFields(a.repair.src), zap.String("node", a.cfg.NodeName), zap.String("requestID", req.GetId()),
		zap.String("cause", req.GetCause()))
	if rec != nil {
		fields = append(fields, zap.String("repairedBy", rec.ID), zap.Time("repairedAt", rec.Time),
			zap.String("repairResult", rec.Result))
	}
	a.log.Warn("drift found again after dkc repaired it; not repairing it again while the node is assigned this config",
		fields...)
}

// sayOnce reports whether what is said of req now (key) differs from what was said last, and remembers it.
func (a *Agent) sayOnce(req *dkcv1.DriftRepair, key string) bool {
	key = req.GetId() + "\x00" + key
	if a.repair.said == key {
		return false
	}
	a.repair.said = key
	return true
}

// repairNote is what a drift of cause adds to its message when that cause was repaired before for the
// node's assignment; "" if it was not.
func (a *Agent) repairNote(cause string) string {
	assigned, err := a.store.Assigned()
	if err != nil {
		return ""
	}
	rec := a.state.repairOf(cause, assigned)
	if rec == nil {
		return ""
	}
	at := rec.Time.UTC().Format(time.RFC3339)
	if rec.Result == repairFailed {
		return fmt.Sprintf("dkc's repair of it at %s failed (%s) and is not made again while the node is assigned "+
			"this config", at, short(rec.Error))
	}
	return fmt.Sprintf("found again after dkc repaired it at %s; not repaired again while the node is assigned this "+
		"config", at)
}

// makeRepair records the repair, puts the wiring back and restarts the kubelet once into assigned, then
// has the drift checked.
func (a *Agent) makeRepair(ctx context.Context, req *dkcv1.DriftRepair, assigned *corev1.NodeConfigSource) {
	log := a.log.With(append(sourceFields(assigned), zap.String("node", a.cfg.NodeName),
		zap.String("requestID", req.GetId()), zap.String("cause", req.GetCause()))...)
	rec := driftRepairRecord{ID: req.GetId(), Cause: req.GetCause(), UID: string(assigned.ConfigMap.UID),
		ResourceVersion: assigned.ConfigMap.ResourceVersion, Time: a.clock.Now().UTC()}
	if err := a.state.recordRepair(rec, assigned); err != nil {
		// Without the record a sidecar restarted in the middle would repair again: nothing is touched, and
		// the next tick tries again.
		if a.sayOnce(req, "unrecorded") {
			log.Error("cannot record the drift repair; not repairing without the record, trying again at the next tick",
				zap.Error(err))
		}
		return
	}
	a.repair.said = ""
	log.Info("repairing kubelet config drift: putting dkc's wiring back, then restarting the kubelet once into "+
		"its assigned config", zap.String("drift", a.drift.current.GetMessage()))
	file := a.configFile(assigned)
	restored, err := a.restoreWiring(ctx, log, file)
	if err == nil {
		before := a.drift.ownStarts
		a.repair.restart = assigned
		a.reconcile(ctx)
		a.repair.restart = nil
		switch {
		case a.drift.ownStarts == before:
			err = fmt.Errorf("the kubelet was not restarted: %s", orNone(a.detail))
		case !a.activeKnown || !nodeconfig.SameSource(a.active, assigned):
			err = fmt.Errorf("the kubelet does not run its assigned config healthy after the restart: %s", orNone(a.detail))
		}
	}
	result := repairRepaired
	if err != nil {
		result = repairFailed
	}
	if serr := a.state.finishRepair(rec.ID, result, err); serr != nil {
		log.Warn("cannot record how the drift repair ended; it stays recorded as made", zap.Error(serr))
	}
	a.metrics.driftRepaired(result)
	if err != nil {
		log.Error("drift repair failed; not made again while the node is assigned this config",
			zap.Strings("files", restored), zap.Error(err))
	} else {
		log.Info("drift repaired: dkc's wiring back, the kubelet restarted healthy into its assigned config",
			zap.Strings("files", restored))
	}
	// What the kubelet runs now is checked at once (the drift should be gone): else at the next tick.
	a.drift.due = true
	a.watchDrift(ctx)
}

func orNone(s string) string {
	if s == "" {
		return "no error reported"
	}
	return s
}

// restoreWiring puts back what the wiring check finds gone or changed, one file at a time: the env file
// (naming file), dkc's drop-in. It returns the files put back. A kubelet that runs another --config than
// the env file names is left to the restart; anything else it cannot put back is an error, and then the
// kubelet must not be restarted (it would not start into its assigned config, and the config be blamed).
func (a *Agent) restoreWiring(ctx context.Context, log *zap.Logger, file string) ([]string, error) {
	var restored []string
	for {
		f, err := a.checkWiring(ctx, file)
		if err != nil {
			return restored, fmt.Errorf("check dkc's wiring of the kubelet: %w", err)
		}
		if f == nil || len(f.files) == 0 {
			return restored, nil
		}
		path := f.files[0]
		switch {
		case slices.Contains(restored, path):
			return restored, fmt.Errorf("put back %s, and still: %s", path, f.message)
		case path == a.env.Path:
			if err := a.env.Set(file); err != nil {
				return restored, fmt.Errorf("write the kubelet env file: %w", err)
			}
		case path != "" && path == a.cfg.KubeletDropIn:
			if err := a.restoreDropIn(ctx); err != nil {
				return restored, err
			}
		default:
			return restored, fmt.Errorf("cannot put back %q: %s", path, f.message)
		}
		restored = append(restored, path)
		log.Info("put back dkc's wiring of the kubelet", zap.String("file", path))
	}
}

// restoreDropIn puts dkc's drop-in back (Config.KubeletDropIn), with the content computed here for this
// node's dynamic config dir, and has systemd read it.
func (a *Agent) restoreDropIn(ctx context.Context) error {
	inst, ok := a.svc.(DropInInstaller)
	if !ok {
		return errors.New("this restart mode cannot install dkc's kubelet drop-in (only systemd's can)")
	}
	src := filepath.Join(a.store.Dir(), kubeletunit.DropInCopyName)
	if err := durable.WriteFile(src, []byte(kubeletunit.DropIn(a.store.Dir())), 0o644); err != nil {
		return fmt.Errorf("write the drop-in's copy: %w", err)
	}
	if err := inst.InstallFile(ctx, src, a.cfg.KubeletDropIn); err != nil {
		return fmt.Errorf("put back the kubelet drop-in: %w", err)
	}
	if err := inst.Reload(ctx); err != nil {
		return fmt.Errorf("put back the kubelet drop-in: %w", err)
	}
	return nil
}
