// SPDX-License-Identifier: Apache-2.0

package app

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dkc-dev/dkc/internal/poll"
	"github.com/dkc-dev/dkc/sidecar/internal/uninstall"
)

// cleanNode is a node with nothing of dkc's on it, its kubelet (PID 1 in the test's proc directory) on its
// local config; healthy says whether that kubelet answers /healthz.
type cleanNode struct{ healthy bool }

func (cleanNode) Reload(context.Context) error                               { return nil }
func (cleanNode) Restart(context.Context) error                              { return nil }
func (cleanNode) MainPID(context.Context) (int, error)                       { return 1, nil }
func (cleanNode) LoadsEnvironmentFile(context.Context, string) (bool, error) { return false, nil }
func (n cleanNode) Healthz(context.Context, string) error {
	if !n.healthy {
		return errors.New("connection refused")
	}
	return nil
}

// TestUninstallReadiness: /readyz of the cleanup mode is 503, with the reason, until the node is clean,
// then 200; /healthz is 200 throughout.
func TestUninstallReadiness(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "1"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "1", "cmdline"), []byte("kubelet\x00--config="+filepath.Join(dir, "config.yaml")+"\x00"), 0o644); err != nil {
		t.Fatal(err)
	}
	get := func(mux http.Handler, path string) (int, string) {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		return rec.Code, rec.Body.String()
	}
	for _, tc := range []struct {
		healthy  bool
		wantCode int
		wantBody string
	}{
		{false, http.StatusServiceUnavailable, "dkc not removed from this node yet"},
		{true, http.StatusOK, "dkc removed from this node"},
	} {
		n := cleanNode{healthy: tc.healthy}
		c := uninstall.New(uninstall.Config{Unit: n, Kubelet: n, DynamicConfigDir: filepath.Join(dir, "dynamic-config"),
			KubeletConfig: filepath.Join(dir, "config.yaml"), DropIn: filepath.Join(dir, "20-dkc.conf"), ProcDir: dir,
			HealthTimeout: 10 * time.Millisecond, PollInterval: time.Millisecond, RetryInterval: time.Hour})
		mux := uninstallMux(c)
		if code, _ := get(mux, "/readyz"); code != http.StatusServiceUnavailable {
			t.Errorf("/readyz before the cleanup ran: %d", code)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- c.Run(ctx) }()
		poll.Until(t, "the cleanup to finish", func() bool { _, msg := c.Ready(); return msg != "cleanup not finished yet" })
		if code, body := get(mux, "/readyz"); code != tc.wantCode || !strings.Contains(body, tc.wantBody) {
			t.Errorf("healthy kubelet %v: /readyz %d %q, want %d %q", tc.healthy, code, body, tc.wantCode, tc.wantBody)
		}
		if code, _ := get(mux, "/healthz"); code != http.StatusOK {
			t.Errorf("/healthz %d", code)
		}
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run after SIGTERM: %v", err)
		}
	}
}
