# End to end: the operator drives TrainingJobs whose pods tandem-node (e2e/) runs as local `tandem`
# processes on a control plane of its own (e2e/run.sh). Part of `make test`.

.PHONY: e2e

TEST_TARGETS += e2e

## e2e: train examples/mnist-hybrid.yaml through the operator, kill a worker, scale up (needs root for /etc/hosts).
e2e: cluster-bins data
	@CARGO="$(CARGO)" e2e/run.sh
