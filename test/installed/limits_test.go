// SPDX-License-Identifier: Apache-2.0

//go:build integration

package installed

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/dkc-dev/dkc/internal/poll"
	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
)

// floodConnCap is the --max-connections the flood test runs dkc-server with: one node's token could fill
// it with few connections if nothing capped that node. The default (1,024 at least) would take thousands
// of connections through the host's forwarder to fill, to the same end.
const floodConnCap = 24

// capsOff are the flags that turn off the caps a valid token does not lift: dkc-server as it was before
// them. The control round runs with them, to show that the flood would lock other nodes out.
var capsOff = []string{"--max-connections-per-node=0", "--max-connections-per-address=0", "--new-connections-per-address-qps=0",
	"--status-reports-per-node-qps=0"}

// TestFloodWithOneNodesTokenLeavesOtherNodesConnected: root on node-1 holds its sidecar's token
// (nodes/node-1/token, CONTRACT §6) and uses it from elsewhere (the host, through DKC_SERVER): it reports
// status as fast as it is answered, connects and closes in a loop, and keeps 60 connections open, each
// authenticated with node-1's token and holding a call, against dkc-server run with --max-connections
// floodConnCap. node-2's sidecar keeps its stream; a new node-2 sidecar (its pod deleted) connects, and an
// assignment to node-2 becomes active, all during the flood; the flood is refused past the caps, and the
// refusals are counted in dkc-server's metrics. A control round first runs the same flood with those caps
// off: then it fills --max-connections and the new node-2 sidecar cannot connect.
func TestFloodWithOneNodesTokenLeavesOtherNodesConnected(t *testing.T) {
	resetAfter(t)
	env := readEnvFile(t, cluster.EnvPath())
	token, err := os.ReadFile(cluster.NodeTokenPath("node-1"))
	if err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(env["DKC_SERVER_CA"])
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		t.Fatalf("DKC_SERVER_CA %s holds no certificate", env["DKC_SERVER_CA"])
	}
	f := flooder{addr: env["DKC_SERVER"], pool: pool, token: strings.TrimSpace(string(token))}
	d, err := admin(t).AppsV1().Deployments("kube-system").Get(ctxFor(t), "dkc-server", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	args := d.Spec.Template.Spec.Containers[0].Args
	t.Cleanup(func() { restartServerWith(t, args) })

	t.Run("control: caps off", func(t *testing.T) {
		restartServerWith(t, append(slices.Clone(args), append([]string{fmt.Sprintf("--max-connections=%d", floodConnCap)}, capsOff...)...))
		stop := f.hold(60)
		defer stop()
		waitFloodHeld(t, &f, 2*floodConnCap-4)
		pod := replaceSidecar(t, "node-2", false)
		// Once its new pod runs, the sidecar retries within 3 s, and is Ready once its stream is open; a
		// minute without a stream is the lockout.
		for end := time.Now().Add(time.Minute); time.Now().Before(end); time.Sleep(2 * time.Second) {
			p, err := admin(t).CoreV1().Pods("kube-system").Get(ctxFor(t), pod, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := servingPod(t, serverPods(t), "node-2"); ok || ready(p) {
				t.Fatalf("with the caps off, node-2's new sidecar connected through a flood of %d connections: the flood "+
					"does not fill --max-connections, so the round with the caps proves nothing", f.held.Load())
			}
		}
		t.Logf("caps off: the flood holds %d connections; node-2's new sidecar had no stream for a minute", f.held.Load())
	})

	t.Run("caps on", func(t *testing.T) {
		restartServerWith(t, append(slices.Clone(args), fmt.Sprintf("--max-connections=%d", floodConnCap)))
		waitServing(t, "node-1") // connected before its token is copied: what the flood may disturb is node-1's
		waitServing(t, "node-2")
		f.exhausted.Store(0)
		// Status reports on one connection, as fast as they are answered: a request without a status, which
		// the handler refuses unwritten, so that only the rate decides what else comes back.
		limited := f.reports(t, 60)
		// A connect/close loop: TLS handshakes, nothing else.
		refusedHandshakes := f.connectLoop(200)
		reconnects := sidecarLogLines(t, "node-2", "", "config stream ended; reconnecting")
		stop := f.hold(60)
		defer stop()
		time.Sleep(20 * time.Second) // the flood reaches every cap and the refused connections are reopened
		if got := sidecarLogLines(t, "node-2", "", "config stream ended; reconnecting"); got != reconnects {
			t.Errorf("node-2's sidecar reconnected %d times during the flood; its stream must not be dropped", got-reconnects)
		}
		replaceSidecar(t, "node-2", true) // Ready: its stream is open
		waitServing(t, "node-2")
		cm := createConfig(t, "installed-flood-node-2", "node-2", 61)
		assign(t, "node-2", cm)
		waitRunning(t, "node-2", cm, 3*time.Minute)

		t.Logf("flood: %d status reports rate limited, %d of 200 handshakes refused, %d connections held, %d calls refused as "+
			"past the node's cap", limited, refusedHandshakes, f.held.Load(), f.exhausted.Load())
		if limited == 0 {
			t.Error("no status report of the flood was rate limited")
		}
		if refusedHandshakes == 0 {
			t.Error("no connection of the connect/close loop was refused")
		}
		if f.exhausted.Load() == 0 {
			t.Error("no connection of the flood was refused as past node-1's cap")
		}
		reader := serviceAccountToken(t, ctxFor(t), "limits-test-metrics-reader", "dkc-metrics-reader")
		for _, m := range []string{"dkc_server_node_connections_refused_total", "dkc_server_connections_rate_limited_total",
			"dkc_server_status_reports_rate_limited_total"} {
			if v := serverMetric(t, reader, m); v == 0 {
				t.Errorf("%s = 0 summed over the replicas, want the flood counted", m)
			}
		}
	})
}

// restartServerWith rolls dkc-server out with args as its arguments, and waits for both replicas.
func restartServerWith(t *testing.T, args []string) {
	t.Helper()
	patch, err := json.Marshal([]map[string]any{{"op": "replace", "path": "/spec/template/spec/containers/0/args", "value": args}})
	if err != nil {
		t.Fatal(err)
	}
	if out, err := kubectl(t, "-n", "kube-system", "patch", "deployment/dkc-server", "--type=json", "-p", string(patch)); err != nil {
		t.Fatalf("patch: %v\n%s", err, out)
	}
	waitRolledOut(t, "deployment/dkc-server")
	waitServerSettled(t)
}

// waitServing waits until node has a stream on a dkc-server replica.
func waitServing(t *testing.T, node string) {
	t.Helper()
	poll.For(t, 2*time.Minute, time.Second, node+" to have a stream on a dkc-server replica", func() bool {
		_, ok := servingPod(t, serverPods(t), node)
		return ok
	})
}

// waitFloodHeld waits until the flood holds n authenticated connections.
func waitFloodHeld(t *testing.T, f *flooder, n int64) {
	t.Helper()
	poll.ForNil(t, 2*time.Minute, time.Second, fmt.Sprintf("the flood to hold %d authenticated connections", n), func() error {
		if held := f.held.Load(); held < n {
			return fmt.Errorf("it holds %d", held)
		}
		return nil
	})
}

// replaceSidecar deletes node's dkc-sidecar pod and waits for the DaemonSet's new one to run (and to be
// Ready, its stream open, if wantReady); it returns the new pod's name.
func replaceSidecar(t *testing.T, node string, wantReady bool) string {
	t.Helper()
	pod := sidecarPod(t, node)
	if err := admin(t).CoreV1().Pods("kube-system").Delete(ctxFor(t), pod, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete %s: %v", pod, err)
	}
	var replaced string
	poll.For(t, 2*time.Minute, time.Second, fmt.Sprintf("a new dkc-sidecar pod ready on %s after deleting %s", node, pod), func() bool {
		pods, err := admin(t).CoreV1().Pods("kube-system").List(ctxFor(t), metav1.ListOptions{
			LabelSelector: "app.kubernetes.io/name=dkc-sidecar", FieldSelector: "spec.nodeName=" + node})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pods.Items {
			if p.Name != pod && p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning && (!wantReady || ready(&p)) {
				replaced = p.Name
				return true
			}
		}
		return false
	})
	return replaced
}

// serverMetric sums a counter over the dkc-server pods' /metrics, read through the apiserver's pod proxy.
func serverMetric(t *testing.T, token, name string) float64 {
	t.Helper()
	total := 0.0
	for _, p := range serverPods(t) {
		// Metrics are served over HTTPS to a token allowed get /metrics (TestMetricsNeedAToken); the host
		// routes to pod IPs. RBAC may take a moment to reach the authorizer's cache: retry a refusal.
		url := "https://" + net.JoinHostPort(p.Status.PodIP, strconv.Itoa(serverMetricsPort)) + "/metrics"
		var raw string
		err := wait.PollUntilContextTimeout(ctxFor(t), time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
			code, body, err := scrape(ctx, url, token)
			if err != nil || code != http.StatusOK {
				return false, nil
			}
			raw = body
			return true, nil
		})
		if err != nil {
			t.Fatalf("metrics of %s (%s): %v", p.Name, url, err)
		}
		sc := bufio.NewScanner(strings.NewReader(raw))
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
				f, _ := strconv.ParseFloat(v, 64)
				total += f
			}
		}
	}
	return total
}

