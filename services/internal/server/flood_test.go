// SPDX-License-Identifier: Apache-2.0

package server

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	"google.golang.org/grpc/metadata"
	authenticationv1 "k8s.io/api/authentication/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/dkc-dev/dkc/internal/poll"
	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
	"github.com/dkc-dev/dkc/services/internal/assignment"
	"github.com/dkc-dev/dkc/services/internal/auth"
	"github.com/dkc-dev/dkc/services/internal/rpc"
)

// What a flood of unauthenticated connections may cost dkc-server: for each connection it holds, at most
// --max-unauthenticated-connections of them whatever the flood's size and whatever --max-connections (the
// Node count) allows, silentConnBudget for one that never sends a byte and holdingConnBudget for a TLS
// client holding --max-concurrent-streams calls, each with 15 KiB of a --max-recv-msg-size-kib request
// sent (the defaults: 4 calls, 32 KiB). The figures this test measured when it was written (amd64, Go
// 1.26, grpc-go 1.82; heap and goroutine stacks, the test's own client side included): 10-11 KB and
// 224-226 KB, a few hundred bytes apart from run to run. The budgets are those plus a margin;
// docs/security.md ("Callers and their limits") turns them into what a pod needs.
const (
	silentConnBudget  = 16 << 10
	holdingConnBudget = 256 << 10
	floodCap          = 1000
	floodConns        = 2000
	// floodNodeCap is --max-connections as a large fleet sizes it: far above what a flood may hold.
	floodNodeCap = 100000
)

