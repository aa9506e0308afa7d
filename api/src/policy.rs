//! The run policy: which failure restarts which part of a job, when the job fails instead, and how
//! long a restarted part waits. The operator's plan step and the local runner's supervisor both
//! decide through these functions, so a job restarts alike on a cluster and on one machine.
//!
//! Rules:
//! - A [`Unit`] restarts together: one parameter-server replica, or one worker group (every rank,
//!   and with `backend: mpi` its launcher). A failure restarts only its unit, whose attempt rises
//!   by one.
//! - Retryable ([`FailureKind::retryable`]): a signal or an exit code ≥ 128, an eviction, a lost
//!   node, a pod deleted from under the job, a failure without an exit code, and with
//!   `restartPolicy: ExitCode` the codes in `retryableExitCodes`. Other exit codes (1–127) are
//!   permanent; with `restartPolicy: Never` every failure is.
//! - When several processes of one unit failed, the unit's failure is retryable if any of them is
//!   ([`cause`]): a killed rank takes its peers down with it, and they are collateral.
//! - Each restart counts towards `maxRestarts`, all units together; past it the job fails. That
//!   includes a parameter server's restarts in place ([`judge_in_place`]): on a cluster a PS pod
//!   has `restartPolicy: OnFailure`, so the kubelet restarts its container in the same pod, whose
//!   output folder keeps its checkpoints; its exit code is judged by the same rules.
//! - A restart as a new attempt ([`judge`]) says what the unit resumes from: a PS-algorithm group
//!   from the PS weights; a PS or an `allreduce` group from its newest checkpoint where its output
//!   folder survives ([`Relaunch`]): always locally, on a cluster only with a checkpoint claim (a
//!   new pod gets a new emptyDir).
//! - A parameter server's failure costs one restart, wherever the job runs. The groups that lose
//!   it start again as new attempts that do not count ([`relaunch_with_ps`]): the local runner
//!   relaunches every unfinished group with a restarted PS; on a cluster each group exits with
//!   [`ExitClass::PeerLost`] when its PS goes, and a group whose every failed process exited so
//!   ([`lost_a_parameter_server`]) while a PS of the job restarted is relaunched the same way.
//! - A restarted unit comes back after `backoffSeconds · 2^(attempt−1)`, at most [`MAX_BACKOFF`]
//!   ([`backoff`]).
//!
//! Guarantees: pure (no clock, no I/O). Every message names the process and what happened to it;
//! a permanent failure's message also says what to change.

use std::fmt;
use std::time::Duration;

use crate::contract::{ExitClass, Role};
use crate::job::{Backend, RestartPolicy, RunPolicy, TrainingJobSpec};

/// Longest back-off before a restarted unit comes back.
pub const MAX_BACKOFF: Duration = Duration::from_secs(3600);

/// What restarts together.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Unit {
    /// One parameter-server replica.
    Ps(u32),
    /// One worker group: every rank, and its mpirun launcher.
    Group(u32),
}

impl Unit {
    /// The unit a process belongs to.
    pub fn of(role: Role) -> Self {
        match role {
            Role::Ps { index } => Unit::Ps(index),
            Role::Worker { group, .. } | Role::Launcher { group } => Unit::Group(group),
        }
    }

    /// The unit's name in `status.attempts`: `ps-<i>` or `group-<g>`.
    pub fn key(self) -> String {
        match self {
            Unit::Ps(index) => format!("ps-{index}"),
            Unit::Group(group) => format!("group-{group}"),
        }
    }

    /// Reads a [`Unit::key`] back; `None` for anything else.
    pub fn from_key(key: &str) -> Option<Self> {
        let number = |prefix: &str| key.strip_prefix(prefix).and_then(|n| n.parse::<u32>().ok());
        number("ps-").map(Unit::Ps).or_else(|| number("group-").map(Unit::Group))
    }

    /// Whether `spec` has this unit (a scaled-down group, a removed PS replica do not).
    pub fn in_spec(self, spec: &TrainingJobSpec) -> bool {
        match self {
            Unit::Ps(index) => index < spec.parameter_servers.replicas,
            Unit::Group(group) => group < spec.workers.groups,
        }
    }

