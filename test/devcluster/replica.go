// SPDX-License-Identifier: Apache-2.0

package devcluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	godbus "github.com/godbus/dbus/v5"
)

// ServiceReplica is one more dkc-server next to the cluster's, started by a test: the cluster service's own
// command line (identity, kubeconfig, flags) on ports of its own, without the webhook, with the test's
// flags appended (later flags win), e.g. a short --token-cache-ttl or a serving certificate of the test's.
// Several replicas are how dkc-server runs in production, so the cluster's service is undisturbed. The
// cluster's Stop does not know it: the test stops it (by PID) with Stop.
type ServiceReplica struct {
	c           *Cluster
	name        string
	argv        []string
	port        int
	metricsPort int
	proc        *process
}

// StartServiceReplica starts the replica called name (process dkc-server-<name>, log in LogDir) and waits
// until its caches are synced.
func (c *Cluster) StartServiceReplica(ctx context.Context, name string, args ...string) (*ServiceReplica, error) {
	data, err := os.ReadFile(filepath.Join(c.runDir(), "dkc-server.argv"))
	if err != nil {
		return nil, fmt.Errorf("the cluster's dkc-server command line: %w", err)
	}
	var rec processRecord
	if err := json.Unmarshal(data, &rec); err != nil {
		return nil, fmt.Errorf("the cluster's dkc-server command line: %w", err)
	}
	ports, err := c.freePorts(2)
	if err != nil {
		return nil, err
	}
	r := &ServiceReplica{c: c, name: "dkc-server-" + name, port: ports[0], metricsPort: ports[1]}
	for _, a := range rec.Argv {
		switch {
		case strings.HasPrefix(a, "--listen-address="), strings.HasPrefix(a, "--metrics-address="),
			strings.HasPrefix(a, "--webhook-address="):
		default:
			r.argv = append(r.argv, a)
		}
	}
	r.argv = append(r.argv, "--listen-address="+r.Address(), "--metrics-address="+r.MetricsAddress(), "--webhook-address=")
	r.argv = append(r.argv, args...)
	if err := r.start(ctx); err != nil {
		return nil, err
	}
	return r, nil
}

// Address is host:port of the replica's gRPC API, on the bridge (reachable from the nodes).
func (r *ServiceReplica) Address() string {
	return net.JoinHostPort(r.c.state.Network.GatewayIP, strconv.Itoa(r.port))
}

// MetricsAddress is host:port of the replica's /metrics and /readyz.
func (r *ServiceReplica) MetricsAddress() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(r.metricsPort))
}

// LogFile is the replica's log.
func (r *ServiceReplica) LogFile() string { return r.c.logFile(r.name) }

// PID is the replica's process ID (0 when it is not running).
func (r *ServiceReplica) PID() int { return r.proc.pid() }

func (r *ServiceReplica) start(ctx context.Context) error {
	p, err := startProcess(r.name, r.c.runDir(), r.LogFile(), nil, r.argv...)
	if err != nil {
		return err
	}
	r.proc = p
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	url := "http://" + r.MetricsAddress() + "/readyz"
	ready := func(ctx context.Context) error { return httpOK(ctx, http.DefaultClient, url) }
	if err := p.waitFor(ctx, "ready", ready); err != nil {
		// Not left running for a caller that gets no replica to stop.
		return errors.Join(err, p.stop(processGrace))
	}
	return nil
}

// Restart stops the replica (SIGTERM: its streams end with Unavailable, as in a rollout) and starts it
// again with the same command line: it reads its files (certificate, key) anew, and every client has to
// connect, and hence handshake, again.
func (r *ServiceReplica) Restart(ctx context.Context) error {
	if err := r.Stop(); err != nil {
		return err
	}
	return r.start(ctx)
}

// Stop stops the replica by PID.
func (r *ServiceReplica) Stop() error { return r.proc.stop(processGrace) }

// nodeSystemd connects to node's systemd over its D-Bus socket, as root.
func (c *Cluster) nodeSystemd(ctx context.Context, node string) (*sddbus.Conn, error) {
	return sddbus.NewConnection(func() (*godbus.Conn, error) {
		conn, err := godbus.Dial(c.BusAddress(node), godbus.WithContext(ctx))
		if err != nil {
			return nil, err
		}
		if err := conn.Auth([]godbus.Auth{godbus.AuthExternal("0")}); err != nil {
			conn.Close()
			return nil, err
		}
		return conn, conn.Hello()
	})
}

