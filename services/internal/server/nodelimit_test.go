// SPDX-License-Identifier: Apache-2.0

package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/dkc-dev/dkc/internal/poll"
	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
	"github.com/dkc-dev/dkc/services/internal/assignment"
	"github.com/dkc-dev/dkc/services/internal/auth"
	"github.com/dkc-dev/dkc/services/internal/nodestatus"
	"github.com/dkc-dev/dkc/services/internal/rpc"
)

// limitServer serves dkc-server's gRPC listener as Run builds it (TLS 1.3, the interceptors, the connection
// caps of lim, status reports paced by reports) on a loopback port, with tokens reviewed as testToken's and
// an assignment for node-a and node-b; it returns the address, the CA and the connection limiter.
func limitServer(t *testing.T, lim connLimits, reports *reportLimiter) (string, *x509.CertPool, *connLimiter) {
	t.Helper()
	pool, cert := servingPair(t)
	cfg := DefaultConfig()
	table := assignment.NewTable(nil)
	a := &dkcv1.Assignment{Source: &dkcv1.NodeConfigSource{ConfigMap: &dkcv1.ConfigMapNodeConfigSource{Namespace: "kube-system", Name: "c",
		Uid: "u", ResourceVersion: "1", KubeletConfigKey: "kubelet"}}, ContentHash: "h1", Files: map[string]string{"kubelet": "kind: KubeletConfiguration\n"}}
	for _, n := range []string{"node-a", "node-b"} {
		table.Set(n, assignment.State{Assignment: a})
	}
	conns := newConnLimiter(lim, nil)
	authn := auth.New(auth.Config{Client: tokenReviews(), Allowed: cfg.AllowedServiceAccounts, TTL: time.Hour})
	svc := rpc.New(rpc.Config{Log: zap.NewNop(), Table: table, Status: acceptReports{}, Streams: rpc.NewStreams()})
	addr := serveTLS(t, cfg, cert, grpcParts{authn: authn, svc: svc, health: health.NewServer(), conns: conns, reports: reports})
	return addr, pool, conns
}

// acceptReports is a status writer that takes every report.
type acceptReports struct{}

func (acceptReports) Report(context.Context, string, *dkcv1.ReportStatusRequest) (nodestatus.Receipt, error) {
	return nodestatus.Receipt{}, nil
}

// dialFrom opens a gRPC connection to addr from the loopback address from (127.0.0.0/8 is all local), closed
// when the test ends.
func dialFrom(t *testing.T, addr, from string, pool *x509.CertPool) *grpc.ClientConn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13})),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) { return d.DialContext(ctx, "tcp", a) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// report makes one ReportStatus call on conn with node's token, for node forNode.
func report(conn *grpc.ClientConn, node, forNode string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+testToken(node))
	_, err := dkcv1.NewConfigServiceClient(conn).ReportStatus(ctx, &dkcv1.ReportStatusRequest{NodeName: forNode, Status: &dkcv1.NodeConfigStatus{}})
	return err
}

// TestConnectionsPerNodeAreCapped: one node's token, valid and cached, opens connection after connection and
// authenticates on each (a call for another node: authenticated, then refused by the handler, so nothing
// but the connection is held). Past --max-connections-per-node its calls get ResourceExhausted, counted,
// and its connections stay unauthenticated; another node, from the same address, is not affected; a
// connection the node closes gives its place back.
func TestConnectionsPerNodeAreCapped(t *testing.T) {
	const flood = 8
	for _, tc := range []struct {
		name    string
		perNode int
		wantIn  int // of the flood's connections, those that authenticate
	}{
		{"default", DefaultConfig().MaxConnectionsPerNode, DefaultConfig().MaxConnectionsPerNode},
		{"one", 1, 1},
		{"off", 0, flood},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr, pool, conns := limitServer(t, connLimits{max: 100, maxPerNode: tc.perNode, authTimeout: time.Hour}, nil)
			var in []*grpc.ClientConn
			refused := 0
			for i := range flood {
				conn := dialFrom(t, addr, "127.0.0.1", pool)
				switch err := report(conn, "node-a", "node-x"); status.Code(err) {
				case codes.PermissionDenied: // authenticated: the handler refuses the other node's report
					in = append(in, conn)
				case codes.ResourceExhausted:
					refused++
				default:
					t.Fatalf("connection %d: %v, want PermissionDenied or ResourceExhausted", i, err)
				}
			}
			if len(in) != tc.wantIn || refused != flood-tc.wantIn {
				t.Errorf("node-a: %d connections authenticated, %d refused; want %d and %d", len(in), refused, tc.wantIn, flood-tc.wantIn)
			}
			if got := testutil.ToFloat64(conns.nodeRefused); got != float64(flood-tc.wantIn) {
				t.Errorf("node_connections_refused_total = %v, want %d", got, flood-tc.wantIn)
			}
			if got := conns.unauth.Load(); got != int64(flood-tc.wantIn) {
				t.Errorf("%d connections unauthenticated, want the %d refused", got, flood-tc.wantIn)
			}
			// Another node, from the same address, gets its stream as if node-a were not there.
			conn := dialFrom(t, addr, "127.0.0.1", pool)
			if err := watchOn(conn, "node-b"); err != nil {
				t.Errorf("node-b while node-a holds its cap: %v", err)
			}
			if tc.perNode == 0 {
				return
			}
			in[0].Close()
			poll.Until(t, "node-a's closed connection to give its place back", func() bool {
				conns.mu.Lock()
				defer conns.mu.Unlock()
				return conns.byNode["node-a"] == tc.perNode-1
			})
			if err := report(dialFrom(t, addr, "127.0.0.1", pool), "node-a", "node-x"); status.Code(err) != codes.PermissionDenied {
				t.Errorf("node-a after closing a connection: %v, want authenticated (PermissionDenied for node-x)", err)
			}
		})
	}
}

