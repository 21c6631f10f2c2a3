// SPDX-License-Identifier: Apache-2.0

package payload

import (
	"fmt"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
)

func TestHash(t *testing.T) {
	src := &dkcv1.ConfigMapNodeConfigSource{Namespace: "kube-system", Name: "c", Uid: "u", ResourceVersion: "1", KubeletConfigKey: "kubelet"}
	base := Hash(src, map[string]string{"kubelet": "a", "extra": "b"})
	if !strings.HasPrefix(base, HashPrefix) || len(base) != len(HashPrefix)+64 {
		t.Fatalf("Hash = %q", base)
	}
	if again := Hash(src, map[string]string{"extra": "b", "kubelet": "a"}); again != base {
		t.Errorf("hash depends on map order")
	}
	other := proto.Clone(src).(*dkcv1.ConfigMapNodeConfigSource)
	other.ResourceVersion = "2"
	for name, h := range map[string]string{
		"other rv":         Hash(other, map[string]string{"kubelet": "a", "extra": "b"}),
		"other content":    Hash(src, map[string]string{"kubelet": "a", "extra": "c"}),
		"boundary shifted": Hash(src, map[string]string{"kubelet": "ae", "xtra": "b"}),
		"file missing":     Hash(src, map[string]string{"kubelet": "a"}),
		"name/value swap":  Hash(src, map[string]string{"a": "kubelet", "extra": "b"}),
	} {
		if h == base {
			t.Errorf("%s: same hash as base", name)
		}
	}
}

// TestValidateNames: every name that becomes a path element (and so part of the kubelet's --config flag) is
// held to the characters the API allows; a refusal names the offending value.
func TestValidateNames(t *testing.T) {
	const injected = "\t--authorization-mode=AlwaysAllow"
	for _, tc := range []struct {
		what     string // how the error names the value
		validate func(string) error
		value    string
		ok       bool
	}{
		{"file name", ValidateFileName, "kubelet", true},
		{"file name", ValidateFileName, "kubelet.yaml", true},
		{"file name", ValidateFileName, "Kubelet_config-1.json", true},
		{"file name", ValidateFileName, ".kubelet", true},
		{"file name", ValidateFileName, strings.Repeat("a", 253), true},
		{"file name", ValidateFileName, "", false},
		{"file name", ValidateFileName, ".", false},
		{"file name", ValidateFileName, "..", false},
		{"file name", ValidateFileName, "..kubelet", false}, // the apiserver refuses a ".." prefix (ConfigMap volumes use ..data)
		{"file name", ValidateFileName, "../etc", false},
		{"file name", ValidateFileName, "a/b", false},
		{"file name", ValidateFileName, "/abs", false},
		{"file name", ValidateFileName, `a\b`, false},
		{"file name", ValidateFileName, "nul\x00", false},
		{"file name", ValidateFileName, "kubelet" + injected, false},
		{"file name", ValidateFileName, "kubelet\v--x", false},
		{"file name", ValidateFileName, "kubelet\r--x", false},
		{"file name", ValidateFileName, "kubelet --x", false},
		{"file name", ValidateFileName, `kubelet"`, false},
		{"file name", ValidateFileName, "kubelet'", false},
		{"file name", ValidateFileName, "kubelet$X", false},
		{"file name", ValidateFileName, "kubelet%n", false},
		{"file name", ValidateFileName, "kubelet\u00a0", false},
		{"file name", ValidateFileName, strings.Repeat("a", 254), false},
		{"uid", ValidateUID, "0f8e5c1a-8d4b-4c1e-9a3e-6f2b7d9c1e42", true},
		{"uid", ValidateUID, "u", true},
		{"uid", ValidateUID, "uid-1", true},
		{"uid", ValidateUID, "", false},
		{"uid", ValidateUID, "..", false},
		{"uid", ValidateUID, "../..", false},
		{"uid", ValidateUID, ".tmp-1", false},
		{"uid", ValidateUID, "-u", false},
		{"uid", ValidateUID, "0F8E5C1A", false},
		{"uid", ValidateUID, "u" + injected, false},
		{"uid", ValidateUID, "u v", false},
		{"uid", ValidateUID, strings.Repeat("a", 64), false},
		{"resourceVersion", ValidateResourceVersion, "42", true},
		{"resourceVersion", ValidateResourceVersion, "18446744073709551615", true},
		{"resourceVersion", ValidateResourceVersion, "abc-DEF-1", true},
		{"resourceVersion", ValidateResourceVersion, strings.Repeat("9", MaxResourceVersionLength), true},
		{"resourceVersion", ValidateResourceVersion, "", false},
		{"resourceVersion", ValidateResourceVersion, "..", false},
		{"resourceVersion", ValidateResourceVersion, "1/2", false},
		{"resourceVersion", ValidateResourceVersion, "1.2", false},
		{"resourceVersion", ValidateResourceVersion, "1" + injected, false},
		{"resourceVersion", ValidateResourceVersion, "1\n--x", false},
		{"resourceVersion", ValidateResourceVersion, "1$X", false},
		{"resourceVersion", ValidateResourceVersion, "1\xff", false},
		{"resourceVersion", ValidateResourceVersion, strings.Repeat("9", MaxResourceVersionLength+1), false},
	} {
		err := tc.validate(tc.value)
		if (err == nil) != tc.ok {
			t.Errorf("%s %q: err = %v, want ok=%v", tc.what, tc.value, err, tc.ok)
			continue
		}
		if err == nil {
			continue
		}
		// The message says what was refused and repeats the value (shortened when long).
		want := fmt.Sprintf("%s %q", tc.what, tc.value)
		if len(tc.value) > maxQuoted {
			want = fmt.Sprintf("%s %q...", tc.what, tc.value[:maxQuoted])
		}
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%s %q: error %q does not contain %q", tc.what, tc.value, err, want)
		}
	}
}
