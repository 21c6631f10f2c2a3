// SPDX-License-Identifier: Apache-2.0

package payload

import (
	"fmt"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
)

func TestCheckSize(t *testing.T) {
	many := map[string]string{}
	for i := range MaxFiles + 1 {
		many[fmt.Sprintf("f%d", i)] = ""
	}
	atLimit := map[string]string{"kubelet": strings.Repeat("x", MaxBytes-len("kubelet"))}
	for _, tc := range []struct {
		name    string
		files   map[string]string
		wantErr string
	}{
		{"none", nil, ""},
		{"one small", map[string]string{"kubelet": "a"}, ""},
		{"exactly MaxBytes", atLimit, ""},
		{"one byte over", map[string]string{"kubelet": strings.Repeat("x", MaxBytes-len("kubelet")+1)}, "larger than"},
		{"names count", map[string]string{strings.Repeat("k", MaxBytes+1): ""}, "larger than"},
		{"too many files", many, "more than 1024"},
	} {
		err := CheckSize(tc.files)
		if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
			t.Errorf("%s: CheckSize = %v, want %q", tc.name, err, tc.wantErr)
		}
	}
}

// TestMaxMessageBytes: the largest payload CheckSize accepts, with the longest source fields the API allows
// and a long sync error, encodes within MaxMessageBytes, the send and receive limit both sides must allow.
func TestMaxMessageBytes(t *testing.T) {
	files := map[string]string{}
	per := MaxBytes / MaxFiles
	for i := range MaxFiles {
		name := fmt.Sprintf("%0253d", i)
		files[name] = strings.Repeat("x", per-len(name))
	}
	if err := CheckSize(files); err != nil {
		t.Fatal(err)
	}
	long := func(n int) string { return strings.Repeat("a", n) }
	src := &dkcv1.ConfigMapNodeConfigSource{Namespace: long(63), Name: long(253), Uid: long(63),
		ResourceVersion: long(MaxResourceVersionLength), KubeletConfigKey: long(253)}
	msg := &dkcv1.WatchConfigResponse{
		Assignment: &dkcv1.Assignment{Source: &dkcv1.NodeConfigSource{ConfigMap: src}, Files: files, ContentHash: Hash(src, files)},
		SyncError:  long(256 << 10), // more than any status error: the annotation it may quote is at most 256 KiB
	}
	if n := proto.Size(msg); n > MaxMessageBytes {
		t.Fatalf("largest accepted message is %d bytes, more than MaxMessageBytes (%d)", n, MaxMessageBytes)
	}
}
