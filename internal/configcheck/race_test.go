// SPDX-License-Identifier: Apache-2.0

//go:build race

package configcheck_test

// raceDetector: this test binary is built with -race, whose shadow memory is most of a process's RSS.
const raceDetector = true
