// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"errors"
	"fmt"

	"go.uber.org/zap"

	"github.com/dkc-dev/dkc/internal/nodeconfig"
	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
	"github.com/dkc-dev/dkc/sidecar/internal/checkpoint"
)

func (a *Agent) assign(ctx context.Context, as *dkcv1.Assignment) {
	assigned, err := a.store.Assigned()
	if err != nil {
		a.log.Error("read assigned record", zap.Error(err))
		assigned = nil
	}
	src := checkpoint.SourceOf(as)
	if a.cfg.Trace != nil {
		a.cfg.Trace(TraceReceived, src)
	}
	if src == nil {
		// Reset: the local config is always assumed good, so last-known-good is forgotten at once (as the
		// original's store.Reset).
		lkg, _ := a.store.LastKnownGood()
		if assigned != nil || lkg != nil {
			a.log.Info("assigned local config (reset)")
		}
		if err := a.store.SetLastKnownGood(nil); err != nil {
			a.failWrite(as, err)
			return
		}
		if err := a.store.SetAssigned(nil); err != nil {
			a.failWrite(as, err)
			return
		}
		if err := a.state.clearAssigned(nil, nil); err != nil {
			a.failWrite(as, fmt.Errorf("forget the trial and failures of the previous assignment: %w", err))
			return
		}
		a.localSyncError = ""
		return
	}
	if err := a.store.Save(as); err != nil {
		if errors.Is(err, checkpoint.ErrRefused) {
			a.fail(nodeconfig.PayloadError, err)
		} else {
			a.failWrite(as, err)
		}
		return
	}
	a.localSyncError = ""
	if nodeconfig.SameSource(src, assigned) && !a.clearPending {
		return
	}
	if err := a.store.SetAssigned(src); err != nil {
		a.failWrite(as, err)
		return
	}
	lkg, err := a.store.LastKnownGood()
	if err != nil {
		// reconcile treats an unreadable last-known-good as local, so it is no fallback whose failures matter.
		a.log.Error("read meta/last-known-good; treating it as local", zap.Error(err))
		lkg = nil
	}
	// A new assignment gets a fresh trial and a fresh chance. If that cannot be recorded, the old
	// failures stay in force (nothing that failed before is restarted into), the node says so, and the
	// retry tick tries again (clearPending: meta/assigned already names it, which alone would end the retry).
	if err := a.state.clearAssigned(src, lkg); err != nil {
		a.clearPending = true
		a.failWrite(as, fmt.Errorf("forget the trial and failures of the previous assignment: %w", err))
		return
	}
	a.clearPending = false
	a.log.Info("checkpointed new assignment", sourceFields(src)...)
	if a.cfg.Trace != nil {
		a.cfg.Trace(TraceCheckpointed, src)
	}
}

// failWrite records that as could not be written to disk and keeps it for the retry tick.
func (a *Agent) failWrite(as *dkcv1.Assignment, err error) {
	a.unsynced = as
	a.fail(nodeconfig.SyncInternalError, err)
}

func (a *Agent) fail(status nodeconfig.StatusError, err error) {
	a.localSyncError, a.localSyncWhy = status, err.Error()
	a.log.Error("sync failed", zap.Stringer("status", status), zap.Error(err))
}
