# Tandem's two commands: `make demo` trains a model on this machine; `make test` runs every test.
# Both install what they need. Areas add their own targets in mk/*.mk and append to TEST_TARGETS.

SHELL := /bin/bash
CARGO ?= cargo
TEST_TARGETS :=

.PHONY: all demo test lint fmt-check clippy unit-test crds crd-check deps

all: test

include $(sort $(wildcard mk/*.mk))

## deps: Debian packages the build and tests need (OpenMPI, libclang for rsmpi's bindgen).
deps:
	@scripts/install-deps.sh

## crds: regenerate the CRD YAML from the api crate.
crds:
	$(CARGO) run -q -p xtask -- crdgen

## crd-check: fail when the committed CRDs are stale.
crd-check:
	$(CARGO) run -q -p xtask -- crdgen --check

fmt-check:
	$(CARGO) fmt --all -- --check

clippy: deps
	$(CARGO) clippy --workspace --all-targets -- -D warnings

lint: fmt-check clippy

unit-test: deps
	$(CARGO) test --workspace

## test: every check and test, the command CI runs.
test: lint unit-test crd-check $(TEST_TARGETS)
	@echo "make test: all checks passed"
