# Local runner (trainer/src/runner): its tests also run under `cargo test --workspace`.

.PHONY: runner-test demo-hybrid

## runner-test: supervision logic without processes, then multi-process jobs end to end (needs data/).
runner-test: data
	$(CARGO) test -p tandem-trainer --test runner_policy
	$(CARGO) test -p tandem-trainer --test runner_e2e

## demo-hybrid: examples/mnist-hybrid.yaml (2 PS, 2 groups of 2) as local processes.
demo-hybrid: data
	$(CARGO) build --release -p tandem-trainer --bin tandem
	./target/release/tandem train -f examples/mnist-hybrid.yaml