    /// What a restart of the unit restarts as a new attempt, relaunched as `relaunch` says, and
    /// what it picks up again from: a PS-algorithm group from the PS weights; a PS, and an
    /// `allreduce` group, from its newest checkpoint where its output folder survives.
    fn restart_scope(self, spec: &TrainingJobSpec, relaunch: Relaunch) -> String {
        let what = match self {
            Unit::Ps(index) => format!("parameter server {index}"),
            Unit::Group(group) if spec.training.algorithm.uses_parameter_server() => {
                return format!("group {group} only (it resumes from the PS weights)");
            }
            Unit::Group(group) => format!("group {group} only"),
        };
        match (relaunch, &spec.training.checkpoint.claim_name) {
            (Relaunch::SameFolder, _) => format!("{what} (it resumes from its latest checkpoint)"),
            (Relaunch::NewPod, Some(claim)) => {
                format!(
                    "{what} in a new pod (it resumes from its newest checkpoint on claim {claim}, if it wrote one)"
                )
            }
            (Relaunch::NewPod, None) => format!(
                "{what} in a new pod, with a new emptyDir output volume: it starts from its initial weights \
                 (set spec.training.checkpoint.claimName to keep checkpoints when a pod is lost)"
            ),
        }
    }
}

/// Where a unit restarted as a new attempt starts again, which decides whether its output folder,
/// and so its checkpoints, survive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Relaunch {
    /// In the same output folder: the local runner starts the processes again on this machine.
    SameFolder,
    /// In new pods (the operator): their output volume is `spec.training.checkpoint.claimName` if
    /// the spec names one, else a new, empty emptyDir.
    NewPod,
}

impl fmt::Display for Unit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unit::Ps(index) => write!(f, "parameter server {index}"),
            Unit::Group(group) => write!(f, "group {group}"),
        }
    }
}

impl Role {
    /// Whether `spec` has this process: a PS index below the replicas, a group and rank within
    /// the groups and their size, a launcher of a group with `backend: mpi`.
    pub fn in_spec(self, spec: &TrainingJobSpec) -> bool {
        let workers = &spec.workers;
        match self {
            Role::Ps { index } => index < spec.parameter_servers.replicas,
            Role::Worker { group, rank } => group < workers.groups && rank < workers.group_size,
            Role::Launcher { group } => workers.backend == Backend::Mpi && group < workers.groups,
        }
    }
}

/// How a process or pod ended without success.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FailureKind {
    /// It exited with this code (a kubelet reports a process killed by signal `s` as `128 + s`).
    Exit(i32),
    /// This signal killed it (seen by its parent, the local runner).
    Signal(i32),
    /// Its pod was evicted.
    Evicted,
    /// Its pod lost its node.
    NodeLost,
    /// Its pod was deleted while the job ran.
    Deleted,
    /// Its pod failed for this reason, without an exit code.
    Other(String),
    /// Its job's step stopped advancing (`runPolicy.stallTimeoutSeconds`); says since when.
    Stalled(String),
}

impl FailureKind {
    /// How the process said it failed, for an exit with one of Tandem's codes.
    pub fn exit_class(&self) -> Option<ExitClass> {
        match self {
            FailureKind::Exit(code) => ExitClass::of_code(*code),
            _ => None,
        }
    }

    /// Whether `policy` restarts a unit that failed like this.
    pub fn retryable(&self, policy: &RunPolicy) -> bool {
        match (policy.restart_policy, self) {
            (RestartPolicy::Never, _) => false,
            (_, FailureKind::Exit(code)) if *code >= 128 => true,
            (RestartPolicy::ExitCode, FailureKind::Exit(code)) => policy.retryable_exit_codes.contains(code),
            (RestartPolicy::OnFailure, FailureKind::Exit(_)) => false,
            (_, FailureKind::Signal(_) | FailureKind::Evicted | FailureKind::NodeLost)
            | (_, FailureKind::Deleted | FailureKind::Other(_) | FailureKind::Stalled(_)) => true,
        }
    }

    /// Why `policy` does not restart it, and what to change; meaningful when not
    /// [`FailureKind::retryable`].
    pub fn why_permanent(&self, policy: &RunPolicy) -> String {
        match (policy.restart_policy, self) {
            (RestartPolicy::Never, _) => "runPolicy.restartPolicy is Never".to_owned(),
            (RestartPolicy::ExitCode, FailureKind::Exit(code)) => format!(
                "exit code {code} is below 128 and not in runPolicy.retryableExitCodes; fix the cause or list it there"
            ),
            _ => {
                "exit codes 1-127 are permanent failures; fix the cause, or use restartPolicy ExitCode with \
                  retryableExitCodes"
                    .to_owned()
            }
        }
    }
}