// watchOn opens a WatchConfig stream for node on conn and waits for its first message (10s at most).
func watchOn(conn *grpc.ClientConn, node string) error {
	return watchWithin(conn, node, 10*time.Second)
}

// watchWithin opens a WatchConfig stream for node with its token on conn and waits for its first message.
func watchWithin(conn *grpc.ClientConn, node string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+testToken(node))
	stream, err := dkcv1.NewConfigServiceClient(conn).WatchConfig(ctx, &dkcv1.WatchConfigRequest{NodeName: node})
	if err != nil {
		return err
	}
	_, err = stream.Recv()
	return err
}

// TestConnectionsPerAddressAreCapped: one IP address holds at most --max-connections-per-address
// connections, authenticated or not; past it a connection is closed at accept and counted, another address
// gets in, and a place given back is taken again. Nothing stays in the counts once every connection closed.
func TestConnectionsPerAddressAreCapped(t *testing.T) {
	for _, tc := range []struct {
		name          string
		authenticated bool // the address's connections authenticate (as node-a and node-b) before the next one
	}{
		{"unauthenticated", false},
		{"authenticated", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const perAddress = 2
			addr, pool, conns := limitServer(t, connLimits{max: 100, maxPerAddress: perAddress, authTimeout: time.Hour}, nil)
			var held []net.Conn
			for i := range perAddress {
				if tc.authenticated {
					if err := watchOn(dialFrom(t, addr, "127.0.0.1", pool), fmt.Sprintf("node-%c", 'a'+i)); err != nil {
						t.Fatal(err)
					}
					continue
				}
				held = append(held, dialTCP(t, addr, "127.0.0.1"))
			}
			poll.Until(t, "the address's connections to be accepted", func() bool { return conns.open.Load() == perAddress })
			if c := dialTCP(t, addr, "127.0.0.1"); !closedByServer(c) {
				t.Errorf("a connection past --max-connections-per-address was kept")
			}
			if c := dialTCP(t, addr, "127.0.0.2"); closedByServer(c) {
				t.Errorf("another address's connection was closed")
			}
			if got := testutil.ToFloat64(conns.addrRefused); got != 1 {
				t.Errorf("address_connections_refused_total = %v, want 1", got)
			}
			if !tc.authenticated {
				held[0].Close()
				poll.Until(t, "the closed connection's place back", func() bool { return conns.open.Load() == perAddress })
				if c := dialTCP(t, addr, "127.0.0.1"); closedByServer(c) {
					t.Error("a place given back was not taken again")
				}
			}
		})
	}
}

// dialTCP opens a TCP connection to addr from the loopback address from, closed when the test ends.
func dialTCP(t *testing.T, addr, from string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestCountsForgetClosedConnections: the per-address and per-node counts hold only what is open, so what
// they cost is bounded by the open connections, whatever came and went.
func TestCountsForgetClosedConnections(t *testing.T) {
	addr, pool, conns := limitServer(t, connLimits{max: 100, maxPerAddress: 50, maxPerNode: 4, authTimeout: time.Hour}, nil)
	for i := range 20 {
		conn := dialFrom(t, addr, fmt.Sprintf("127.0.0.%d", 1+i%5), pool)
		if err := report(conn, fmt.Sprintf("node-%d", i), "node-x"); status.Code(err) != codes.PermissionDenied {
			t.Fatalf("node-%d: %v, want authenticated", i, err)
		}
		conn.Close()
		_ = dialTCP(t, addr, fmt.Sprintf("127.0.1.%d", i)).Close()
	}
	poll.Until(t, "every connection to close", func() bool {
		conns.mu.Lock()
		defer conns.mu.Unlock()
		return conns.open.Load() == 0 && len(conns.byNode) == 0 && len(conns.byAddrAll) == 0 && len(conns.byAddr) == 0 && len(conns.conns) == 0
	})
}

// TestNewConnectionsPerAddressAreRateLimited: a client that connects and closes in a loop gets
// --new-connections-per-address-burst connections, then each further one is closed at accept, before any
// TLS handshake, and counted; another address keeps its own budget. Off, every connection is accepted.
func TestNewConnectionsPerAddressAreRateLimited(t *testing.T) {
	const loop = 40
	for _, tc := range []struct {
		name   string
		qps    float64
		burst  int
		wantIn int
	}{
		// A rate this low adds no token while the loop runs: the burst is what gets in.
		{"burst", 0.001, 5, 5},
		{"default burst", 0.001, DefaultConfig().NewConnectionsPerAddressBurst, DefaultConfig().NewConnectionsPerAddressBurst},
		{"off", 0, 5, loop},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newConnLimiter(connLimits{max: 1000, newPerAddressQPS: tc.qps, newPerAddressBurst: tc.burst}, nil)
			addr, accepted := countAccepted(t, l)
			for range loop {
				_ = dialTCP(t, addr, "127.0.0.1").Close()
			}
			poll.Until(t, "the listener to take every connection", func() bool {
				return accepted.Load()+int64(testutil.ToFloat64(l.rateRefused)) == loop
			})
			if got := accepted.Load(); got != int64(tc.wantIn) {
				t.Errorf("%d of %d connections accepted, want %d", got, loop, tc.wantIn)
			}
			if c := dialTCP(t, addr, "127.0.0.2"); closedByServer(c) {
				t.Error("another address's first connection was closed")
			}
		})
	}
}

