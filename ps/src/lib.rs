//! The parameter server's protocol and client: the flat parameter vector, sharded by key range
//! over PS replicas, as workers and observers reach it. The server (`tandem ps`) is the trainer's
//! `ps::server`; it links this crate for the same protocol.
//!
//! [`shard`] (who holds which range, a pure function both sides share), [`wire`] (the framed
//! binary protocol), [`client`] (the client end: push and pull across every shard) and [`group`]
//! (a worker group's half of each algorithm, over the group's collectives and the client: what
//! `tandem worker` and `tandem.torch` both run). Nothing here imports the server, a role, the
//! training loop, data or models.
//!
//! Expected flow, per worker rank: connect to every shard, read its challenge and say hello (an
//! HMAC of the job token over the challenge, group, rank, attempt, vector length, run length);
//! `init` its range with the initial weights (ignored once a shard holds weights); `join`; pull
//! the current weights; then each step push its range and pull it back.
//! A group leaves explicitly, or implicitly when its last connection to a shard closes.
//!
//! Guarantees: the server's state machine (the trainer's `ps::server::state`) documents the
//! consistency of each [`tandem_api::PsMode`].

pub mod client;
pub mod group;
pub mod shard;
pub mod wire;