// flooder is a second client holding node-1's token, reaching dkc-server as the host reaches it.
type flooder struct {
	addr  string
	pool  *x509.CertPool
	token string

	held      atomic.Int64 // connections open on which node-1's token authenticated
	exhausted atomic.Int64 // calls refused as past node-1's connection cap
}

func (f *flooder) dial() (*grpc.ClientConn, error) {
	return grpc.NewClient(f.addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: f.pool, MinVersion: tls.VersionTLS13})))
}

func (f *flooder) authed(ctx context.Context) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+f.token)
}

// reports sends n status reports of node-1 on one connection, one after the other, and returns how many
// were refused as past node-1's rate.
func (f *flooder) reports(t *testing.T, n int) int {
	t.Helper()
	conn, err := f.dial()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	limited := 0
	for range n {
		ctx, cancel := context.WithTimeout(f.authed(context.Background()), 30*time.Second)
		_, err := dkcv1.NewConfigServiceClient(conn).ReportStatus(ctx, &dkcv1.ReportStatusRequest{NodeName: "node-1"})
		cancel()
		switch {
		case status.Code(err) == codes.ResourceExhausted && strings.Contains(err.Error(), "reports status faster"):
			limited++
		case status.Code(err) == codes.InvalidArgument: // taken, and refused unwritten: no status
		default:
			t.Fatalf("status report with node-1's token: %v", err)
		}
	}
	return limited
}

