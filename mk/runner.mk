# Local runner (trainer/src/runner): its tests also run under `cargo test --workspace`.

.PHONY: runner-test

## runner-test: supervision logic without processes, then multi-process jobs end to end (needs data/).
runner-test: data
	$(CARGO) test -p tandem-trainer --test it -- runner_policy::
	$(CARGO) test -p tandem-trainer --test it -- runner_e2e::

# The multi-process demo is `make demo` (mk/trainer.mk).
