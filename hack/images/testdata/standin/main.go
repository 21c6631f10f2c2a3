// SPDX-License-Identifier: Apache-2.0

// Command standin stands in for dkc's binaries in hack/images' tests: built like them (hack/images
// compile) in seconds, and linking a module dependency (grpc) an SBOM must list.
package main

import (
	"fmt"

	"google.golang.org/grpc"
)

func main() { fmt.Println(grpc.Version) }
