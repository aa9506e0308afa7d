//! Progress and stalls: the step read from the trainer goes into the status with the time it was
//! first seen and as a point of `status.history` (the curve `kubectl tandem plot` draws), and a Running job whose step stays put for `runPolicy.stallTimeoutSeconds` is
//! declared stalled (condition `Stalled`, a warning Event, the stalls metric) and handled as
//! `runPolicy.stallPolicy` says, through the restart path and `maxRestarts` of failures.
//!
//! The stall clock starts at the later of the time the current step was first seen and the time
//! the job last became Running, so a job that is still starting, or restarting, is never stalled.
//! A stall is declared once per clock: its `Stalled=True` condition is stamped with the time it
//! was declared, and only a clock that started after that (the job ran again after a restart)
//! declares it again. `Stalled` turns False when the step advances.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::SignedDuration;
use tandem_api::policy::{self, Failure, FailureKind, Relaunch, Unit, Verdict};
use tandem_api::{JobPhase, Progress, Role, StallPolicy};

use super::failures::record_restart;
use super::pods::ObservedPod;
use super::{Draft, JobFailure, Transition, attempt_in, condition, condition_is};

/// Reason of the `Stalled=True` condition and its Event.
pub const STALLED: &str = "ProgressStalled";

/// Records `progress` (when read) and its step's time, then declares and handles a stall. Returns
/// the job's failure when the stall policy would restart past `maxRestarts`.
pub(super) fn check(
    draft: &mut Draft<'_>,
    pods: &[ObservedPod<'_>],
    progress: Option<&Progress>,
) -> Option<JobFailure> {
    let now = draft.now;
    let old_step = draft.old.progress.as_ref().map(|p| p.step);
    if let Some(p) = progress {
        if old_step != Some(p.step) || draft.status.step_time.is_none() {
            draft.status.step_time = Some(Time(now));
        }
        draft.status.progress = Some(p.clone());
        draft.status.record_history(p);
    }
    let advanced = progress.is_some_and(|p| old_step.is_some_and(|old| p.step > old));
    let step = draft.status.progress.as_ref().map(|p| p.step);
    if advanced && condition_is(&draft.old, condition::STALLED, "True").is_some() {
        let message = format!("status.progress.step advanced to {}", step.unwrap_or_default());
        draft.set(condition::STALLED, false, "Progressing", &message);
    }
    let limit = draft.job.spec.run_policy.stall_timeout_seconds?;
    if draft.old.phase != Some(JobPhase::Running) || !draft.plan.restarted.is_empty() {
        return None;
    }
    let running_since = condition_is(&draft.old, condition::RUNNING, "True")?;
    let stepped = draft.status.step_time.as_ref().map_or(running_since, |t| t.0);
    let origin = stepped.max(running_since);
    let due = origin.checked_add(SignedDuration::from_secs(i64::from(limit))).unwrap_or(origin);
    if now < due {
        draft.wake_at(due);
        return None;
    }
    if condition_is(&draft.status, condition::STALLED, "True").is_some_and(|declared| declared >= due) {
        return None;
    }
    let detail = match step {
        Some(step) => format!(
            "status.progress.step has stayed at {step} since {} (runPolicy.stallTimeoutSeconds is {limit} s)",
            stepped.max(running_since)
        ),
        None => format!(
            "no step was reported since the job started running at {running_since} (runPolicy.stallTimeoutSeconds \
             is {limit} s)"
        ),
    };
    declare(draft, &detail);
    handle(draft, pods, &detail)
}

/// Sets `Stalled=True`, stamped now, with an Event and the stalls metric.
fn declare(draft: &mut Draft<'_>, detail: &str) {
    let policy = draft.job.spec.run_policy.stall_policy;
    let message = format!("{detail}; runPolicy.stallPolicy is {policy:?}");
    draft.set(condition::STALLED, true, STALLED, &message);
    let now = draft.now;
    if let Some(c) = draft.status.conditions.iter_mut().find(|c| c.type_ == condition::STALLED) {
        c.last_transition_time = Time(now);
    }
    draft.plan.events.push(Transition { warning: true, reason: STALLED.to_owned(), message });
    draft.plan.stalled = true;
}

/// Restarts the units `stallPolicy` names, counted as one restart of the job; or fails the job
/// when that restart is refused (`maxRestarts` used up, `restartPolicy: Never`).
fn handle(draft: &mut Draft<'_>, pods: &[ObservedPod<'_>], detail: &str) -> Option<JobFailure> {
    let spec = draft.job.spec;
    let groups = (0..spec.workers.groups).map(Unit::Group);
    let units: Vec<Unit> = match spec.run_policy.stall_policy {
        StallPolicy::None => return None,
        StallPolicy::RestartGroup => groups.collect(),
        StallPolicy::RestartJob => (0..spec.parameter_servers.replicas).map(Unit::Ps).chain(groups).collect(),
    };
    let first = *units.first()?;
    let role = |unit: Unit| match unit {
        Unit::Ps(index) => Role::Ps { index },
        Unit::Group(group) => Role::Worker { group, rank: 0 },
    };
    let cause = Failure {
        who: format!("job {}", draft.job.name),
        role: role(first),
        kind: FailureKind::Stalled(detail.to_owned()),
        message: None,
    };
    let attempt = attempt_in(&draft.status, role(first));
    let verdict = policy::judge(spec, Relaunch::NewPod, first, &cause, attempt, draft.status.restarts);
    let restarts = match verdict {
        Verdict::Fail { reason, message } => {
            let reason = if reason == policy::MAX_RESTARTS_EXCEEDED { reason } else { STALLED };
            return Some(JobFailure { reason: reason.to_owned(), message });
        }
        Verdict::Restart { restarts, .. } => restarts,
    };
    draft.status.restarts = restarts;
    let scope = match spec.run_policy.stall_policy {
        StallPolicy::RestartJob => "every parameter server and worker group",
        _ => "every worker group (the parameter servers keep their state)",
    };
    let message = format!(
        "{cause}: restarting {scope} (runPolicy.stallPolicy {:?}), restart {restarts} of {}",
        spec.run_policy.stall_policy, spec.run_policy.max_restarts
    );
    for &unit in &units {
        let attempt = attempt_in(&draft.status, role(unit)) + 1;
        record_restart(draft, unit, attempt, None);
        for p in pods.iter().filter(|p| Unit::of(p.role) == unit && !p.deleting) {
            draft.delete(&p.name);
        }
        draft.plan.restarted.push(role(unit));
    }
    draft.set(condition::RESTARTING, true, STALLED, &message);
    draft.plan.events.push(Transition { warning: true, reason: "StallRestart".to_owned(), message });
    None
}
