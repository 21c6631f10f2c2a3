// SPDX-License-Identifier: Apache-2.0

package devcluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Every loopback port a dev cluster's processes listen on (etcd, kube-apiserver, dkc-server and its
// replicas, the kubelets of process-form nodes, simulated nodes) comes from a block of ports that the
// cluster leases for its lifetime. A port picked with ":0" and bound later by another process can be taken
// in between: by another cluster starting at the same moment, or as the source port of any outgoing
// connection, since ":0" hands out the kernel's ephemeral range. The blocks lie below that range, so no
// outgoing connection takes one, and a lease under a machine-wide lock gives each running cluster its own.
const (
	portBlockFirst = 10000
	portBlockSize  = 400
	// portLeaseGrace is how long a lease whose cluster has no state.json yet is kept: Start leases before
	// it writes the state.
	portLeaseGrace = 30 * time.Minute
)

// portLeaseDir holds one file per leased block, named by its index and holding the cluster's dir (a
// variable for tests).
var portLeaseDir = runtimeRoot + "/ports"

// portBlocks returns how many blocks fit below the kernel's ephemeral port range.
func portBlocks() int {
	low := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if v, err := strconv.Atoi(f[0]); err == nil {
				low = v
			}
		}
	}
	return max(0, (low-portBlockFirst)/portBlockSize)
}

// leasePortBlock leases a block for the cluster in dir and returns its first port. A lease whose cluster is
// gone (no state.json naming the block, past the grace) is taken over.
func leasePortBlock(dir string) (int, error) {
	n := portBlocks()
	if n == 0 {
		return 0, errors.New("lease a port block: the kernel's ephemeral port range leaves no room below it")
	}
	if err := os.MkdirAll(portLeaseDir, 0o755); err != nil {
		return 0, fmt.Errorf("lease a port block: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(portLeaseDir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return 0, fmt.Errorf("lease a port block: %w", err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return 0, fmt.Errorf("lease a port block: lock %s: %w", lock.Name(), err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN) //nolint:errcheck // closing the file unlocks too
	// Start where the dir's hash points, so that clusters rarely probe the same leases.
	start := 0
	for _, c := range dir {
		start = (start*31 + int(c)) % n
	}
	for i := range n {
		b := (start + i) % n
		path := filepath.Join(portLeaseDir, strconv.Itoa(b))
		if owner, err := os.ReadFile(path); err == nil && string(owner) != dir && !staleLease(path, string(owner), b) {
			continue
		}
		if err := os.WriteFile(path, []byte(dir), 0o644); err != nil {
			return 0, fmt.Errorf("lease port block %d: %w", b, err)
		}
		return portBlockFirst + b*portBlockSize, nil
	}
	return 0, fmt.Errorf("lease a port block: all %d blocks under %s are leased by running clusters", n, portLeaseDir)
}

// staleLease tells whether the lease of block b at path, held by the cluster in owner, outlived it.
func staleLease(path, owner string, b int) bool {
	data, err := os.ReadFile(filepath.Join(owner, "state.json"))
	if err == nil {
		var st struct {
			PortBlock int `json:"portBlock"`
		}
		return json.Unmarshal(data, &st) != nil || st.PortBlock != portBlockFirst+b*portBlockSize
	}
	fi, err := os.Stat(path)
	return err == nil && time.Since(fi.ModTime()) > portLeaseGrace
}

// releasePortBlock ends the lease of the block starting at first, if the cluster in dir holds it.
func releasePortBlock(dir string, first int) {
	if first < portBlockFirst {
		return
	}
	path := filepath.Join(portLeaseDir, strconv.Itoa((first-portBlockFirst)/portBlockSize))
	if owner, err := os.ReadFile(path); err == nil && string(owner) == dir {
		_ = os.Remove(path)
	}
}

// freePorts returns n ports of the cluster's block that nothing listens on, each handed out once. A
// cluster recorded before blocks existed picks from the ephemeral range as it did then.
func (c *Cluster) freePorts(n int) ([]int, error) {
	if c.state.PortBlock == 0 {
		return ephemeralPorts(n)
	}
	c.portMu.Lock()
	defer c.portMu.Unlock()
	if c.state.PortNext < c.state.PortBlock {
		c.state.PortNext = c.state.PortBlock
	}
	var ports []int
	for len(ports) < n {
		p := c.state.PortNext
		if p >= c.state.PortBlock+portBlockSize {
			return nil, fmt.Errorf("find %d free ports: the cluster's block %d-%d is used up", n, c.state.PortBlock,
				c.state.PortBlock+portBlockSize-1)
		}
		c.state.PortNext++
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			continue // something else listens there: skip it
		}
		l.Close()
		ports = append(ports, p)
	}
	return ports, nil
}

// ephemeralPorts picks n free ports from the kernel's ephemeral range.
func ephemeralPorts(n int) ([]int, error) {
	var ports []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("find a free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
