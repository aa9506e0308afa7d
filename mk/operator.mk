# The operator: its cluster tests join the control-plane test run; `operator-run` starts it locally.

.PHONY: operator operator-run operator-test

# Integration tests of tandem-operator run against the real apiserver of `make cluster-up`.
CLUSTER_TEST_PACKAGES += tandem-operator

# They also run a real `tandem ps` and `tandem worker` (progress read from the PS status endpoint),
# found next to the test binary: test-cluster's workspace build builds target/debug/tandem with them.

## operator: build the tandem-operator binary.
operator:
	$(CARGO) build --release -p tandem-operator

## operator-test: the operator's unit and fixture tests (no cluster needed).
operator-test:
	$(CARGO) test -p tandem-operator

## operator-run: run the operator against $KUBECONFIG (text logs, no leader election).
operator-run:
	$(CARGO) run -p tandem-operator -- --no-leader-election --log-format text
