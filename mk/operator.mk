# The operator: its cluster tests join the control-plane test run; `operator-run` starts it locally.

.PHONY: operator operator-run operator-test operator-cluster-bins

# Integration tests of tandem-operator run against the real apiserver of `make cluster-up`.
CLUSTER_TEST_PACKAGES += tandem-operator

# They also run a real `tandem ps` and `tandem worker` (progress read from the PS status endpoint),
# found next to the test binary, so the trainer binary is built into the same target folder first.
test-cluster: operator-cluster-bins

operator-cluster-bins:
	$(CARGO) build -p tandem-trainer --bin tandem

## operator: build the tandem-operator binary.
operator:
	$(CARGO) build --release -p tandem-operator

## operator-test: the operator's unit and fixture tests (no cluster needed).
operator-test:
	$(CARGO) test -p tandem-operator

## operator-run: run the operator against $KUBECONFIG (text logs, no leader election).
operator-run:
	$(CARGO) run -p tandem-operator -- --no-leader-election --log-format text
