//! The Tandem trainer: everything a `tandem` process does, as a library so that tests can drive it.
//!
//! Layers, bottom up; a layer imports only the layers below it:
//! - [`util`]: files, processes and tokens; imports nothing of the crate.
//! - [`comm`] (collectives behind one `Communicator`) and [`compute`] (models, data, parameters,
//!   optimizers, checkpoints and the one training loop; no sockets, no processes, no CLI).
//! - [`ps`]: the parameter server's protocol and client, which workers use, and its server.
//! - roles: [`worker`] (a rank of a group, the training loop with a PS or allreduce step) and
//!   [`runner`] (the local runner); neither imports the other, nor the PS server's internals.
//!
//! Only `main.rs` (with `cli/`, the subcommands and their reporting) reads the environment and the
//! command line.

pub mod comm;
pub mod compute;
pub mod ps;
pub mod runner;
pub mod util;
pub mod worker;
