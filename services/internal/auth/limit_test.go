// SPDX-License-Identifier: Apache-2.0

package auth

import (
	"context"
	"net"
	"testing"

	"google.golang.org/grpc/peer"
)

// TestPeerKey: what the per-address TokenReview limit counts as one caller.
func TestPeerKey(t *testing.T) {
	tcp := func(ip string, port int) net.Addr { return &net.TCPAddr{IP: net.ParseIP(ip), Port: port} }
	for _, tc := range []struct {
		name string
		addr net.Addr // nil: no peer in the context
		want string
	}{
		{"IPv4: the address, not the port", tcp("10.0.0.1", 40000), "10.0.0.1"},
		{"IPv4 through a dual-stack listener", tcp("::ffff:10.0.0.1", 40000), "10.0.0.1"},
		{"IPv6: the whole address", tcp("2001:db8::1", 40000), "2001:db8::1"},
		{"IPv6: another node of the same /64 is another peer", tcp("2001:db8::2", 40000), "2001:db8::2"},
		{"IPv6 link-local: the zone is not part of the caller", &net.TCPAddr{IP: net.ParseIP("fe80::1"), Zone: "eth0", Port: 1}, "fe80::1"},
		{"an address that is not IP (bufconn)", pipeAddr{}, "pipe"},
		{"no peer", nil, "unknown"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			if tc.addr != nil {
				ctx = peer.NewContext(ctx, &peer.Peer{Addr: tc.addr})
			}
			if got := peerKey(ctx); got != tc.want {
				t.Errorf("peerKey = %q, want %q", got, tc.want)
			}
		})
	}
}

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "pipe" }
