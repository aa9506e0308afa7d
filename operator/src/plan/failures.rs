//! Pods that must go: stale and out-of-spec pods, the units of failed pods, and the whole job
//! past its deadline; and the parameter servers the kubelet restarted in place, which stay.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::SignedDuration;
use tandem_api::UnitAttempt;
use tandem_api::policy::{self, Failure, FailureKind, Relaunch, Unit, Verdict};

use tandem_api::Role;

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
/// condition and an Event saying why — unless the run policy fails the job instead. Returns the
/// job's failure, or the units restarted.
pub(super) fn restart_failed_units(
    draft: &mut Draft<'_>,
    pods: &[ObservedPod<'_>],
) -> Result<Vec<Unit>, JobFailure> {
    let spec = draft.job.spec;
    let mut restarted = Vec::new();
    for (unit, failures) in failures_by_unit(draft, pods) {
        let Some(cause) = policy::cause(&spec.run_policy, &failures) else { continue };
        let attempt = attempt_in(&draft.status, cause.role);
        let lost_ps = policy::lost_a_parameter_server(unit, &failures)
            .then(|| restarted_parameter_server(draft, pods, unit))
            .flatten();
        let verdict = match lost_ps {
            Some(ps) => {
                let backoff = policy::backoff(spec.run_policy.backoff_seconds, attempt + 1);
                policy::relaunch_with_ps(unit, ps, attempt, draft.status.restarts, backoff)
            }
            None => policy::judge(spec, Relaunch::NewPod, unit, cause, attempt, draft.status.restarts),
        };
        restart(draft, cause, verdict, None)?;
        for p in pods.iter().filter(|p| Unit::of(p.role) == unit && !p.deleting) {
            draft.delete(&p.name);
        }
        restarted.push(unit);
    }
    Ok(restarted)
}

/// The parameter server that restarted while `group`'s current attempt ran, if one did: its pod
/// failed, its container is down or was restarted in place (counted yet or not), or its unit
/// restarted after the group's last restart. A group whose processes all exited with the peer-lost
/// code then lost that server ([`policy::lost_a_parameter_server`]), and is relaunched without
/// counting a restart: the server's own restart counts, once.
fn restarted_parameter_server(draft: &Draft<'_>, pods: &[ObservedPod<'_>], group: Unit) -> Option<u32> {
    let spec = draft.job.spec;
    let last_restart = |unit: Unit| {
        draft.old.attempts.iter().find(|a| a.unit == unit.key()).and_then(|a| a.last_restart_time.as_ref())
    };
    let group_since = last_restart(group).map(|t| t.0);
    let since_group = (0..spec.parameter_servers.replicas)
        .find(|&index| last_restart(Unit::Ps(index)).is_some_and(|t| group_since.is_none_or(|g| t.0 > g)));
    since_group.or_else(|| {
        pods.iter().filter(|p| p.role.in_spec(spec)).find_map(|p| {
            let Role::Ps { index } = p.role else { return None };
            let record = draft.old.attempts.iter().find(|a| a.unit == Unit::of(p.role).key());
            let counted = record.and_then(|r| r.container_restarts).unwrap_or(0);
            let restarted = p.container_restarts().is_some_and(|(count, _)| count > counted);
            (p.failure().is_some() || restarted || p.container_down()).then_some(index)
        })
    })
}

/// Parameter servers whose container the kubelet restarted in place (`restartPolicy: OnFailure`,
/// see the builder) since the last reconcile: each current PS pod's `tandem` container's restart
/// count above the one its unit's record counted is new. The restarts are judged by the run
/// policy from the last run's exit code and counted (the record remembers the count), with the
/// Restarting condition and an Event; the pod stays. `skip` are the units restarted as a new
/// attempt in this reconcile, whose pods are going.
pub(super) fn count_in_place_restarts(
    draft: &mut Draft<'_>,
    pods: &[ObservedPod<'_>],
    skip: &[Unit],
) -> Option<JobFailure> {
    let spec = draft.job.spec;
    for p in pods.iter().filter(|p| matches!(p.role, Role::Ps { .. }) && !p.deleting && p.role.in_spec(spec))
    {
        let unit = Unit::of(p.role);
        let record = draft.old.attempts.iter().find(|a| a.unit == unit.key());
        if skip.contains(&unit) || p.attempt < record.map_or(0, |r| r.attempt) {
            continue;
        }
        let Some((count, exit)) = p.container_restarts() else { continue };
        let counted = record.and_then(|r| r.container_restarts).unwrap_or(0);
        if count <= counted {
            continue;
        }
        let kind =
            exit.map_or_else(|| FailureKind::Other("restarted by the kubelet".to_owned()), FailureKind::Exit);
        let message = p.last_termination_message();
        let cause = Failure { who: format!("pod {}", p.name), role: p.role, kind, message };
        let verdict = policy::judge_in_place(spec, &cause, p.attempt, count - counted, draft.status.restarts);
        if let Err(failure) = restart(draft, &cause, verdict, Some(count)) {
            return Some(failure);
        }
    }
    None
}

/// Carries out `verdict` about `cause`'s unit: the job's failure, or the restart recorded (the
/// unit's attempt, restarted now, with `container_restarts` in-place restarts of its pod counted:
/// `None` for a new attempt, whose pod has none) and announced (the Restarting condition, a
/// warning Event, the restarts metric).
fn restart(
    draft: &mut Draft<'_>,
    cause: &Failure,
    verdict: Verdict,
    container_restarts: Option<u32>,
) -> Result<(), JobFailure> {
    let (attempt, message) = match verdict {
        Verdict::Fail { reason, message } => return Err(JobFailure { reason: reason.to_owned(), message }),
        Verdict::Restart { attempt, restarts, message, .. } => {
            draft.status.restarts = restarts;
            (attempt, message)
        }
    };
    record_restart(draft, Unit::of(cause.role), attempt, container_restarts);
    draft.set(condition::RESTARTING, true, cause.reason(), &message);
    draft.plan.events.push(Transition { warning: true, reason: cause.reason().to_owned(), message });
    draft.plan.restarted.push(cause.role);
    Ok(())
}

/// Records in `status.attempts` that `unit` restarted now as `attempt`, with `container_restarts`
/// in-place restarts of its pod counted (`None` for a new attempt, whose pod has none).
pub(super) fn record_restart(
    draft: &mut Draft<'_>,
    unit: Unit,
    attempt: u32,
    container_restarts: Option<u32>,
) {
    let (key, now) = (unit.key(), Some(Time(draft.now)));
    let attempts = &mut draft.status.attempts;
    match attempts.iter_mut().find(|a| a.unit == key) {
        Some(record) => {
            record.attempt = attempt;
            record.last_restart_time = now;
            record.container_restarts = container_restarts;
        }
        None => attempts.push(UnitAttempt { unit: key, attempt, last_restart_time: now, container_restarts }),
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
