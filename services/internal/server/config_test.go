// SPDX-License-Identifier: Apache-2.0

package server

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"io"
	"math/big"
	"slices"
	"strings"
	"testing"
	"time"

	flag "github.com/spf13/pflag"
)

func TestConfigNamespacesFlag(t *testing.T) {
	base := []string{"--insecure"}
	for _, tc := range []struct {
		name    string
		args    []string
		want    []string
		wantErr string // substring of Validate's error; "" = valid
	}{
		{name: "default is kube-system", want: []string{"kube-system"}},
		{name: "one", args: []string{"--config-namespaces=team-a"}, want: []string{"team-a"}},
		{name: "several, spaces trimmed", args: []string{"--config-namespaces=kube-system, team-a"}, want: []string{"kube-system", "team-a"}},
		{name: "empty refused", args: []string{"--config-namespaces="}, wantErr: "--config-namespaces must name at least one namespace"},
		{name: "only commas refused", args: []string{"--config-namespaces=,,"}, wantErr: "--config-namespaces must name at least one namespace"},
		{name: "not a namespace name", args: []string{"--config-namespaces=kube-system,Team_A"}, wantErr: `--config-namespaces: "Team_A" is not a namespace name`},
		{name: "namespace/name is not a namespace", args: []string{"--config-namespaces=kube-system/x"}, wantErr: `--config-namespaces: "kube-system/x" is not a namespace name`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			fs := flag.NewFlagSet("dkc-server", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			cfg.BindFlags(fs)
			if err := fs.Parse(append(slices.Clone(base), tc.args...)); err != nil {
				t.Fatalf("parse: %v", err)
			}
			err := cfg.Validate()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Validate() = %v, want an error containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Validate() = %v", err)
			}
			if !slices.Equal(cfg.ConfigNamespaces, tc.want) {
				t.Errorf("ConfigNamespaces = %q, want %q", cfg.ConfigNamespaces, tc.want)
			}
		})
	}
}

