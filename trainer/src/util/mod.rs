//! Small helpers below every layer: files written atomically and pruned ([`fs`]), and the job's
//! secrets ([`token`]).

pub mod fs;
pub mod token;
