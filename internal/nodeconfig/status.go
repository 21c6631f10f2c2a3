// SPDX-License-Identifier: Apache-2.0

package nodeconfig

import (
	"fmt"
	"unicode/utf8"
)

// StatusError is a status error: what status.config.error (the StatusAnnotation) and the ConfigOK
// condition's message say. Values are the original kubelet's texts (pkg/kubelet/kubeletconfig/status) or
// dkc's own in their style; the README lists them. A StatusError is an error, so code wraps and tests for
// them with errors.Is instead of comparing texts.
type StatusError string

func (e StatusError) Error() string { return string(e) }

// SyncErrorPrefix starts every error of syncing a source (reading, resolving or writing it), as opposed to
// loading, validating or running the config.
const SyncErrorPrefix = "failed to sync: "

// InvalidSourcePrefix follows SyncErrorPrefix in dkc's error for a source the apiserver would have
// refused; the apiserver's field errors follow it, in its words.
const InvalidSourcePrefix = "invalid NodeConfigSource: "

// Errors of syncing a source: dkc-server sends them to the node, which reports them.
const (
	// AllNilSubfieldsError: the source has no subfield dkc knows (the kubelet's wording; the apiserver's
	// would be "exactly one reference subfield must be non-nil").
	AllNilSubfieldsError StatusError = SyncErrorPrefix + "invalid NodeConfigSource, exactly one subfield " +
		"must be non-nil, but all were nil"
	// DownloadError: the referenced ConfigMap cannot be read (missing, or the apiserver refused).
	DownloadError StatusError = SyncErrorPrefix + "failed to download config, see Kubelet log for details"
	// NamespaceNotAllowedError: a well-formed source in a namespace dkc-server does not read configs from
	// (its --config-namespaces). The original had no such limit: the node authorizer let a kubelet read its
	// ConfigMap anywhere. dkc-server reads ConfigMaps with its own identity, so it keeps to namespaces where
	// it is granted that read, and its log says which namespace was refused.
	NamespaceNotAllowedError StatusError = SyncErrorPrefix + "config namespace not allowed, see dkc-server log for details"
	// SnapshotMismatchError (dkc): the source names a KubeletConfigPool's revision snapshot that is not the
	// one its pool created: its data are not its revision's, or its UID is not the one the pool records
	// (pre-created, or deleted and created again). The node keeps its config; dkc-server's log names the
	// ConfigMap, its UID and what differs.
	SnapshotMismatchError StatusError = SyncErrorPrefix + "revision snapshot does not match its revision, " +
		"see dkc-server log for details"
	// SyncInternalError: syncing failed for a reason that is nobody's config (a write, a bug).
	SyncInternalError StatusError = SyncErrorPrefix + InternalError
	// PayloadError: the service sent a payload the node refuses to write (bad hash, names, sizes).
	PayloadError StatusError = SyncErrorPrefix + "refused invalid payload, see dkc-sidecar log for details"
)

// TooLargeError is the sync error of a node whose resolved config has more files or bytes than a node
// accepts (payload.MaxFiles, payload.MaxBytes): it is never sent.
func TooLargeError(maxFiles, maxMiB int) StatusError {
	return StatusError(fmt.Sprintf("%sconfig too large: a node takes at most %d files and %d "+
		"MiB of file names and contents",
		SyncErrorPrefix, maxFiles, maxMiB))
}

// Errors of using a config: the node reports them.
const (
	LoadError     StatusError = "failed to load config, see Kubelet log for details"
	ValidateError StatusError = "failed to validate config, see Kubelet log for details"
	InternalError StatusError = "internal failure, see Kubelet log for details"
	// UnsupportedKubeletError (dkc): the node's kubelet is of a minor dkc has no validation code for (or its
	// version is not known yet); nothing is checked with another version's code, and the kubelet is left
	// alone. The message names the version and the minors this dkc supports.
	UnsupportedKubeletError StatusError = "unsupported kubelet version, see dkc-sidecar log for details"
	// HealthError: the config passed validation but the kubelet did not come back healthy running it
	// within the health timeout; the node was rolled back.
	HealthError StatusError = "failed to run kubelet with config, rolled back, see dkc-sidecar log for details"
	// RestartError: the service manager did not restart the kubelet (a failed job, the bus unreachable) or
	// the env file could not be written. Not the config's fault: nothing is rolled back, and the restart is
	// retried at the next tick.
	RestartError StatusError = "failed to restart kubelet, will retry, see dkc-sidecar log for details"
	// VerifyError: the kubelet is healthy but refuses the sidecar /configz (it cannot authenticate it while
	// the apiserver is unreachable, or the sidecar lacks nodes/configz), so what it runs cannot be proven.
	// Not the config's fault: nothing is rolled back or restarted, and the check is retried at the next tick.
	VerifyError StatusError = "failed to verify config, the kubelet refused /configz, will retry, " +
		"see dkc-sidecar log for details"
	// VerifyTimeoutError: as VerifyError, but the kubelet took the request and did not answer in time (its
	// authentication webhook waits on an apiserver it cannot reach).
	VerifyTimeoutError StatusError = "failed to verify config, the kubelet did not answer /configz, will retry, " +
		"see dkc-sidecar log for details"
	// DrainRequiredError (dkc): the kubelet would refuse to start with the assigned config on the state its
	// resource managers checkpointed under the config it runs (package disruption), or, restarted with it,
	// would evict pods under its new eviction thresholds (package capacity), and the node is not drained for
	// this assignment (WatchConfigResponse.drained). Not the config's fault: the kubelet is not restarted and
	// keeps what it runs, nothing is rolled back, and the node goes ahead — removing the state files with the
	// kubelet stopped, if any — once it is drained for this assignment. The message names the files and the fields
	// that invalidate them, or the pods, and how to drain the node.
	DrainRequiredError StatusError = "failed to use config, the node must be drained first, " +
		"see dkc-sidecar log for details"
)

// String makes a StatusError a zap.Stringer.
func (e StatusError) String() string { return string(e) }

// MaxDetailBytes bounds the human-readable detail a node sends with its status (the kubelet's validation
// message, a restart's failure): a hostile or huge config can make the kubelet's message as long as the
// config, and a report past dkc-server's receive limit would be refused and retried for ever. The full
// message stays in the sidecar's log.
const MaxDetailBytes = 4 << 10

// TruncateDetail cuts detail to MaxDetailBytes, at a UTF-8 boundary, saying that it did.
func TruncateDetail(detail string) string {
	return truncate(detail, " … (truncated; the full message is in the dkc-sidecar log)")
}

// TruncateStatusError cuts a status error dkc-server made to MaxDetailBytes, at a UTF-8 boundary, saying
// that it did. A sync error can quote an invalid source's values, as long as a Node's annotations allow
// (256 KiB): the sidecar echoes it when it resumes its stream (WatchConfigRequest.sync_error), and a
// request past dkc-server's receive limit would be refused at every retry.
func TruncateStatusError(e StatusError) StatusError {
	return StatusError(truncate(string(e), " … (truncated; the full message is in the dkc-server log)"))
}

func truncate(s, tail string) string {
	if len(s) <= MaxDetailBytes {
		return s
	}
	cut := MaxDetailBytes - len(tail)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + tail
}
