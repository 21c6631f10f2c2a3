// SPDX-License-Identifier: Apache-2.0

// Package reporoot finds the dkc checkout a test runs in: the tests that read the tree (docs, headers) and
// the dev cluster (which builds from it) all start from the package directory `go test` runs them in.
package reporoot

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
)

// Module is the main module's path.
const Module = "github.com/dkc-dev/dkc"

// Find returns the root of the dkc checkout that holds dir: the nearest directory at or above dir whose
// go.mod declares Module (the nested modules' go.mod files, e.g. internal/kubeletcheck's, declare others).
func Find(dir string) (string, error) {
	for d := dir; ; d = filepath.Dir(d) {
		data, err := os.ReadFile(filepath.Join(d, "go.mod"))
		if err == nil && strings.HasPrefix(string(data), "module "+Module+"\n") {
			return d, nil
		}
		if d == filepath.Dir(d) {
			return "", errors.New("not inside the dkc repository (no go.mod of " + Module + " above " + dir + ")")
		}
	}
}
