//! Subcommands of the `tandem` binary; each module parses its arguments and calls the library.

pub mod bench;
pub mod ps;
pub mod train;
pub mod worker;
