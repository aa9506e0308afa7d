# Parameter server (trainer/src/ps): its tests also run under `cargo test --workspace`.

.PHONY: ps-test

## ps-test: the parameter-server tests only (state machine on a simulated network, real `tandem ps` and
## `tandem worker` processes on loopback).
ps-test:
	$(CARGO) test -p tandem-trainer --lib ps::
	$(CARGO) test -p tandem-trainer --test it -- ps_modes:: ps_faults:: ps_training:: ps_worker::
