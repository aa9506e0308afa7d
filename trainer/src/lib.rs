//! The Tandem trainer: everything a `tandem` process does, as a library so that tests can drive it.
//!
//! Layers, bottom up: `comm` (collectives behind one `Communicator`), then compute (models, data,
//! optimizers on flat buffers, checkpoints), then roles (parameter server, worker, local runner).
//! Only `main.rs` reads the environment and the command line.

pub mod checkpoint;
pub mod comm;
pub mod curve;
pub mod data;
pub mod flat;
pub mod model;
pub mod optim;
pub mod ps;
pub mod rng;
pub mod runner;
pub mod train;
pub mod util;
pub mod worker;
