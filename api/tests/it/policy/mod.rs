//! The run policy that both the operator and the local runner apply (`tandem_api::policy`), one
//! module per behaviour: which failures are retryable (`classify`), what a restart of a unit does
//! and says (`restart`), a parameter server restarted in place by the kubelet (`in_place`), how
//! long a restarted unit waits (`backoff`), and which units and roles a spec has (`units`).
//!
//! The operator's plan tests and the runner's supervisor tests check that each side calls these
//! rules (the right unit restarts, the verdict's message reaches the user); they do not restate
//! them.
#![allow(clippy::expect_used, clippy::unwrap_used)] // tests fail loudly by design

mod backoff;
mod classify;
mod in_place;
mod restart;
mod units;

use tandem_api::policy::{Failure, FailureKind};
use tandem_api::{RestartPolicy, Role, RunPolicy, TrainingJobSpec};

fn spec(yaml: &str) -> TrainingJobSpec {
    serde_yaml::from_str(yaml).unwrap()
}

/// Two PS and two groups of two ranks, hybrid, with the given run policy.
fn hybrid(restart_policy: RestartPolicy, max_restarts: u32, retryable: &[i32]) -> TrainingJobSpec {
    let mut spec = spec(
        "model: {kind: mlp, hidden: [8]}\ndata: {source: mnist5k}\ntraining: {algorithm: hybrid, steps: 10}\n\
         parameterServers: {replicas: 2}\nworkers: {groups: 2, groupSize: 2}\n",
    );
    spec.run_policy = RunPolicy {
        restart_policy,
        max_restarts,
        retryable_exit_codes: retryable.to_vec(),
        backoff_seconds: 2,
        ..RunPolicy::default()
    };
    spec
}

fn worker(group: u32, rank: u32, kind: FailureKind) -> Failure {
    Failure { who: format!("worker {group}/{rank}"), role: Role::Worker { group, rank }, kind, message: None }
}

fn ps(index: u32, kind: FailureKind) -> Failure {
    Failure { who: format!("pod j-ps-{index}"), role: Role::Ps { index }, kind, message: None }
}
