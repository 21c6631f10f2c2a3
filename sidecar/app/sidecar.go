// SPDX-License-Identifier: Apache-2.0

package app

import (
	"go.uber.org/zap"

	"github.com/dkc-dev/dkc/internal/configcheck"
	"github.com/dkc-dev/dkc/sidecar/internal/agent"
	"github.com/dkc-dev/dkc/sidecar/internal/kubeletunit"
)

// Sidecar is one node's dkc-sidecar. New builds it; Run runs it.
type Sidecar struct {
	cfg Config
	log *zap.Logger
}

// ServiceManager restarts the kubelet: systemd over D-Bus by default (--restart-mode).
type ServiceManager = agent.ServiceManager

// Prober asks the running kubelet how it is (/healthz, /configz): over HTTPS by default.
type Prober = agent.Prober

// Checker loads and validates configs with the kubelet's code: the dkc-kubelet-check helper by default.
type Checker = configcheck.Checker

// Trace events (Config.Trace).
const (
	TraceReceived     = agent.TraceReceived
	TraceCheckpointed = agent.TraceCheckpointed
)

// New returns the sidecar for cfg (see Config.Validate).
func New(cfg Config) *Sidecar {
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	return &Sidecar{cfg: cfg, log: cfg.Log}
}

// KubeletDropIn is the kubelet unit's drop-in that makes it run the config dkc names in
// <dynamicConfigDir>/kubelet.env (what --print-kubelet-dropin prints), for node provisioning.
func KubeletDropIn(dynamicConfigDir string) string { return kubeletunit.DropIn(dynamicConfigDir) }

// KubeletEnvFile is the file the drop-in loads, and KubeletConfigVariable the variable it sets there: the
// kubelet's --config argument.
func KubeletEnvFile(dynamicConfigDir string) string { return kubeletunit.New(dynamicConfigDir).Path }

// KubeletConfigVariable: see KubeletEnvFile.
const KubeletConfigVariable = kubeletunit.Variable

// KubeletConfigFile is the config file the kubelet runs after its next restart, as the env file in
// dynamicConfigDir names it; "" when there is none (the unit's own --config).
func KubeletConfigFile(dynamicConfigDir string) (string, error) {
	return kubeletunit.New(dynamicConfigDir).Get()
}
