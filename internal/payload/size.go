// SPDX-License-Identifier: Apache-2.0

package payload

import "fmt"

// Limits on a payload, one definition for both sides of the wire: the service never sends a payload over
// them (the node keeps what it has and gets a sync error instead), and a node refuses to checkpoint one
// from the wire that is. The apiserver caps a ConfigMap at 1 MiB of data but not its number of keys, so
// MaxFiles is reachable by a valid ConfigMap; MaxBytes only stops hostile input.
const (
	// MaxFiles is the most files (ConfigMap data keys) a payload may have.
	MaxFiles = 1024
	// MaxBytes bounds a payload's file names and contents added up.
	MaxBytes = 2 << 20
	// MaxMessageBytes bounds an encoded WatchConfigResponse whose payload is within MaxFiles and MaxBytes:
	// the files' framing (at most 13 bytes each), the source (under 1 KiB), the content hash and a sync
	// error (which quotes at most a few hundred bytes of a Node annotation) fit in the 1 MiB on top. The
	// service's send limit and the sidecar's receive limit must be at least this.
	MaxMessageBytes = MaxBytes + 1<<20
)

// CheckSize reports whether files are within MaxFiles and MaxBytes, saying which limit they exceed.
func CheckSize(files map[string]string) error {
	if len(files) > MaxFiles {
		return fmt.Errorf("payload has %d files, more than %d", len(files), MaxFiles)
	}
	total := 0
	for name, data := range files {
		total += len(name) + len(data)
	}
	if total > MaxBytes {
		return fmt.Errorf("payload of %d bytes is larger than %d", total, MaxBytes)
	}
	return nil
}