// unitJob waits for a job queued by start (StartUnit, StopUnit, StartTransientUnit) to finish as "done".
func unitJob(ctx context.Context, what string, start func(chan<- string) (int, error)) error {
	ch := make(chan string, 1)
	if _, err := start(ch); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	select {
	case res := <-ch:
		if res != "done" {
			return fmt.Errorf("%s: job %s", what, res)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%s: %w", what, ctx.Err())
	}
}

// SidecarUnit is a real node's sidecar run by a test as a transient unit of the node's systemd in place of
// dkc-sidecar.service: the same flags but those the test replaces (--server, --server-ca-file, ...).
// Restart=no, so that a sidecar that exits shows as such instead of being restarted behind the test's back.
type SidecarUnit struct {
	c    *Cluster
	node string
	unit string
}

// RunSidecarUnit stops node's dkc-sidecar.service and starts the transient unit unit running the sidecar
// with the flags of replace (name without dashes -> value) in place of the unit's; its output goes to
// unit.log in NodeLogDir. Restore puts dkc-sidecar.service back.
func (c *Cluster) RunSidecarUnit(ctx context.Context, node, unit string,
	replace map[string]string) (*SidecarUnit, error) {
	var n *NodeState
	for i := range c.state.Nodes {
		if c.state.Nodes[i].Name == node && c.state.Nodes[i].Systemd {
			n = &c.state.Nodes[i]
		}
	}
	if n == nil {
		return nil, fmt.Errorf("%s is not a real node with a dkc-sidecar.service", node)
	}
	argv := []string{"/usr/local/bin/dkc-sidecar"}
	for _, a := range c.sidecarArgs(*n) {
		name, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if _, ok := replace[name]; !ok {
			argv = append(argv, a)
		}
	}
	for name, v := range replace {
		argv = append(argv, "--"+name+"="+v)
	}
	sd, err := c.nodeSystemd(ctx, node)
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", node, err)
	}
	defer sd.Close()
	if err := unitJob(ctx, "stop dkc-sidecar.service", func(ch chan<- string) (int, error) {
		return sd.StopUnitContext(ctx, "dkc-sidecar.service", "replace", ch)
	}); err != nil {
		return nil, err
	}
	s := &SidecarUnit{c: c, node: node, unit: unit}
	logFile := "/var/log/dkc/" + strings.TrimSuffix(unit, ".service") + ".log"
	props := []sddbus.Property{
		sddbus.PropDescription("dkc sidecar of dev node " + node + ", run by a test"),
		sddbus.PropExecStart(argv, false),
		{Name: "StandardOutputFileToAppend", Value: godbus.MakeVariant(logFile)},
		{Name: "StandardErrorFileToAppend", Value: godbus.MakeVariant(logFile)},
	}
	if err := unitJob(ctx, "start "+unit, func(ch chan<- string) (int, error) {
		return sd.StartTransientUnitContext(ctx, unit, "replace", props, ch)
	}); err != nil {
		_ = s.Restore(context.WithoutCancel(ctx))
		return nil, err
	}
	return s, nil
}

// MainPID is the unit's main process (0: not running).
func (s *SidecarUnit) MainPID(ctx context.Context) (int, error) {
	sd, err := s.c.nodeSystemd(ctx, s.node)
	if err != nil {
		return 0, err
	}
	defer sd.Close()
	p, err := sd.GetServicePropertyContext(ctx, s.unit, "MainPID")
	if err != nil {
		return 0, err
	}
	pid, _ := p.Value.Value().(uint32)
	return int(pid), nil
}

// LogFile is the unit's log on the host.
func (s *SidecarUnit) LogFile() string {
	return filepath.Join(s.c.NodeLogDir(s.node), strings.TrimSuffix(s.unit, ".service")+".log")
}

// Restore stops the transient unit and starts dkc-sidecar.service again.
func (s *SidecarUnit) Restore(ctx context.Context) error {
	sd, err := s.c.nodeSystemd(ctx, s.node)
	if err != nil {
		return err
	}
	defer sd.Close()
	if err := unitJob(ctx, "stop "+s.unit, func(ch chan<- string) (int, error) {
		return sd.StopUnitContext(ctx, s.unit, "replace", ch)
	}); err != nil && !strings.Contains(err.Error(), "not loaded") {
		return err
	}
	return unitJob(ctx, "start dkc-sidecar.service", func(ch chan<- string) (int, error) {
		return sd.StartUnitContext(ctx, "dkc-sidecar.service", "replace", ch)
	})
}
