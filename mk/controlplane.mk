# The test control plane: kube-apiserver, etcd, kube-controller-manager and kwok on loopback, built from
# the Go module proxy into ${TANDEM_CACHE:-$HOME/.cache/tandem}/k8s/<version>/bin (scripts/controlplane/).

## cluster-bins: build the pinned control-plane binaries (kube-apiserver, kube-controller-manager, kubectl, etcd, kwok, helm) if missing.
## cluster-up: start the control plane on loopback; its last line is `export KUBECONFIG=<path>`.
## cluster-down: stop the control plane and remove its state.
## test-cluster: start the control plane, run every workspace test with the cluster tests of
## $(CLUSTER_TEST_PACKAGES) compiled in (one build, one run), always stop it.
.PHONY: cluster-bins cluster-up cluster-down test-cluster

# Packages whose tests need the control plane: each has a `cluster-tests` feature that compiles them.
# Other areas append to this in their own mk file (`CLUSTER_TEST_PACKAGES += tandem-operator`).
CLUSTER_TEST_PACKAGES += tandem-testkit
# The features of every test build in `make test` (clippy, test-cluster, e2e): recursive, so the
# packages appended by later mk files count, and so do the features they add to TEST_EXTRA_FEATURES
# (`tandem-kernels/references`: the benchmark tools' reference GEMMs, whose test needs them).
comma := ,
empty :=
space := $(empty) $(empty)
TEST_FEATURES = $(subst $(space),$(comma),$(strip $(foreach p,$(CLUSTER_TEST_PACKAGES),$(p)/cluster-tests) $(TEST_EXTRA_FEATURES)))
export TEST_FEATURES

TEST_TARGETS += test-cluster

# Where kubectl, helm, kwok etc. of the pinned versions live; the cluster tests get it on PATH and as
# $TANDEM_K8S_BIN (e.g. for `helm template`).
K8S_BIN := $(shell scripts/controlplane/bin-dir.sh)

cluster-bins:
	@scripts/controlplane/build.sh all

cluster-up: cluster-bins
	@scripts/controlplane/cluster-up.sh

cluster-down:
	@scripts/controlplane/cluster-down.sh

# One shell, so the trap stops the control plane however the tests end, and the tests' failure (or a
# failed start) is the target's exit status. A control plane already running in the same state folder is
# reused and then stopped too; set TANDEM_CLUSTER_DIR to keep a separate one.
test-cluster: cluster-bins data
	@set -euo pipefail; \
	trap 'scripts/controlplane/cluster-down.sh' EXIT; \
	up="$$(scripts/controlplane/cluster-up.sh)" || { echo "test-cluster: the control plane did not start" >&2; exit 1; }; \
	eval "$$(printf '%s\n' "$$up" | tail -n 1)"; \
	export TANDEM_K8S_BIN="$(K8S_BIN)" PATH="$(K8S_BIN):$$PATH"; \
	echo "test-cluster: cargo test --workspace --features $(TEST_FEATURES)" >&2; \
	$(CARGO) test --workspace --features $(TEST_FEATURES) $(TEST_ARGS)
