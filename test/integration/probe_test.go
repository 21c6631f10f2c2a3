// SPDX-License-Identifier: Apache-2.0

//go:build integration

package integration

import (
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dkc-dev/dkc/internal/nodeconfig"
	"github.com/dkc-dev/dkc/test/devcluster/devclustertest"
)

// tokenTrap is an HTTPS server that records every connection and every Authorization header it is sent.
type tokenTrap struct {
	*httptest.Server
	mu     sync.Mutex
	conns  int
	tokens []string
}

func newTokenTrap(t *testing.T, host string) *tokenTrap {
	t.Helper()
	trap := &tokenTrap{}
	trap.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		trap.mu.Lock()
		trap.tokens = append(trap.tokens, r.Header.Get("Authorization"))
		trap.mu.Unlock()
		http.Error(w, "not a kubelet", http.StatusServiceUnavailable)
	}))
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	trap.Listener = l
	trap.Config.ErrorLog = log.New(io.Discard, "", 0)
	trap.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			trap.mu.Lock()
			trap.conns++
			trap.mu.Unlock()
		}
	}
	trap.StartTLS()
	t.Cleanup(trap.Close)
	return trap
}

func (trap *tokenTrap) seen() (int, []string) {
	trap.mu.Lock()
	defer trap.mu.Unlock()
	return trap.conns, append([]string(nil), trap.tokens...)
}

// withFields is node's local kubelet config with the given top-level fields replaced (or added).
func withFields(t *testing.T, node string, fields map[string]string) string {
	t.Helper()
	local, err := os.ReadFile(cluster.KubeletConfigPath(node))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(strings.TrimRight(string(local), "\n"), "\n") {
		key, _, _ := strings.Cut(line, ":")
		if _, ok := fields[key]; ok && !strings.HasPrefix(line, " ") {
			continue
		}
		out = append(out, line)
	}
	for key, value := range fields {
		out = append(out, key+": "+value)
	}
	return strings.Join(out, "\n") + "\n"
}

// TestConfigPointingTheKubeletOffTheNodeGetsNoToken: a ConfigMap author sets the kubelet's `address` to an
// address that is not the real node's — the host's address on the cluster bridge, which the node reaches
// (its apiserver listens there) and where this test listens with TLS. healthzPort 0 leaves /configz the only
// signal, so the sidecar goes straight to it after the restart. The token must never arrive there (no
// connection at all), and the config, on which the kubelet cannot listen on this node, is rolled back with
// a status that says why.
func TestConfigPointingTheKubeletOffTheNodeGetsNoToken(t *testing.T) {
	client := adminClient(t)
	resetRealNode(t)
	t.Cleanup(func() { resetRealNode(t) })

	gateway := cluster.State().Network.GatewayIP
	trap := newTokenTrap(t, gateway)
	port := trap.Listener.Addr().(*net.TCPAddr).Port
	createConfigMap(t, "probe-foreign", map[string]string{"kubelet": withFields(t, realNode, map[string]string{
		"address": gateway, "port": fmt.Sprint(port), "healthzPort": "0"})})
	setSource(t, client, realNode, cmSource("probe-foreign"))
	waitNodeStatus(t, realNode, "probe-foreign@"+mustRV(t, "probe-foreign"), "local", "local", string(nodeconfig.HealthError),
		devclustertest.HealthTimeout+2*time.Minute)

	if conns, tokens := trap.seen(); conns != 0 || len(tokens) != 0 {
		withToken := 0
		for _, tok := range tokens {
			if tok != "" {
				withToken++
			}
		}
		t.Errorf("the sidecar connected %d times to %s:%d, which is not the node's, and sent %d requests, %d with an Authorization header; want no connection",
			conns, gateway, port, len(tokens), withToken)
	}
	cond := configOK(t, realNode)
	for _, want := range []string{"address " + gateway, "neither loopback nor an address of this node's interfaces"} {
		if !strings.Contains(cond.Message, want) {
			t.Errorf("ConfigOK message %q does not say %q", cond.Message, want)
		}
	}
	// The node runs its local config again, proven through /configz with the pinned certificate.
	resetRealNode(t)
	if conns, _ := trap.seen(); conns != 0 {
		t.Errorf("the sidecar connected %d times to %s:%d", conns, gateway, port)
	}
}
