// SPDX-License-Identifier: Apache-2.0

package server

import (
	"net"
	"time"

	"golang.org/x/sys/unix"
)

// setTCPUserTimeout sets TCP_USER_TIMEOUT on c: unacknowledged data fails the connection after d instead of
// after the kernel's ~15 minutes of retransmissions. grpc-go sets it from the keepalive timeout itself, but
// only on a *net.TCPConn, which a connection wrapped by connLimiter no longer is.
func setTCPUserTimeout(c *net.TCPConn, d time.Duration) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(d/time.Millisecond))
	}); err != nil {
		return err
	}
	return serr
}
