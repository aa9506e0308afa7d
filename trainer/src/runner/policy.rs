//! The runner's restart decisions, mirroring the operator's: which failures restart which unit, and
//! when the job fails instead. Pure: no processes, no clock.
//!
//! Rules (the same as `tandem-operator`'s plan step):
//! - A unit is one worker group (all its ranks, or its mpirun launcher) or one PS replica; a
//!   failure restarts only its unit, with the unit's attempt raised by one.
//! - Retryable: killed by a signal or exit code ≥ 128; with `restartPolicy: ExitCode` also the
//!   codes in `retryableExitCodes`. Exit codes 1–127 are permanent otherwise; with
//!   `restartPolicy: Never` every failure is.
//! - Each restart counts towards `maxRestarts`; past it the job fails with a message naming the
//!   role, index and exit status. The unit comes back after `backoffSeconds · 2^(attempt−1)`,
//!   at most an hour.
//! - When several processes of one unit fail together (a killed rank takes its peers down with
//!   it), the unit's failure is retryable if any of them is: the others are collateral.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use tandem_api::contract::Role;
use tandem_api::{RestartPolicy, RunPolicy};

/// Longest back-off before a unit comes back.
pub const MAX_BACKOFF: Duration = Duration::from_secs(3600);

/// How a process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// It exited with this code.
    Code(i32),
    /// A signal killed it.
    Signal(i32),
}

impl Exit {
    /// The exit of a finished child.
    pub fn from_status(status: std::process::ExitStatus) -> Self {
        use std::os::unix::process::ExitStatusExt;
        match (status.code(), status.signal()) {
            (Some(code), _) => Exit::Code(code),
            (None, Some(signal)) => Exit::Signal(signal),
            // Neither a code nor a signal cannot happen for a waited child on Unix.
            (None, None) => Exit::Code(-1),
        }
    }

    /// The code a shell reports for it: the exit code, or 128 + the signal that killed it.
    pub fn shell_code(self) -> i32 {
        match self {
            Exit::Code(code) => code,
            Exit::Signal(signal) => 128 + signal,
        }
    }

    /// Whether it exited cleanly.
    pub fn success(self) -> bool {
        self == Exit::Code(0)
    }

    /// Whether `policy` restarts a unit that ended like this.
    pub fn retryable(self, policy: &RunPolicy) -> bool {
        match (policy.restart_policy, self) {
            (RestartPolicy::Never, _) => false,
            (_, Exit::Signal(_)) => true,
            (_, Exit::Code(code)) if code >= 128 => true,
            (RestartPolicy::ExitCode, Exit::Code(code)) => policy.retryable_exit_codes.contains(&code),
            (RestartPolicy::OnFailure, Exit::Code(_)) => false,
        }
    }

    fn why_permanent(self, policy: &RunPolicy) -> String {
        match (policy.restart_policy, self) {
            (RestartPolicy::Never, _) => "runPolicy.restartPolicy is Never".to_owned(),
            (RestartPolicy::ExitCode, Exit::Code(code)) => format!(
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

impl fmt::Display for Exit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Exit::Code(code) => write!(f, "exit code {code}"),
            Exit::Signal(signal) => write!(f, "signal {signal}"),
        }
    }
}

/// What restarts together.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Unit {
    /// One parameter-server replica.
    Ps(u32),
    /// One worker group: every rank, or its mpirun launcher.
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
}

impl fmt::Display for Unit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unit::Ps(index) => write!(f, "parameter server {index}"),
            Unit::Group(group) => write!(f, "group {group}"),
        }
    }
}

/// One failed process: who, and how it ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Failure {
    /// The process.
    pub role: Role,
    /// How it ended.
    pub exit: Exit,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.exit {
            Exit::Code(code) => write!(f, "{} exited with code {code}", self.role),
            Exit::Signal(signal) => write!(f, "{} was killed by signal {signal}", self.role),
        }
    }
}

/// What to do about a failed unit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Start the unit again as `attempt` after `backoff`.
    Restart {
        /// The unit.
        unit: Unit,
        /// Its new attempt (TANDEM_ATTEMPT).
        attempt: u32,
        /// Wait before starting it.
        backoff: Duration,
        /// What happened, for the user.
        message: String,
    },
    /// The job fails with this message.
    Fail(String),
}

/// Restarts so far and each unit's attempt.
#[derive(Clone, Debug)]
pub struct Supervisor {
    policy: RunPolicy,
    restarts: u32,
    attempts: BTreeMap<Unit, u32>,
}

impl Supervisor {
    /// A supervisor applying `policy`.
    pub fn new(policy: RunPolicy) -> Self {
        Self { policy, restarts: 0, attempts: BTreeMap::new() }
    }

    /// Restarts counted so far.
    pub fn restarts(&self) -> u32 {
        self.restarts
    }

    /// The current attempt of `unit` (0 until it restarts).
    pub fn attempt(&self, unit: Unit) -> u32 {
        self.attempts.get(&unit).copied().unwrap_or(0)
    }

    /// Decides about `unit`, whose current attempt had these failed processes (earliest first;
    /// must not be empty).
    pub fn on_failure(&mut self, unit: Unit, failures: &[Failure]) -> Decision {
        let cause = failures.iter().find(|f| f.exit.retryable(&self.policy)).or(failures.first());
        let Some(cause) = cause.copied() else {
            return Decision::Fail(format!("{unit} failed without a failed process; this is a runner bug"));
        };
        if !cause.exit.retryable(&self.policy) {
            return Decision::Fail(format!(
                "{cause} (permanent: {})",
                cause.exit.why_permanent(&self.policy)
            ));
        }
        if self.restarts >= self.policy.max_restarts {
            return Decision::Fail(format!(
                "{cause}; the job already used all {} restarts of runPolicy.maxRestarts",
                self.policy.max_restarts
            ));
        }
        self.restarts += 1;
        let attempt = self.attempt(unit) + 1;
        self.attempts.insert(unit, attempt);
        let what = match unit {
            Unit::Ps(index) => format!("parameter server {index} (it resumes from its latest checkpoint)"),
            Unit::Group(group) => format!(
                "group {group} only (it resumes from the PS weights, or allreduce from its checkpoint)"
            ),
        };
        Decision::Restart {
            unit,
            attempt,
            backoff: backoff(self.policy.backoff_seconds, attempt),
            message: format!(
                "{cause} (retryable): restarting {what}, attempt {attempt}, restart {} of {}",
                self.restarts, self.policy.max_restarts
            ),
        }
    }

    /// Relaunches `unit` because another unit's restart took it down (a group that lost its PS):
    /// a new attempt, no back-off, not counted towards `maxRestarts`.
    pub fn relaunch(&mut self, unit: Unit) -> u32 {
        let attempt = self.attempt(unit) + 1;
        self.attempts.insert(unit, attempt);
        attempt
    }
}

/// `base · 2^(attempt−1)` seconds, at most [`MAX_BACKOFF`].
pub fn backoff(base_seconds: u32, attempt: u32) -> Duration {
    let shift = attempt.saturating_sub(1).min(20);
    Duration::from_secs(u64::from(base_seconds).saturating_mul(1 << shift)).min(MAX_BACKOFF)
}