// TestUnauthenticatedFloodIsBounded opens floodConns connections against dkc-server's gRPC listener as Run
// builds it (the connection caps, TLS 1.3, the interceptors, the limits of DefaultConfig) with a cap of
// floodCap unauthenticated connections under a --max-connections of floodNodeCap: raw TCP connections that
// never send a byte, and TLS clients that open --max-concurrent-streams ReportStatus calls with a garbage
// token and send part of a request as large as --max-recv-msg-size-kib allows (grpc-go reads a unary
// request whole before auth runs, so these calls are held before any token is looked at), half the cap of
// each kind first, then as many again of both. A sidecar connected before the flood keeps its stream and
// does not count against the cap. It checks that the listener holds exactly floodCap unauthenticated
// connections and closes the rest, that each kind costs the process's heap and goroutine stacks less than
// its budget, that the whole flood costs no more than the connections held, that a new client is refused
// while the cap is full, and that once the flood is gone a sidecar gets its config. Memory and counts
// only: nothing here is timed.
func TestUnauthenticatedFloodIsBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("opens 2,000 connections")
	}
	if raceEnabled {
		t.Skip("the race detector's shadow memory is not what a connection costs")
	}
	pool, cert := servingPair(t)
	cfg := DefaultConfig()
	cfg.MaxConnections, cfg.MaxUnauthenticatedConnections = floodNodeCap, floodCap
	// Nothing is reaped while the flood is measured; TestHandshakeTimeoutClosesSilentConnections and
	// TestAuthenticationTimeoutClosesUnauthenticatedConnections check the reaping.
	cfg.HandshakeTimeout, cfg.AuthenticationTimeout = time.Hour, time.Hour
	log := zap.NewNop()

	authn := auth.New(auth.Config{Client: tokenReviews(), Allowed: cfg.AllowedServiceAccounts, TTL: time.Hour,
		PeerQPS: auth.DefaultPeerQPS, PeerBurst: auth.DefaultPeerBurst})
	table := assignment.NewTable(nil)
	svc := rpc.New(rpc.Config{Log: log, Table: table, Streams: rpc.NewStreams()})
	lis := newConnLimiter(connLimits{max: cfg.MaxConnections, maxUnauthenticated: cfg.MaxUnauthenticatedConnections,
		authTimeout: cfg.AuthenticationTimeout}, nil)
	addr := serveTLS(t, cfg, cert, grpcParts{authn: authn, svc: svc, health: health.NewServer(), conns: lis})
	a := &dkcv1.Assignment{Source: &dkcv1.NodeConfigSource{ConfigMap: &dkcv1.ConfigMapNodeConfigSource{Namespace: "kube-system", Name: "c",
		Uid: "u", ResourceVersion: "1", KubeletConfigKey: "kubelet"}}, ContentHash: "h1", Files: map[string]string{"kubelet": "kind: KubeletConfiguration\n"}}
	table.Set("node-a", assignment.State{Assignment: a})
	table.Set("node-b", assignment.State{Assignment: a})

	// A sidecar connected before the flood: authenticated, so outside the cap the flood fills.
	stream, err := watch(t, addr, pool, "node-b")
	if err != nil {
		t.Fatalf("sidecar before the flood: %v", err)
	}
	poll.Until(t, "the sidecar's connection to count as authenticated", func() bool { return lis.unauth.Load() == 0 && lis.open.Load() == 1 })

	var held []net.Conn
	t.Cleanup(func() {
		for _, c := range held {
			c.Close()
		}
	})
	// First half the cap in silent TCP connections, then half in TLS clients holding calls, each kind
	// measured; then as many again of both, which the cap refuses.
	tlsRefused := 0
	open := func(n int, silent bool) {
		for i := range n {
			if silent {
				c, err := net.Dial("tcp", addr)
				if err != nil {
					t.Fatalf("dial %d: %v", i, err)
				}
				held = append(held, c)
				continue
			}
			c, err := holdCalls(addr, pool, cfg.MaxConcurrentStreams, cfg.MaxRecvMsgSizeKiB<<10)
			if err != nil {
				tlsRefused++ // closed at accept: the handshake gets EOF
				continue
			}
			held = append(held, c)
		}
	}
	// seen counts the flood's connections the listener has accepted: held unauthenticated, or refused.
	seen := func() int64 { return lis.unauth.Load() + int64(counterValue(t, lis)) }
	settle := func(n int64) {
		t.Helper()
		poll.UntilNil(t, fmt.Sprintf("the listener to see %d connections", n), func() error {
			if got := seen(); got < n {
				return fmt.Errorf("it saw %d", got)
			}
			return nil
		})
	}
	before := memory()
	open(floodCap/2, true)
	settle(floodCap / 2)
	silent := memory()
	open(floodCap/2, false)
	settle(floodCap)
	holding := memory()
	perSilent := float64(int64(silent.stack+silent.heap)-int64(before.stack+before.heap)) / (floodCap / 2)
	perHolding := float64(int64(holding.stack+holding.heap)-int64(silent.stack+silent.heap)) / (floodCap / 2)
	t.Logf("per connection: silent TCP %.0f B (budget %d), TLS holding %d calls %.0f B (budget %d); heap and stacks, the test's client side included",
		perSilent, silentConnBudget, cfg.MaxConcurrentStreams, perHolding, holdingConnBudget)
	if perSilent > silentConnBudget || perHolding > holdingConnBudget {
		t.Errorf("a held connection costs more than its budget: what grpc-go or dkc holds before auth grew (a larger --max-recv-msg-size-kib or --max-concurrent-streams default, say)")
	}
	open((floodConns-floodCap)/2, true)
	open((floodConns-floodCap)/2, false)
	// The listener accepts what the kernel queued; wait until it has seen every connection.
	settle(floodConns)
	after := memory()
	nheld, refused := lis.unauth.Load(), counterValue(t, lis)
	grown := int64(after.stack+after.heap) - int64(before.stack+before.heap)
	bound := int64(floodCap/2) * (silentConnBudget + holdingConnBudget)
	t.Logf("%d connections: %d held, %.0f closed at accept (%d of them TLS clients); heap + stacks grew %.1f MiB (bound %.1f MiB); %d goroutines more",
		floodConns, nheld, refused, tlsRefused, float64(grown)/(1<<20), float64(bound)/(1<<20), after.goroutines-before.goroutines)
	if nheld != floodCap {
		t.Errorf("%d unauthenticated connections held, want the cap, %d", nheld, floodCap)
	}
	if open := lis.open.Load(); open != floodCap+1 {
		t.Errorf("%d connections open, want the cap and the sidecar's, %d", open, floodCap+1)
	}
	if testutil.ToFloat64(lis.refused) != 0 {
		t.Errorf("%.0f connections refused by --max-connections, want every refusal by the unauthenticated cap", testutil.ToFloat64(lis.refused))
	}
	if int(refused) != floodConns-floodCap {
		t.Errorf("%d connections closed at accept, want %d", int(refused), floodConns-floodCap)
	}
	if grown > bound {
		t.Errorf("heap and stacks grew %d B with the flood, over the bound of %d B: the connections past the cap cost something", grown, bound)
	}

	// The sidecar connected before kept its stream; while the cap is full a new one is refused like anyone
	// else; once the flood is gone it gets through.
	if err := stream.Context().Err(); err != nil {
		t.Errorf("the connected sidecar's stream ended during the flood: %v", err)
	}
	if err := watchOnce(addr, pool, "node-a", 2*time.Second); err == nil {
		t.Error("a client got a stream while the cap was full")
	}
	for _, c := range held {
		c.Close()
	}
	held = nil
	poll.UntilNil(t, "the flood's connections to be closed", func() error {
		if open := lis.open.Load() - 1; open > 0 {
			return fmt.Errorf("%d still open", open)
		}
		return nil
	})
	if err := watchOnce(addr, pool, "node-a", 10*time.Second); err != nil {
		t.Fatalf("authenticated client after the flood: %v", err)
	}
}

