// SPDX-License-Identifier: Apache-2.0

package app_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/dkc-dev/dkc/internal/configcheck"
	"github.com/dkc-dev/dkc/internal/kubeletcheck"
	"github.com/dkc-dev/dkc/internal/nodeconfig"

	"github.com/dkc-dev/dkc/internal/payload"
	"github.com/dkc-dev/dkc/internal/poll"
	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
	"github.com/dkc-dev/dkc/sidecar/app"
)

// rawCodec lets the malicious server send bytes no honest protobuf marshaller would produce.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) {
	if b, ok := v.([]byte); ok {
		return b, nil
	}
	return proto.Marshal(v.(proto.Message))
}
func (rawCodec) Unmarshal(data []byte, v any) error { return proto.Unmarshal(data, v.(proto.Message)) }
func (rawCodec) Name() string                       { return "proto" }

var _ encoding.Codec = rawCodec{}

// malicious is a config service that sends whatever it is told to.
type malicious struct {
	dkcv1.UnimplementedConfigServiceServer
	send    chan []byte
	mu      sync.Mutex
	reports []*dkcv1.ReportStatusRequest
	watches int
}

func (m *malicious) WatchConfig(_ *dkcv1.WatchConfigRequest, stream dkcv1.ConfigService_WatchConfigServer) error {
	m.mu.Lock()
	m.watches++
	m.mu.Unlock()
	for {
		select {
		case b := <-m.send:
			if err := stream.SendMsg(b); err != nil {
				return err
			}
		case <-stream.Context().Done():
			return nil
		}
	}
}

func (m *malicious) ReportStatus(_ context.Context, req *dkcv1.ReportStatusRequest) (*dkcv1.ReportStatusResponse, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.reports = append(m.reports, req)
	return &dkcv1.ReportStatusResponse{}, nil
}

func (m *malicious) lastMessage() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.reports) == 0 {
		return ""
	}
	return m.reports[len(m.reports)-1].GetMessage()
}

func (m *malicious) lastError() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.reports) == 0 {
		return "<none>"
	}
	return m.reports[len(m.reports)-1].GetStatus().GetError()
}

// steadyKubelet is a kubelet that is always healthy and runs whatever file it was last restarted into.
type steadyKubelet struct {
	mu       sync.Mutex
	restarts int
	file     string
}

func (k *steadyKubelet) Restart(context.Context) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.restarts++
	return nil
}
func (k *steadyKubelet) MainPID(context.Context) (int, error) { return 4242, nil }
func (k *steadyKubelet) Healthz(context.Context, *configcheck.Checked) error {
	return nil
}
func (k *steadyKubelet) Foreign(*configcheck.Checked) error { return nil }
func (k *steadyKubelet) Configz(ctx context.Context, _ *configcheck.Checked) (map[string]any, error) {
	r, err := kubeletcheck.Load(ctx, k.file, nil)
	if err != nil {
		return nil, err
	}
	return kubeletcheck.ToV1beta1JSON(r.Config)
}

func hostile(uid, rv string, files map[string]string, badHash bool) []byte {
	return hostileKey(uid, rv, "kubelet", files, badHash)
}

func hostileKey(uid, rv, key string, files map[string]string, badHash bool) []byte {
	src := &dkcv1.ConfigMapNodeConfigSource{Namespace: "kube-system", Name: "evil", Uid: uid, ResourceVersion: rv, KubeletConfigKey: key}
	h := payload.Hash(src, files)
	if badHash {
		h = "sha256:0000"
	}
	b, err := proto.Marshal(&dkcv1.WatchConfigResponse{Assignment: &dkcv1.Assignment{Source: &dkcv1.NodeConfigSource{ConfigMap: src}, Files: files, ContentHash: h}})
	if err != nil {
		panic(err)
	}
	return b
}

// nonUTF8 is a WatchConfigResponse whose file content is not UTF-8, encoded by hand.
func nonUTF8() []byte {
	var entry []byte
	entry = protowire.AppendTag(entry, 1, protowire.BytesType)
	entry = protowire.AppendString(entry, "kubelet")
	entry = protowire.AppendTag(entry, 2, protowire.BytesType)
	entry = protowire.AppendBytes(entry, []byte{0xff, 0xfe, 0xfd})
	var as []byte
	as = protowire.AppendTag(as, 2, protowire.BytesType)
	as = protowire.AppendBytes(as, entry)
	var resp []byte
	resp = protowire.AppendTag(resp, 1, protowire.BytesType)
	return protowire.AppendBytes(resp, as)
}

