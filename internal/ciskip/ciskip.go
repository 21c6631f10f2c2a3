// SPDX-License-Identifier: Apache-2.0

// Package ciskip is t.Skip for tests whose skip condition must never hold in CI: where CI=true (as
// .ci/run and most CI systems set it) a skip is a failure, because a test that silently stops testing is
// worse than one that fails — the skip of TestRealNodeOnFreshKernel once hid a cluster leaked by an
// earlier test.
package ciskip

import (
	"os"
	"strconv"
	"testing"
)

// InCI reports whether the environment says this is a CI run ($CI true).
func InCI() bool {
	ci, _ := strconv.ParseBool(os.Getenv("CI"))
	return ci
}

// Skipf skips the test, or in CI fails it with the same message.
func Skipf(t testing.TB, format string, args ...any) {
	t.Helper()
	if InCI() {
		t.Fatalf("would skip, which CI does not allow (CI=true): "+format, args...)
	}
	t.Skipf(format, args...)
}
