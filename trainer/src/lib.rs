//! The Tandem trainer: everything a `tandem` process does, as a library so that tests can drive it.
//!
//! It stands on crates that cannot import it (ARCHITECTURE.md draws them): `tandem-util`
//! (files, processes, tokens, metrics, randomness), `tandem-comm` (collectives behind one
//! `Communicator`), `tandem-ps` (the parameter server's protocol and client), `tandem-input` (data
//! sources and object storage) and `tandem-compute` (models, parameters, optimizers, checkpoints
//! and the one training loop; no sockets, no processes, no CLI). Its own layers, bottom up; a
//! layer imports only the layers below it:
//! - [`ps`]: the parameter server's server side.
//! - roles: [`worker`] (a rank of a group, the training loop with a PS or allreduce step) and
//!   [`runner`] (the local runner); neither imports the other, nor the PS server's internals.
//!
//! Only `main.rs` (with `cli/`, the subcommands and their reporting) reads the environment and the
//! command line.

pub mod ps;
pub mod runner;
pub mod worker;
