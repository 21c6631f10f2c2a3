// SPDX-License-Identifier: Apache-2.0

package checkapi

import (
	"slices"
	"testing"
)

func TestMinor(t *testing.T) {
	for in, want := range map[string]string{
		"v1.37.2": "1.37", "1.34": "1.34", "v1.35.0-rc.1": "1.35", "v1.36.3-eks-4f1a2b": "1.36", "v1.37.2+k3s1": "1.37",
		"v1.10.0": "1.10", "": "", "v1": "", "vx.y": "", "v1.x.2": "", "unknown": "", "v1.37a": "", "1.": "",
	} {
		if got := Minor(in); got != want {
			t.Errorf("Minor(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestCompareMinors(t *testing.T) {
	got := []string{"1.10", "1.37", "1.9", "2.0", "1.34"}
	slices.SortFunc(got, CompareMinors)
	if want := []string{"1.9", "1.10", "1.34", "1.37", "2.0"}; !slices.Equal(got, want) {
		t.Errorf("sorted = %v, want %v", got, want)
	}
}
