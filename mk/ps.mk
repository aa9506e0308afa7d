# Parameter server (the tandem-ps crate, ps/, and its server, trainer/src/ps): its tests also run under `cargo test --workspace`.

.PHONY: ps-test

## ps-test: the parameter-server tests only (state machine on a simulated network, real `tandem ps` and
## `tandem worker` processes on loopback).
ps-test:
	$(CARGO) test -p tandem-trainer --lib ps::
	$(CARGO) test -p tandem-trainer --test it -- ps_modes:: ps_faults:: ps_training:: ps_worker:: ps_bounds::

.PHONY: bench-ps-finite

## bench-ps-finite: what the PS's finite check costs a push's floats, before and after, alternating in one
## run (bench/ps_finite.rs, built by plain rustc in seconds); figures count under quiet-run only.
bench-ps-finite:
	mkdir -p target
	rustc -C opt-level=3 --edition 2024 bench/ps_finite.rs -o target/ps_finite
	target/ps_finite