/// One failed process or pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// Who failed, as the user finds it: `pod mnist-g0-1`, or `worker 0/1` locally.
    pub who: String,
    /// Its role in the job.
    pub role: Role,
    /// How it failed.
    pub kind: FailureKind,
    /// What it said as it ended: the container's termination message (`tandem` writes its last
    /// error there, e.g. the peers-reachable gate naming an unreachable peer), shown after the
    /// failure, at most [`MESSAGE_CHARS`] of it.
    pub message: Option<String>,
}

/// Most characters of a termination message a failure shows (an Event's note holds 1 KiB).
pub const MESSAGE_CHARS: usize = 400;

impl Failure {
    /// The CamelCase reason of a condition or Event about it.
    pub fn reason(&self) -> &'static str {
        match self.role {
            Role::Ps { .. } => "ParameterServerFailed",
            Role::Worker { .. } => "WorkerFailed",
            Role::Launcher { .. } => "LauncherFailed",
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let who = &self.who;
        match &self.kind {
            FailureKind::Exit(code) => write!(f, "{who} exited with code {code}"),
            FailureKind::Signal(signal) => write!(f, "{who} was killed by signal {signal}"),
            FailureKind::Evicted => write!(f, "{who} was evicted"),
            FailureKind::NodeLost => write!(f, "{who} lost its node"),
            FailureKind::Deleted => write!(f, "{who} was deleted while the job ran"),
            FailureKind::Other(reason) => write!(f, "{who} failed ({reason})"),
            FailureKind::Stalled(detail) => write!(f, "{who} stalled: {detail}"),
        }?;
        match self.message.as_deref().map(str::trim).filter(|m| !m.is_empty()) {
            Some(m) if m.chars().count() > MESSAGE_CHARS => {
                let cut: String = m.chars().take(MESSAGE_CHARS).collect();
                write!(f, " (its termination message: {cut}…)")
            }
            Some(m) => write!(f, " (its termination message: {m})"),
            None => Ok(()),
        }
    }
}

/// The failure that decides about a unit whose current attempt had `failures` (earliest first):
/// the first retryable one, else the first. `None` when there are none.
pub fn cause<'a>(policy: &RunPolicy, failures: &'a [Failure]) -> Option<&'a Failure> {
    failures.iter().find(|f| f.kind.retryable(policy)).or(failures.first())
}

/// Reason of a job that failed because it used up `runPolicy.maxRestarts`.
pub const MAX_RESTARTS_EXCEEDED: &str = "MaxRestartsExceeded";

/// What to do about a failed unit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Start the unit again as `attempt` once `backoff` has passed; the job has then used
    /// `restarts` restarts. (After [`judge_in_place`]: the kubelet already restarted it; count it.)
    Restart {
        /// The unit's new attempt (`TANDEM_ATTEMPT` of its processes); unchanged in place.
        attempt: u32,
        /// The job's restarts, this one included.
        restarts: u32,
        /// How long the unit waits before it starts again.
        backoff: Duration,
        /// What happened and what restarts, for the user.
        message: String,
    },
    /// The job fails.
    Fail {
        /// CamelCase reason: the failed role's ([`Failure::reason`]) or [`MAX_RESTARTS_EXCEEDED`].
        reason: &'static str,
        /// What happened and, for a permanent failure, what to change.
        message: String,
    },
}

/// Decides about `unit` of a job with `spec`, failed by `cause` (see [`cause`]) in its attempt
/// `attempt`, when the job has used `restarts` restarts so far; a restart relaunches the unit as a
/// new attempt, as `relaunch` says.
pub fn judge(
    spec: &TrainingJobSpec,
    relaunch: Relaunch,
    unit: Unit,
    cause: &Failure,
    attempt: u32,
    restarts: u32,
) -> Verdict {
    let policy = &spec.run_policy;
    if let Some(fail) = refuse(policy, cause, restarts.saturating_add(1)) {
        return fail;
    }
    let (attempt, restarts) = (attempt + 1, restarts + 1);
    Verdict::Restart {
        attempt,
        restarts,
        backoff: backoff(policy.backoff_seconds, attempt),
        message: format!(
            "{cause} (retryable): restarting {}, attempt {attempt}, restart {restarts} of {}",
            unit.restart_scope(spec, relaunch),
            policy.max_restarts
        ),
    }
}