// TestHandshakeTimeoutClosesSilentConnections: a connection that never starts its TLS handshake is closed
// after --handshake-timeout, and gives its place under the cap back.
func TestHandshakeTimeoutClosesSilentConnections(t *testing.T) {
	_, cert := servingPair(t)
	cfg := DefaultConfig()
	cfg.HandshakeTimeout = 200 * time.Millisecond
	lis := newConnLimiter(connLimits{max: 10}, nil)
	addr := serveTLS(t, cfg, cert, grpcParts{authn: auth.New(auth.Config{Allowed: cfg.AllowedServiceAccounts, TTL: time.Minute}),
		svc: rpc.New(rpc.Config{Log: zap.NewNop(), Table: assignment.NewTable(nil)}), health: health.NewServer(), conns: lis})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) && !strings.Contains(fmtErr(err), "reset") {
		t.Fatalf("silent connection: read %v, want it closed by the server", err)
	}
	poll.Until(t, "the closed connection to be counted no more", func() bool { return lis.open.Load() == 0 })
}

// TestAuthenticationTimeoutClosesUnauthenticatedConnections: a TLS client whose calls carry no valid token
// is closed after --authentication-timeout and gives its place back; a sidecar whose stream authenticated
// outlives it.
func TestAuthenticationTimeoutClosesUnauthenticatedConnections(t *testing.T) {
	pool, cert := servingPair(t)
	cfg := DefaultConfig()
	cfg.AuthenticationTimeout = 300 * time.Millisecond
	table := assignment.NewTable(nil)
	table.Set("node-a", assignment.State{Assignment: &dkcv1.Assignment{Source: &dkcv1.NodeConfigSource{ConfigMap: &dkcv1.ConfigMapNodeConfigSource{
		Namespace: "kube-system", Name: "c", Uid: "u", ResourceVersion: "1", KubeletConfigKey: "kubelet"}}, ContentHash: "h1",
		Files: map[string]string{"kubelet": "kind: KubeletConfiguration\n"}}})
	lis := newConnLimiter(connLimits{max: 10, maxUnauthenticated: 5, authTimeout: cfg.AuthenticationTimeout}, nil)
	addr := serveTLS(t, cfg, cert, grpcParts{authn: auth.New(auth.Config{Client: tokenReviews(), Allowed: cfg.AllowedServiceAccounts, TTL: time.Minute}),
		svc: rpc.New(rpc.Config{Log: zap.NewNop(), Table: table, Streams: rpc.NewStreams()}), health: health.NewServer(), conns: lis})

	stream, err := watch(t, addr, pool, "node-a")
	if err != nil {
		t.Fatalf("sidecar: %v", err)
	}
	c, err := holdCalls(addr, pool, 1, 1<<10)
	if err != nil {
		t.Fatalf("unauthenticated client: %v", err)
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.Copy(io.Discard, c); err != nil && !strings.Contains(err.Error(), "reset") {
		t.Fatalf("unauthenticated client: read %v, want its connection closed by the server", err)
	}
	poll.Until(t, "the unauthenticated connection to give its place back", func() bool { return lis.unauth.Load() == 0 && lis.open.Load() == 1 })
	if got := testutil.ToFloat64(lis.unauthExpired); got != 1 {
		t.Errorf("%.0f connections expired, want 1", got)
	}
	time.Sleep(3 * cfg.AuthenticationTimeout) // proves a negative: the authenticated stream outlives the timeout
	if err := stream.Context().Err(); err != nil {
		t.Errorf("the sidecar's authenticated stream ended: %v", err)
	}
	if lis.open.Load() != 1 {
		t.Errorf("%d connections open, want the sidecar's", lis.open.Load())
	}
}

// tokenReviews is an apiserver's TokenReview API for testToken's tokens: the node a token names, as a
// sidecar's ServiceAccount token bound to its node; a token naming none is refused.
func tokenReviews() *fake.Clientset {
	reviews := fake.NewClientset()
	reviews.PrependReactor("create", "tokenreviews", func(a k8stesting.Action) (bool, k8sruntime.Object, error) {
		tr := a.(k8stesting.CreateAction).GetObject().(*authenticationv1.TokenReview).DeepCopy()
		var node string
		_ = json.Unmarshal(tokenPayload(tr.Spec.Token), &struct {
			Node *string `json:"node"`
		}{&node})
		if node == "" {
			tr.Status = authenticationv1.TokenReviewStatus{Error: "invalid token"}
			return true, tr, nil
		}
		tr.Status = authenticationv1.TokenReviewStatus{Authenticated: true, Audiences: []string{auth.Audience},
			User: authenticationv1.UserInfo{Username: "system:serviceaccount:kube-system:dkc-sidecar",
				Extra: map[string]authenticationv1.ExtraValue{auth.NodeNameExtra: {node}}}}
		return true, tr, nil
	})
	return reviews
}

// serveTLS serves newGRPCServer(cfg, parts) with TLS 1.3 and cert on a loopback port behind parts.conns,
// stopped when the test ends, and returns its address.
func serveTLS(t *testing.T, cfg Config, cert tls.Certificate, parts grpcParts) string {
	t.Helper()
	parts.creds = credentials.NewTLS(serverTLSConfig(func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return &cert, nil }).Clone())
	srv := newGRPCServer(cfg, zap.NewNop(), parts)
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(parts.conns.wrap(tcp)) }()
	t.Cleanup(srv.Stop)
	return tcp.Addr().String()
}

