//! Small helpers below every layer of Tandem's processes (the collectives, the parameter server,
//! data, compute, the trainer); they import no other Tandem crate but the api's contract: files
//! written atomically and pruned ([`fs`]), the process's Prometheus metrics ([`metrics`]),
//! processes ([`proc`]), seeded randomness ([`rng`]), the preemption flag that SIGTERM sets
//! ([`signal`]) and the job's secrets ([`token`]).

pub mod fs;
pub mod metrics;
pub mod proc;
pub mod rng;
pub mod signal;
pub mod token;
