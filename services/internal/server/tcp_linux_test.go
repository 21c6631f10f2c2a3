// SPDX-License-Identifier: Apache-2.0

package server

import (
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestAcceptedConnectionsGetTheUserTimeout: the keepalive timeout becomes the accepted socket's
// TCP_USER_TIMEOUT, as grpc-go sets it on connections it can see are TCP (a wrapped one it cannot).
func TestAcceptedConnectionsGetTheUserTimeout(t *testing.T) {
	l := newConnLimiter(connLimits{max: 10, tcpUserTimeout: 20 * time.Second}, nil)
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lis := l.wrap(tcp)
	defer lis.Close()
	c, err := net.Dial("tcp", tcp.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	accepted, err := lis.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer accepted.Close()
	raw, err := accepted.(*countedConn).Conn.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var ms int
	var gerr error
	if err := raw.Control(func(fd uintptr) { ms, gerr = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT) }); err != nil || gerr != nil {
		t.Fatal(err, gerr)
	}
	if ms != 20000 {
		t.Errorf("TCP_USER_TIMEOUT %d ms, want 20000 (the keepalive timeout)", ms)
	}
}