/// Whether `unit`'s `failures` are only the loss of a peer outside it: `unit` is a worker group
/// and every one of its processes that failed exited with [`ExitClass::PeerLost`]. Nothing in the
/// group was killed (a killed process ends by a signal or with 128 + its number, a lost pod is
/// evicted, deleted or loses its node), so the peer it lost is a parameter server. When one of the
/// job's parameter servers restarted, the group is relaunched with [`relaunch_with_ps`].
pub fn lost_a_parameter_server(unit: Unit, failures: &[Failure]) -> bool {
    matches!(unit, Unit::Group(_))
        && !failures.is_empty()
        && failures.iter().all(|f| f.kind.exit_class() == Some(ExitClass::PeerLost))
}

/// Decides about `group` (in its attempt `attempt`), which starts again because parameter server
/// `ps` restarted, when the job has used `restarts` restarts: a new attempt after `backoff` that
/// does not count towards `maxRestarts`, since the server's own restart was counted. One PS
/// failure so costs one restart, locally and on a cluster.
pub fn relaunch_with_ps(group: Unit, ps: u32, attempt: u32, restarts: u32, backoff: Duration) -> Verdict {
    Verdict::Restart {
        attempt: attempt + 1,
        restarts,
        backoff,
        message: format!(
            "{group} relaunched because parameter server {ps} restarted (not counted towards \
             runPolicy.maxRestarts: the server's restart was)"
        ),
    }
}

/// Decides about `count` restarts of a parameter server's container that the kubelet already
/// made in place (`restartPolicy: OnFailure`: same pod, so the output folder and its checkpoints
/// survive), the last one caused by `cause`, in the unit's attempt `attempt`, when the job had used
/// `restarts` restarts before them. They count towards `maxRestarts` like any restart, and the
/// job fails on a permanent cause or once they exceed it. A [`Verdict::Restart`] keeps the
/// attempt and has no back-off of its own (the kubelet's CrashLoopBackOff applies).
pub fn judge_in_place(
    spec: &TrainingJobSpec,
    cause: &Failure,
    attempt: u32,
    count: u32,
    restarts: u32,
) -> Verdict {
    let policy = &spec.run_policy;
    let restarts = restarts.saturating_add(count);
    if let Some(fail) = refuse(policy, cause, restarts) {
        return fail;
    }
    Verdict::Restart {
        attempt,
        restarts,
        backoff: Duration::ZERO,
        message: format!(
            "{cause} (retryable): the kubelet restarted its container in place, in the same pod, whose output \
             volume keeps its checkpoints: it resumes from its newest checkpoint there, if it wrote one; \
             restart {restarts} of {}",
            policy.max_restarts
        ),
    }
}

/// The job's failure when `cause` is permanent, or when the restart that would make the job's
/// restarts `restarts` exceeds `maxRestarts`; `None` when the restart is allowed.
fn refuse(policy: &RunPolicy, cause: &Failure, restarts: u32) -> Option<Verdict> {
    if !cause.kind.retryable(policy) {
        let message = format!("{cause} (permanent: {})", cause.kind.why_permanent(policy));
        return Some(Verdict::Fail { reason: cause.reason(), message });
    }
    if restarts > policy.max_restarts {
        let message = format!(
            "{cause}; the job already used all {} restarts of runPolicy.maxRestarts",
            policy.max_restarts
        );
        return Some(Verdict::Fail { reason: MAX_RESTARTS_EXCEEDED, message });
    }
    None
}

/// How long a unit restarted as `attempt` waits: `base · 2^(attempt−1)` seconds, at most
/// [`MAX_BACKOFF`].
pub fn backoff(base_seconds: u32, attempt: u32) -> Duration {
    let shift = attempt.saturating_sub(1).min(20);
    Duration::from_secs(u64::from(base_seconds).saturating_mul(1 << shift)).min(MAX_BACKOFF)
}
