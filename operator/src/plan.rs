//! The decision step of a reconcile: from a job and the pods that exist, what to do now.
//!
//! Expected flow: the controller lists the job's pods, asks [`decide`] for a [`Plan`], writes the
//! plan's status first and then carries out its deletions and creations. Because the status is
//! written first, a crash between the two steps is repaired by the next reconcile: pods whose
//! `tandem.dev/attempt` label is older than their unit's attempt in the status are stale and get
//! deleted, pods that are missing get created.
//!
//! Guarantees: [`decide`] is a pure function of its inputs (no API calls, the clock is passed
//! in), so every restart, scale, suspend, deadline and TTL rule is tested without a cluster.
//! A failed pod is acted on once: the restart raises its unit's attempt, after which the pod
//! is stale. Only the failed pod's unit restarts — one worker group, or one PS replica.
//!
//! Rules:
//! - Retryable failures: exit code ≥ 128 (killed by a signal), eviction, node loss (pod phase
//!   `Unknown`, or the pod deleted from under the job), a pod failure without an exit code, and
//!   with `restartPolicy: ExitCode` the codes in `retryableExitCodes`. Exit codes 1–127 are
//!   permanent and fail the job; with `restartPolicy: Never` every failure does.
//! - Each restart counts towards `maxRestarts`; the unit's pods return after
//!   `backoffSeconds · 2^(attempt−1)` (at most an hour).
//! - PS pods run with `restartPolicy: OnFailure`: when a PS process dies, the kubelet restarts its
//!   container in the same pod, whose output volume (an emptyDir by default) keeps the shard's
//!   checkpoints, so it resumes from them. The operator reads each new restart from the
//!   container's `restartCount` and `lastState` ([`container_restart`]), judges its exit code by
//!   the rules above, counts it towards `maxRestarts` (remembered per unit in
//!   `status.attempts[].containerRestarts`) and fails the job on a permanent code or once the
//!   restarts are used up. Back-off between such restarts is the kubelet's (CrashLoopBackOff). A PS
//!   pod that is lost (evicted, node lost, deleted) is recreated as a new attempt: with an emptyDir
//!   it starts from its initial weights, and the event says so.
//! - A tcp group is done when all its workers succeeded, an mpi group when its launcher
//!   succeeded; the job succeeds when every group in the spec is done.
//! - Terminal phases are sticky: afterwards only `cleanPodPolicy` and the TTL act.
//!
//! Caveats: `activeDeadlineSeconds` counts from `status.startTime` (all pods first running), or,
//! before that, from creation or the last resume, whichever is later.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;
use tandem_api::{
    Backend, CleanPodPolicy, JobPhase, RestartPolicy, Role, RoleStatus, RunPolicy, TrainingJob,
    TrainingJobStatus, UnitAttempt,
};

use crate::names;

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
}

/// Longest back-off between restarts of one unit.
const MAX_BACKOFF: Duration = Duration::from_secs(3600);

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
    /// When to look again.
    pub requeue_after: Duration,
}

/// Why a pod failed.
#[derive(Clone, Debug, PartialEq, Eq)]
enum FailureKind {
    Exit(i32),
    Evicted,
    NodeLost,
    Deleted,
    Other(String),
}

#[derive(Clone, Debug)]
struct Failure {
    pod: String,
    role: Role,
    kind: FailureKind,
}

impl Failure {
    fn describe(&self) -> String {
        match &self.kind {
            FailureKind::Exit(code) => format!("pod {} exited with code {code}", self.pod),
            FailureKind::Evicted => format!("pod {} was evicted", self.pod),
            FailureKind::NodeLost => format!("pod {} lost its node", self.pod),
            FailureKind::Deleted => format!("pod {} was deleted while the job ran", self.pod),
            FailureKind::Other(reason) => format!("pod {} failed ({reason})", self.pod),
        }
    }

