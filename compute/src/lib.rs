//! Compute: what one rank does with its data and its flat parameter vector, with no sockets, no
//! processes and no command line — models ([`model`]), the flat parameter store ([`params`]),
//! optimizers ([`optim`]), checkpoints ([`checkpoint`], mirrored to object storage by
//! [`mirror`]) and the one training loop ([`train`]), into which the roles plug how gradients are
//! combined (locally, with a parameter server, or by allreduce). Data sources are the
//! `tandem-input` crate; seeded randomness is `tandem_util::rng`.

pub mod checkpoint;
pub mod device;
pub mod mirror;
pub mod model;
pub mod optim;
pub mod params;
pub mod train;
