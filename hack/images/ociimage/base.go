// SPDX-License-Identifier: Apache-2.0

package ociimage

import "io/fs"

// Users of the base layer. 65532 is distroless' "nonroot", so tooling and policies written for distroless
// images (runAsUser: 65532) apply unchanged.
const (
	RootUID    = 0
	NonrootUID = 65532
)

// BaseFiles is the minimal root filesystem every Go image here starts from, in place of a distroless base
// that cannot be pulled on this machine: user and group names for the two users (so `ps` and log
// collectors can name them), a world-writable /tmp for os.TempDir, and nsswitch.conf so Go's resolver
// looks at /etc/hosts before DNS. No shell and no package manager: nothing to exec into.
func BaseFiles() []File {
	return []File{
		{Path: "/etc/passwd", Mode: 0o644, Data: []byte(
			"root:x:0:0:root:/root:/sbin/nologin\n" +
				"nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
		{Path: "/etc/group", Mode: 0o644, Data: []byte("root:x:0:\nnonroot:x:65532:\n")},
		{Path: "/etc/nsswitch.conf", Mode: 0o644, Data: []byte("hosts: files dns\n")},
		{Path: "/home/nonroot", Dir: true, Mode: 0o700, UID: NonrootUID, GID: NonrootUID},
		{Path: "/root", Dir: true, Mode: 0o700},
		{Path: "/tmp", Dir: true, Mode: fs.ModeSticky | 0o777},
	}
}
