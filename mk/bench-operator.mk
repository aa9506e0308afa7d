# The operator benchmark (issue 7): tandem-operator vs the Kubeflow MPI Operator on N_JOBS (default 1000)
# equivalent jobs on kwok nodes, side by side, against one fresh control plane. Not part of `make test`.

.PHONY: bench-operator mpi-operator-bin bench-cel bench-creates

## mpi-operator-bin: build the Kubeflow MPI Operator from the Go module proxy into the cache (if missing).
mpi-operator-bin:
	@bench/operator/build-mpi-operator.sh

## bench-operator: run the operator benchmark, then creation alone with no operator (N_JOBS, N_NODES, OPERATORS, CREATE_ROUNDS, MPI_OPERATOR_QPS; see bench/operator/run.sh); results in target/bench/operator/.
bench-operator: cluster-bins
	@bench/operator/run.sh

## bench-cel: each CEL rule of crds/ as kube-apiserver compiles and runs it: estimated cost and time per object (bench/operator/celcost.sh).
bench-cel:
	@bench/operator/celcost.sh

## bench-creates: creation alone for the CRD as installed (rules compiled), as written and without its CEL rules, against kube-apiserver as released and (PATCHED=1) with the CEL schema adaptor's per-access copy removed (N_JOBS, ROUNDS; bench/operator/creates.sh).
bench-creates: cluster-bins
	@bench/operator/creates.sh
