// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"
)

// echoServer answers each line with its name and the line, until closed.
func echoServer(t *testing.T, name string) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					if _, err := fmt.Fprintf(c, "%s %s\n", name, sc.Text()); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln
}

// roundTrip connects to addr, sends one line and returns the answer.
func roundTrip(t *testing.T, addr, line string) (string, net.Conn) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := fmt.Fprintln(c, line); err != nil {
		t.Fatal(err)
	}
	got, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatalf("read the answer to %q: %v", line, err)
	}
	return got, c
}

func TestBalancer(t *testing.T) {
	a, b := echoServer(t, "a"), echoServer(t, "b")
	defer a.Close()
	lb, err := newBalancer("127.0.0.1:0", a.Addr().String(), b.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer lb.Close()

	// Round-robin while both serve.
	var conns []net.Conn
	for i, want := range []string{"a 0\n", "b 1\n", "a 2\n", "b 3\n"} {
		got, c := roundTrip(t, lb.Addr(), fmt.Sprint(i))
		conns = append(conns, c)
		if got != want {
			t.Errorf("connection %d: got %q, want %q", i, got, want)
		}
	}
	for i := range 2 {
		if total, open := lb.Forwarded(i); total != 2 || open != 2 {
			t.Errorf("backend %d: %d forwarded, %d open; want 2 and 2", i, total, open)
		}
	}

	// Backend a refuses connections, as a killed replica's port does: every new connection is b's.
	a.Close()
	for i := 4; i < 8; i++ {
		got, c := roundTrip(t, lb.Addr(), fmt.Sprint(i))
		c.Close()
		if want := fmt.Sprintf("b %d\n", i); got != want {
			t.Errorf("connection %d with a closed: got %q, want %q", i, got, want)
		}
	}
	if total, _ := lb.Forwarded(1); total != 6 {
		t.Errorf("backend b took %d connections, want 6", total)
	}

	// Closing the client's side closes the backend's: nothing stays open after the balancer closes.
	for _, c := range conns {
		c.Close()
	}
	if err := lb.Close(); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if _, open := lb.Forwarded(i); open != 0 {
			t.Errorf("backend %d: %d connections open after Close", i, open)
		}
	}
	if _, err := net.DialTimeout("tcp", lb.Addr(), time.Second); err == nil {
		t.Error("the balancer accepts connections after Close")
	}
}

// TestBalancerBackendEnds checks that a backend ending a connection ends it at the client: a killed
// replica's nodes must see their stream gone to reconnect.
func TestBalancerBackendEnds(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			c.Close()
		}
	}()
	lb, err := newBalancer("127.0.0.1:0", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer lb.Close()
	c, err := net.Dial("tcp", lb.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Errorf("read after the backend closed: %v, want EOF", err)
	}
}
