#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0

# Splits the module's test packages for make test-unit by whether Go's test cache can be trusted with them.
#
#   hack/unitpkgs.sh cached   packages whose test results go test may reuse
#   hack/unitpkgs.sh fresh    packages whose tests always run
#
# go test reuses a result only when the test binary, the environment variables the test read and the files
# it opened or looked at inside the module (their content, size and modification time) are unchanged. It
# cannot see what a program the test starts reads (`go build`, `git ls-files`, `kubectl kustomize`, a
# kubelet-check helper), nor files outside the module (so the pool window tests compile the time zones in).
# So a package is fresh when its tests, or any package of this module they import, import os/exec; every
# other package is cached. The rule is conservative (a package that starts only `sh` is fresh too) and needs
# no list kept by hand: a test that starts a program through os/exec is fresh from the commit that adds it.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:?usage: hack/unitpkgs.sh cached|fresh}
mod=$(go list -m)
# Listed with the settings the unit tests build with (make test-unit: cgo on, -race), so that files only
# those settings select are counted.
export CGO_ENABLED=1
export GOFLAGS="${GOFLAGS:-} -race"

# The module's packages that import os/exec (their own files), and each test package's test files' imports.
execs=$(go list -f '{{range .Imports}}{{if eq . "os/exec"}}{{$.ImportPath}}{{"\n"}}{{end}}{{end}}' ./... | sort -u)
tests=$(go list -f '{{if or .TestGoFiles .XTestGoFiles}}{{.ImportPath}}{{range .TestImports}} {{.}}{{end}}{{range .XTestImports}} {{.}}{{end}}{{end}}' ./...)

# Per test binary (<pkg>.test), every package it links; a module package recompiled for the test is listed
# as "<pkg> [<pkg>.test]".
deps=$(go list -test -f '{{if eq .Name "main"}}{{if ne .ForTest ""}}{{else}}{{.ImportPath}}{{range .Deps}} {{.}}{{end}}{{end}}{{end}}' ./... |
	grep '\.test ' || true)

{ echo "$execs" | sed 's/^/exec /'; echo "$tests" | sed 's/^/test /'; echo "$deps" | sed 's/^/bin /'; } |
	awk -v mod="$mod/" -v mode="$mode" '
		$1 == "exec" { x[$2] = 1; next }
		$1 == "test" { seen[$2] = 1; for (i = 3; i <= NF; i++) if ($i == "os/exec") fresh[$2] = 1; next }
		$1 == "bin" {
			pkg = $2; sub(/\.test$/, "", pkg)
			for (i = 3; i <= NF; i++) if (index($i, mod) == 1 && ($i in x)) fresh[pkg] = 1
		}
		END { for (p in seen) if ((p in fresh) == (mode == "fresh")) print p }' | sort
