// SPDX-License-Identifier: Apache-2.0

package app

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"

	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/dkc-dev/dkc/internal/httpserve"
	"github.com/dkc-dev/dkc/sidecar/internal/agent"
	"github.com/dkc-dev/dkc/sidecar/internal/kubeletunit"
	"github.com/dkc-dev/dkc/sidecar/internal/probe"
	"github.com/dkc-dev/dkc/sidecar/internal/systemd"
	"github.com/dkc-dev/dkc/sidecar/internal/uninstall"
)

// uninstallNode is --uninstall: under the node's lock (a sidecar pod of the normal mode, being replaced by
// this one, may still be restarting the kubelet), it takes dkc off the node (package uninstall), then stays
// up serving /healthz and /readyz — ready once the node is clean — so that the DaemonSet's rollout into
// this mode completes only when every node is. It talks to no dkc-server.
func (s *Sidecar) uninstallNode(ctx context.Context, log *zap.Logger) error {
	cfg := s.cfg
	if !cfg.NoNodeLock {
		release, err := lockNode(ctx, cfg.DynamicConfigDir, log)
		if err != nil {
			return err
		}
		defer release()
	}
	var unit uninstall.Unit
	if u, ok := cfg.ServiceManager.(uninstall.Unit); ok {
		unit = u
	} else {
		m, err := systemd.Dial(ctx, cfg.DBusAddress, cfg.KubeletUnit)
		if err != nil {
			return err
		}
		defer m.Close()
		if err := m.CheckUnit(ctx); err != nil {
			return err
		}
		unit = m
	}
	p, err := probe.New(probe.Config{Log: log.Named("probe"), Host: cfg.KubeletHost})
	if err != nil {
		return err
	}
	// The local config is validated with the code of the kubelet's minor before the kubelet is restarted onto
	// it: the version the normal mode recorded (dkc-server sent it), unless --kubelet-version says.
	checker := cfg.Checker
	if checker == nil {
		if checker, err = kubeletChecker(cfg, log); err != nil {
			return err
		}
	}
	version, flags, err := agent.Recorded(cfg.DynamicConfigDir)
	if err != nil {
		log.Warn("uninstall: the sidecar's state file is unreadable: the kubelet's version and flags are not known from it",
			zap.Error(err))
	}
	if cfg.KubeletVersion != "" {
		version = cfg.KubeletVersion
	}
	c := uninstall.New(uninstall.Config{
		Log: log.Named("uninstall"), Unit: unit, Kubelet: configHealthz{probe: p},
		DynamicConfigDir: cfg.DynamicConfigDir, KubeletConfig: cfg.KubeletConfig,
		DropIn: cfg.KubeletDropIn, ProcDir: cfg.HostProc,
		HealthTimeout: cfg.HealthTimeout, Checker: checker, KubeletVersion: version, KubeletFlags: flags,
		Files: []string{agent.StateFileName, kubeletunit.DropInCopyName, systemd.VersionFileName},
	})
	log.Info("dkc-sidecar uninstalling dkc from this node", zap.String("dynamicConfigDir", cfg.DynamicConfigDir),
		zap.String("dropIn", cfg.KubeletDropIn), zap.String("kubeletConfig", cfg.KubeletConfig))
	var health httpserve.Listener
	if cfg.MetricsAddress != "" {
		if health, err = metricsListener("health", cfg, uninstallMux(c), false, log); err != nil {
			return err
		}
	}
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return c.Run(gctx) })
	if cfg.MetricsAddress != "" {
		g.Go(func() error { return httpserve.Serve(gctx, health) })
	}
	err = g.Wait()
	if ready, _ := c.Ready(); ready && !cfg.NoNodeLock {
		// The lock file, dkc's last on the node, goes only now that this process serves nothing more and
		// acts no more: a sidecar started meanwhile (dkc installed again) waits on it until this one exits,
		// and one that comes after the removal finds the port free.
		if rerr := os.Remove(filepath.Join(cfg.DynamicConfigDir, LockFileName)); rerr != nil &&
			!errors.Is(rerr, os.ErrNotExist) {
			log.Warn("uninstall: remove the node's sidecar lock", zap.Error(rerr))
		} else {
			log.Info("uninstall: dkc-sidecar.lock", zap.String("result", "removed"))
		}
	}
	log.Info("dkc-sidecar stopped")
	return err
}

// uninstallMux serves the probes of the cleanup mode: /healthz while the process serves HTTP, /readyz 200
// once the node is clean and 503 with what is missing (the last failure) until then.
func uninstallMux(c *uninstall.Cleaner) *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		ready, msg := c.Ready()
		if !ready {
			http.Error(w, "dkc not removed from this node yet: "+msg, http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte(msg))
	})
	return mux
}

// configHealthz asks the kubelet's /healthz where a config file makes it serve it (read at every check: the
// file may have been fixed meanwhile).
type configHealthz struct {
	probe *probe.Kubelet
}

func (h configHealthz) Healthz(ctx context.Context, config string) error {
	kc, err := uninstall.HealthzEndpoint(config)
	if err != nil {
		return err
	}
	return h.probe.Healthz(ctx, kc)
}
