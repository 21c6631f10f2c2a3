package server

import (
	"io"
	"slices"
	"strings"
	"testing"

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
