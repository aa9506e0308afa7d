//! Small helpers every role may use; they import nothing else of the crate.

pub mod proc;
