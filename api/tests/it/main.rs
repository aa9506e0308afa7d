//! The api crate's integration tests: one binary (one link), a module per concern — the CRD's CEL
//! rules (`cel`), the launch contract (`contract`), the examples (`examples`), the status's training curve (`history`), the local manifest
//! front door (`manifest`), the memory estimate (`memory`) and the run policy (`policy`).
#![allow(clippy::expect_used, clippy::unwrap_used)] // tests fail loudly by design

mod cel;
mod common;
mod contract;
mod examples;
mod history;
mod manifest;
mod memory;
mod policy;
