//! The Tandem trainer: everything a `tandem` process does, as a library so that tests can drive it.
//!
//! Layers, bottom up; a layer imports only the layers below it:
//! - the `tandem-util` crate (files, processes, tokens, metrics), and above it the `tandem-comm`
//!   crate (collectives behind one `Communicator`) and the `tandem-ps` crate (the parameter
//!   server's protocol and client), which cannot import anything of this crate;
//! - [`compute`]: models, data, parameters, optimizers, checkpoints and the one training loop (no
//!   sockets, no processes, no CLI).
//! - [`ps`]: the parameter server's server side.
//! - roles: [`worker`] (a rank of a group, the training loop with a PS or allreduce step) and
//!   [`runner`] (the local runner); neither imports the other, nor the PS server's internals.
//!
//! Only `main.rs` (with `cli/`, the subcommands and their reporting) reads the environment and the
//! command line.

pub mod compute;
pub mod ps;
pub mod runner;
pub mod worker;
