// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// idleNode is the dev cluster's simulated node whose real dkc-sidecar process is measured.
const idleNode = "sim-1"

// realSidecar is a dkc-sidecar process this benchmark started (the dev cluster's own runs with metrics off).
type realSidecar struct {
	cmd         *exec.Cmd
	metricsAddr string
	done        chan struct{}
}

// startRealSidecar replaces the dev cluster's dkc-sidecar of sim-1 by one with the production flags the
// benchmark can give it: metrics served (and scraped), the default last-known-good machinery, logs at info.
// The restart mode stays signal: the benchmark runs no systemd (a node's systemd is a systemd-nspawn
// machine with a real kubelet and containerd, which would share the 2 cores with every measurement), so
// the stand-in kubelet's supervisor is the dev cluster's shell loop and the sidecar signals it by PID.
func (r *run) startRealSidecar(trial time.Duration) (*realSidecar, error) {
	if err := r.cluster.StopProcess("dkc-sidecar-" + idleNode); err != nil {
		return nil, fmt.Errorf("stop the dev cluster's sidecar of %s: %w", idleNode, err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	metricsAddr := l.Addr().String()
	l.Close()
	log, err := os.Create(filepath.Join(r.cfg.Dir, "dkc-sidecar-"+idleNode+".log"))
	if err != nil {
		return nil, err
	}
	defer log.Close()
	cmd := exec.Command(filepath.Join(r.cfg.Bin, "dkc-sidecar"),
		"--node-name="+idleNode,
		"--server="+r.cluster.ServiceAddress(),
		"--server-ca-file="+r.cluster.CAFile(),
		"--token-file="+r.cluster.NodeTokenPath(idleNode),
		"--kubelet-token-file="+r.cluster.NodeTokenPath(idleNode),
		"--kubelet-config="+r.cluster.KubeletConfigPath(idleNode),
		"--dynamic-config-dir="+r.cluster.DynamicConfigDir(idleNode),
		"--restart-mode=signal",
		"--kubelet-pid-file="+filepath.Join(r.cluster.NodeDir(idleNode), "kubelet.pid"),
		"--kubelet-host=127.0.0.1",
		"--trial-duration="+trial.String(),
		"--health-timeout=30s",
		"--metrics-address="+metricsAddr,
		// Plain HTTP, read without a token: a process outside a pod has no ServiceAccount to review tokens as.
		"--metrics-auth=false",
	)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start dkc-sidecar for %s: %w", idleNode, err)
	}
	s := &realSidecar{cmd: cmd, metricsAddr: metricsAddr, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(s.done) }()
	return s, nil
}

// stop ends the process by its PID: TERM, then KILL after 10s.
func (s *realSidecar) stop() {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
}

// idleSidecar measures one real dkc-sidecar process as it sits on a production node most of its life: a
// config assigned, active and last-known-good, metrics on and scraped, connected and quiet.
func (r *run) idleSidecar(ctx context.Context) error {
	const trial = 10 * time.Second
	s, err := r.startRealSidecar(trial)
	if err != nil {
		return err
	}
	r.idle = s
	if err := r.pointAt(ctx, idleNode, cmA); err != nil {
		return err
	}
	names := func(st map[string]any, field string) string {
		m, _ := st[field].(map[string]any)
		cm, _ := m["configMap"].(map[string]any)
		name, _ := cm["name"].(string)
		return name
	}
	wctx, cancel := context.WithTimeout(ctx, trial+2*time.Minute)
	defer cancel()
	if err := r.cluster.WaitStatus(wctx, idleNode, func(st map[string]any) bool {
		return names(st, "active") == cmA && names(st, "lastKnownGood") == cmA && st["error"] == nil
	}); err != nil {
		return fmt.Errorf("%s's real sidecar never had %s active and last-known-good: %w", idleNode, cmA, err)
	}
	// Scraped like Prometheus would, every 2s over the settling time (the metrics are part of the cost).
	var samples []int64
	for i := range 10 {
		if _, err := serverMetrics(ctx, s.metricsAddr); err != nil {
			return fmt.Errorf("scrape %s's sidecar: %w", idleNode, err)
		}
		time.Sleep(2 * time.Second)
		if i >= 7 {
			v, err := rss(s.cmd.Process.Pid)
			if err != nil {
				return err
			}
			samples = append(samples, v)
		}
	}
	r.res.set("sidecar_idle_rss_bytes", float64(median(samples)))
	return nil
}
