// SPDX-License-Identifier: Apache-2.0

//go:build integration

package integration

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/dkc-dev/dkc/internal/poll"
	"github.com/dkc-dev/dkc/test/devcluster"
)

// metricAt reads one sample from the /metrics of the dkc-server at addr (0 when absent).
func metricAt(t *testing.T, addr, series string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var v float64
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, series+" ") {
			if _, err := fmt.Sscanf(strings.Fields(line)[1], "%g", &v); err != nil {
				t.Fatalf("%s: %v", line, err)
			}
		}
	}
	return v
}

// caVolume is a CA bundle file laid out as the kubelet lays out a ConfigMap volume (AtomicWriter): the
// content in a timestamped directory, ..data a symlink to it, ca.crt a symlink through ..data. An update
// writes a new directory, renames a new ..data over the old one and removes the old directory, as the
// kubelet does when the ConfigMap dkc-server-ca changes.
type caVolume struct {
	t   *testing.T
	dir string
	gen int
}

func (v *caVolume) file() string { return filepath.Join(v.dir, "ca.crt") }

func (v *caVolume) write(pems ...[]byte) {
	v.t.Helper()
	v.gen++
	ts := fmt.Sprintf("..%s.%d", time.Now().Format("2006_01_02_15_04_05"), v.gen)
	if err := os.MkdirAll(filepath.Join(v.dir, ts), 0o755); err != nil {
		v.t.Fatal(err)
	}
	var bundle []byte
	for _, p := range pems {
		bundle = append(bundle, p...)
	}
	if err := os.WriteFile(filepath.Join(v.dir, ts, "ca.crt"), bundle, 0o644); err != nil {
		v.t.Fatal(err)
	}
	old, _ := os.Readlink(filepath.Join(v.dir, "..data"))
	if err := os.Symlink(ts, filepath.Join(v.dir, "..data_tmp")); err != nil {
		v.t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(v.dir, "..data_tmp"), filepath.Join(v.dir, "..data")); err != nil {
		v.t.Fatal(err)
	}
	if _, err := os.Lstat(v.file()); os.IsNotExist(err) {
		if err := os.Symlink("..data/ca.crt", v.file()); err != nil {
			v.t.Fatal(err)
		}
	}
	if old != "" {
		if err := os.RemoveAll(filepath.Join(v.dir, old)); err != nil {
			v.t.Fatal(err)
		}
	}
}

