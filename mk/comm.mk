# Collectives (the tandem-comm crate, comm/): tests run with `cargo test --workspace`; the benchmark is separate.

.PHONY: comm-test bench-allreduce

## comm-test: the collective tests only (real processes on loopback, and under mpirun).
comm-test:
	$(CARGO) test -p tandem-trainer --test it -- comm_tcp:: comm_mpi::

## bench-allreduce: tandem tcp / shm / hierarchical vs OpenMPI over TCP and shared memory; writes out/bench/allreduce.
bench-allreduce:
	bench/allreduce.sh