func TestMaliciousServer(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "dynamic-config")
	local := filepath.Join(root, "config.yaml")
	token := filepath.Join(root, "token")
	for p, c := range map[string]string{local: "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nfailCgroupV1: false\n", token: "t"} {
		if err := os.WriteFile(p, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	srv := &malicious{send: make(chan []byte)}
	lis := bufconn.Listen(64 << 20)
	gs := grpc.NewServer(grpc.ForceServerCodec(rawCodec{}))
	dkcv1.RegisterConfigServiceServer(gs, srv)
	go func() { _ = gs.Serve(lis) }()
	defer gs.Stop()
	conn, err := grpc.NewClient("passthrough:///evil", grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(8<<20)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	kubelet := &steadyKubelet{file: local}
	// The whole sidecar as the daemon builds it, with the node's kubelet and the network replaced.
	sc := app.New(app.Config{
		Conn: conn, ServiceManager: kubelet, Prober: kubelet, Checker: kubeletcheck.InProcess{}, KubeletArgs: []string{},
		NodeName: "n1", TokenFile: token, DynamicConfigDir: dir, KubeletConfig: local,
		TrialDuration: time.Hour, HealthTimeout: time.Second, HostProc: "/proc"})
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	go func() { stopped <- sc.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-stopped; err != nil {
			t.Errorf("sidecar: %v", err)
		}
	}()

	many := map[string]string{"kubelet": "x"}
	for i := 0; i < 5000; i++ {
		many[fmt.Sprintf("f%d", i)] = ""
	}
	const inject = "\t--authorization-mode=AlwaysAllow"
	cases := []struct {
		name string
		msg  []byte
	}{
		{"slash in a file name", hostile("u", "1", map[string]string{"kubelet": "x", "a/b": "x"}, false)},
		{"dot-dot file name", hostile("u", "2", map[string]string{"kubelet": "x", "..": "x"}, false)},
		{"absolute file name", hostile("u", "3", map[string]string{"/etc/cron.d/evil": "x"}, false)},
		{"NUL in a file name", hostile("u", "4", map[string]string{"a\x00b": "x"}, false)},
		{"3 MiB payload", hostile("u", "5", map[string]string{"kubelet": strings.Repeat("x", 3<<20)}, false)},
		{"5000 files", hostile("u", "6", many, false)},
		{"uid traversal", hostile("../../..", "7", map[string]string{"kubelet": "x"}, false)},
		{"resourceVersion traversal", hostile("u", "..", map[string]string{"kubelet": "x"}, false)},
		{"wrong content hash", hostile("u", "8", map[string]string{"kubelet": "x"}, true)},
		// A tab splits the kubelet's --config flag in two (systemd splits $KUBELET_CONFIG_ARGS on it).
		{"tab in kubeletConfigKey", hostileKey("u", "9", "kubelet"+inject, map[string]string{"kubelet" + inject: "x"}, false)},
		{"tab in uid", hostile("u"+inject, "10", map[string]string{"kubelet": "x"}, false)},
		{"tab in resourceVersion", hostile("u", "11"+inject, map[string]string{"kubelet": "x"}, false)},
	}
	for _, tc := range cases {
		srv.send <- tc.msg
		poll.UntilNil(t, tc.name+": a status with the payload error", func() error {
			if got := srv.lastError(); got != string(nodeconfig.PayloadError) {
				return fmt.Errorf("status error %q", got)
			}
			return nil
		})
		if !strings.Contains(srv.lastMessage(), "refuse payload") {
			t.Errorf("%s: status message does not say why: %q", tc.name, srv.lastMessage())
		}
		// Clear the error with a valid local assignment before the next case.
		clear, _ := proto.Marshal(&dkcv1.WatchConfigResponse{Assignment: &dkcv1.Assignment{}})
		srv.send <- clear
		poll.UntilNil(t, tc.name+": the error cleared", func() error {
			if got := srv.lastError(); got != "" {
				return fmt.Errorf("status error %q", got)
			}
			return nil
		})
	}

	// Bytes that are not valid protobuf for the schema (a non-UTF-8 string) are refused by gRPC itself: the
	// stream ends with an error, the client reconnects, and nothing changes on the node.
	srv.mu.Lock()
	watches := srv.watches
	srv.mu.Unlock()
	srv.send <- nonUTF8()
	poll.Until(t, "the client to reconnect after an undecodable message", func() bool {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		return srv.watches > watches
	})

	if kubelet.restarts != 0 {
		t.Errorf("hostile payloads restarted the kubelet %d times", kubelet.restarts)
	}
	entries, _ := os.ReadDir(root)
	for _, e := range entries {
		if e.Name() != "dynamic-config" && e.Name() != "config.yaml" && e.Name() != "token" {
			t.Errorf("written outside the dynamic config dir: %s", e.Name())
		}
	}
	cps, _ := os.ReadDir(filepath.Join(dir, "checkpoints"))
	if len(cps) != 0 {
		t.Errorf("hostile payloads left checkpoints: %v", cps)
	}
}