// TestCARotationWithoutRestartingTheSidecar rotates the CA of dkc-server's certificate under a running
// sidecar of the real node, docs/security.md's procedure: the sidecar's CA bundle (a ConfigMap volume's layout,
// updated by symlink swap) gains the new CA; the server moves to a certificate of the new CA; the bundle
// drops the old CA. After each step the server restarts, so the sidecar must connect and verify it again.
// The sidecar is never restarted, keeps the node's stream and reports, and the kubelet is never restarted;
// a client that trusts only the old CA is refused by the rotated server (what a sidecar that read its CA
// only at start would be, and why this test fails on one).
//
// The server is a replica of the cluster's own (devcluster.ServiceReplica) with a CA and files of the
// test's, and node-1's sidecar runs for the test's duration as a transient unit pointed at it: the cluster
// CA, which every component trusts, is not touched.
func TestCARotationWithoutRestartingTheSidecar(t *testing.T) {
	ctx := testContext(t)
	client := adminClient(t)
	resetRealNode(t)
	t.Cleanup(func() { resetRealNode(t) })

	// Inside the cluster's directory: the node sees it at the same path.
	dir := filepath.Join(cluster.Dir(), "rotation")
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "ca"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	oldCA, err := devcluster.NewCA("dkc-ca-old")
	if err != nil {
		t.Fatal(err)
	}
	newCA, err := devcluster.NewCA("dkc-ca-new")
	if err != nil {
		t.Fatal(err)
	}
	ips := []net.IP{net.ParseIP(cluster.State().Network.GatewayIP)}
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := oldCA.IssueServing(certFile, keyFile, ips, nil); err != nil {
		t.Fatal(err)
	}
	bundle := &caVolume{t: t, dir: filepath.Join(dir, "ca")}
	bundle.write(oldCA.PEM())

	server, err := cluster.StartServiceReplica(ctx, "rotation", "--tls-cert-file="+certFile, "--tls-key-file="+keyFile)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := server.Stop(); err != nil {
			t.Error(err)
		}
	})
	sidecar, err := cluster.RunSidecarUnit(ctx, realNode, "dkc-sidecar-rotation.service",
		map[string]string{"server": server.Address(), "server-ca-file": bundle.file()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sidecar.Restore(context.Background()); err != nil {
			t.Errorf("put dkc-sidecar.service back on %s: %v", realNode, err)
		}
	})

	// streaming waits until the server (this process of it) has the node's stream. Not its report: a node
	// with nothing new to say may have reported to the process before the restart, during its graceful
	// stop; the reset at the end shows reports going through the rotated connection.
	streaming := func(step string) {
		t.Helper()
		poll.For(t, 30*time.Second, 200*time.Millisecond, fmt.Sprintf("%s: node %s streaming to the server (sidecar log %s, server log %s)",
			step, realNode, sidecar.LogFile(), server.LogFile()), func() bool {
			return metricAt(t, server.MetricsAddress(), "dkc_server_connected_nodes") == 1
		})
		if c := configOK(t, realNode); c.Status != corev1.ConditionTrue {
			t.Fatalf("%s: ConfigOK %s %q", step, c.Status, c.Message)
		}
	}
	streaming("before the rotation")

	// The node is assigned a config, through this server.
	cm := createConfigMap(t, "rotation-config", map[string]string{"kubelet": kubeletConfig(t, "eventRecordQPS: 9\n")})
	assigned := "rotation-config@" + cm.ResourceVersion
	setSource(t, client, realNode, cmSource(cm.Name))
	waitNodeStatus(t, realNode, assigned, assigned, "*", "", 2*time.Minute)
	kubelet := kubeletPID(t)
	sidecarPID, err := sidecar.MainPID(ctx)
	if err != nil || sidecarPID == 0 {
		t.Fatalf("sidecar unit's main PID: %d, %v", sidecarPID, err)
	}

	restart := func(step string) {
		t.Helper()
		if err := server.Restart(ctx); err != nil {
			t.Fatalf("%s: restart the server: %v", step, err)
		}
		streaming(step)
	}
	// 1. The bundle gains the new CA; the server still serves the old CA's certificate.
	bundle.write(oldCA.PEM(), newCA.PEM())
	restart("bundle of old and new CA, old certificate")
	// 2. The server moves to a certificate of the new CA.
	if err := newCA.IssueServing(certFile, keyFile, ips, nil); err != nil {
		t.Fatal(err)
	}
	restart("bundle of old and new CA, new certificate")
	// A sidecar still trusting only the old CA (one that read its bundle at start) could not reconnect.
	_, err = tls.Dial("tcp", server.Address(), &tls.Config{RootCAs: oldCA.Pool(), MinVersion: tls.VersionTLS13})
	if err == nil || !strings.Contains(err.Error(), "certificate signed by unknown authority") {
		t.Fatalf("a client trusting only the old CA: %v, want certificate signed by unknown authority", err)
	}
	// 3. The old CA leaves the bundle.
	bundle.write(newCA.PEM())
	restart("new CA only, new certificate")

	// Nothing was restarted on the node; its status is the same, and still written: a reset now goes
	// through the rotated connection end to end.
	if pid, err := sidecar.MainPID(ctx); err != nil || pid != sidecarPID {
		t.Errorf("sidecar main PID %d (%v), was %d: the sidecar was restarted", pid, err, sidecarPID)
	}
	if got := kubeletPID(t); got != kubelet {
		t.Errorf("kubelet PID %d, was %d: the rotation restarted the kubelet", got, kubelet)
	}
	waitNodeStatus(t, realNode, assigned, assigned, "*", "", 5*time.Second)
	setSource(t, client, realNode, "")
	waitNodeStatus(t, realNode, "local", "local", "local", "", time.Minute)
}
