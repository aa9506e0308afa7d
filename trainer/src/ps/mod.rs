//! The parameter server: the flat parameter vector, sharded by key range over PS replicas.
//!
//! Two sides, one protocol. What workers and observers use: [`shard`] (who holds which range, a
//! pure function both sides share), [`wire`] (the framed binary protocol) and [`client`] (the
//! client end: push and pull across every shard). What only `tandem ps` runs: [`server`] (the
//! per-shard state machine, free of I/O, its tokio driver, its update rule, checkpoints and HTTP
//! status endpoint). Nothing here imports a role or the training loop.
//!
//! Expected flow, per worker rank: connect to every shard, read its challenge and say hello (an
//! HMAC of the job token over the challenge, group, rank, attempt, vector length, run length);
//! `init` its range with the initial weights (ignored once a shard holds weights); `join`; pull
//! the current weights; then each step push its range and pull it back.
//! A group leaves explicitly, or implicitly when its last connection to a shard closes.
//!
//! Guarantees: see [`server::state`] for the consistency of each [`tandem_api::PsMode`].

pub mod client;
pub mod server;
pub mod shard;
pub mod wire;
