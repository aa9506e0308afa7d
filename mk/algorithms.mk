# The parallel SGD algorithms compared: acceptance tests (also run by `cargo test --workspace`) and the
# time-to-accuracy benchmark.

.PHONY: algorithms-test bench-tta

## algorithms-test: ps-sync, ps-async, easgd and allreduce each reach 0.90 on MNIST-5k as local processes.
algorithms-test: data
	$(CARGO) test -p tandem-trainer --test it -- algorithms:: --test-threads=1

## bench-tta: time to 0.90 test accuracy per algorithm, same 4 workers and data; writes out/bench/tta.
bench-tta: data
	bench/tta.sh
