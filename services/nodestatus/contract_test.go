package nodestatus_test

import (
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/dkc-dev/dkc/services/nodestatus"
	"github.com/dkc-dev/dkc/services/resolve"
	"github.com/dkc-dev/dkc/sidecar/agent"
)

// TestContractStrings pins, as literals, every text of CONTRACT §4 that users, scripts and the original's
// e2e tests match on, against the constants the code writes. Every other test compares with the same
// constants, so this is the one place where changing a constant's text fails: if it fails, the change
// breaks the contract — restore the text instead of updating this test.
func TestContractStrings(t *testing.T) {
	remote := &corev1.NodeConfigSource{ConfigMap: &corev1.ConfigMapNodeConfigSource{
		Namespace: "kube-system", Name: "my-node-config-gkt4c2m4b2", UID: "0d3c6f9e", ResourceVersion: "42", KubeletConfigKey: "kubelet"}}
	for _, tc := range []struct {
		name, got, want string
	}{
		// Status errors: the seed table, written by the sidecar (config) or the service (sync).
		{"load error", agent.LoadError, "failed to load config, see Kubelet log for details"},
		{"validate error", agent.ValidateError, "failed to validate config, see Kubelet log for details"},
		{"all-nil source error", resolve.AllNilSubfieldsError, "invalid NodeConfigSource, exactly one subfield must be non-nil, but all were nil"},
		{"download error", resolve.SyncErrorPrefix + resolve.DownloadError, "failed to sync: failed to download config, see Kubelet log for details"},
		{"sync internal error (sidecar)", agent.SyncInternalError, "failed to sync: internal failure, see Kubelet log for details"},
		{"sync internal error (service)", resolve.SyncErrorPrefix + resolve.InternalError, "failed to sync: internal failure, see Kubelet log for details"},
		{"internal error", agent.InternalError, "internal failure, see Kubelet log for details"},
		// dkc's own texts, documented in the README's status tables: users match on them too.
		{"health error", agent.HealthError, "failed to run kubelet with config, rolled back, see dkc-sidecar log for details"},
		{"payload error", agent.PayloadError, "failed to sync: refused invalid payload, see dkc-sidecar log for details"},
		{"restart error", agent.RestartError, "failed to restart kubelet, will retry, see dkc-sidecar log for details"},
		{"verify error", agent.VerifyError, "failed to verify config, the kubelet refused /configz, will retry, see dkc-sidecar log for details"},
		{"verify timeout error", agent.VerifyTimeoutError, "failed to verify config, the kubelet did not answer /configz, will retry, see dkc-sidecar log for details"},
		{"namespace not allowed", resolve.SyncErrorPrefix + resolve.NamespaceNotAllowedError, "failed to sync: config namespace not allowed, see dkc-server log for details"},
		{"reason using current", nodestatus.ReasonUsingCurrent, "UsingCurrent"},
		{"reason using last-known-good", nodestatus.ReasonUsingLastKnownGood, "UsingLastKnownGood"},
		{"reason sync failed", nodestatus.ReasonSyncFailed, "SyncFailed"},
		{"reason config failed", nodestatus.ReasonConfigFailed, "ConfigFailed"},
		// Events.
		{"event reason", nodestatus.EventReason, "KubeletConfigChanged"},
		{"local event message", nodestatus.EventMessage(nil), "Kubelet restarting to use local config"},
		{"remote event message", nodestatus.EventMessage(remote),
			"Kubelet restarting to use /api/v1/namespaces/kube-system/configmaps/my-node-config-gkt4c2m4b2, UID: 0d3c6f9e, ResourceVersion: 42, KubeletConfigKey: kubelet"},
		{"remote event format", nodestatus.RemoteEventMessageFmt, "Kubelet restarting to use %s, UID: %s, ResourceVersion: %s, KubeletConfigKey: %s"},
		// Where status is written.
		{"condition type", string(nodestatus.ConditionType), "ConfigOK"},
		{"status annotation", nodestatus.StatusAnnotation, "dkc.dev/config-status"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.got != tc.want {
				t.Errorf("%q, CONTRACT §4 says %q", tc.got, tc.want)
			}
		})
	}
}
