// SPDX-License-Identifier: Apache-2.0

package nodeconfig

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// TestTruncateDetail: the sidecar's details and dkc-server's status errors are cut to MaxDetailBytes at a
// UTF-8 boundary, saying so and whose log holds the rest.
func TestTruncateDetail(t *testing.T) {
	for _, fn := range []struct {
		name     string
		truncate func(string) string
		log      string
	}{
		{"TruncateDetail", TruncateDetail, "dkc-sidecar log"},
		{"TruncateStatusError", func(s string) string { return string(TruncateStatusError(StatusError(s))) }, "dkc-server log"},
	} {
		t.Run(fn.name, func(t *testing.T) { testTruncate(t, fn.truncate, fn.log) })
	}
}

func testTruncate(t *testing.T, truncate func(string) string, log string) {
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
			got := truncate(tc.in)
			if len(got) > MaxDetailBytes {
				t.Errorf("%d bytes, want at most %d", len(got), MaxDetailBytes)
			}
			if !utf8.ValidString(got) {
				t.Errorf("not valid UTF-8 after the cut")
			}
			if (got != tc.in) != tc.truncated || strings.Contains(got, "truncated") != tc.truncated {
				t.Errorf("truncated = %v, want %v", got != tc.in, tc.truncated)
			}
			if tc.truncated && !strings.Contains(got, log) {
				t.Errorf("%q does not say the %s holds the rest", got[len(got)-80:], log)
			}
		})
	}
}

// TestDrainRequiredErrorText pins the text of DrainRequiredError, a dkc status error that users and pool
// tooling match on like the others of the status contract (contract_test.go): if it fails, restore the text.
func TestDrainRequiredErrorText(t *testing.T) {
	const want = "failed to use config, the node must be drained first, see dkc-sidecar log for details"
	if got := string(DrainRequiredError); got != want {
		t.Errorf("%q, the contract says %q", got, want)
	}
	if strings.HasPrefix(want, SyncErrorPrefix) {
		t.Errorf("%q reads as a sync error: it is an error of using the config", want)
	}
}
