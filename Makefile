# SPDX-License-Identifier: Apache-2.0

# dkc — `make demo` runs the main job end to end; `make test` runs every test. `make help` lists the rest.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

# One build configuration for every go command make runs, static and path-free as the images' binaries are
# built: tests, vet, lint, code generators and builds then share one compile of each package, and a fresh
# clone (CI's) compiles from the Go build cache what any earlier checkout compiled. The race detector needs
# cgo: test-unit turns it back on for its run.
export CGO_ENABLED := 0
export GOFLAGS := -trimpath $(GOFLAGS)

OUT        := _output
BIN        := $(OUT)/bin
DEV_DIR    := $(OUT)/dev
GO_TOOLS   := go tool -modfile=hack/tools/go.mod
BUF        := $(GO_TOOLS) buf
# The branch `buf breaking` compares the API against; main itself compares with its previous commit.
BUF_AGAINST ?= .git\#ref=HEAD~1
# The cluster suites: each test binary starts a real cluster of its own, and the two suites run side by side
# (INTEGRATION_P=1 runs them one after the other, unsharded). Each cluster leases a block of loopback ports
# below the kernel's ephemeral range (test/devcluster/ports.go), so clusters starting at once never pick the
# same port. The suites mostly wait (kubelet restarts, trials): INTEGRATION_SHARDS=n and INSTALLED_SHARDS=n
# run each as n shards side by side, each on a cluster of its own with a share of its tests dealt slowest
# first (hack/clustersuites.sh, the suites' shards_test.go); the defaults are the counts docs/results.md
# measured (1: the suite whole). test/freshkernel changes host-wide kernel settings and requires that no
# other cluster runs: it runs first, alone.
INTEGRATION_SOLO_PKGS := ./test/freshkernel/
INTEGRATION_PKGS := ./test/integration/ ./test/installed/
INTEGRATION_P ?= 2
# Four clusters at once (both suites as two shards) overloaded a 2-core machine into flaky waits
# (docs/results.md): the integration suite runs whole by default; INTEGRATION_SHARDS=2 where cores allow.
INTEGRATION_SHARDS ?= 1
INSTALLED_SHARDS ?= 2
TEST_FLAGS ?=

# Programs `make build` puts in $(BIN).
MAINS := ./cli/cmd/kubectl-dkc ./hack/demo ./hack/dkc-dev ./hack/fake-kubelet ./services/cmd/dkc-server ./sidecar/cmd/dkc-sidecar ./hack/bench
# The kubelet-config checkers, one per kubelet minor dkc supports (dkc-kubelet-check-1.34 … -1.37), each
# linking that minor's kubelet code: their own module, built once per pinned go.mod (docs/versions.md).
KUBELETCHECK := internal/kubeletcheck

.PHONY: help
help: ## list targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-10s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

# The typed clientset, listers and informers of dkc.dev/v1alpha1 (docs/development.md, "Layout"), made by the
# pinned k8s.io/code-generator from the +genclient types in api/v1alpha1. The tree holds generated code
# only and is written anew each time: a type or file the generators stop writing does not linger.
API_GEN     := api/generated
API_GEN_PKG := github.com/dkc-dev/dkc/$(API_GEN)
BOILERPLATE := hack/boilerplate.go.txt

