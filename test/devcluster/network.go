// SPDX-License-Identifier: Apache-2.0

package devcluster

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strings"
)

// The dev cluster's network. The apiserver proxies to a node (`kubectl get --raw .../proxy/configz`) only
// when the node's address is global unicast — never loopback (pkg/registry/core/node/strategy.go,
// isProxyableHostname) — and the kubelet refuses a loopback --node-ip. So each real node is a test host in a
// network namespace of its own, attached by a veth pair to a bridge the cluster creates; the control plane
// listens on the bridge address. Addresses come from 198.18.0.0/15, the range RFC 2544 sets aside for
// benchmarking networks, so they collide with no real network; all traffic stays on this machine.
//
//	root netns: bridge dkcbr<id> 198.18.<k>.1/24   (kube-apiserver, later the dkc config service)
//	netns dkc-<id>-<node>: eth0 198.18.<k>.<10+i>/24 (kubelet, containerd; later the node's systemd)

// Network is the recorded shape of the cluster network.
type Network struct {
	Bridge    string `json:"bridge"`
	GatewayIP string `json:"gatewayIP"` // the bridge address, where the control plane listens
	PrefixLen int    `json:"prefixLen"`
}

// ipCmd runs `ip args...`.
func ipCmd(ctx context.Context, args ...string) error {
	out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// pickSubnet chooses 198.18.<k>.0/24 for the cluster that leased the port block starting at portBlock:
// derived from the block, which no other running cluster holds, so that clusters starting at the same
// moment (the cluster suites and the installed suite's shards) start from different subnets, moved on when
// the address is already on an interface (a cluster of an older checkout, which derived it from its dir).
func pickSubnet(portBlock int) (int, error) {
	used := map[string]bool{}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return 0, fmt.Errorf("list interface addresses: %w", err)
	}
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok {
			used[ipn.IP.String()] = true
		}
	}
	// Fewer blocks than subnets fit below the ephemeral range: spread the blocks over the subnets.
	start := max(0, portBlock-portBlockFirst) / portBlockSize * 4 % 250
	for i := range 250 {
		k := 1 + (start+i)%250
		if !used[fmt.Sprintf("198.18.%d.1", k)] {
			return k, nil
		}
	}
	return 0, fmt.Errorf("no free subnet in 198.18.0.0/16 for the dev cluster")
}

// createBridge creates and brings up the bridge with the gateway address.
func createBridge(ctx context.Context, n Network) error {
	if err := ipCmd(ctx, "link", "add", n.Bridge, "type", "bridge"); err != nil {
		return err
	}
	if err := ipCmd(ctx, "addr", "add", fmt.Sprintf("%s/%d", n.GatewayIP, n.PrefixLen), "dev", n.Bridge); err != nil {
		return err
	}
	return ipCmd(ctx, "link", "set", n.Bridge, "up")
}

// createNodeNetns creates the node's namespace with eth0 at ip, attached to the bridge.
func createNodeNetns(ctx context.Context, n Network, netns, hostVeth, ip string) error {
	peer := hostVeth + "p"
	steps := [][]string{
		{"netns", "add", netns},
		{"link", "add", hostVeth, "type", "veth", "peer", "name", peer},
		{"link", "set", hostVeth, "master", n.Bridge, "up"},
		{"link", "set", peer, "netns", netns},
		{"-n", netns, "link", "set", peer, "name", "eth0"},
		{"-n", netns, "addr", "add", fmt.Sprintf("%s/%d", ip, n.PrefixLen), "dev", "eth0"},
		{"-n", netns, "link", "set", "eth0", "up"},
		{"-n", netns, "link", "set", "lo", "up"},
	}
	for _, s := range steps {
		if err := ipCmd(ctx, s...); err != nil {
			return err
		}
	}
	return nil
}

// deleteNetns removes a node namespace (and with it the veth pair); a missing one is not an error.
func deleteNetns(ctx context.Context, netns string) error {
	if netns == "" || exec.CommandContext(ctx, "ip", "netns", "pids", netns).Run() != nil {
		return nil // does not exist
	}
	if out, _ := exec.CommandContext(ctx, "ip", "netns", "pids", netns).Output(); len(strings.TrimSpace(string(out))) > 0 {
		return fmt.Errorf("network namespace %s still has processes %s", netns, strings.Fields(string(out)))
	}
	return ipCmd(ctx, "netns", "del", netns)
}

// deleteBridge removes the bridge; a missing one is not an error.
func deleteBridge(ctx context.Context, bridge string) error {
	if bridge == "" {
		return nil
	}
	if _, err := net.InterfaceByName(bridge); err != nil {
		return nil
	}
	return ipCmd(ctx, "link", "del", bridge)
}
