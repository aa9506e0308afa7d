# End to end with tandem-node (e2e/): the operator drives TrainingJobs whose pods tandem-node runs as local
# `tandem` processes on a control plane of its own (e2e/run.sh). The fast loop while changing the
# operator or the trainer (no images to build); not part of `make test`, whose end-to-end test of record
# is `make e2e-node` (mk/node.mk: real containers on a real node, the same scenarios and more).

.PHONY: e2e

## e2e: train examples/mnist-hybrid.yaml through the operator, kill a worker, scale up (needs root for /etc/hosts).
e2e: cluster-bins data
	@CARGO="$(CARGO)" e2e/run.sh
