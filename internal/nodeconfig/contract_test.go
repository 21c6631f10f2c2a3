// SPDX-License-Identifier: Apache-2.0

package nodeconfig_test

import (
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/dkc-dev/dkc/internal/nodeconfig"
)

// TestContractStrings pins, as literals, every text of the status contract (docs/design.md) that users, scripts and the original's
// e2e tests match on, against the constants the code writes. Every other test compares with the same
// constants, so this is the one place where changing a constant's text fails: if it fails, the change
// breaks the contract — restore the text instead of updating this test.
func TestContractStrings(t *testing.T) {
	remote := &corev1.NodeConfigSource{ConfigMap: &corev1.ConfigMapNodeConfigSource{
		Namespace: "kube-system", Name: "my-node-config-gkt4c2m4b2", UID: "0d3c6f9e", ResourceVersion: "42", KubeletConfigKey: "kubelet"}}
	for _, tc := range []struct {
		name string
		got  any
		want string
	}{
		// Status errors: the seed table, written by the sidecar (config) or the service (sync).
		{"load error", nodeconfig.LoadError, "failed to load config, see Kubelet log for details"},
		{"validate error", nodeconfig.ValidateError, "failed to validate config, see Kubelet log for details"},
		{"all-nil source error", nodeconfig.AllNilSubfieldsError, "failed to sync: invalid NodeConfigSource, exactly one subfield must be non-nil, but all were nil"},
		{"download error", nodeconfig.DownloadError, "failed to sync: failed to download config, see Kubelet log for details"},
		{"sync internal error", nodeconfig.SyncInternalError, "failed to sync: internal failure, see Kubelet log for details"},
		{"internal error", nodeconfig.InternalError, "internal failure, see Kubelet log for details"},
		// dkc's own texts, documented in the README's status tables: users match on them too.
		{"health error", nodeconfig.HealthError, "failed to run kubelet with config, rolled back, see dkc-sidecar log for details"},
		{"payload error", nodeconfig.PayloadError, "failed to sync: refused invalid payload, see dkc-sidecar log for details"},
		{"restart error", nodeconfig.RestartError, "failed to restart kubelet, will retry, see dkc-sidecar log for details"},
		{"verify error", nodeconfig.VerifyError, "failed to verify config, the kubelet refused /configz, will retry, see dkc-sidecar log for details"},
		{"verify timeout error", nodeconfig.VerifyTimeoutError, "failed to verify config, the kubelet did not answer /configz, will retry, see dkc-sidecar log for details"},
		{"unsupported kubelet", nodeconfig.UnsupportedKubeletError, "unsupported kubelet version, see dkc-sidecar log for details"},
		{"namespace not allowed", nodeconfig.NamespaceNotAllowedError, "failed to sync: config namespace not allowed, see dkc-server log for details"},
		{"snapshot mismatch", nodeconfig.SnapshotMismatchError, "failed to sync: revision snapshot does not match its revision, see dkc-server log for details"},
		{"too large", nodeconfig.TooLargeError(1024, 2), "failed to sync: config too large: a node takes at most 1024 files and 2 MiB of file names and contents"},
		{"reason using current", nodeconfig.ReasonUsingCurrent, "UsingCurrent"},
		{"reason using last-known-good", nodeconfig.ReasonUsingLastKnownGood, "UsingLastKnownGood"},
		{"reason sync failed", nodeconfig.ReasonSyncFailed, "SyncFailed"},
		{"reason config failed", nodeconfig.ReasonConfigFailed, "ConfigFailed"},
		// Events.
		{"event reason", nodeconfig.EventReason, "KubeletConfigChanged"},
		{"local event message", nodeconfig.EventMessage(nil), "Kubelet restarting to use local config"},
		{"remote event message", nodeconfig.EventMessage(remote),
			"Kubelet restarting to use /api/v1/namespaces/kube-system/configmaps/my-node-config-gkt4c2m4b2, UID: 0d3c6f9e, ResourceVersion: 42, KubeletConfigKey: kubelet"},
		{"remote event format", nodeconfig.RemoteEventMessageFmt, "Kubelet restarting to use %s, UID: %s, ResourceVersion: %s, KubeletConfigKey: %s"},
		// Where status is written.
		{"condition type", string(nodeconfig.ConditionType), "ConfigOK"},
		{"status annotation", nodeconfig.StatusAnnotation, "dkc.dev/config-status"},
		// Where a source is set.
		{"source annotation", nodeconfig.SourceAnnotation, "dkc.dev/config-source"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := fmt.Sprint(tc.got); got != tc.want {
				t.Errorf("%q, the contract (docs/design.md, Status) says %q", got, tc.want)
			}
		})
	}
}
