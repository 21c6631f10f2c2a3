// SPDX-License-Identifier: Apache-2.0

// Package nodeconfig is dkc's vocabulary, in one place: the Node annotations and condition users and tools
// read and write, the condition's reasons, the restart Event, every status error text, what a valid config
// source is, and when two sources are the same. The design doc (docs/design.md) states the contract these
// names are part of.
//
// It is a leaf: it imports only the Kubernetes API types, so the CLI, the service and the sidecar can all
// use it without linking each other (the wire↔core conversion, which needs the gRPC types, is in the
// sub-package wire).
package nodeconfig
