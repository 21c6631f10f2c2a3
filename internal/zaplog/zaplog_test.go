// SPDX-License-Identifier: Apache-2.0

package zaplog

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestSampling: the production logger samples repeated lines (the first 100 of a message each second, then
// every 100th), except at debug, where an operator follows nodes through a storm and needs every line.
func TestSampling(t *testing.T) {
	for _, tc := range []struct {
		level string
		want  func(n int) bool
	}{
		{"info", func(n int) bool { return n < 300 }},
		{"debug", func(n int) bool { return n == 300 }},
	} {
		t.Run(tc.level, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "log")
			log, err := build(tc.level, false, []string{path})
			if err != nil {
				t.Fatal(err)
			}
			for range 300 {
				log.Info("node watching")
			}
			_ = log.Sync()
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if n := bytes.Count(data, []byte("\n")); !tc.want(n) {
				t.Errorf("level %s: %d of 300 identical lines written", tc.level, n)
			}
		})
	}
}