// countAccepted accepts connections through l on a loopback port until the test ends, counting them, and
// closes each as soon as its peer does; it returns the address and the count.
func countAccepted(t *testing.T, l *connLimiter) (string, *atomic.Int64) {
	t.Helper()
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lis := l.wrap(tcp)
	t.Cleanup(func() { lis.Close() })
	var n atomic.Int64
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			n.Add(1)
			go func() { _, _ = io.Copy(io.Discard, c); c.Close() }()
		}
	}()
	return tcp.Addr().String(), &n
}

// TestRefusedBeforeTheHandshake: a connection past the accept rate never gets a TLS handshake; the client
// sees the connection closed.
func TestRefusedBeforeTheHandshake(t *testing.T) {
	addr, pool, conns := limitServer(t, connLimits{max: 100, newPerAddressQPS: 0.001, newPerAddressBurst: 1}, nil)
	if err := watchOn(dialFrom(t, addr, "127.0.0.1", pool), "node-a"); err != nil {
		t.Fatal(err)
	}
	c := dialTCP(t, addr, "127.0.0.1")
	tc := tls.Client(c, &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13, ServerName: "127.0.0.1", NextProtos: []string{"h2"}})
	_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
	if err := tc.Handshake(); err == nil {
		t.Error("handshake completed past the accept rate")
	}
	if got := testutil.ToFloat64(conns.rateRefused); got != 1 {
		t.Errorf("connections_rate_limited_total = %v, want 1", got)
	}
}

// TestStatusReportsArePacedPerNode: a node that reports faster than --status-reports-per-node-qps gets
// ResourceExhausted past its burst, counted; another node reports as before. Off, nothing is refused.
func TestStatusReportsArePacedPerNode(t *testing.T) {
	const calls = 30
	for _, tc := range []struct {
		name   string
		qps    float64
		burst  int
		wantOK int
	}{
		{"burst", 0.001, 3, 3},
		{"default burst", 0.001, DefaultConfig().StatusReportsPerNodeBurst, DefaultConfig().StatusReportsPerNodeBurst},
		{"off", 0, 3, calls},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reports := newReportLimiter(tc.qps, tc.burst, nil)
			addr, pool, _ := limitServer(t, connLimits{max: 100, authTimeout: time.Hour}, reports)
			conn := dialFrom(t, addr, "127.0.0.1", pool)
			ok := 0
			for i := range calls {
				switch err := report(conn, "node-a", "node-a"); status.Code(err) {
				case codes.OK:
					ok++
				case codes.ResourceExhausted:
				default:
					t.Fatalf("report %d: %v", i, err)
				}
			}
			if ok != tc.wantOK {
				t.Errorf("node-a: %d of %d reports taken, want %d", ok, calls, tc.wantOK)
			}
			if got := testutil.ToFloat64(reports.refused); got != float64(calls-tc.wantOK) {
				t.Errorf("status_reports_rate_limited_total = %v, want %d", got, calls-tc.wantOK)
			}
			if err := report(conn, "node-b", "node-b"); err != nil {
				t.Errorf("node-b after node-a's reports: %v", err)
			}
		})
	}
}

// TestKeyedLimiterIsBounded: the buckets of a limiter keyed by address or node stay within maxLimiterKeys,
// whatever the number of keys seen; a key's bucket is its own.
func TestKeyedLimiterIsBounded(t *testing.T) {
	l := newKeyedLimiter(0.001, 1)
	for i := range maxLimiterKeys + 1000 {
		if !l.allow(fmt.Sprint(i)) {
			t.Fatalf("key %d refused on its first use", i)
		}
	}
	if n := l.buckets.Len(); n > maxLimiterKeys {
		t.Errorf("%d buckets, want at most %d", n, maxLimiterKeys)
	}
	if l.allow(fmt.Sprint(maxLimiterKeys + 999)) {
		t.Error("a key past its burst was allowed")
	}
	if newKeyedLimiter(0, 1) != nil || !(*keyedLimiter)(nil).allow("x") {
		t.Error("qps 0 should be no limit")
	}
}
