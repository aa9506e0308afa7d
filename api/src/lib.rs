//! Tandem's API: the `TrainingJob` custom resource and the launch contract between the operator
//! and the trainer.
//!
//! This crate is pure data and pure rules: no I/O, no async runtime, no client. Both binaries
//! depend on it, so a field added here reaches the CRD, the operator and the trainer together, and
//! the run policy ([`policy`]) decides restarts alike on a cluster and on one machine.

pub mod contract;
pub mod crd;
pub mod cursor;
pub mod job;
pub mod manifest;
pub mod names;
pub mod plan;
pub mod policy;

pub use contract::{
    ContractError, Endpoint, ExitClass, GroupTopology, JobConfig, LaunchEnv, Role, WorkerLine,
};
pub use crd::crd;
pub use cursor::DataCursor;
pub use job::*;
pub use manifest::ManifestError;
pub use plan::{JobPlan, PlanError, PsMode};
