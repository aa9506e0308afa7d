//! The engine's tests, as one test binary (one link instead of one per area): each module is one
//! area, so `cargo test -p tandem-kernels --test it -- <area>::` runs one of them.
//! - [`gemm`]: the GEMM against the naive triple loop;
//! - [`layers`]: every layer against its naive form;
//! - [`models`]: whole networks by finite differences, parameter counts, state, bad input;
//! - [`torch_reference`]: the models against PyTorch's fixtures (`fixtures/`).
//! - [`split`]: model-parallel (split) networks against the unsplit one.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

#[allow(dead_code)] // each area uses part of the helpers
mod common;

mod gemm;
mod layers;
mod models;
mod split;
mod torch_reference;
