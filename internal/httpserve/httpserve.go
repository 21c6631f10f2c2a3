// SPDX-License-Identifier: Apache-2.0

// Package httpserve serves HTTP until a context ends: what dkc-server's metrics and webhook listeners and
// dkc-sidecar's metrics listener share, with the limits every one of them needs against callers that
// hold connections open (docs/security.md, "Unauthenticated callers").
package httpserve

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"golang.org/x/net/netutil"
)

// Limits of every listener. Its callers — Prometheus, the kubelet's probes, the kube-apiserver calling the
// webhook — send a request of a few KiB at once and read a response within seconds; nothing else needs
// more, and the defaults of net/http (no read, write or idle timeout, 1 MiB of headers, unlimited
// connections) let one client hold goroutines and buffers forever.
const (
	ReadHeaderTimeout = 5 * time.Second
	// ReadTimeout covers the body too: an AdmissionReview holds two Nodes, well under a MiB.
	ReadTimeout = 30 * time.Second
	// DefaultWriteTimeout is from the end of the request's headers to the end of the response: a scrape
	// of /metrics takes milliseconds. Profiles (dkc-server --profiling) need Listener.WriteTimeout.
	DefaultWriteTimeout = time.Minute
	// IdleTimeout lets a keep-alive connection wait this long for its next request (Prometheus scrapes
	// every 15-60 s over one connection; a closed one is simply opened again).
	IdleTimeout    = 90 * time.Second
	MaxHeaderBytes = 16 << 10
	// DefaultMaxConns is 0, no cap: further connections would wait in the kernel's accept queue behind
	// whoever holds the slots, so one pod holding them would fail the kubelet's liveness probes (1 s) and
	// the apiserver's webhook calls. The timeouts above bound what each connection can hold, and for how long.
	DefaultMaxConns = 0
)

// Listener is one HTTP listener.
type Listener struct {
	// Name names the listener in errors ("metrics", "admission webhook").
	Name    string
	Addr    string
	Handler http.Handler
	// TLS, if not nil, makes it HTTPS; the certificate comes from it.
	TLS *tls.Config
	// Grace is how long requests in flight get at shutdown.
	Grace time.Duration
	// WriteTimeout replaces DefaultWriteTimeout (e.g. for /debug/pprof/profile?seconds=N, which net/http/pprof
	// refuses when N exceeds it); MaxConns, if positive, caps the connections held at once. 0: the default.
	WriteTimeout time.Duration
	MaxConns     int
}

// server is the http.Server for l, with the limits above.
func (l Listener) server() *http.Server {
	wt := l.WriteTimeout
	if wt <= 0 {
		wt = DefaultWriteTimeout
	}
	return &http.Server{Addr: l.Addr, Handler: l.Handler, TLSConfig: l.TLS, ReadHeaderTimeout: ReadHeaderTimeout,
		ReadTimeout: ReadTimeout, WriteTimeout: wt, IdleTimeout: IdleTimeout, MaxHeaderBytes: MaxHeaderBytes}
}

// Serve serves l until ctx ends, then shuts down.
func Serve(ctx context.Context, l Listener) error {
	what, addr := l.Name, l.Addr
	srv := l.server()
	tcp, err := net.Listen("tcp", addr)
	if err != nil {
		// The address is taken, say: the caller's other work stops with it.
		return fmt.Errorf("serve %s on %s: %w", what, addr, err)
	}
	maxConns := l.MaxConns
	if maxConns <= 0 {
		maxConns = DefaultMaxConns
	}
	lis := tcp
	if maxConns > 0 {
		lis = netutil.LimitListener(tcp, maxConns)
	}
	errc := make(chan error, 1)
	go func() {
		if l.TLS != nil {
			errc <- srv.ServeTLS(lis, "", "")
		} else {
			errc <- srv.Serve(lis)
		}
	}()
	select {
	case err := <-errc:
		return fmt.Errorf("serve %s on %s: %w", what, addr, err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), l.Grace)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("shut down %s on %s: %w", what, addr, err)
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve %s on %s: %w", what, addr, err)
	}
	return nil
}
