//! The trainer's integration tests, as one test binary: each module is one area (the file names
//! of the former separate test binaries), so `cargo test -p tandem-trainer --test it -- <area>::`
//! runs one area. One binary links the trainer (candle, tokio, MPI) once instead of once per area.
//!
//! Tests that train a whole multi-process job take [`runner_support::one_job_at_a_time`]; the
//! acceptance runs in [`algorithms`] are meant to run alone (`-- algorithms:: --test-threads=1`).
//! Most areas need the built-in data sets in `data/` (`make data`).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

mod ps_common;
mod runner_support;
mod trainer_support;

mod accuracy;
mod algorithms;
mod checkpoint;
mod cli_train;
mod comm_mpi;
mod comm_tcp;
mod data;
mod data_pipeline;
mod engine;
mod epoch_plan;
mod flat;
mod image_data;
mod launcher;
mod model_parallel;
mod models;
mod nodes;
#[cfg(feature = "cluster-tests")]
mod object_store;
mod optim;
mod peers;
mod preemption;
mod ps_bounds;
mod ps_faults;
mod ps_hostile;
mod ps_modes;
mod ps_status;
mod ps_training;
mod ps_worker;
mod real_data;
mod resume;
mod runner_e2e;
mod runner_policy;
mod runner_stall;
mod state;
mod stream;
mod user_command;
mod worker_allreduce;
