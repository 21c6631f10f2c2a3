// SPDX-License-Identifier: Apache-2.0

package devcluster

import (
	"context"
	"crypto/x509"
	"fmt"
	"path/filepath"
)

// The installed form's control plane beside etcd and kube-apiserver: kube-controller-manager (Deployments,
// ReplicaSets, DaemonSets, EndpointSlices, service account tokens, node lifecycle, garbage collection) and
// kube-scheduler, each with its own identity, as kubeadm runs them. Neither serves HTTPS (--secure-port=0):
// nothing scrapes them here, and fixed default ports would collide between two dev clusters on one machine.

// controlPlaneIdentities are the client certificates of the components that join in the installed form; the
// default RBAC of the apiserver binds exactly these user names.
var controlPlaneIdentities = map[string]string{
	"kube-controller-manager": "system:kube-controller-manager",
	"kube-scheduler":          "system:kube-scheduler",
	"kube-proxy":              "system:kube-proxy",
}

// componentKubeconfig is the kubeconfig of a control-plane component or kube-proxy.
func (c *Cluster) componentKubeconfig(name string) string {
	return filepath.Join(c.cfg.Dir, name+".kubeconfig")
}

func (c *Cluster) issueControlPlaneCertificates() error {
	for name, cn := range controlPlaneIdentities {
		if err := c.pki.issue(name, cn, nil, x509.ExtKeyUsageClientAuth, nil, nil); err != nil {
			return err
		}
		if err := writeKubeconfig(c.componentKubeconfig(name), c.apiServerURL(), c.pki.CAFile(), c.pki.path(name+".crt"),
			c.pki.path(name+".key")); err != nil {
			return err
		}
	}
	return nil
}

func (c *Cluster) startControllerManager(ctx context.Context, bin string) error {
	fmt.Fprintf(c.cfg.Progress, "starting kube-controller-manager and kube-scheduler\n")
	kc := c.componentKubeconfig("kube-controller-manager")
	p, err := startProcess("kube-controller-manager", c.runDir(), c.logFile("kube-controller-manager"), nil, bin,
		"--kubeconfig="+kc,
		"--authentication-kubeconfig="+kc,
		"--authorization-kubeconfig="+kc,
		"--secure-port=0",
		"--leader-elect=false",
		"--use-service-account-credentials=true",
		"--service-account-private-key-file="+c.pki.path("sa.key"),
		"--root-ca-file="+c.pki.CAFile(),
		"--cluster-signing-cert-file="+c.pki.CAFile(),
		"--cluster-signing-key-file="+c.pki.path("ca.key"),
		"--cluster-name=dkc-dev",
		// Pod subnets are fixed per node by the dev cluster's CNI config (installed.go), not allocated here.
		"--allocate-node-cidrs=false",
		"--v=1",
	)
	if err != nil {
		return err
	}
	c.procs = append(c.procs, p)
	return nil
}

func (c *Cluster) startScheduler(ctx context.Context, bin string) error {
	kc := c.componentKubeconfig("kube-scheduler")
	p, err := startProcess("kube-scheduler", c.runDir(), c.logFile("kube-scheduler"), nil, bin,
		"--kubeconfig="+kc,
		"--authentication-kubeconfig="+kc,
		"--authorization-kubeconfig="+kc,
		"--secure-port=0",
		"--leader-elect=false",
		"--v=1",
	)
	if err != nil {
		return err
	}
	c.procs = append(c.procs, p)
	return nil
}
