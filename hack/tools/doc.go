// SPDX-License-Identifier: Apache-2.0

// Package tools pins developer tools that are too heavy to share the main module's dependency graph: buf
// pulls in versions of cel-go, grpc and others that would otherwise be forced onto dkc's Kubernetes
// libraries. Run them with `go tool -modfile=hack/tools/go.mod NAME` (the Makefile does).
package tools