    fn reason(&self) -> &'static str {
        match self.role {
            Role::Ps { .. } => "ParameterServerFailed",
            Role::Worker { .. } => "WorkerFailed",
            Role::Launcher { .. } => "LauncherFailed",
        }
    }

    fn retryable(&self, policy: &RunPolicy) -> bool {
        match (policy.restart_policy, &self.kind) {
            (RestartPolicy::Never, _) => false,
            (_, FailureKind::Exit(code)) if *code >= 128 => true,
            (RestartPolicy::ExitCode, FailureKind::Exit(code)) => policy.retryable_exit_codes.contains(code),
            (_, FailureKind::Exit(_)) => false,
            _ => true,
        }
    }

    /// The job's failure (reason, message) for this permanent failure.
    fn permanent(&self, policy: &RunPolicy) -> (String, String) {
        (self.reason().to_owned(), format!("{} (permanent: {})", self.describe(), self.why_permanent(policy)))
    }

    /// The job's failure (reason, message) when this failure finds the restarts used up.
    fn exhausted(&self, policy: &RunPolicy) -> (String, String) {
        (
            "MaxRestartsExceeded".to_owned(),
            format!(
                "{}; the job already used all {} restarts of runPolicy.maxRestarts",
                self.describe(),
                policy.max_restarts
            ),
        )
    }

    fn why_permanent(&self, policy: &RunPolicy) -> String {
        match (policy.restart_policy, &self.kind) {
            (RestartPolicy::Never, _) => "restartPolicy is Never".to_owned(),
            (RestartPolicy::ExitCode, FailureKind::Exit(code)) => format!(
                "exit code {code} is below 128 and not in runPolicy.retryableExitCodes; fix the cause or list it there"
            ),
            _ => "exit codes 1-127 are permanent failures; fix the cause, or use restartPolicy ExitCode with retryableExitCodes".to_owned(),
        }
    }
}

/// Facts about one existing pod.
#[derive(Clone, Debug)]
struct Seen<'a> {
    pod: &'a Pod,
    name: String,
    role: Role,
    attempt: u32,
    phase: String,
    deleting: bool,
}

impl Seen<'_> {
    fn running(&self) -> bool {
        self.phase == "Running" && !self.deleting
    }
    fn succeeded(&self) -> bool {
        self.phase == "Succeeded"
    }
    fn ready(&self) -> bool {
        self.running()
            && self
                .pod
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
    }
}

/// The exit code of the `tandem` container (else of the first container that failed).
pub fn exit_code(pod: &Pod) -> Option<i32> {
    let statuses = pod.status.as_ref()?.container_statuses.as_ref()?;
    let code = |name: Option<&str>| {
        statuses
            .iter()
            .filter(|s| name.is_none_or(|n| s.name == n))
            .filter_map(|s| s.state.as_ref()?.terminated.as_ref().map(|t| t.exit_code))
            .find(|code| name.is_some() || *code != 0)
    };
    code(Some(names::CONTAINER)).or_else(|| code(None))
}

/// The kubelet's in-place restarts of `pod`'s `tandem` container: its restart count and the exit
/// code of the run that ended last (`None` when the kubelet reports none).
pub fn container_restart(pod: &Pod) -> Option<(u32, Option<i32>)> {
    let statuses = pod.status.as_ref()?.container_statuses.as_ref()?;
    let c = statuses.iter().find(|s| s.name == names::CONTAINER)?;
    let last = c.last_state.as_ref().and_then(|s| s.terminated.as_ref()).map(|t| t.exit_code);
    Some((u32::try_from(c.restart_count).unwrap_or(0), last))
}

fn failure_of(seen: &Seen<'_>) -> Option<Failure> {
    let status = seen.pod.status.as_ref();
    let reason = status.and_then(|s| s.reason.clone()).unwrap_or_default();
    let disrupted = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "DisruptionTarget" && c.status == "True"))
        .and_then(|c| c.reason.clone());
    let kind = match seen.phase.as_str() {
        "Failed" => match exit_code(seen.pod) {
            _ if reason == "Evicted" || disrupted.as_deref() == Some("EvictionByEvictionAPI") => {
                FailureKind::Evicted
            }
            _ if reason == "NodeLost" => FailureKind::NodeLost,
            Some(code) => FailureKind::Exit(code),
            None if reason.is_empty() => FailureKind::Other("no exit code".to_owned()),
            None => FailureKind::Other(reason),
        },
        "Unknown" => FailureKind::NodeLost,
        "Succeeded" => return None,
        _ if seen.deleting => FailureKind::Deleted,
        _ => return None,
    };
    Some(Failure { pod: seen.name.clone(), role: seen.role, kind })
}