.PHONY: generate
generate: ## regenerate Go code from proto/ with buf (local plugins pinned in go.mod), the API's deep copies, CRD, clientset, listers and informers, the kubelet defaults (per minor) kubectl-dkc embeds, and the flag references in docs/reference/
	$(BUF) generate
	go generate ./internal/configz
	hack/flagdocs.sh
	rm -rf $(API_GEN)
	$(GO_TOOLS) controller-gen object:headerFile=$(BOILERPLATE) crd paths=./api/... output:crd:artifacts:config=deploy/crds
	$(GO_TOOLS) client-gen --go-header-file $(BOILERPLATE) --input-base github.com/dkc-dev/dkc --input api/v1alpha1 \
		--clientset-name clientset --output-dir $(API_GEN) --output-pkg $(API_GEN_PKG)
	$(GO_TOOLS) lister-gen --go-header-file $(BOILERPLATE) --output-dir $(API_GEN)/listers --output-pkg $(API_GEN_PKG)/listers ./api/v1alpha1
	$(GO_TOOLS) informer-gen --go-header-file $(BOILERPLATE) --single-directory --versioned-clientset-package $(API_GEN_PKG)/clientset \
		--listers-package $(API_GEN_PKG)/listers --output-dir $(API_GEN)/informers --output-pkg $(API_GEN_PKG)/informers ./api/v1alpha1
	go run ./hack/helmchart