// connectLoop opens n TLS connections one after the other, closing each once its handshake is done, and
// returns how many were refused.
func (f *flooder) connectLoop(n int) int {
	refused := 0
	d := tls.Dialer{Config: &tls.Config{RootCAs: f.pool, MinVersion: tls.VersionTLS13, NextProtos: []string{"h2"}}}
	for range n {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		c, err := d.DialContext(ctx, "tcp", f.addr)
		cancel()
		if err != nil {
			refused++
			continue
		}
		c.Close()
	}
	return refused
}

// hold keeps n connections open until the returned stop is called, each authenticated with node-1's token
// (a status report for node-2: authenticated, then refused by the handler) and holding a health stream so
// that it is never idle; a connection that is refused or closed is opened again at once.
func (f *flooder) hold(n int) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				f.holdOne(ctx)
				select {
				case <-ctx.Done():
				case <-time.After(500 * time.Millisecond):
				}
			}
		}()
	}
	return func() { cancel(); wg.Wait() }
}

func (f *flooder) holdOne(ctx context.Context) {
	conn, err := f.dial()
	if err != nil {
		return
	}
	defer conn.Close()
	cctx, cancel := context.WithTimeout(f.authed(ctx), 30*time.Second)
	_, err = dkcv1.NewConfigServiceClient(conn).ReportStatus(cctx, &dkcv1.ReportStatusRequest{NodeName: "node-2", Status: &dkcv1.NodeConfigStatus{}})
	cancel()
	switch status.Code(err) {
	case codes.PermissionDenied:
		f.held.Add(1)
		defer f.held.Add(-1)
	case codes.ResourceExhausted:
		f.exhausted.Add(1) // the connection stays, unauthenticated, until dkc-server closes it
	default:
		return
	}
	w, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return
	}
	for {
		if _, err := w.Recv(); err != nil {
			return
		}
	}
}
