//! The decision step of a reconcile: from a job and the pods that exist, what to do now.
//!
//! Expected flow: the controller reads the job's pods, asks [`decide`] for a [`Plan`], writes the
//! plan's status first and then carries out its deletions and creations. Because the status is
//! written first, a crash between the two steps is repaired by the next reconcile: pods whose
//! `tandem.dev/attempt` label is older than their unit's attempt in the status are stale and get
//! deleted, pods that are missing get created.
//!
//! [`decide`] is a pipeline of named steps over the observed pods (`pods.rs`): force-delete pods
//! stuck on lost nodes; a finished job only cleans up, a suspended one deletes its pods
//! (`finish.rs`); otherwise delete stale and out-of-spec pods, restart the units of failed pods or
//! fail the job, count the parameter servers the kubelet restarted in place, check the deadline
//! (`failures.rs`), record the progress and declare a stall (`stall.rs`), count what runs, succeed once every group is
//! done, create what is missing after its back-off (`launch.rs`), and set the phase and
//! conditions (`phase.rs`).
//!
//! Guarantees: [`decide`] is a pure function of its inputs (no API calls, the clock is passed
//! in), so every restart, scale, suspend, deadline and TTL rule is tested without a cluster.
//! A failed pod is acted on once: the restart raises its unit's attempt, after which the pod
//! is stale. Only the failed pod's unit restarts — one worker group, or one PS replica.
//!
//! Rules:
//! - Which failure restarts which unit, when the job fails instead, and the back-off are
//!   [`tandem_api::policy`]'s, shared with the local runner. A pod in phase `Unknown` lost its
//!   node; a pod deleted from under the job counts as a failure of its unit.
//! - PS pods run with `restartPolicy: OnFailure`: when a PS process dies, the kubelet restarts its
//!   container in the same pod, whose output volume (an emptyDir by default) keeps the shard's
//!   checkpoints, so it resumes from them. Each reconcile reads the container's `restartCount`
//!   and `lastState`; restarts above `status.attempts[].containerRestarts` are new and are judged
//!   and counted by [`tandem_api::policy::judge_in_place`]; the pod is not touched. Back-off
//!   between such restarts is the kubelet's (CrashLoopBackOff). A PS pod that is lost (evicted,
//!   node lost, deleted) is recreated as a new attempt, which resets `containerRestarts`; with an
//!   emptyDir it starts from its initial weights, and the event says so.
//! - A tcp group is done when all its workers succeeded, an mpi group when its launcher
//!   succeeded; the job succeeds when every group in the spec is done.
//! - Terminal phases are sticky: afterwards only `cleanPodPolicy` and the TTL act.
//!
//! Caveats: `activeDeadlineSeconds` counts from `status.startTime` (all pods first running), or,
//! before that, from creation or the last resume, whichever is later.

mod failures;
mod finish;
mod launch;
mod phase;
mod pods;
mod stall;

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use tandem_api::policy::Unit;
use tandem_api::{JobPhase, Progress, Role, TrainingJobStatus};

use crate::kueue::Admission;
use crate::validate::ValidatedJob;
use pods::ObservedPod;
pub use pods::{PodPhase, container_restarts, exit_code, keep_what_is_read};
use tandem_api::names;

/// Condition types the operator maintains.
pub mod condition {
    /// The job's objects were created.
    pub const CREATED: &str = "Created";
    /// Every pod is running.
    pub const RUNNING: &str = "Running";
    /// A group or PS is being restarted.
    pub const RESTARTING: &str = "Restarting";
    /// Groups are being added or removed.
    pub const SCALING: &str = "Scaling";
    /// The job is suspended.
    pub const SUSPENDED: &str = "Suspended";
    /// Training finished.
    pub const SUCCEEDED: &str = "Succeeded";
    /// The job failed.
    pub const FAILED: &str = "Failed";
    /// The step has not advanced for `runPolicy.stallTimeoutSeconds`.
    pub const STALLED: &str = "Stalled";
    /// Every pod is bound to a node and its containers could start; False names what blocks one.
    pub const SCHEDULED: &str = "Scheduled";
}

pub use stall::STALLED as STALLED_REASON;

/// Operator settings that shape decisions.
#[derive(Clone, Debug)]
pub struct Settings {
    /// How long past its deletion deadline a pod on a lost node may stay before it is force-deleted.
    pub force_delete_after: Duration,
    /// Requeue interval of a job with nothing pending (picks up progress and lost watches).
    pub resync: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Self { force_delete_after: Duration::from_secs(60), resync: Duration::from_secs(300) }
    }
}

/// What the controller observed besides the job.
#[derive(Clone, Debug)]
pub struct Observed<'a> {
    /// Every pod labelled with the job's name.
    pub pods: &'a [Pod],
    /// Nodes that are gone or not Ready, among those of terminating pods.
    pub lost_nodes: &'a BTreeSet<String>,
    /// The current time.
    pub now: Timestamp,
    /// The progress just read from the trainer, if any.
    pub progress: Option<&'a Progress>,
    /// Where the job stands in Kueue, for a job submitted to a Kueue queue (see [`crate::kueue`]).
    pub queue: Option<&'a Admission>,
}

