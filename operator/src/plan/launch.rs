//! Pods that are missing are created, unit by unit, once their unit's back-off has passed.

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use tandem_api::policy::{self, Unit};
use tandem_api::{Backend, Role, RunPolicy, UnitAttempt};

use super::phase::Current;
use super::pods::ObservedPod;
use super::{Draft, attempt_in};
use tandem_api::names;

/// When a unit's pods may be launched again after its last restart.
fn backoff_until(policy: &RunPolicy, record: &UnitAttempt) -> Option<Timestamp> {
    let last = record.last_restart_time.as_ref()?.0;
    let wait = policy::backoff(policy.backoff_seconds, record.attempt);
    last.checked_add(SignedDuration::try_from(wait).ok()?).ok()
}

/// Plans the creation of every missing PS and worker pod whose unit is not in its back-off, and
/// of each mpi group's launcher once all its workers are Ready. Returns whether a unit waits out
/// its back-off.
pub(super) fn missing(draft: &mut Draft<'_>, pods: &[ObservedPod<'_>], current: &Current<'_, '_>) -> bool {
    let (job, spec) = (draft.job.name, draft.job.spec);
    let exists = |role: Role| pods.iter().any(|p| p.name == names::pod(job, role));
    let mut waiting = false;
    let ps = (0..spec.parameter_servers.replicas).map(|index| Role::Ps { index });
    let workers = (0..spec.workers.groups)
        .flat_map(|group| (0..spec.workers.group_size).map(move |rank| Role::Worker { group, rank }));
    // A group that runs the user's command is one torch.distributed world per attempt: its new
    // pods wait until every pod of the previous attempt has gone, or a new rank could join the
    // rendezvous of a rank 0 that is still stopping (and fail when it goes).
    let going: Vec<u32> = match spec.workers.command {
        None => Vec::new(),
        Some(_) => pods
            .iter()
            .filter(|p| p.deleting || p.attempt < attempt_in(&draft.status, p.role))
            .filter_map(|p| match p.role {
                Role::Worker { group, .. } => Some(group),
                Role::Ps { .. } | Role::Launcher { .. } => None,
            })
            .collect(),
    };
    let previous_attempt_going =
        |role: Role| matches!(role, Role::Worker { group, .. } if going.contains(&group));
    for role in ps.chain(workers).filter(|&role| !exists(role)) {
        if previous_attempt_going(role) {
            continue;
        }
        let key = Unit::of(role).key();
        let record = draft.status.attempts.iter().find(|a| a.unit == key);
        match record.and_then(|r| backoff_until(&spec.run_policy, r)) {
            Some(at) if draft.now < at => {
                draft.wake_at(at);
                waiting = true;
            }
            _ => draft.plan.create.push((role, attempt_in(&draft.status, role))),
        }
    }
    if spec.workers.backend == Backend::Mpi {
        for group in 0..spec.workers.groups {
            let role = Role::Launcher { group };
            let workers_ready = (0..spec.workers.group_size)
                .all(|rank| current.get(Role::Worker { group, rank }).is_some_and(ObservedPod::ready));
            if workers_ready && !exists(role) {
                draft.plan.create.push((role, attempt_in(&draft.status, role)));
            }
        }
    }
    waiting
}
