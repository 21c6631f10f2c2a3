// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"github.com/dkc-dev/dkc/internal/nodeconfig"
	"github.com/dkc-dev/dkc/internal/nodeconfig/wire"
	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
)

// Status is the node's current config status.
func (a *Agent) Status() (*dkcv1.NodeConfigStatus, string) {
	assigned, _ := a.store.Assigned()
	lkg, _ := a.store.LastKnownGood()
	errText, detail := statusError(a.syncError, a.localSyncError, a.localSyncWhy, a.configError, a.detail)
	// Not proven yet by this process, a.active is the last proven config (Init), never a default of local.
	active := a.active
	return &dkcv1.NodeConfigStatus{
		Assigned:      wire.SourceFromCore(assigned),
		Active:        wire.SourceFromCore(active),
		LastKnownGood: wire.SourceFromCore(lkg),
		Error:         string(errText),
	}, nodeconfig.TruncateDetail(detail)
}

func (a *Agent) report() {
	st, detail := a.Status()
	a.metrics.set(st)
	if !a.activeRecorded && len(a.pendingRestarts) == 0 && st.GetError() == "" {
		// Nothing ever proved what the kubelet runs (a sidecar upgraded from a version that kept no record,
		// with the kubelet stopped or its flags unknown): the service writes an absent active as local, which
		// may be false. Report nothing until it is known; the Node keeps what it showed. An error is reported
		// all the same (active then shows local): the operator must see why the node is stuck.
		a.log.Debug("not reporting status until the kubelet's active config is known")
		return
	}
	if a.reporter != nil {
		if len(a.pendingRestarts) == 0 {
			a.reporter.Report(st, detail, a.preview.result, a.driftReport(), nil)
		}
		for _, r := range a.pendingRestarts {
			a.reporter.Report(st, detail, a.preview.result, a.driftReport(), r)
		}
	}
	a.pendingRestarts = nil // the reporter owns them now, until acknowledged
}
