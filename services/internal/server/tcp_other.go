// SPDX-License-Identifier: Apache-2.0

//go:build !linux

package server

import (
	"net"
	"time"
)

// setTCPUserTimeout does nothing where TCP_USER_TIMEOUT does not exist (dkc-server ships for Linux).
func setTCPUserTimeout(*net.TCPConn, time.Duration) error { return nil }
