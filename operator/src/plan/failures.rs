//! Pods that must go: stale and out-of-spec pods, the units of failed pods, and the whole job
//! past its deadline.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::SignedDuration;
use tandem_api::UnitAttempt;
use tandem_api::policy::{self, Failure, Unit, Verdict};

use super::pods::ObservedPod;
use super::{Draft, JobFailure, Transition, attempt_in, condition, condition_is};

/// Pods of an older attempt than their unit's, and pods the spec no longer has, are deleted.
pub(super) fn delete_stale(draft: &mut Draft<'_>, pods: &[ObservedPod<'_>]) {
    for p in pods.iter().filter(|p| !p.deleting) {
        let stale = p.attempt < attempt_in(&draft.status, p.role);
        if stale || !p.role.in_spec(draft.job.spec) {
            draft.delete(&p.name);
        }
    }
}

/// The failed pods of each unit's current attempt, by unit in the order of their first pod's name.
fn failures_by_unit(draft: &Draft<'_>, pods: &[ObservedPod<'_>]) -> Vec<(Unit, Vec<Failure>)> {
    let mut by_unit: Vec<(Unit, Vec<Failure>)> = Vec::new();
    let current =
        pods.iter().filter(|p| p.role.in_spec(draft.job.spec) && p.attempt >= attempt_in(&draft.old, p.role));
    for failure in current.filter_map(ObservedPod::failure) {
        let unit = Unit::of(failure.role);
        match by_unit.iter_mut().find(|(u, _)| *u == unit) {
            Some((_, failures)) => failures.push(failure),
            None => by_unit.push((unit, vec![failure])),
        }
    }
    by_unit
}

/// Each unit with failed pods restarts — its attempt raised, its pods deleted, the Restarting
/// condition and an Event saying why — unless the run policy fails the job instead.
pub(super) fn restart_failed_units(draft: &mut Draft<'_>, pods: &[ObservedPod<'_>]) -> Option<JobFailure> {
    let spec = draft.job.spec;
    for (unit, failures) in failures_by_unit(draft, pods) {
        let Some(cause) = policy::cause(&spec.run_policy, &failures) else { continue };
        let attempt = attempt_in(&draft.status, cause.role);
        let (attempt, message) = match policy::judge(spec, unit, cause, attempt, draft.status.restarts) {
            Verdict::Fail { reason, message } => {
                return Some(JobFailure { reason: reason.to_owned(), message });
            }
            Verdict::Restart { attempt, restarts, message, .. } => {
                draft.status.restarts = restarts;
                (attempt, message)
            }
        };
        record_attempt(draft, unit, attempt);
        draft.set(condition::RESTARTING, true, cause.reason(), &message);
        draft.plan.events.push(Transition { warning: true, reason: cause.reason().to_owned(), message });
        draft.plan.restarted.push(cause.role);
        for p in pods.iter().filter(|p| Unit::of(p.role) == unit && !p.deleting) {
            draft.delete(&p.name);
        }
    }
    None
}

/// Raises `unit`'s attempt in the status to `attempt`, restarted now (the start of its back-off).
fn record_attempt(draft: &mut Draft<'_>, unit: Unit, attempt: u32) {
    let (key, now) = (unit.key(), Some(Time(draft.now)));
    let attempts = &mut draft.status.attempts;
    match attempts.iter_mut().find(|a| a.unit == key) {
        Some(record) => {
            record.attempt = attempt;
            record.last_restart_time = now;
        }
        None => attempts.push(UnitAttempt { unit: key, attempt, last_restart_time: now }),
    }
    attempts.sort_by(|a, b| a.unit.cmp(&b.unit));
}

/// The job fails once it ran longer than `activeDeadlineSeconds`; until then the plan looks again
/// at the deadline.
pub(super) fn deadline(draft: &mut Draft<'_>) -> Option<JobFailure> {
    let limit = draft.job.spec.run_policy.active_deadline_seconds?;
    let now = draft.now;
    let created = draft.job.job.metadata.creation_timestamp.as_ref().map_or(now, |t| t.0);
    let resumed = condition_is(&draft.old, condition::SUSPENDED, "False").unwrap_or(created);
    let origin = draft.status.start_time.as_ref().map_or(created.max(resumed), |t| t.0);
    let deadline = origin.checked_add(SignedDuration::from_secs(limit)).unwrap_or(origin);
    if now >= deadline {
        return Some(JobFailure {
            reason: "DeadlineExceeded".to_owned(),
            message: format!("the job ran longer than runPolicy.activeDeadlineSeconds ({limit} s)"),
        });
    }
    draft.wake_at(deadline);
    None
}