func TestStreamLimitsValidate(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(*Config)
		ok     bool
	}{
		{"defaults", func(*Config) {}, true},
		{"send limit fits the largest message a node accepts", func(c *Config) { c.MaxSendMsgSizeMiB = 3 }, true},
		{"send limit below it", func(c *Config) { c.MaxSendMsgSizeMiB = 2 }, false},
		{"two streams per connection", func(c *Config) { c.MaxConcurrentStreams = 2 }, true},
		{"one stream per connection starves status reports", func(c *Config) { c.MaxConcurrentStreams = 1 }, false},
	} {
		c := DefaultConfig()
		c.Insecure = true
		tc.mutate(&c)
		if err := c.Validate(); (err == nil) != tc.ok {
			t.Errorf("%s: Validate() = %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
}

// TestNamespaceChecks: a kustomize `namespace:` override that moved dkc-server but left the flags or the
// certificate on kube-system is refused at start, with what to change; matching flags, no namespace known
// and certificates without a Service name pass.
func TestNamespaceChecks(t *testing.T) {
	for _, tc := range []struct {
		name      string
		namespace string
		allowed   []string
		dnsNames  []string
		wantErr   string // substring; "" = accepted
	}{
		{name: "as deploy/ installs it", namespace: "kube-system", allowed: []string{"kube-system/dkc-sidecar"},
			dnsNames: []string{"dkc-server", "dkc-server.kube-system", "dkc-server.kube-system.svc", "dkc-server.kube-system.svc.cluster.local"}},
		{name: "namespace unknown: no check", allowed: []string{"kube-system/dkc-sidecar"}, dnsNames: []string{"dkc-server.kube-system.svc"}},
		{name: "moved, flags and certificate too", namespace: "dkc", allowed: []string{"dkc/dkc-sidecar"}, dnsNames: []string{"dkc-server.dkc.svc"}},
		{name: "one of several service accounts here", namespace: "dkc", allowed: []string{"kube-system/dkc-sidecar", "dkc/dkc-sidecar"}},
		{name: "certificate without Service names", namespace: "dkc", allowed: []string{"dkc/dkc-sidecar"}, dnsNames: []string{"dkc.example.com"}},
		{name: "certificate for both namespaces", namespace: "dkc", allowed: []string{"dkc/dkc-sidecar"}, dnsNames: []string{"dkc-server.kube-system.svc", "dkc-server.dkc.svc"}},
		{name: "override left the service account", namespace: "dkc", allowed: []string{"kube-system/dkc-sidecar"},
			wantErr: `dkc-server runs in namespace "dkc" (--namespace, $POD_NAMESPACE) but --allowed-service-accounts=kube-system/dkc-sidecar names no ServiceAccount there`},
		{name: "override left the certificate", namespace: "dkc", allowed: []string{"dkc/dkc-sidecar"},
			dnsNames: []string{"dkc-server", "dkc-server.kube-system.svc", "dkc-server.kube-system.svc.cluster.local"},
			wantErr:  `is for dkc-server.kube-system.svc, dkc-server.kube-system.svc.cluster.local, but dkc-server runs in namespace "dkc"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Insecure, cfg.Namespace, cfg.AllowedServiceAccounts = true, tc.namespace, tc.allowed
			err := cfg.Validate()
			if err == nil {
				err = checkCertNamespace("tls.crt", certFor(t, tc.dnsNames), tc.namespace)
			}
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

// TestNamespaceFlagDefaultsToPodNamespace: deploy/ passes the namespace through $POD_NAMESPACE.
func TestNamespaceFlagDefaultsToPodNamespace(t *testing.T) {
	t.Setenv("POD_NAMESPACE", "dkc")
	if got := DefaultConfig().Namespace; got != "dkc" {
		t.Fatalf("Namespace = %q, want $POD_NAMESPACE", got)
	}
}

// certFor is a self-signed certificate for dnsNames.
func certFor(t *testing.T, dnsNames []string) *tls.Certificate {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "dkc-server"}, NotBefore: time.Now(),
		NotAfter: time.Now().Add(time.Hour), DNSNames: dnsNames}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// TestLeaderElectionFlags: the Lease's timing must let a leader renew before others may take it, and the
// Lease lives in dkc-server's namespace unless told otherwise.
func TestLeaderElectionFlags(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(*Config)
		ok     bool
	}{
		{"defaults", func(*Config) {}, true},
		{"renew deadline not below the lease duration", func(c *Config) { c.LeaderElectionRenewDeadline = c.LeaderElectionLeaseDuration }, false},
		{"retry period not below the renew deadline", func(c *Config) { c.LeaderElectionRetryPeriod = c.LeaderElectionRenewDeadline }, false},
		{"renew deadline within client-go's jitter of the retry period", func(c *Config) {
			c.LeaderElectionRetryPeriod, c.LeaderElectionRenewDeadline = 9*time.Second, 10*time.Second
		}, false},
		{"no lease name", func(c *Config) { c.LeaderElectionID = "" }, false},
		{"timings unchecked without election", func(c *Config) { c.LeaderElect, c.LeaderElectionRetryPeriod = false, 0 }, true},
		{"no pool worker", func(c *Config) { c.PoolWorkers = 0 }, false},
	} {
		c := DefaultConfig()
		c.Insecure = true
		tc.mutate(&c)
		if err := c.Validate(); (err == nil) != tc.ok {
			t.Errorf("%s: Validate() = %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
	for _, tc := range []struct{ namespace, flag, want string }{
		{"dkc", "", "dkc"},
		{"dkc", "leases", "leases"},
		{"", "", "kube-system"},
	} {
		c := Config{Namespace: tc.namespace, LeaderElectionNamespace: tc.flag}
		if got := c.LeaseNamespace(); got != tc.want {
			t.Errorf("LeaseNamespace() with --namespace=%q --leader-election-namespace=%q = %q, want %q", tc.namespace, tc.flag, got, tc.want)
		}
	}
}
