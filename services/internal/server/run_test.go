package server

import (
	"os"
	"path/filepath"
	"testing"

	"go.uber.org/zap"
)

// TestNewServerBuildsEveryPartWithoutContactingAnything: construction is pure wiring, in dependency order;
// nothing is dialled or listened on before Run, and every gauge reads a part that exists.
func TestNewServerBuildsEveryPartWithoutContactingAnything(t *testing.T) {
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "http://127.0.0.1:1"}}]
contexts: [{name: c, context: {cluster: c}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Kubeconfig, cfg.Insecure = kubeconfig, true
	s, err := newServer(cfg, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	families, err := s.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, f := range families {
		got[f.GetName()] = true
	}
	for _, name := range []string{"dkc_server_watched_configmaps", "dkc_server_resolved_nodes", "dkc_server_resolved_configs", "dkc_server_reported_nodes"} {
		if !got[name] {
			t.Errorf("gauge %s not registered", name)
		}
	}
	if s.svc.Serving("n1") {
		t.Error("a node is served before any stream opened")
	}
}
