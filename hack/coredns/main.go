// SPDX-License-Identifier: Apache-2.0

// Command coredns is CoreDNS with only the plugins a Kubernetes cluster's DNS needs, built from the pinned
// github.com/coredns/coredns module for the dev cluster's cluster DNS. Selecting plugins at compile time is
// how CoreDNS documents custom builds (core/dnsserver.Directives); the full plugin set would pull in every
// cloud provider's SDK for nothing.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

func init() {
	// The order in which plugins handle a query: the same relative order as upstream's zdirectives.go.
	dnsserver.Directives = []string{"ready", "health", "errors", "log", "loadbalance", "cache", "kubernetes"}
}

func main() { coremain.Run() }
