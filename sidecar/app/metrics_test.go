// SPDX-License-Identifier: Apache-2.0

package app

import (
	"strings"
	"testing"

	"go.uber.org/zap"
)

// TestMetricsListener: HTTPS by default; plain HTTP with --metrics-auth=false; outside a pod (no in-cluster
// apiserver) the default refuses to start and says how to do without.
func TestMetricsListener(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("KUBERNETES_SERVICE_PORT", "")
	cfg := DefaultConfig()
	l, err := metricsListener("health", cfg, nil, false, zap.NewNop())
	if err != nil || l.TLS == nil {
		t.Errorf("cleanup mode's listener: TLS %v, error %v; want HTTPS", l.TLS != nil, err)
	}
	if _, err := metricsListener("metrics", cfg, nil, true, zap.NewNop()); err == nil || !strings.Contains(err.Error(), "--metrics-auth=false") {
		t.Errorf("without an in-cluster apiserver: %v, want an error that names --metrics-auth=false", err)
	}
	cfg.MetricsAuth.Auth = false
	if l, err := metricsListener("metrics", cfg, nil, true, zap.NewNop()); err != nil || l.TLS != nil {
		t.Errorf("--metrics-auth=false: TLS %v, error %v; want plain HTTP", l.TLS != nil, err)
	}
}
