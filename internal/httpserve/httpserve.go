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

// Serve serves handler on addr until ctx ends, then shuts down, giving requests in flight up to grace. With
// tlsConfig it serves HTTPS (the certificate comes from tlsConfig). what names the listener in errors.
func Serve(ctx context.Context, what, addr string, handler http.Handler, tlsConfig *tls.Config, grace time.Duration) error {
	srv := &http.Server{Addr: addr, Handler: handler, TLSConfig: tlsConfig, ReadHeaderTimeout: 5 * time.Second}
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
	sctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("shut down %s on %s: %w", what, addr, err)
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve %s on %s: %w", what, addr, err)
	}
	return nil
}
