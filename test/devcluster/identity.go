// SPDX-License-Identifier: Apache-2.0

package devcluster

import (
	"crypto/x509"
	"fmt"
	"path/filepath"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// NodeCredentials issues a kubelet client certificate for node (identity system:node:<node> in group
// system:nodes, exactly what the Node authorizer and NodeRestriction recognise), writes a kubeconfig for it
// into the node's directory and returns its client configuration. Tests use it to act as a node that has no
// running kubelet, to check what the apiserver lets a node read and write.
func (c *Cluster) NodeCredentials(node string) (*rest.Config, error) {
	name := "node-" + node
	if err := c.pki.issue(name, "system:node:"+node, []string{"system:nodes"}, x509.ExtKeyUsageClientAuth, nil,
		nil); err != nil {
		return nil, fmt.Errorf("issue credentials of node %s: %w", node, err)
	}
	path := filepath.Join(c.NodeDir(node), "kubelet.kubeconfig")
	if err := writeKubeconfig(path, c.apiServerURL(), c.pki.CAFile(), c.pki.path(name+".crt"),
		c.pki.path(name+".key")); err != nil {
		return nil, fmt.Errorf("write kubeconfig of node %s: %w", node, err)
	}
	return clientcmd.BuildConfigFromFlags("", path)
}
