//! Compute: what one rank does with its data and its flat parameter vector, with no sockets, no
//! processes and no command line — models ([`model`]), data sources ([`data`]), the flat
//! parameter store ([`params`]), optimizers ([`optim`]), seeded randomness ([`rng`]),
//! checkpoints ([`checkpoint`]) and the one training loop ([`train`]), into which the roles plug
//! how gradients are combined (locally, with a parameter server, or by allreduce).

pub mod checkpoint;
pub mod data;
pub mod device;
pub mod mirror;
pub mod model;
pub mod optim;
pub mod params;
pub mod rng;
pub mod train;