// watch opens a WatchConfig stream for node with its token and waits for its first message; the stream
// stays open until the test ends.
func watch(t *testing.T, addr string, pool *x509.CertPool, node string) (dkcv1.ConfigService_WatchConfigClient, error) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13})))
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+testToken(node))
	stream, err := dkcv1.NewConfigServiceClient(conn).WatchConfig(ctx, &dkcv1.WatchConfigRequest{NodeName: node})
	if err != nil {
		return nil, err
	}
	if _, err := stream.Recv(); err != nil {
		return nil, err
	}
	return stream, nil
}

func fmtErr(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func counterValue(t *testing.T, l *connLimiter) float64 {
	t.Helper()
	return testutil.ToFloat64(l.refused) + testutil.ToFloat64(l.unauthRefused)
}

// holdCalls opens a TLS connection to addr, then streams ReportStatus calls with a garbage token, each with
// the gRPC prefix of a request of msgSize bytes and 15 KiB of it (within HTTP/2's initial windows without
// reading a frame); it returns the connection, left open. An error means the connection was refused.
func holdCalls(addr string, pool *x509.CertPool, streams, msgSize int) (net.Conn, error) {
	c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13, NextProtos: []string{"h2"}})
	if err != nil {
		return nil, err
	}
	fail := func(err error) (net.Conn, error) { c.Close(); return nil, err }
	if _, err := c.Write([]byte(http2.ClientPreface)); err != nil {
		return fail(err)
	}
	fr := http2.NewFramer(c, c)
	if err := fr.WriteSettings(); err != nil {
		return fail(err)
	}
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	const sent = 15 << 10
	data := make([]byte, 5+sent)
	binary.BigEndian.PutUint32(data[1:5], uint32(msgSize))
	for i := range streams {
		block.Reset()
		for _, f := range []hpack.HeaderField{{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "https"},
			{Name: ":path", Value: dkcv1.ConfigService_ReportStatus_FullMethodName}, {Name: ":authority", Value: "dkc-server"},
			{Name: "content-type", Value: "application/grpc"}, {Name: "te", Value: "trailers"},
			{Name: "authorization", Value: "Bearer garbage"}} {
			if err := enc.WriteField(f); err != nil {
				return fail(err)
			}
		}
		id := uint32(2*i + 1)
		if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block.Bytes(), EndHeaders: true}); err != nil {
			return fail(err)
		}
		for off := 0; off < len(data); off += 8 << 10 {
			if err := fr.WriteData(id, false, data[off:min(off+8<<10, len(data))]); err != nil {
				return fail(err)
			}
		}
	}
	return c, nil
}

// watchOnce opens a WatchConfig stream for node with its token and waits for its first message.
func watchOnce(addr string, pool *x509.CertPool, node string, timeout time.Duration) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13})))
	if err != nil {
		return err
	}
	defer conn.Close()
	return watchWithin(conn, node, timeout)
}
