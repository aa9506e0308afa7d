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
//! - Which failure restarts which unit, when the job fails instead, and the back-off are
//!   [`tandem_api::policy`]'s, shared with the local runner. A pod in phase `Unknown` lost its
//!   node; a pod deleted from under the job counts as a failure of its unit.
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
use tandem_api::policy::{self, Failure, FailureKind, Unit, Verdict};
use tandem_api::{
    Backend, CleanPodPolicy, JobPhase, Role, RoleStatus, RunPolicy, TrainingJob, TrainingJobStatus,
    UnitAttempt,
};

use crate::names;
use crate::validate::ValidatedJob;

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
    Some(Failure { who: format!("pod {}", seen.name), role: seen.role, kind })
}

fn in_range(job: &TrainingJob, role: Role) -> bool {
    role.in_spec(&job.spec)
}

fn attempt_of<'a>(status: &'a TrainingJobStatus, unit: &str) -> Option<&'a UnitAttempt> {
    status.attempts.iter().find(|a| a.unit == unit)
}

/// When a unit's pods may be launched again after its last restart.
fn backoff_until(policy: &RunPolicy, record: &UnitAttempt) -> Option<Timestamp> {
    let last = record.last_restart_time.as_ref()?.0;
    let wait = policy::backoff(policy.backoff_seconds, record.attempt);
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
pub fn decide(job: &ValidatedJob<'_>, observed: &Observed<'_>, settings: &Settings) -> Plan {
    let job = job.job;
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
    st.attempts.retain(|a| Unit::from_key(&a.unit).is_some_and(|unit| unit.in_spec(spec)));
    let current_attempt =
        |st: &TrainingJobStatus, role: Role| attempt_of(st, &Unit::of(role).key()).map_or(0, |a| a.attempt);

    // Stale (older attempt) and out-of-range pods go.
    for s in &seen {
        let stale = s.attempt < current_attempt(&st, s.role);
        if (stale || !in_range(job, s.role)) && !s.deleting {
            plan.delete.push(s.name.clone());
        }
    }

    // Failures of current pods, by unit: restart the unit, or fail the job.
    let mut failed: Option<(String, String)> = None;
    let mut restarted_units: BTreeSet<String> = BTreeSet::new();
    let mut failures: Vec<(Unit, Vec<Failure>)> = Vec::new();
    for failure in seen
        .iter()
        .filter(|s| in_range(job, s.role) && s.attempt >= current_attempt(&old, s.role))
        .filter_map(failure_of)
    {
        let unit = Unit::of(failure.role);
        match failures.iter_mut().find(|(u, _)| *u == unit) {
            Some((_, of_unit)) => of_unit.push(failure),
            None => failures.push((unit, vec![failure])),
        }
    }
    for (unit, of_unit) in &failures {
        let Some(cause) = policy::cause(policy, of_unit) else { continue };
        let key = unit.key();
        let (attempt, message) =
            match policy::judge(spec, *unit, cause, current_attempt(&st, cause.role), st.restarts) {
                Verdict::Fail { reason, message } => {
                    failed = Some((reason.to_owned(), message));
                    break;
                }
                Verdict::Restart { attempt, restarts, message, .. } => {
                    st.restarts = restarts;
                    (attempt, message)
                }
            };
        match st.attempts.iter_mut().find(|a| a.unit == key) {
            Some(record) => {
                record.attempt = attempt;
                record.last_restart_time = Some(Time(now));
            }
            None => st.attempts.push(UnitAttempt {
                unit: key.clone(),
                attempt,
                last_restart_time: Some(Time(now)),
            }),
        }
        st.attempts.sort_by(|a, b| a.unit.cmp(&b.unit));
        set_condition(
            &mut st.conditions,
            condition::RESTARTING,
            true,
            cause.reason(),
            &message,
            now,
            generation,
        );
        plan.events.push(Transition { warning: true, reason: cause.reason().to_owned(), message });
        plan.restarted.push(cause.role);
        for s in seen.iter().filter(|s| Unit::of(s.role) == *unit && !s.deleting) {
            if !plan.delete.contains(&s.name) {
                plan.delete.push(s.name.clone());
            }
        }
        restarted_units.insert(key);
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
        match attempt_of(&st, &Unit::of(role).key()).and_then(|r| backoff_until(policy, r)) {
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
        || !restarted_units.is_empty()
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
