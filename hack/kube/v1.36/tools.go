// SPDX-License-Identifier: Apache-2.0

//go:build tools

// Package tools pins the Kubernetes v1.36 binaries the local cluster runs (hack/kube/add-release.sh made
// it). This module is kept out of the main go.mod on purpose: kube-apiserver drags in etcd's server and a
// large dependency tree that dkc itself must not inherit.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
