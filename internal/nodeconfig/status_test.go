package nodeconfig

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestTruncateDetail(t *testing.T) {
	for _, tc := range []struct {
		name      string
		in        string
		truncated bool
	}{
		{"short", "invalid configuration: cgroupDriver", false},
		{"at the bound", strings.Repeat("a", MaxDetailBytes), false},
		{"past the bound", strings.Repeat("a", MaxDetailBytes+1), true},
		{"huge, multi-byte", strings.Repeat("é€", 100_000), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := TruncateDetail(tc.in)
			if len(got) > MaxDetailBytes {
				t.Errorf("%d bytes, want at most %d", len(got), MaxDetailBytes)
			}
			if !utf8.ValidString(got) {
				t.Errorf("not valid UTF-8 after the cut")
			}
			if (got != tc.in) != tc.truncated || strings.Contains(got, "truncated") != tc.truncated {
				t.Errorf("truncated = %v, want %v", got != tc.in, tc.truncated)
			}
		})
	}
}
