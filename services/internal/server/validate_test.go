// SPDX-License-Identifier: Apache-2.0

package server

import (
	"strings"
	"testing"
	"time"
)

// TestValidateChecks: each of Validate's checks refuses what its rule says and passes the defaults and the
// edge values its rule allows; Validate reports what the check reports.
func TestValidateChecks(t *testing.T) {
	for _, tc := range []struct {
		name    string
		check   func(Config) []error
		mutate  func(*Config)
		wantErr string // substring of the check's one error; "" = no error
	}{
		{"serving: defaults", Config.checkServing, func(*Config) {}, ""},
		{"serving: no listen address", Config.checkServing, func(c *Config) { c.ListenAddress = "" },
			"--listen-address is required"},
		{"serving: tls files", Config.checkServing,
			func(c *Config) { c.Insecure, c.TLSCertFile, c.TLSKeyFile = false, "a", "b" }, ""},
		{"serving: key without certificate", Config.checkServing,
			func(c *Config) { c.Insecure, c.TLSKeyFile = false, "b" }, "--tls-cert-file and --tls-key-file are required"},
		{"serving: insecure with a key", Config.checkServing, func(c *Config) { c.TLSKeyFile = "b" },
			"--insecure conflicts with --tls-cert-file/--tls-key-file"},

		{"names: defaults", Config.checkNames, func(*Config) {}, ""},
		{"names: service account without namespace", Config.checkNames,
			func(c *Config) { c.AllowedServiceAccounts = []string{"/dkc-sidecar"} }, `"/dkc-sidecar" is not namespace/name`},
		{"names: service account with two slashes", Config.checkNames,
			func(c *Config) { c.AllowedServiceAccounts = []string{"a/b/c"} }, `"a/b/c" is not namespace/name`},
		{"names: no config namespace", Config.checkNames, func(c *Config) { c.ConfigNamespaces = nil },
			"--config-namespaces must name at least one namespace"},

		{"work: defaults", Config.checkWork, func(*Config) {}, ""},
		{"work: restarting status written at once", Config.checkWork, func(c *Config) { c.RestartingStatusDelay = 0 }, ""},
		{"work: negative restarting status delay", Config.checkWork,
			func(c *Config) { c.RestartingStatusDelay = -time.Second }, "--restarting-status-delay must not be negative"},
		{"work: no status worker", Config.checkWork, func(c *Config) { c.StatusWorkers = 0 },
			"--workers and --status-workers must be at least 1"},
		{"work: token reviews sized to the cluster", Config.checkWork,
			func(c *Config) { c.TokenReviewQPS, c.TokenReviewBurst = 0, 0 }, ""},
		{"work: negative token review burst", Config.checkWork, func(c *Config) { c.TokenReviewBurst = -1 },
			"--token-review-qps and --token-review-burst must not be negative"},
		{"work: no token review per peer", Config.checkWork, func(c *Config) { c.TokenReviewPeerBurst = 0 },
			"--token-review-per-peer-burst at least 1"},
		{"work: negative kube api qps", Config.checkWork, func(c *Config) { c.KubeAPIQPS = -1 },
			"--kube-api-qps and --kube-api-burst must not be negative"},
		{"work: negative direct config changes", Config.checkWork, func(c *Config) { c.MaxDirectConfigChanges = -1 },
			"--max-direct-config-changes must not be negative"},
		{"work: negative inline status writes", Config.checkWork, func(c *Config) { c.MaxInlineStatusWrites = -1 },
			"--max-inline-status-writes must not be negative"},

		{"durations: defaults", Config.checkDurations, func(*Config) {}, ""},
		{"durations: no keepalive", Config.checkDurations, func(c *Config) { c.KeepaliveTime = 0 },
			"--keepalive-time must be positive"},
		{"durations: negative token cache ttl", Config.checkDurations, func(c *Config) { c.TokenCacheTTL = -1 },
			"--token-cache-ttl must be positive"},

		{"connections: defaults", Config.checkConnections, func(*Config) {}, ""},
		{"connections: negative max connections", Config.checkConnections, func(c *Config) { c.MaxConnections = -1 },
			"--max-connections must not be negative"},
		{"connections: no authentication timeout", Config.checkConnections,
			func(c *Config) { c.AuthenticationTimeout = 0 }, ""},
		{"connections: negative authentication timeout", Config.checkConnections,
			func(c *Config) { c.AuthenticationTimeout = -1 }, "--authentication-timeout must not be negative"},
		{"connections: negative per-node connections", Config.checkConnections,
			func(c *Config) { c.MaxConnectionsPerNode = -1 }, "--status-reports-per-node-qps must not be negative"},
		{"connections: no status report burst", Config.checkConnections,
			func(c *Config) { c.StatusReportsPerNodeBurst = 0 }, "--status-reports-per-node-burst must be at least 1"},
		{"connections: authentication timeout shorter than a handshake and a review", Config.checkConnections,
			func(c *Config) { c.AuthenticationTimeout = c.HandshakeTimeout }, "--authentication-timeout must be 0 or at least"},
		{"connections: no handshake timeout", Config.checkConnections,
			func(c *Config) { c.HandshakeTimeout, c.AuthenticationTimeout = 0, 0 },
			"--handshake-timeout and --max-connection-idle must be positive"},
		{"connections: smallest receive limit", Config.checkConnections,
			func(c *Config) { c.MaxRecvMsgSizeKiB = minRecvMsgSizeKiB }, ""},
		{"connections: receive limit below a status report", Config.checkConnections,
			func(c *Config) { c.MaxRecvMsgSizeKiB = minRecvMsgSizeKiB - 1 }, "--max-recv-msg-size-kib must be at least"},

		{"pools: defaults", Config.checkPools, func(*Config) {}, ""},
		{"pools: lease duration equal to the renew deadline", Config.checkPools,
			func(c *Config) { c.LeaderElectionLeaseDuration = c.LeaderElectionRenewDeadline },
			"--leader-election-id must be set"},
		{"pools: no pool worker", Config.checkPools, func(c *Config) { c.PoolWorkers = 0 },
			"--pool-workers must be at least 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			c.Insecure = true
			tc.mutate(&c)
			errs := tc.check(c)
			if tc.wantErr == "" {
				if len(errs) != 0 {
					t.Fatalf("check = %v, want none", errs)
				}
				if err := c.Validate(); err != nil {
					t.Fatalf("Validate() = %v", err)
				}
				return
			}
			if len(errs) != 1 || !strings.Contains(errs[0].Error(), tc.wantErr) {
				t.Fatalf("check = %v, want one error containing %q", errs, tc.wantErr)
			}
			if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Validate() = %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
}