/// A transition worth an Event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transition {
    /// Warning (failures, restarts) or Normal.
    pub warning: bool,
    /// CamelCase reason, as in the condition.
    pub reason: String,
    /// What happened, naming pods and exit codes.
    pub message: String,
}

/// What the controller should do now.
#[derive(Clone, Debug, Default)]
pub struct Plan {
    /// The status to write (written only if it differs from the current one).
    pub status: TrainingJobStatus,
    /// Pods to create, in order: PS by index, then workers by group and rank, then launchers.
    pub create: Vec<(Role, u32)>,
    /// Pods to delete (gracefully).
    pub delete: Vec<String>,
    /// Pods stuck terminating on lost nodes, to delete with grace period 0.
    pub force_delete: Vec<String>,
    /// Whether the Service, ConfigMap, Secrets and hostfiles should be applied.
    pub ensure_children: bool,
    /// Whether the PodGroup should exist (gang scheduling, job neither suspended nor finished).
    pub want_pod_group: bool,
    /// Delete the TrainingJob itself (TTL after finish expired).
    pub delete_job: bool,
    /// Events to publish.
    pub events: Vec<Transition>,
    /// Roles whose unit was restarted (for the restarts metric).
    pub restarted: Vec<Role>,
    /// A stall was declared (for the stalls metric).
    pub stalled: bool,
    /// When to look again.
    pub requeue_after: Duration,
}

/// Why the job fails in this reconcile: a condition reason and message.
struct JobFailure {
    reason: String,
    message: String,
}

/// The plan being made: the job, the status as read and as it will be written, and the plan.
struct Draft<'a> {
    job: &'a ValidatedJob<'a>,
    now: Timestamp,
    /// The status as read.
    old: TrainingJobStatus,
    /// The status to write.
    status: TrainingJobStatus,
    plan: Plan,
}

impl<'a> Draft<'a> {
    fn new(job: &'a ValidatedJob<'a>, now: Timestamp, settings: &Settings) -> Self {
        let old = job.job.status.clone().unwrap_or_default();
        let mut status = old.clone();
        status.observed_generation = job.generation();
        status.selector = Some(names::worker_selector(job.name));
        Self { job, now, old, status, plan: Plan { requeue_after: settings.resync, ..Plan::default() } }
    }

    /// Looks again within `after` at the latest.
    fn wake_within(&mut self, after: Duration) {
        self.plan.requeue_after = self.plan.requeue_after.min(after);
    }

    /// Looks again when `then` is reached.
    fn wake_at(&mut self, then: Timestamp) {
        // A time already past means "now"; a second's floor avoids a hot loop on clock skew.
        let after = Duration::try_from(then.duration_since(self.now)).unwrap_or_default();
        self.wake_within(after.max(Duration::from_secs(1)));
    }

    /// Sets condition `type_` of the status to write.
    fn set(&mut self, type_: &str, status: bool, reason: &str, message: &str) {
        let (now, generation) = (self.now, self.job.generation());
        set_condition(&mut self.status.conditions, type_, status, reason, message, now, generation);
    }

    /// Records an Event when the phase changes.
    fn transition(&mut self, reason: &str, message: &str, warning: bool) {
        if self.old.phase != self.status.phase {
            let event = Transition { warning, reason: reason.to_owned(), message: message.to_owned() };
            self.plan.events.push(event);
        }
    }

    /// Deletes pod `name` gracefully, once.
    fn delete(&mut self, name: &str) {
        if !self.plan.delete.iter().any(|n| n == name) {
            self.plan.delete.push(name.to_owned());
        }
    }

    fn into_plan(mut self) -> Plan {
        self.plan.status = self.status;
        self.plan
    }
}

/// The attempt of the unit of `role` that `status` records (0 until it restarts).
fn attempt_in(status: &TrainingJobStatus, role: Role) -> u32 {
    let key = Unit::of(role).key();
    status.attempts.iter().find(|a| a.unit == key).map_or(0, |a| a.attempt)
}

/// Whether `status` has condition `type_` with `value`; when it changed to it.
fn condition_is(status: &TrainingJobStatus, type_: &str, value: &str) -> Option<Timestamp> {
    status.conditions.iter().find(|c| c.type_ == type_ && c.status == value).map(|c| c.last_transition_time.0)
}

