// SPDX-License-Identifier: Apache-2.0

//go:build tools

// Package tools pins the etcd server the local cluster runs, in a module of its own so that neither dkc nor
// the Kubernetes wrapper module inherits etcd's server dependencies.
package tools

import _ "go.etcd.io/etcd/server/v3"
