// SPDX-License-Identifier: Apache-2.0

package httpserve

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/dkc-dev/dkc/internal/poll"
)

func TestServeUntilContextEnds(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Serve(ctx, Listener{Name: "test", Addr: addr, Grace: time.Second,
			Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })})
	}()
	var body string
	poll.UntilNil(t, "the listener to serve", func() error {
		resp, err := http.Get("http://" + addr + "/")
		if err != nil {
			return err
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		body = string(b)
		return nil
	})
	if body != "ok" {
		t.Fatalf("served %q, want ok", body)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Serve after ctx ended = %v, want nil", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return after ctx ended")
	}
}

func TestServeReportsAListenFailure(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	err = Serve(context.Background(), Listener{Name: "metrics", Addr: lis.Addr().String(), Handler: http.NotFoundHandler(), Grace: time.Second})
	if err == nil || !strings.Contains(err.Error(), "serve metrics on "+lis.Addr().String()) {
		t.Fatalf("Serve on a taken address = %v, want an error naming the listener and address", err)
	}
}

// TestServerHasLimits: every listener gets read, write and idle timeouts and a header cap, so a client
// cannot hold a connection's goroutine and buffers by sending slowly or never reading.
func TestServerHasLimits(t *testing.T) {
	for _, tc := range []struct {
		name      string
		l         Listener
		wantWrite time.Duration
	}{
		{"defaults", Listener{Name: "metrics"}, DefaultWriteTimeout},
		{"write timeout for profiles", Listener{Name: "metrics", WriteTimeout: 5 * time.Minute}, 5 * time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.l.server()
			if s.ReadHeaderTimeout != ReadHeaderTimeout || s.ReadTimeout != ReadTimeout || s.IdleTimeout != IdleTimeout || s.MaxHeaderBytes != MaxHeaderBytes {
				t.Errorf("server limits: header %v read %v idle %v header bytes %d", s.ReadHeaderTimeout, s.ReadTimeout, s.IdleTimeout, s.MaxHeaderBytes)
			}
			if s.WriteTimeout != tc.wantWrite {
				t.Errorf("WriteTimeout = %v, want %v", s.WriteTimeout, tc.wantWrite)
			}
		})
	}
}

// TestConnectionsPastTheCapWait: with MaxConns connections held open by clients that send nothing, a
// further request is not served until one of them closes.
func TestConnectionsPastTheCapWait(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		_ = Serve(ctx, Listener{Name: "test", Addr: addr, Grace: time.Second, MaxConns: 2,
			Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })})
	}()
	get := func(timeout time.Duration) error {
		c := &http.Client{Timeout: timeout, Transport: &http.Transport{DisableKeepAlives: true}}
		resp, err := c.Get("http://" + addr + "/")
		if err != nil {
			return err
		}
		resp.Body.Close()
		return nil
	}
	poll.UntilNil(t, "the listener to serve", func() error { return get(time.Second) })
	var idle []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		idle = append(idle, c)
	}
	if err := get(300 * time.Millisecond); err == nil { // proves a negative: not served within 300ms
		t.Fatal("a third connection was served while two were held open")
	}
	idle[0].Close()
	if err := get(5 * time.Second); err != nil {
		t.Fatalf("after one held connection closed: %v", err)
	}
}
