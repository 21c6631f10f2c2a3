package payload

import (
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

func TestValidateFileName(t *testing.T) {
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"kubelet", true},
		{"kubelet.yaml", true},
		{"..kubelet", true},
		{strings.Repeat("a", 255), true},
		{"", false},
		{".", false},
		{"..", false},
		{"../etc", false},
		{"a/b", false},
		{"/abs", false},
		{`a\b`, false},
		{"nul\x00", false},
		{strings.Repeat("a", 256), false},
	} {
		if err := ValidateFileName(tc.name); (err == nil) != tc.ok {
			t.Errorf("ValidateFileName(%q) = %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
}
