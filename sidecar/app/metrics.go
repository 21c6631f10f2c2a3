// SPDX-License-Identifier: Apache-2.0

package app

import (
	"fmt"
	"net/http"
	"time"

	"go.uber.org/zap"
	"k8s.io/client-go/rest"

	"github.com/dkc-dev/dkc/internal/httpserve"
	"github.com/dkc-dev/dkc/internal/metricsauth"
)

// metricsListener is the listener of --metrics-address, serving h. With --metrics-auth it is HTTPS, and
// every path but the probes' is served only to callers the kube-apiserver authenticates and authorizes,
// through the pod's ServiceAccount (withReviews; without it, the cleanup mode, only the probes are served);
// otherwise plain HTTP to anyone.
func metricsListener(name string, cfg Config, h http.Handler, withReviews bool,
	log *zap.Logger) (httpserve.Listener, error) {
	l := httpserve.Listener{Name: name, Addr: cfg.MetricsAddress, Handler: h, Grace: 5 * time.Second}
	if !cfg.MetricsAuth.Auth {
		log.Warn("SERVING METRICS OVER PLAIN HTTP TO ANYONE (--metrics-auth=false)",
			zap.String("address", cfg.MetricsAddress))
		return l, nil
	}
	var rc *rest.Config
	if withReviews {
		// The pod's ServiceAccount token (its kube-api volume, with the cluster's CA) and the apiserver's
		// in-cluster address, which a host-network pod reaches through the node's Service routing.
		var err error
		if rc, err = rest.InClusterConfig(); err != nil {
			return l, fmt.Errorf("--metrics-auth reviews scrapers' tokens through the apiserver as the pod's ServiceAccount: "+
				"%w (--metrics-auth=false serves the metrics without, to anyone)", err)
		}
		rc.UserAgent = "dkc-sidecar"
	}
	g, err := metricsauth.New(cfg.MetricsAuth, rc, log.Named("metrics"))
	if err != nil {
		return l, err
	}
	l.Handler, l.TLS = g.Handler(h), g.TLS()
	return l, nil
}