fn in_range(job: &TrainingJob, role: Role) -> bool {
    let spec = &job.spec;
    match role {
        Role::Ps { index } => index < spec.parameter_servers.replicas,
        Role::Worker { group, rank } => group < spec.workers.groups && rank < spec.workers.group_size,
        Role::Launcher { group } => spec.workers.backend == Backend::Mpi && group < spec.workers.groups,
    }
}

fn attempt_of<'a>(status: &'a TrainingJobStatus, unit: &str) -> Option<&'a UnitAttempt> {
    status.attempts.iter().find(|a| a.unit == unit)
}

/// When a unit's pods may be launched again after its last restart.
fn backoff_until(policy: &RunPolicy, record: &UnitAttempt) -> Option<Timestamp> {
    let last = record.last_restart_time.as_ref()?.0;
    let exp = record.attempt.saturating_sub(1).min(20);
    let base = Duration::from_secs(u64::from(policy.backoff_seconds));
    let wait = base.saturating_mul(1u32 << exp).min(MAX_BACKOFF);
    last.checked_add(SignedDuration::try_from(wait).ok()?).ok()
}

fn until(now: Timestamp, then: Timestamp) -> Duration {
    // A time already past means "now"; a second's floor avoids a hot loop on clock skew.
    Duration::try_from(then.duration_since(now)).unwrap_or_default().max(Duration::from_secs(1))
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

fn condition_is(status: &TrainingJobStatus, type_: &str, value: &str) -> Option<Timestamp> {
    status.conditions.iter().find(|c| c.type_ == type_ && c.status == value).map(|c| c.last_transition_time.0)
}

/// Decides what to do for `job` given what exists.
pub fn decide(job: &TrainingJob, observed: &Observed<'_>, settings: &Settings) -> Plan {
    let now = observed.now;
    let name = job.name_any();
    let spec = &job.spec;
    let policy = &spec.run_policy;
    let generation = job.metadata.generation;
    let old = job.status.clone().unwrap_or_default();
    let mut st = old.clone();
    st.observed_generation = generation;
    st.selector = Some(names::worker_selector(&name));
    let mut plan = Plan { requeue_after: settings.resync, ..Plan::default() };
    let mut wake = |plan: &mut Plan, after: Duration| plan.requeue_after = plan.requeue_after.min(after);

    let mut seen: Vec<Seen<'_>> = observed
        .pods
        .iter()
        .filter_map(|pod| {
            let labels = pod.labels();
            Some(Seen {
                pod,
                name: pod.name_any(),
                role: names::role_of(labels)?,
                attempt: names::attempt_of(labels),
                phase: pod.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default(),
                deleting: pod.metadata.deletion_timestamp.is_some(),
            })
        })
        .collect();
    seen.sort_by(|a, b| a.name.cmp(&b.name));

    // Pods stuck terminating on a lost node: force-deleted once past their deadline.
    for s in seen.iter().filter(|s| s.deleting) {
        let node = s.pod.spec.as_ref().and_then(|p| p.node_name.as_deref());
        let (Some(node), Some(deadline)) = (node, s.pod.metadata.deletion_timestamp.as_ref()) else {
            continue;
        };
        if !observed.lost_nodes.contains(node) {
            continue;
        }
        let grace = SignedDuration::try_from(settings.force_delete_after).unwrap_or(SignedDuration::ZERO);
        let due = deadline.0.checked_add(grace).unwrap_or(deadline.0);
        if now >= due {
            plan.force_delete.push(s.name.clone());
        } else {
            wake(&mut plan, until(now, due));
        }
    }

    let finished = old.phase.is_some_and(JobPhase::is_finished);
    if finished {
        finish_up(job, &seen, &mut st, &mut plan, now, &mut wake);
        plan.status = st;
        return plan;
    }
    plan.ensure_children = true;
    plan.want_pod_group = policy.scheduling.gang && !policy.suspend;

    if policy.suspend {
        for s in seen.iter().filter(|s| !s.deleting) {
            plan.delete.push(s.name.clone());
        }
        st.start_time = None;
        st.groups = 0;
        st.phase = Some(JobPhase::Suspended);
        let message = "runPolicy.suspend is true: pods deleted, spec and status kept";
        set_condition(&mut st.conditions, condition::SUSPENDED, true, "Suspended", message, now, generation);
        set_condition(&mut st.conditions, condition::RUNNING, false, "Suspended", message, now, generation);
        set_condition(&mut st.conditions, condition::SCALING, false, "Suspended", message, now, generation);
        set_condition(
            &mut st.conditions,
            condition::RESTARTING,
            false,
            "Suspended",
            message,
            now,
            generation,
        );
        st.parameter_servers = Some(RoleStatus::default());
        st.workers = Some(RoleStatus::default());
        transition(&old, &mut st, &mut plan, "Suspended", message, false);
        plan.status = st;
        return plan;
    }
    if condition_is(&old, condition::SUSPENDED, "True").is_some() {
        set_condition(
            &mut st.conditions,
            condition::SUSPENDED,
            false,
            "Resumed",
            "runPolicy.suspend is false: pods recreated",
            now,
            generation,
        );
    }
    set_condition(
        &mut st.conditions,
        condition::CREATED,
        true,
        "JobCreated",
        "Service, ConfigMap and Secrets created",
        now,
        generation,
    );

    // Drop bookkeeping of units the spec no longer has (scaled-down groups).
    st.attempts.retain(|a| unit_in_spec(job, &a.unit));
    let current_attempt =
        |st: &TrainingJobStatus, role: Role| attempt_of(st, &names::unit(role)).map_or(0, |a| a.attempt);

    // Stale (older attempt) and out-of-range pods go.
    for s in &seen {
        let stale = s.attempt < current_attempt(&st, s.role);
        if (stale || !in_range(job, s.role)) && !s.deleting {
            plan.delete.push(s.name.clone());
        }
    }

    // Failures of current pods: restart their unit, or fail the job.
    let mut failed: Option<(String, String)> = None;
    let mut restarted_units: BTreeSet<String> = BTreeSet::new();
    let failures: Vec<Failure> = seen
        .iter()
        .filter(|s| in_range(job, s.role) && s.attempt >= current_attempt(&old, s.role))
        .filter_map(failure_of)
        .collect();
    for failure in failures {
        let unit = names::unit(failure.role);
        if restarted_units.contains(&unit) {
            continue;
        }
        if !failure.retryable(policy) {
            failed = Some(failure.permanent(policy));
            break;
        }
        if st.restarts >= policy.max_restarts {
            failed = Some(failure.exhausted(policy));
            break;
        }
        st.restarts += 1;
        let attempt = current_attempt(&st, failure.role) + 1;
        record_restart(&mut st, &unit, attempt, None, now);
        let what = match failure.role {
            Role::Ps { index } => match &spec.training.checkpoint.claim_name {
                Some(claim) => format!(
                    "parameter server {index} in a new pod (it resumes from its newest checkpoint on \
                     claim {claim}, if it wrote one)"
                ),
                None => format!(
                    "parameter server {index} in a new pod, with a new emptyDir output volume: it starts \
                     from its initial weights (set spec.training.checkpoint.claimName to keep checkpoints \
                     when a pod is lost)"
                ),
            },
            Role::Worker { group, .. } | Role::Launcher { group } => format!("group {group} only"),
        };
        let message = format!(
            "{} (retryable): restarting {what}, attempt {attempt}, restart {} of {}",
            failure.describe(),
            st.restarts,
            policy.max_restarts
        );
        announce_restart(&mut st, &mut plan, &failure, message, now, generation);
        for s in seen.iter().filter(|s| names::unit(s.role) == unit && !s.deleting) {
            if !plan.delete.contains(&s.name) {
                plan.delete.push(s.name.clone());
            }
        }
        restarted_units.insert(unit);
    }

    // PS containers the kubelet restarted in place (restartPolicy OnFailure): count or fail.
    if failed.is_none() {
        failed = in_place_restarts(job, &seen, &old, &mut st, &mut plan, &restarted_units, now);
    }

    // Deadline.
    if failed.is_none()
        && let Some(limit) = policy.active_deadline_seconds
    {
        let created = job.metadata.creation_timestamp.as_ref().map_or(now, |t| t.0);
        let resumed = condition_is(&old, condition::SUSPENDED, "False").unwrap_or(created);
        let origin = st.start_time.as_ref().map_or(created.max(resumed), |t| t.0);
        let deadline = origin.checked_add(SignedDuration::from_secs(limit)).unwrap_or(origin);
        if now >= deadline {
            failed = Some((
                "DeadlineExceeded".to_owned(),
                format!("the job ran longer than runPolicy.activeDeadlineSeconds ({limit} s)"),
            ));
        } else {
            wake(&mut plan, until(now, deadline));
        }
    }

    let current: Vec<&Seen<'_>> = seen
        .iter()
        .filter(|s| {
            in_range(job, s.role)
                && s.attempt >= current_attempt(&st, s.role)
                && !plan.delete.contains(&s.name)
        })
        .collect();
    st.parameter_servers = Some(role_counts(&current, |r| matches!(r, Role::Ps { .. })));
    st.workers = Some(role_counts(&current, |r| matches!(r, Role::Worker { .. })));
    let find = |role: Role| current.iter().find(|s| s.role == role);
    let groups = spec.workers.groups;
    let size = spec.workers.group_size;
    let mpi = spec.workers.backend == Backend::Mpi;
    st.groups = (0..groups)
        .filter(|&group| {
            (0..size).all(|rank| find(Role::Worker { group, rank }).is_some_and(|s| !s.deleting))
        })
        .count() as u32;

    if let Some((reason, message)) = failed {
        st.phase = Some(JobPhase::Failed);
        st.completion_time = Some(Time(now));
        set_condition(&mut st.conditions, condition::FAILED, true, &reason, &message, now, generation);
        close_conditions(&mut st, &reason, now, generation);
        transition(&old, &mut st, &mut plan, &reason, &message, true);
        finish_up(job, &seen, &mut st, &mut plan, now, &mut wake);
        plan.status = st;
        return plan;
    }

    let group_done = |group: u32| {
        if mpi {
            find(Role::Launcher { group }).is_some_and(|s| s.succeeded())
        } else {
            (0..size).all(|rank| find(Role::Worker { group, rank }).is_some_and(|s| s.succeeded()))
        }
    };
    if (0..groups).all(group_done) {
        let message = format!("all {groups} worker groups finished training");
        st.phase = Some(JobPhase::Succeeded);
        st.completion_time = Some(Time(now));
        set_condition(
            &mut st.conditions,
            condition::SUCCEEDED,
            true,
            "TrainingSucceeded",
            &message,
            now,
            generation,
        );
        close_conditions(&mut st, "TrainingSucceeded", now, generation);
        transition(&old, &mut st, &mut plan, "TrainingSucceeded", &message, false);
        finish_up(job, &seen, &mut st, &mut plan, now, &mut wake);
        plan.status = st;
        return plan;
    }

    // Launch what is missing, unit by unit, respecting back-off.
    let exists = |name: &str| seen.iter().any(|s| s.name == name);
    let mut waiting = false;
    let mut launchable = |plan: &mut Plan, role: Role| -> bool {
        match attempt_of(&st, &names::unit(role)).and_then(|r| backoff_until(policy, r)) {
            Some(at) if now < at => {
                wake(plan, until(now, at));
                waiting = true;
                false
            }
            _ => true,
        }
    };
    for index in 0..spec.parameter_servers.replicas {
        let role = Role::Ps { index };
        if !exists(&names::pod(&name, role)) && launchable(&mut plan, role) {
            plan.create.push((role, current_attempt(&st, role)));
        }
    }
    for group in 0..groups {
        for rank in 0..size {
            let role = Role::Worker { group, rank };
            if !exists(&names::pod(&name, role)) && launchable(&mut plan, role) {
                plan.create.push((role, current_attempt(&st, role)));
            }
        }
    }
    if mpi {
        for group in 0..groups {
            let role = Role::Launcher { group };
            let workers_ready =
                (0..size).all(|rank| find(Role::Worker { group, rank }).is_some_and(|s| s.ready()));
            if workers_ready && !exists(&names::pod(&name, role)) {
                plan.create.push((role, current_attempt(&st, role)));
            }
        }
    }

    // Phase.
    let all_running = (0..spec.parameter_servers.replicas)
        .all(|index| find(Role::Ps { index }).is_some_and(|s| s.running()))
        && (0..groups).all(|group| {
            (0..size)
                .all(|rank| find(Role::Worker { group, rank }).is_some_and(|s| s.running() || s.succeeded()))
                && (!mpi || find(Role::Launcher { group }).is_some_and(|s| s.running() || s.succeeded()))
        });
    let restarting = waiting
        || !plan.restarted.is_empty()
        || (condition_is(&old, condition::RESTARTING, "True").is_some() && !all_running);
    let leaving = seen.iter().any(|s| !in_range(job, s.role));
    let scaling = !restarting && old.start_time.is_some() && (leaving || !all_running);
    let (phase, reason, message) = if restarting {
        let c = st.conditions.iter().find(|c| c.type_ == condition::RESTARTING);
        let reason = c.map_or("Restarting".to_owned(), |c| c.reason.clone());
        let message = c.map_or(String::new(), |c| c.message.clone());
        (JobPhase::Restarting, reason, message)
    } else if scaling {
        (JobPhase::Scaling, "GroupsChanged".to_owned(), format!("scaling to {groups} worker groups"))
    } else if all_running {
        (
            JobPhase::Running,
            "AllPodsRunning".to_owned(),
            format!("all pods of {groups} worker groups are running"),
        )
    } else {
        (JobPhase::Created, "PodsStarting".to_owned(), "waiting for pods to run".to_owned())
    };
    set_condition(&mut st.conditions, condition::RESTARTING, restarting, &reason, &message, now, generation);
    set_condition(&mut st.conditions, condition::SCALING, scaling, &reason, &message, now, generation);
    set_condition(
        &mut st.conditions,
        condition::RUNNING,
        all_running && !restarting && !scaling,
        &reason,
        &message,
        now,
        generation,
    );
    if phase == JobPhase::Running && st.start_time.is_none() {
        st.start_time = Some(Time(now));
    }
    st.phase = Some(phase);
    if plan.restarted.is_empty() {
        transition(&old, &mut st, &mut plan, &reason, &message, false);
    }
    plan.status = st;
    plan
}

/// New in-place restarts of current PS pods: each is judged like a failed pod (a permanent exit
/// code or used-up restarts fail the job: the returned reason and message) and otherwise counted
/// towards `maxRestarts`, without touching the pod.
fn in_place_restarts(
    job: &TrainingJob,
    seen: &[Seen<'_>],
    old: &TrainingJobStatus,
    st: &mut TrainingJobStatus,
    plan: &mut Plan,
    restarted_units: &BTreeSet<String>,
    now: Timestamp,
) -> Option<(String, String)> {
    let policy = &job.spec.run_policy;
    let generation = job.metadata.generation;
    for s in seen.iter().filter(|s| matches!(s.role, Role::Ps { .. }) && !s.deleting && in_range(job, s.role))
    {
        let unit = names::unit(s.role);
        let record = attempt_of(old, &unit);
        if restarted_units.contains(&unit) || s.attempt < record.map_or(0, |r| r.attempt) {
            continue;
        }
        let Some((count, exit)) = container_restart(s.pod) else { continue };
        let counted = record.and_then(|r| r.container_restarts).unwrap_or(0);
        if count <= counted {
            continue;
        }
        let kind =
            exit.map_or_else(|| FailureKind::Other("restarted by the kubelet".to_owned()), FailureKind::Exit);
        let failure = Failure { pod: s.name.clone(), role: s.role, kind };
        if !failure.retryable(policy) {
            return Some(failure.permanent(policy));
        }
        let new = count - counted;
        if st.restarts.saturating_add(new) > policy.max_restarts {
            return Some(failure.exhausted(policy));
        }
        st.restarts += new;
        record_restart(st, &unit, s.attempt, Some(count), now);
        let message = format!(
            "{} (retryable): the kubelet restarted its container in place, in the same pod, whose output \
             volume keeps its checkpoints: it resumes from its newest checkpoint there, if it wrote one; \
             restart {} of {}",
            failure.describe(),
            st.restarts,
            policy.max_restarts
        );
        announce_restart(st, plan, &failure, message, now, generation);
    }
    None
}

/// Records a restart of `unit` at `now`: its pods' attempt, and the in-place restarts of that
/// attempt's pod counted so far (`None` for a new attempt, whose pod has none).
fn record_restart(
    st: &mut TrainingJobStatus,
    unit: &str,
    attempt: u32,
    container_restarts: Option<u32>,
    now: Timestamp,
) {
    match st.attempts.iter_mut().find(|a| a.unit == unit) {
        Some(record) => {
            record.attempt = attempt;
            record.last_restart_time = Some(Time(now));
            record.container_restarts = container_restarts;
        }
        None => st.attempts.push(UnitAttempt {
            unit: unit.to_owned(),
            attempt,
            last_restart_time: Some(Time(now)),
            container_restarts,
        }),
    }
    st.attempts.sort_by(|a, b| a.unit.cmp(&b.unit));
}

/// The Restarting condition, a warning Event and the restarts metric for a retried `failure`.
fn announce_restart(
    st: &mut TrainingJobStatus,
    plan: &mut Plan,
    failure: &Failure,
    message: String,
    now: Timestamp,
    generation: Option<i64>,
) {
    let reason = failure.reason();
    set_condition(&mut st.conditions, condition::RESTARTING, true, reason, &message, now, generation);
    plan.events.push(Transition { warning: true, reason: reason.to_owned(), message });
    plan.restarted.push(failure.role);
}

fn unit_in_spec(job: &TrainingJob, unit: &str) -> bool {
    let parse = |prefix: &str| unit.strip_prefix(prefix).and_then(|n| n.parse::<u32>().ok());
    if let Some(index) = parse("ps-") {
        return index < job.spec.parameter_servers.replicas;
    }
    parse("group-").is_some_and(|group| group < job.spec.workers.groups)
}

fn role_counts(current: &[&Seen<'_>], pick: impl Fn(Role) -> bool) -> RoleStatus {
    let mut counts = RoleStatus::default();
    for s in current.iter().filter(|s| pick(s.role)) {
        counts.total += 1;
        counts.ready += u32::from(s.ready());
        counts.active += u32::from(s.running());
        counts.succeeded += u32::from(s.succeeded());
        counts.failed += u32::from(s.phase == "Failed");
    }
    counts
}

/// Sets the False side of the running-state conditions when the job ends.
fn close_conditions(st: &mut TrainingJobStatus, reason: &str, now: Timestamp, generation: Option<i64>) {
    let message = "the job finished";
    for type_ in [condition::RUNNING, condition::RESTARTING, condition::SCALING] {
        set_condition(&mut st.conditions, type_, false, reason, message, now, generation);
    }
}

/// Records an Event when the phase changes.
fn transition(
    old: &TrainingJobStatus,
    st: &mut TrainingJobStatus,
    plan: &mut Plan,
    reason: &str,
    message: &str,
    warning: bool,
) {
    if old.phase != st.phase {
        plan.events.push(Transition { warning, reason: reason.to_owned(), message: message.to_owned() });
    }
}

/// A finished job: clean-up policy, PodGroup removal, TTL.
fn finish_up(
    job: &TrainingJob,
    seen: &[Seen<'_>],
    st: &mut TrainingJobStatus,
    plan: &mut Plan,
    now: Timestamp,
    wake: &mut impl FnMut(&mut Plan, Duration),
) {
    let policy = &job.spec.run_policy;
    plan.ensure_children = false;
    plan.want_pod_group = false;
    plan.create.clear();
    for s in seen.iter().filter(|s| !s.deleting) {
        let delete = match policy.clean_pod_policy {
            CleanPodPolicy::None => false,
            CleanPodPolicy::All => true,
            CleanPodPolicy::Running => !matches!(s.phase.as_str(), "Succeeded" | "Failed"),
        };
        if delete && !plan.delete.contains(&s.name) {
            plan.delete.push(s.name.clone());
        }
    }
    st.groups = 0;
    if let (Some(ttl), Some(done)) = (policy.ttl_seconds_after_finished, st.completion_time.as_ref()) {
        let expiry = done.0.checked_add(SignedDuration::from_secs(ttl)).unwrap_or(done.0);
        if now >= expiry {
            plan.delete_job = true;
        } else {
            wake(plan, until(now, expiry));
        }
    }
}

/// Counts of jobs by phase, for the jobs-by-phase metric.
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
