// SPDX-License-Identifier: Apache-2.0

package version

import (
	"runtime"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestDevelVersion(t *testing.T) {
	for _, tc := range []struct {
		name     string
		settings []debug.BuildSetting
		ok       bool
		want     string
	}{
		{"no build info", nil, false, "devel"},
		{"no VCS", []debug.BuildSetting{{Key: "-trimpath", Value: "true"}}, true, "devel"},
		{"clean checkout", []debug.BuildSetting{{Key: "vcs.revision", Value: "538c0ee00d9c7a1b2c3d4e5f60718293a4b5c6d7"}, {Key: "vcs.modified", Value: "false"}}, true, "devel+538c0ee00d9c"},
		{"dirty checkout", []debug.BuildSetting{{Key: "vcs.revision", Value: "538c0ee00d9c7a1b"}, {Key: "vcs.modified", Value: "true"}}, true, "devel+538c0ee00d9c-dirty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var info *debug.BuildInfo
			if tc.ok {
				info = &debug.BuildInfo{Settings: tc.settings}
			}
			if got := develVersion(info, tc.ok); got != tc.want {
				t.Errorf("develVersion = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestStamped(t *testing.T) {
	defer func(v string) { version = v }(version)
	version = "v0.2.0"
	if got := Get(); got != "v0.2.0" {
		t.Errorf("Get = %q, want the stamped v0.2.0", got)
	}
	if !strings.HasPrefix(String(), "v0.2.0 (go") {
		t.Errorf("String = %q", String())
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewCollector())
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`# HELP dkc_build_info Always 1; its labels say which dkc release this process runs and the Go release it was built with.
# TYPE dkc_build_info gauge
dkc_build_info{go_version="`+runtime.Version()+`",version="v0.2.0"} 1
`), "dkc_build_info"); err != nil {
		t.Error(err)
	}
}
