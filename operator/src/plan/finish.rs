//! The ends of the pipeline: a suspended job, a job that fails or succeeds now, and a finished
//! job's clean-up.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::SignedDuration;
use tandem_api::{CleanPodPolicy, JobPhase, RoleStatus};

use super::pods::{ObservedPod, PodPhase};
use super::{Draft, JobFailure, Plan, condition};

/// A suspended job (`runPolicy.suspend`, or held by Kueue): every pod goes, spec and status stay;
/// `reason` and `message` say why.
pub(super) fn suspend(mut draft: Draft<'_>, pods: &[ObservedPod<'_>], reason: &str, message: &str) -> Plan {
    for p in pods.iter().filter(|p| !p.deleting) {
        draft.delete(&p.name);
    }
    let status = &mut draft.status;
    status.start_time = None;
    status.groups = 0;
    status.phase = Some(JobPhase::Suspended);
    status.parameter_servers = Some(RoleStatus::default());
    status.workers = Some(RoleStatus::default());
    draft.set(condition::SUSPENDED, true, reason, message);
    for type_ in [condition::RUNNING, condition::SCALING, condition::RESTARTING] {
        draft.set(type_, false, reason, message);
    }
    draft.transition(reason, message, false);
    draft.into_plan()
}

/// The job fails now, for `failure`.
pub(super) fn fail(mut draft: Draft<'_>, pods: &[ObservedPod<'_>], failure: JobFailure) -> Plan {
    let JobFailure { reason, message } = failure;
    draft.status.phase = Some(JobPhase::Failed);
    draft.status.completion_time = Some(Time(draft.now));
    draft.set(condition::FAILED, true, &reason, &message);
    close_conditions(&mut draft, &reason);
    draft.transition(&reason, &message, true);
    clean_up(draft, pods)
}

/// The job succeeds now: every group finished training.
pub(super) fn succeed(mut draft: Draft<'_>, pods: &[ObservedPod<'_>]) -> Plan {
    let message = format!("all {} worker groups finished training", draft.job.spec.workers.groups);
    draft.status.phase = Some(JobPhase::Succeeded);
    draft.status.completion_time = Some(Time(draft.now));
    draft.set(condition::SUCCEEDED, true, "TrainingSucceeded", &message);
    close_conditions(&mut draft, "TrainingSucceeded");
    draft.transition("TrainingSucceeded", &message, false);
    clean_up(draft, pods)
}

/// Sets the False side of the running-state conditions when the job ends.
fn close_conditions(draft: &mut Draft<'_>, reason: &str) {
    for type_ in [condition::RUNNING, condition::RESTARTING, condition::SCALING] {
        draft.set(type_, false, reason, "the job finished");
    }
}

/// A finished job: no children applied, no PodGroup, no pod created; pods deleted as
/// `cleanPodPolicy` says; the job itself deleted once `ttlSecondsAfterFinished` expired.
pub(super) fn clean_up(mut draft: Draft<'_>, pods: &[ObservedPod<'_>]) -> Plan {
    let spec = draft.job.spec;
    let policy = &spec.run_policy;
    draft.plan.ensure_children = false;
    draft.plan.want_pod_group = false;
    draft.plan.create.clear();
    for p in pods.iter().filter(|p| !p.deleting) {
        let delete = match policy.clean_pod_policy {
            CleanPodPolicy::None => false,
            CleanPodPolicy::All => true,
            CleanPodPolicy::Running => !matches!(p.phase, PodPhase::Succeeded | PodPhase::Failed),
        };
        if delete {
            draft.delete(&p.name);
        }
    }
    draft.status.groups = 0;
    if let (Some(ttl), Some(done)) =
        (policy.ttl_seconds_after_finished, draft.status.completion_time.as_ref())
    {
        let expiry = done.0.checked_add(SignedDuration::from_secs(ttl)).unwrap_or(done.0);
        if draft.now >= expiry {
            draft.plan.delete_job = true;
        } else {
            draft.wake_at(expiry);
        }
    }
    draft.into_plan()
}
