// SPDX-License-Identifier: Apache-2.0

package probe

import (
	"context"
	"encoding/pem"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/dkc-dev/dkc/internal/configcheck"
)

// TestConfigzErrorsSayWhatTheyProve: the agent blames a config only for a /configz failure that says
// something about it. A refusal (401/403) and a request the kubelet took but did not answer in time
// (its authentication webhook waiting on an unreachable apiserver) say nothing; no kubelet listening, a
// server error, or a hanging /healthz are failures.
func TestConfigzErrorsSayWhatTheyProve(t *testing.T) {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Query().Get("as") {
		case "refuse":
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
		case "hang":
			select {
			case <-release:
			case <-r.Context().Done():
				// The client gave up: a kubelet that hangs never answers, so no response (not an empty 200) is
				// written after it either.
				panic(http.ErrAbortHandler)
			}
		case "fail":
			http.Error(w, "boom", http.StatusInternalServerError)
		default:
			_, _ = w.Write([]byte(`{"kubeletconfig":{"eventRecordQPS":7}}`))
		}
	}))
	t.Cleanup(srv.Close)
	u, err := url.Parse(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	port, _ := strconv.Atoi(u.Port())
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedPort := closed.Addr().(*net.TCPAddr).Port
	closed.Close()

	token := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(token, []byte("t"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The test server's certificate is the kubelet's (its tlsCertFile): the token goes only to it.
	certFile := filepath.Join(t.TempDir(), "kubelet.crt")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	fields := map[string]any{"tlsCertFile": certFile}
	// The "hang" row waits this long; the others must answer within it under CI's load too (a run at 1da9870,
	// beside two clusters and -race, took over 300 ms for a TLS handshake on loopback).
	k, err := New(Config{TokenFile: token, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		as           string
		port         int
		want         error // nil: no error
		unverifiable bool
	}{
		{as: "ok", port: port},
		{as: "refuse", port: port, want: ErrRefused, unverifiable: true},
		{as: "hang", port: port, want: ErrNoAnswer, unverifiable: true},
		{as: "fail", port: port},
		{as: "nobody listening", port: closedPort},
	} {
		t.Run(tc.as, func(t *testing.T) {
			kc := &configcheck.Checked{Address: "127.0.0.1", Port: int32(tc.port), Fields: fields}
			verify, err := k.trust(kc)
			if err != nil {
				t.Fatal(err)
			}
			got, err := k.get(context.Background(), "https://"+net.JoinHostPort("127.0.0.1", strconv.Itoa(tc.port))+"/configz?as="+url.QueryEscape(tc.as), verify)
			if tc.as == "ok" {
				if err != nil || len(got) == 0 {
					t.Fatalf("get = %q, %v", got, err)
				}
				if _, err := k.Configz(context.Background(), kc); err != nil {
					t.Fatalf("Configz: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("get succeeded: %q", got)
			}
			if tc.want != nil && !errors.Is(err, tc.want) {
				t.Errorf("error %v, want %v", err, tc.want)
			}
			if Unverifiable(err) != tc.unverifiable {
				t.Errorf("Unverifiable(%v) = %v, want %v", err, Unverifiable(err), tc.unverifiable)
			}
		})
	}

	// /healthz hanging is a kubelet that is not healthy, whatever the reason.
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(plain.Close)
	pu, _ := url.Parse(plain.URL)
	hz := &configcheck.Checked{HealthzBindAddress: "127.0.0.1", HealthzPort: int32(mustAtoi(t, pu.Port()))}
	if err := k.Healthz(context.Background(), hz); err == nil || Unverifiable(err) {
		t.Errorf("hanging /healthz: %v; want an error that is not Unverifiable", err)
	}
}

func mustAtoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
