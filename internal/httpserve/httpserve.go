// Package httpserve serves HTTP until a context ends: what dkc-server's metrics and webhook listeners and
// dkc-sidecar's metrics listener share.
package httpserve

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"time"
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
}

// Serve serves l until ctx ends, then shuts down.
func Serve(ctx context.Context, l Listener) error {
	what, addr, tlsConfig := l.Name, l.Addr, l.TLS
	srv := &http.Server{Addr: addr, Handler: l.Handler, TLSConfig: tlsConfig, ReadHeaderTimeout: 5 * time.Second}
	errc := make(chan error, 1)
	go func() {
		var err error
		if tlsConfig != nil {
			err = srv.ListenAndServeTLS("", "")
		} else {
			err = srv.ListenAndServe()
		}
		errc <- err
	}()
	select {
	case err := <-errc:
		// Listening failed (the address is taken, say): the caller's other work stops with it.
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
