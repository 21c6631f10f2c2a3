// SPDX-License-Identifier: Apache-2.0

//go:build integration

package installed

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"

	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
)

// TestContractPaths: CONTRACT §6's paths keep their meaning in the installed form. The env file names
// KUBECONFIG, DKC_SERVER (reachable from the host) and DKC_SERVER_CA; each node has its dynamic config dir
// and a sidecar credential in nodes/<N>/token. A client that knows only those — as a user's script or
// grpcurl would — verifies the server's certificate against DKC_SERVER_CA (no server-name override) and
// watches node-1's config with node-1's token, through every dkc-server replica in turn.
func TestContractPaths(t *testing.T) {
	diagnoseOnFailure(t)
	waitServerSettled(t)
	env := readEnvFile(t, cluster.EnvPath())
	for _, k := range []string{"KUBECONFIG", "DKC_SERVER", "DKC_SERVER_CA"} {
		if env[k] == "" {
			t.Fatalf("%s has no %s: %v", cluster.EnvPath(), k, env)
		}
	}
	for _, n := range []string{"node-1", "node-2"} {
		dir := filepath.Join(cluster.NodeDir(n), "dynamic-config")
		if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
			t.Errorf("%s: dynamic config dir %s: %v", n, dir, err)
		}
	}
	token, err := os.ReadFile(filepath.Join(cluster.NodeDir("node-1"), "token"))
	if err != nil || len(token) == 0 {
		t.Fatalf("node-1's token file: %v", err)
	}
	caPEM, err := os.ReadFile(env["DKC_SERVER_CA"])
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		t.Fatalf("DKC_SERVER_CA %s holds no certificate", env["DKC_SERVER_CA"])
	}
	// Several connections: the forwarder picks a ready replica for each, so both are reached.
	for i := range 4 {
		conn, err := grpc.NewClient(env["DKC_SERVER"], grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12})))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(ctxFor(t), "authorization", "Bearer "+strings.TrimSpace(string(token))), 30*time.Second)
		stream, err := dkcv1.NewConfigServiceClient(conn).WatchConfig(ctx, &dkcv1.WatchConfigRequest{NodeName: "node-1"})
		var msg *dkcv1.WatchConfigResponse
		if err == nil {
			msg, err = stream.Recv()
		}
		cancel()
		conn.Close()
		if err != nil {
			t.Fatalf("connection %d: WatchConfig as node-1 through DKC_SERVER=%s with DKC_SERVER_CA and nodes/node-1/token: %v", i, env["DKC_SERVER"], err)
		}
		if msg.GetResolvedTime() == nil {
			t.Errorf("connection %d: first WatchConfig message has no resolved time: %v", i, msg)
		}
	}
}

// readEnvFile parses the shell-sourceable env file: `export KEY=VALUE` lines.
func readEnvFile(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	env := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(strings.TrimPrefix(strings.TrimSpace(sc.Text()), "export "), "=")
		if ok {
			env[k] = v
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return env
}
