//! The parameter server's server side, what only `tandem ps` runs: the per-shard state machine,
//! free of I/O, its tokio driver, its update rule, checkpoints and HTTP status endpoint. The
//! protocol and the client that workers use are the `tandem-ps` crate.
//!
//! Guarantees: see [`server::state`] for the consistency of each [`tandem_api::PsMode`].

pub mod server;