.PHONY: lint
lint: golangci-lint ## gofmt, go vet, golangci-lint (.golangci.yml), buf lint (STANDARD) and buf breaking (FILE)
	@out=$$(gofmt -l $$(git ls-files '*.go' | grep -v '\.pb\.go$$')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	go vet ./...
	go vet -tags integration $(INTEGRATION_SOLO_PKGS) $(INTEGRATION_PKGS)
	go vet -tags helm ./hack/helmchart/...
	cd $(KUBELETCHECK) && go vet ./...
	cd test/monitoring && go vet ./...
	$(BUF) lint
	@if git rev-parse -q --verify 'HEAD~1^{commit}' >/dev/null && git cat-file -e 'HEAD~1:proto/dkc/v1/config.proto' 2>/dev/null; then \
		echo "$(BUF) breaking --against '$(BUF_AGAINST)'"; $(BUF) breaking --against '$(BUF_AGAINST)'; \
	else echo "buf breaking: no earlier API to compare against"; fi

.PHONY: verify-generated
verify-generated: generate ## fail if generated code differs from what is committed
	@git diff --exit-code -- proto/ internal/configz/defaults/ docs/reference/ 'api/*/zz_generated.deepcopy.go' $(API_GEN)/ deploy/crds/ deploy/helm/ || { echo "generated code is stale: run make generate and commit"; exit 1; }
	@if [ -n "$$(git status --porcelain -- internal/configz/defaults/ docs/reference/ 'api/*/zz_generated.deepcopy.go' $(API_GEN)/ deploy/crds/ deploy/helm/)" ]; then git status --short -- internal/configz/defaults/ docs/reference/ 'api/*/zz_generated.deepcopy.go' $(API_GEN)/ deploy/crds/ deploy/helm/; echo "generated files added or removed: run make generate and commit"; exit 1; fi

# Static, path-free builds, as the images are built (hack/images): the binaries `make build` and the
# integration tests run are the ones the images ship, and the three share one compile cache.
# The version make build stamps into the binaries (internal/version): VERSION, else git describe.
BUILD_VERSION := $(or $(VERSION),$(shell git describe --tags --always --dirty 2>/dev/null),devel)
GO_BUILD := CGO_ENABLED=0 go build -trimpath -buildvcs=false -ldflags '-X github.com/dkc-dev/dkc/internal/version.version=$(BUILD_VERSION)'

# The pinned tools are linked once per machine until their pins change (hack/gobuild.sh), not per checkout.
# The pinned Helm (hack/tools/helm), which the chart's tests and the installed suite's TestHelmInstall run.
HELM_BIN := $(BIN)/helm
GOLANGCI_LINT_BIN := $(BIN)/golangci-lint
$(GOLANGCI_LINT_BIN): hack/tools/golangci-lint/go.mod hack/tools/golangci-lint/go.sum
	@mkdir -p $(BIN)
	hack/gobuild.sh $(BIN) -modfile=hack/tools/golangci-lint/go.mod github.com/golangci/golangci-lint/v2/cmd/golangci-lint

.PHONY: golangci-lint
golangci-lint: $(GOLANGCI_LINT_BIN) ## golangci-lint with .golangci.yml over every Go module of the tree (part of make lint)
	$(GOLANGCI_LINT_BIN) run ./...
	cd $(KUBELETCHECK) && $(abspath $(GOLANGCI_LINT_BIN)) run ./...
	cd test/monitoring && $(abspath $(GOLANGCI_LINT_BIN)) run ./...
$(HELM_BIN): hack/tools/helm/go.mod hack/tools/helm/go.sum
	@mkdir -p $(BIN)
	hack/gobuild.sh $(BIN) -modfile=hack/tools/helm/go.mod helm.sh/helm/v4/cmd/helm

.PHONY: build
build: ## build the binaries into _output/bin (with one dkc-kubelet-check-<minor> per supported kubelet minor)
	@mkdir -p $(BIN)
	$(GO_BUILD) -o $(BIN)/ $(MAINS)
	$(KUBELETCHECK)/build.sh $(BIN)

# Images: `make images` builds dkc-server, dkc-sidecar and pause from source (no daemon, no base image to pull)
# into $(OUT)/images, one image index per image over IMAGE_PLATFORMS (linux/amd64 and linux/arm64): the OCI
# layout oci/<image> (the index, what push-images pushes), <image>.tar (docker-archive of the host's platform:
# `ctr -n k8s.io images import` loads it), sbom/<image>_<os>_<arch>.spdx.json (also in each image, at
# /usr/share/sbom/<image>.spdx.json), and the release overlay $(RELEASE_OVERLAY)/kustomization.yaml, which
# installs RELEASE_BASE with dkc-server and dkc-sidecar pinned by their index digests. dkc-server and
# dkc-sidecar carry the dkc-kubelet-check-<minor> helpers in one shared layer. Timestamps come from
# SOURCE_DATE_EPOCH, else HEAD's commit time: a commit rebuilds to the same digests. VERSION (default: git
# describe --tags --always --dirty) becomes org.opencontainers.image.version.
# A release builds with its registry and tag, pushes the indexes as built, then installs the overlay:
#   make images push-images IMAGE_REPO=ghcr.io/dkc-dev IMAGE_TAG=v0.2.0 VERSION=v0.2.0
#   kubectl apply -k _output/release/deploy
# push-images runs, per image, `crane push _output/images/oci/dkc-server ghcr.io/dkc-dev/dkc-server:v0.2.0`
# (credentials from ~/.docker/config.json, e.g. `crane auth login ghcr.io`), with the IMAGE_REPO the overlay
# pins. The local cluster (make up INSTALLED=1, make demo; test/devcluster runs hack/images itself) imports the
# host's platform only and builds nothing else: those targets empty IMAGE_PLATFORMS, which hack/images takes as
# the host's platform, and RELEASE_OVERLAY.
IMAGE_REPO      ?= dkc.local
IMAGE_TAG       ?= dev
IMAGE_PLATFORMS ?= linux/amd64,linux/arm64
RELEASE_OVERLAY ?= $(OUT)/release/deploy
RELEASE_BASE    ?= deploy/overlays/self-signed
VERSION         ?=
IMAGES          := dkc-server dkc-sidecar pause
CRANE           := $(GO_TOOLS) crane
# Target-specific values hold for the images target these build as a prerequisite.
up demo: IMAGE_PLATFORMS =
up demo: RELEASE_OVERLAY =

.PHONY: images
images: ## build the OCI image indexes (dkc-server, dkc-sidecar, pause; IMAGE_PLATFORMS), SBOMs and the digest-pinned release overlay into _output (IMAGE_REPO, IMAGE_TAG, VERSION, RELEASE_BASE)
	go run ./hack/images -repo $(IMAGE_REPO) -tag $(IMAGE_TAG) -out $(OUT)/images $(if $(IMAGE_PLATFORMS),-platforms '$(IMAGE_PLATFORMS)') $(if $(VERSION),-version $(VERSION)) $(if $(RELEASE_OVERLAY),-release-overlay $(RELEASE_OVERLAY) -release-base $(RELEASE_BASE))

.PHONY: push-images
push-images: ## push the image indexes `make images` wrote (every platform) to $(IMAGE_REPO)/<image>:$(IMAGE_TAG) with crane
	@for i in $(IMAGES); do echo "crane push $(OUT)/images/oci/$$i $(IMAGE_REPO)/$$i:$(IMAGE_TAG)"; \
		$(CRANE) push $(OUT)/images/oci/$$i $(IMAGE_REPO)/$$i:$(IMAGE_TAG) || exit 1; done

# The unit tests and fuzzing run beside the cluster suites at the lowest CPU priority, their output printed
# at the end (also in $(OUT)/test-unit.log): the suites spend much of their time waiting on kubelet restarts
# and trials, and the unit tests fill it. UNIT_BESIDE=0 runs them first, alone.
UNIT_BESIDE ?= 1
.PHONY: test
ifeq ($(UNIT_BESIDE),1)
test: $(HELM_BIN) ## run every test: unit and fuzzing (short) beside integration against real local clusters
	@mkdir -p $(OUT); rc=0; \
	nice -n 19 $(MAKE) --no-print-directory test-unit test-fuzz >$(OUT)/test-unit.log 2>&1 & unit=$$!; \
	$(MAKE) --no-print-directory test-integration || rc=1; \
	wait $$unit || { rc=1; echo "== unit tests or fuzzing FAILED (log: $(OUT)/test-unit.log)"; }; \
	echo "== unit tests and fuzzing ($(OUT)/test-unit.log):"; cat $(OUT)/test-unit.log; exit $$rc
else
test: test-unit test-fuzz test-integration ## run every test: unit, fuzzing (short), then integration against the real local cluster
endif

# Per target, a count of executions (about 10 s each on a 2-core machine), not a duration: with a duration,
# Go's fuzz coordinator (before Go 1.27, go.dev/issue/75804) can fail a clean run with "context deadline
# exceeded" when the deadline falls while a worker is busy (FuzzSave so, on a loaded CI machine, no crasher
# saved). Minimizing a newly interesting input is bounded to a few executions. FUZZTIME, if set, replaces
# every target's count (e.g. make test-fuzz FUZZTIME=10m for a long run).
FUZZTIME ?=
FUZZMINIMIZE ?= 20x
FUZZ_TARGETS := ./services/internal/auth:FuzzParseToken:10000x ./internal/payload:FuzzValidateFileName:90000x \
	./services/internal/resolve:FuzzParseAnnotation:30000x ./sidecar/internal/checkpoint:FuzzSave:2500x \
	./sidecar/internal/checkpoint:FuzzDecodeRecord:17000x ./sidecar/internal/kubeletunit:FuzzEnvFileSet:120000x
.PHONY: test-fuzz
test-fuzz: ## run each fuzz target for its count of executions (about 10s each; longer: make test-fuzz FUZZTIME=10m)
	@for t in $(FUZZ_TARGETS); do pkg=$${t%%:*}; rest=$${t#*:}; fn=$${rest%%:*}; ft="$(FUZZTIME)"; [ -n "$$ft" ] || ft=$${rest#*:}; \
		echo "go test -run=^$$ -fuzz=^$$fn\$$ -fuzztime=$$ft -fuzzminimizetime=$(FUZZMINIMIZE) $$pkg"; \
		go test -run='^$$' -fuzz="^$$fn\$$" -fuzztime=$$ft -fuzzminimizetime=$(FUZZMINIMIZE) $$pkg || exit 1; done

# The unit tests run under the race detector: dkc is concurrent throughout (status workers, the outbox,
# streams, leader election, informers), and a race is a bug whether or not a test's assertions see it. The
# kubelet-check module is the exception: a loader around the kubelet's own code with no concurrency of
# dkc's, whose instrumented build of the kubelet's dependency tree takes longer than the other tests. Its
# tests build as its helpers do, so they compile nothing the helpers did not.
#
# Go's test cache reuses a package's passing result while its test binary, the environment it read and the
# files it opened in the module are unchanged: a warm run tests only what a change reaches. Packages whose
# tests start programs through os/exec (go build, git, kubectl kustomize, the kubelet-check helpers) always
# run, since go test cannot see what those read (hack/unitpkgs.sh). UNIT_CACHE=0 runs every package.
UNIT_CACHE ?= 1
.PHONY: test-unit
test-unit: $(HELM_BIN) ## unit tests under the race detector (no cluster; -tags helm: the chart rendered by the pinned helm; UNIT_CACHE=0: no cached results)
ifeq ($(UNIT_CACHE),1)
	cached=$$(hack/unitpkgs.sh cached) && fresh=$$(hack/unitpkgs.sh fresh) && \
		CGO_ENABLED=1 go test -race -timeout 30m $(TEST_FLAGS) $$cached && \
		CGO_ENABLED=1 go test -race -count=1 -timeout 30m $(TEST_FLAGS) $$fresh
else
	CGO_ENABLED=1 go test -race -count=1 -timeout 30m $(TEST_FLAGS) ./...
endif
	@# Every program links (the suites build only what they run), unstamped and only when its code changed.
	hack/gobuild.sh $(OUT)/mains -buildvcs=false $(MAINS)
	HELM=$(abspath $(HELM_BIN)) go test -count=1 -tags helm $(TEST_FLAGS) ./hack/helmchart/...
	cd $(KUBELETCHECK) && go test -count=1 $(TEST_FLAGS) ./...
	cd test/monitoring && go test -count=1 $(TEST_FLAGS) ./...

.PHONY: test-race
test-race: test-unit ## the unit tests under the race detector (what test-unit runs)

# dkc-dev alone, unstamped: what the cluster suites need besides the binaries they build themselves (it stops
# their clusters); linked only when its code changed since the last build on this machine (hack/gobuild.sh).
.PHONY: dkc-dev
dkc-dev:
	@mkdir -p $(BIN)
	hack/gobuild.sh $(BIN) -buildvcs=false ./hack/dkc-dev

.PHONY: test-integration
test-integration: dkc-dev $(HELM_BIN) ## tests against real local clusters (root; INTEGRATION_P, INTEGRATION_SHARDS, INSTALLED_SHARDS)
	@rc=0; $(if $(INTEGRATION_SOLO_PKGS),go test -tags integration -count=1 -p 1 -timeout 20m -v $(TEST_FLAGS) \
		$(INTEGRATION_SOLO_PKGS) || rc=1;) \
	HELM=$(abspath $(HELM_BIN)) OUT=$(OUT) INTEGRATION_P=$(INTEGRATION_P) INTEGRATION_SHARDS=$(INTEGRATION_SHARDS) \
		INSTALLED_SHARDS=$(INSTALLED_SHARDS) TEST_FLAGS='$(TEST_FLAGS)' hack/clustersuites.sh $(INTEGRATION_PKGS) || rc=1; \
	for d in $(OUT)/test/*/; do [ -f "$$d/state.json" ] && $(BIN)/dkc-dev -dir "$$d" down; done; exit $$rc

.PHONY: up
up: build $(if $(INSTALLED),images) ## start the local cluster in the background (INSTALLED=1: the installed form, dkc as pods; KUBE_VERSION=1.35|1.36|1.37, KUBELET_VERSIONS=node-1=1.34,..., KUBE_BIN_DIR, SIM_NODES, DKC_TRIAL_DURATION); see _output/dev/env
	$(BIN)/dkc-dev -dir $(DEV_DIR) $(if $(INSTALLED),-installed -images-dir $(OUT)/images) up

.PHONY: down
down: ## stop everything `make up` started
	@if [ -x $(BIN)/dkc-dev ]; then $(BIN)/dkc-dev -dir $(DEV_DIR) down; else go run ./hack/dkc-dev -dir $(DEV_DIR) down; fi

DEMO_DIR := $(OUT)/demo
.PHONY: demo
demo: build images ## the main job end to end: dkc installed as users install it (images, kubectl apply -k) on a fresh two-node cluster, then the seed workflow on node-1 (DEMO_KEEP=1 keeps it)
	@$(BIN)/dkc-dev -dir $(DEMO_DIR) down >/dev/null
	DKC_TRIAL_DURATION=20s $(BIN)/dkc-dev -dir $(DEMO_DIR) -installed -images-dir $(OUT)/images up
	kubectl --kubeconfig $(DEMO_DIR)/kubeconfig get pods -A -o wide
	@rc=0; $(BIN)/demo -kubeconfig $(DEMO_DIR)/kubeconfig || rc=$$?; \
	if [ -z "$${DEMO_KEEP:-}" ]; then $(BIN)/dkc-dev -dir $(DEMO_DIR) down; else echo "cluster kept: . $(DEMO_DIR)/env"; fi; \
	if [ $$rc -ne 0 ]; then echo "logs: $(DEMO_DIR)/logs"; fi; exit $$rc

.PHONY: bench
BENCH_DIR := $(OUT)/bench
bench: build ## the scale benchmark: prints a table, writes _output/bench/results.json (BENCH_FLAGS=-help for knobs)
	@$(BIN)/dkc-dev -dir $(BENCH_DIR)/cluster down >/dev/null
	$(BIN)/bench -dir $(BENCH_DIR) -bin $(BIN) $(BENCH_FLAGS)

# Release: `make release` cross-builds kubectl-dkc for PLATFORMS (static, -trimpath, -s -w, as `make images`) and,
# for linux only, the dkc-kubelet-check-<minor> helpers `kubectl dkc diff` runs (they run the kubelet's Linux
# code: docs/development.md, "Releasing"), and writes into $(OUT)/release one kubectl-dkc_<version>_<os>_<arch>.tar.gz
# per platform (reproducible: times from SOURCE_DATE_EPOCH, else HEAD's commit), their SHA-256 sums
# (kubectl-dkc_<version>_checksums.txt, sha256sum -c) and the krew manifest dkc.yaml generated from the archives,
# whose URIs are $(RELEASE_URL)/<archive>. VERSION must be v<semver> (krew's rule); by default git describe, or
# v0.0.0-g<commit> before the first tag. RELEASE_URL defaults to the GitHub release of VERSION. E.g.
#   make release VERSION=v0.2.0 RELEASE_URL=https://github.com/dkc-dev/dkc/releases/download/v0.2.0
RELEASE_URL ?=
PLATFORMS   ?= linux/amd64,linux/arm64,darwin/amd64,darwin/arm64

.PHONY: release
release: ## kubectl-dkc archives (+ kubelet-check helpers on linux), checksums and krew manifest into _output/release (VERSION, RELEASE_URL, PLATFORMS)
	go run ./hack/release -out $(OUT)/release -platforms '$(PLATFORMS)' $(if $(VERSION),-version '$(VERSION)') $(if $(RELEASE_URL),-release-url '$(RELEASE_URL)')

.PHONY: clean
clean: down ## stop the cluster and remove _output
	rm -rf $(OUT)

# The Helm chart deploy/helm/dkc is generated from deploy/ (docs/helm.md): never edit it, run make chart.
# Helm is pinned in its own tool module (its k8s.io libraries stay off the other tools'); the chart's tests
# run the binary $(HELM_BIN) (built once: minutes cold), passed to them as $$HELM. CHART_VERSION
# sets Chart.yaml's version (kept by later runs without it); appVersion is dkc-server's image tag in deploy/base.
CHART_VERSION ?=

.PHONY: chart
chart: ## regenerate the Helm chart deploy/helm/dkc from deploy/ (CHART_VERSION; check: go test -tags helm ./hack/helmchart/...)
	go run ./hack/helmchart $(if $(CHART_VERSION),-version $(CHART_VERSION))
