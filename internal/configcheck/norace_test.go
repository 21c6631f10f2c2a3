// SPDX-License-Identifier: Apache-2.0

//go:build !race

package configcheck_test

// raceDetector: this test binary is built without -race.
const raceDetector = false