/// Decides what to do for `job` given what exists.
pub fn decide(job: &ValidatedJob<'_>, observed: &Observed<'_>, settings: &Settings) -> Plan {
    let pods = ObservedPod::all(observed.pods);
    let mut draft = Draft::new(job, observed.now, settings);
    force_deletes(&mut draft, &pods, observed.lost_nodes, settings.force_delete_after);
    if draft.old.phase.is_some_and(JobPhase::is_finished) {
        return finish::clean_up(draft, &pods);
    }
    let policy = &job.spec.run_policy;
    draft.plan.ensure_children = true;
    let held = match observed.queue {
        Some(Admission::Waiting { reason, message }) => {
            Some(("QueuedByKueue", format!("waiting for Kueue to admit it ({reason}): {message}")))
        }
        Some(Admission::Evicted { reason, message }) => Some((
            "EvictedByKueue",
            format!(
                "evicted by Kueue ({reason}): pods stopped, to be queued again once they are gone: {message}"
            ),
        )),
        Some(Admission::Admitted { .. }) | None => None,
    };
    draft.plan.want_pod_group = policy.scheduling.gang && !policy.suspend && held.is_none();
    if policy.suspend {
        return finish::suspend(
            draft,
            &pods,
            "Suspended",
            "runPolicy.suspend is true: pods deleted, spec and status kept",
        );
    }
    if let Some((reason, message)) = held {
        return finish::suspend(draft, &pods, reason, &message);
    }
    let resumed = match observed.queue {
        Some(Admission::Admitted { cluster_queue, .. }) => {
            ("Admitted", format!("admitted by Kueue to ClusterQueue {cluster_queue}: pods created"))
        }
        _ => ("Resumed", "runPolicy.suspend is false: pods recreated".to_owned()),
    };
    created(&mut draft, resumed);
    failures::delete_stale(&mut draft, &pods);
    let failure = match failures::restart_failed_units(&mut draft, &pods) {
        Ok(restarted) => failures::count_in_place_restarts(&mut draft, &pods, &restarted),
        Err(failure) => Some(failure),
    }
    .or_else(|| failures::deadline(&mut draft))
    .or_else(|| stall::check(&mut draft, &pods, observed.progress));
    let current = phase::Current::of(&draft, &pods);
    current.count(&mut draft.status, job.spec, &[]);
    if let Some(failure) = failure {
        return finish::fail(draft, &pods, failure);
    }
    if current.every_group_done(job.spec) {
        return finish::succeed(draft, &pods);
    }
    let waiting = launch::missing(&mut draft, &pods, &current);
    phase::set(&mut draft, &pods, &current, waiting);
    // The controller creates the pods before it writes the status unless a unit restarts (see
    // [`Plan::restarted`]): the status then counts them, so their arrival in the cache, still
    // Pending, writes nothing again (a status write costs the API server about as much as a create).
    if draft.plan.restarted.is_empty() && !draft.plan.create.is_empty() {
        current.count(&mut draft.status, job.spec, &draft.plan.create);
    }
    draft.into_plan()
}

/// Pods stuck terminating on a lost node are force-deleted once `after` past their deadline.
fn force_deletes(
    draft: &mut Draft<'_>,
    pods: &[ObservedPod<'_>],
    lost_nodes: &BTreeSet<String>,
    after: Duration,
) {
    let grace = SignedDuration::try_from(after).unwrap_or(SignedDuration::ZERO);
    for p in pods.iter().filter(|p| p.deleting) {
        let node = p.pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
        let (Some(node), Some(deadline)) = (node, p.pod.metadata.deletion_timestamp.as_ref()) else {
            continue;
        };
        if !lost_nodes.contains(node) {
            continue;
        }
        let due = deadline.0.checked_add(grace).unwrap_or(deadline.0);
        if draft.now >= due {
            draft.plan.force_delete.push(p.name.clone());
        } else {
            draft.wake_at(due);
        }
    }
}

/// A running (not suspended, not finished) job: its objects exist, a resume is recorded, and
/// units the spec no longer has (scaled-down groups) lose their bookkeeping.
fn created(draft: &mut Draft<'_>, (reason, message): (&str, String)) {
    if condition_is(&draft.old, condition::SUSPENDED, "True").is_some() {
        draft.set(condition::SUSPENDED, false, reason, &message);
    }
    draft.set(condition::CREATED, true, "JobCreated", "Service, ConfigMap and Secrets created");
    let spec = draft.job.spec;
    draft.status.attempts.retain(|a| Unit::from_key(&a.unit).is_some_and(|unit| unit.in_spec(spec)));
}

/// Sets condition `type_`, moving `lastTransitionTime` only when its status changes. A False
/// condition that never was True is not added.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    now: Timestamp,
    generation: Option<i64>,
) {
    let status_text = if status { "True" } else { "False" };
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(c) => {
            if c.status != status_text {
                c.last_transition_time = Time(now);
                c.status = status_text.to_owned();
            }
            c.reason = reason.to_owned();
            c.message = message.to_owned();
            c.observed_generation = generation;
        }
        None if status => conditions.push(Condition {
            type_: type_.to_owned(),
            status: status_text.to_owned(),
            reason: reason.to_owned(),
            message: message.to_owned(),
            last_transition_time: Time(now),
            observed_generation: generation,
        }),
        None => {}
    }
}

/// The name of a job's phase as the jobs-by-phase metric labels it: `Pending` before the first
/// status.
pub fn phase_name(phase: Option<JobPhase>) -> &'static str {
    match phase {
        None => "Pending",
        Some(JobPhase::Created) => "Created",
        Some(JobPhase::Running) => "Running",
        Some(JobPhase::Restarting) => "Restarting",
        Some(JobPhase::Scaling) => "Scaling",
        Some(JobPhase::Suspended) => "Suspended",
        Some(JobPhase::Succeeded) => "Succeeded",
        Some(JobPhase::Failed) => "Failed",
    }
}
