# Tandem's two commands: `make demo` trains a model on this machine; `make test` runs every test.
# Both install what they need. Areas add their own targets in mk/*.mk and append to TEST_TARGETS.

SHELL := /bin/bash
CARGO ?= cargo
TEST_TARGETS :=

.PHONY: all demo test test-build prepare lint fmt-check clippy unit-test crds crd-check deps fresh-check FORCE

all: test

# Every goal, whatever its name (those of mk/*.mk and any added later), first makes sure the Debian
# packages the build needs are installed: GNU make remakes its included makefiles before it builds
# anything, so this rule runs once per `make` invocation. scripts/install-deps.sh is a few checks when
# nothing is missing; the file is never written, so make does not restart.
-include target/.ensure-deps.mk
target/.ensure-deps.mk: FORCE
	@scripts/install-deps.sh
FORCE:

include $(sort $(wildcard mk/*.mk))

## deps: Debian packages the build and tests need (OpenMPI, libclang for rsmpi's bindgen, …).
deps:
	@scripts/install-deps.sh

## fresh-check: `make demo` on a clean Debian root with only what a new machine has (not a test).
## FRESH_GOALS picks other goals; state lives outside the repository and is removed afterwards.
FRESH_GOALS ?= demo
fresh-check:
	@scripts/fresh-check.sh $(FRESH_GOALS)

## crds: regenerate the CRD YAML from the api crate.
crds:
	$(CARGO) run -q -p xtask -- crdgen

## crd-check: fail when the committed CRDs are stale.
crd-check:
	$(CARGO) run -q -p xtask -- crdgen --check

fmt-check:
	$(CARGO) fmt --all -- --check

# Lints every target, the cluster and e2e tests included, with the feature set of the test build.
clippy:
	$(CARGO) clippy --workspace --all-targets --features $(TEST_FEATURES),tandem-e2e/e2e -- -D warnings

lint: fmt-check clippy

## unit-test: the workspace's tests that need no cluster (a developer's quick run; `make test` runs
## them inside test-cluster, in the same build as the cluster tests).
unit-test:
	$(CARGO) test --workspace

## test: every check and test, the command CI runs. Every cargo command in it selects the whole
## workspace with the same features (TEST_FEATURES add test targets and the benchmark tools' references), so the
## dependencies compile once; the CRDs' staleness is a unit test of xtask (crd-check is for humans).
# Two stages. The first compiles: the Rust side (lint, then every test binary) beside the set-up that
# needs no cargo (`prepare`: the Go builds of the control plane and the node, the node's packages, the
# images' bases, the data), so each fills the other's idle time (downloads, serial crates, link steps);
# on a new machine this saves minutes. The second runs the tests, one target at a time.
test:
	@$(MAKE) --no-print-directory -j2 test-build prepare
	@$(MAKE) --no-print-directory $(TEST_TARGETS)
	@echo "make test: all checks passed"

## test-build: lint, then compile every test binary of `make test` (no test runs).
test-build: lint
	$(CARGO) test --workspace --features $(TEST_FEATURES) --no-run

## prepare: what `make test` needs besides cargo: cluster-bins, node-bins, the images' bases and the data.
prepare: cluster-bins node-bins image-bases data
