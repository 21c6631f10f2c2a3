// SPDX-License-Identifier: Apache-2.0

package app

import (
	"slices"
	"testing"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
)

// The normal mode's steps (follow), a table each; malicious_test.go runs the mode whole.

func TestConnect(t *testing.T) {
	injected, err := grpc.NewClient("passthrough:///injected", grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = injected.Close() })
	for _, tc := range []struct {
		name     string
		cfg      Config
		injected bool // the connection is Config.Conn
		streams  bool // /readyz follows the connection's streams
	}{
		{name: "injected: used as it is, its streams not followed", cfg: Config{Conn: injected}, injected: true},
		{name: "dialled to --server: its streams followed for /readyz",
			cfg: Config{Server: "passthrough:///dkc-server", Insecure: true}, streams: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn, streams, closeConn, err := connect(tc.cfg, zap.NewNop())
			if err != nil {
				t.Fatal(err)
			}
			defer closeConn()
			if (conn == injected) != tc.injected {
				t.Errorf("connection %p, the injected one (%p): %v", conn, injected, tc.injected)
			}
			if (streams != nil) != tc.streams {
				t.Errorf("streams %v, want them followed: %v", streams, tc.streams)
			}
		})
	}
	// Its owner closes the injected connection, not connect's closer.
	_, _, closeConn, _ := connect(Config{Conn: injected}, zap.NewNop())
	closeConn()
	if injected.GetState() == connectivity.Shutdown {
		t.Error("the injected connection was closed")
	}
}

func TestKubeletFlags(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want []string // nil: read from the running kubelet
	}{
		{name: "neither: read from the running kubelet"},
		{name: "--kubelet-flags, split on white space", cfg: Config{KubeletFlags: " --v=2\t--config=/k.yaml \n"},
			want: []string{"--v=2", "--config=/k.yaml"}},
		{name: "KubeletArgs take their place", cfg: Config{KubeletArgs: []string{"--v=4"}, KubeletFlags: "--v=2"},
			want: []string{"--v=4"}},
		{name: "empty KubeletArgs: no flags, not read", cfg: Config{KubeletArgs: []string{}, KubeletFlags: "--v=2"},
			want: []string{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := kubeletFlags(tc.cfg)
			if !slices.Equal(got, tc.want) || (got == nil) != (tc.want == nil) {
				t.Errorf("flags %q (nil: %v), want %q (nil: %v)", got, got == nil, tc.want, tc.want == nil)
			}
		})
	}
}
