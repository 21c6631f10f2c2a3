// SPDX-License-Identifier: Apache-2.0

//go:build race

package server

// raceEnabled: the race detector multiplies what goroutines and allocations cost (TestStreamMemory).
const raceEnabled = true
