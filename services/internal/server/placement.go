// SPDX-License-Identifier: Apache-2.0

package server

import (
	"os"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
)

// controlPlaneLabel is the role label kubeadm (and most installers) put on control-plane nodes; deploy/base
// requires it of dkc-server's node.
const controlPlaneLabel = "node-role.kubernetes.io/control-plane"

// placement is where this replica runs and where the install meant it to run, as deploy/ passes them
// through the downward API: the node ($NODE_NAME), the Deployment's dkc.dev/placement annotation
// ($DKC_PLACEMENT: controlPlane, dedicated or anywhere) and, for a dedicated pool, the label its nodes carry
// ($DKC_PLACEMENT_POOL_LABEL). A replica holds the serving key and the write powers of every node, so an
// operator reading its log must see at once when it runs where a worker's compromise reaches it.
type placement struct {
	node, mode, poolLabel string
}

func placementFromEnv() placement {
	return placement{
		node:      os.Getenv("NODE_NAME"),
		mode:      os.Getenv("DKC_PLACEMENT"),
		poolLabel: os.Getenv("DKC_PLACEMENT_POOL_LABEL"),
	}
}

// guarded reports whether n is a node dkc-server belongs on: one with the control-plane role, or one of the
// dedicated pool the install names.
func (p placement) guarded(n *corev1.Node) bool {
	if _, ok := n.Labels[controlPlaneLabel]; ok {
		return true
	}
	if p.poolLabel == "" {
		return false
	}
	_, ok := n.Labels[p.poolLabel]
	return ok
}

// log says once, at start, which placement this replica runs under and on which node, and warns when that
// node has neither the control-plane role nor the dedicated pool's label. Outside a pod ($NODE_NAME unset:
// a host process, as in the local cluster's fast form) there is nothing to say.
func (p placement) log(log *zap.Logger, nodes corelisters.NodeLister) {
	if p.node == "" {
		return
	}
	mode := p.mode
	if mode == "" {
		mode = "unknown" // a Deployment without the dkc.dev/placement annotation: not rendered from deploy/
	}
	fields := []zap.Field{zap.String("placement", mode), zap.String("node", p.node)}
	if p.poolLabel != "" {
		fields = append(fields, zap.String("poolLabel", p.poolLabel))
	}
	n, err := nodes.Get(p.node)
	if err != nil {
		log.Warn("cannot tell whether this replica's node is a control-plane node or in the dedicated pool",
			append(fields, zap.Error(err))...)
		return
	}
	if !p.guarded(n) {
		log.Warn("dkc-server runs on a node without the control-plane role or the dedicated pool's label: whoever is "+
			"root on this node can make every node run any config (docs/security.md, \"Where dkc-server runs\")", fields...)
		return
	}
	log.Info("dkc-server placement", fields...)
}
