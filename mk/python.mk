# The `tandem` Python package (python/): a PyO3 extension built by maturin, with tandem.torch.
# Its Python tools (maturin, pytest, ruff) live in a venv outside the repository, made from Debian's
# python3 with its site packages, so PyTorch (python3-torch) is visible; pip's cache is beside it.

## python-env: the venv with maturin, pytest and ruff (made once, outside the repository).
## python-wheel: build the release wheel into target/wheels (what a user's image pip-installs).
## python-test: ruff, then a dev wheel installed into the venv, then pytest on loopback (real PyTorch).
## bench-torch: a PyTorch step with 4 worker processes: DDP (gloo) beside tandem.torch's allreduce, hybrid and pure PS.
.PHONY: python-env python-wheel python-dev-install python-lint python-test bench-torch

TEST_TARGETS += python-test
prepare: python-env

PY_CACHE ?= $(or $(TANDEM_CACHE),$(HOME)/.cache/tandem)
PY_ENV ?= $(PY_CACHE)/python-venv
PY_BIN := $(PY_ENV)/bin
# Pinned, so a new machine gets what the tests were written against.
PY_TOOLS := maturin==1.16.0 pytest==9.2.0 ruff==0.17.6
PY_TARGET := $(abspath $(or $(CARGO_TARGET_DIR),target))

python-env: deps $(PY_ENV)/.tools

$(PY_ENV)/.tools: mk/python.mk
	/usr/bin/python3 -c "import torch, numpy" || { echo "Debian's python3-torch is missing: run scripts/install-deps.sh" >&2; exit 1; }
	/usr/bin/python3 -m venv --system-site-packages $(PY_ENV)
	$(PY_BIN)/pip install -q --cache-dir $(PY_CACHE)/pip $(PY_TOOLS)
	touch $@

python-wheel: python-env
	cd python && $(PY_BIN)/maturin build --release --out $(PY_TARGET)/wheels

# A dev-profile wheel (the workspace's dev build is optimised enough for the tests and shares its
# dependencies), installed into the venv in place of any earlier one.
python-dev-install: python-env
	rm -rf $(PY_TARGET)/wheels-dev
	cd python && $(PY_BIN)/maturin build --out $(PY_TARGET)/wheels-dev
	$(PY_BIN)/pip install -q --no-deps --force-reinstall $(PY_TARGET)/wheels-dev/tandem-*.whl

python-lint: python-env
	cd python && $(PY_BIN)/ruff format --check . && $(PY_BIN)/ruff check .
	$(PY_BIN)/ruff format --check --config python/pyproject.toml bench/torch && \
		$(PY_BIN)/ruff check --config python/pyproject.toml bench/torch

# The jobs run the `tandem` binary of the test build (a no-op after `make test`'s test-build; built
# with the same features, so nothing compiles twice).
python-test: python-lint python-dev-install data
	$(CARGO) test -q --workspace --features $(TEST_FEATURES) --no-run
	cd python && TANDEM_BIN=$(abspath $(PY_TARGET))/debug/tandem TANDEM_DATA_DIR=$(abspath data) \
		$(PY_BIN)/pytest -q tests
images: python-env

# A benchmark, not a test: the release `tandem` runs the jobs (its parameter servers), the venv's
# Python the script with the wheel just installed; see bench/README.md.
bench-torch: python-dev-install
	$(CARGO) build --release -p tandem-trainer --bin tandem
	$(PY_BIN)/python3 bench/torch/run.py
