//! Fault injection for the local runner: `--chaos kill:ps:<i>@<step>` and
//! `--chaos kill:worker:<group>:<rank>@<step>` (SIGKILL), and the same with `term:` (SIGTERM, as
//! a pod's eviction or preemption sends it: the process is expected to save its state and exit
//! with a retryable code).
//!
//! Guarantees: a spec parses into exactly one [`Chaos`] or an error that quotes the spec and shows
//! both accepted forms; each chaos fires at most once, the first time the merged progress reaches
//! its step.

use std::fmt;
use std::str::FromStr;

use tandem_api::contract::Role;

/// One process to signal when the job reaches a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chaos {
    /// The process: `Role::Ps` or `Role::Worker`.
    pub target: Role,
    /// Merged step at which it is signalled.
    pub step: u64,
    /// What it is sent.
    pub action: Action,
}

/// The signal a [`Chaos`] sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// SIGKILL: the process dies at once.
    Kill,
    /// SIGTERM: the process may save its state and exit.
    Term,
}

impl Action {
    /// The signal number.
    pub fn signal(self) -> i32 {
        match self {
            Action::Kill => libc::SIGKILL,
            Action::Term => libc::SIGTERM,
        }
    }

    /// `kill` or `term`, as written in `--chaos`.
    pub fn name(self) -> &'static str {
        match self {
            Action::Kill => "kill",
            Action::Term => "term",
        }
    }
}

/// A `--chaos` value that does not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "--chaos {spec:?}: {reason}; write kill:ps:<index>@<step> or kill:worker:<group>:<rank>@<step> \
     (or term: instead of kill: for SIGTERM), e.g. kill:worker:1:0@200"
)]
pub struct ChaosError {
    /// The value given.
    pub spec: String,
    /// What is wrong with it.
    pub reason: String,
}

impl FromStr for Chaos {
    type Err = ChaosError;

    fn from_str(spec: &str) -> Result<Self, Self::Err> {
        let fail = |reason: &str| ChaosError { spec: spec.to_owned(), reason: reason.to_owned() };
        let (what, step) = spec.rsplit_once('@').ok_or_else(|| fail("the step after '@' is missing"))?;
        let step: u64 = step.trim().parse().map_err(|_| fail("the step after '@' is not a whole number"))?;
        let parts: Vec<&str> = what.split(':').collect();
        let number = |s: &str, name: &str| -> Result<u32, ChaosError> {
            s.trim().parse().map_err(|_| fail(&format!("the {name} {s:?} is not a whole number")))
        };
        let action = match parts.first() {
            Some(&"kill") => Action::Kill,
            Some(&"term") => Action::Term,
            _ => return Err(fail("the action must be kill or term")),
        };
        let target = match &parts[1..] {
            ["ps", index] => Role::Ps { index: number(index, "PS index")? },
            ["worker", group, rank] => {
                Role::Worker { group: number(group, "group")?, rank: number(rank, "rank")? }
            }
            ["ps", ..] => return Err(fail("a PS is named by one index")),
            ["worker", ..] => return Err(fail("a worker is named by its group and rank")),
            _ => return Err(fail("the target must be ps or worker")),
        };
        Ok(Self { target, step, action })
    }
}

impl fmt::Display for Chaos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let action = self.action.name();
        match self.target {
            Role::Ps { index } => write!(f, "{action}:ps:{index}@{}", self.step),
            Role::Worker { group, rank } => write!(f, "{action}:worker:{group}:{rank}@{}", self.step),
            Role::Launcher { group } => write!(f, "{action}:launcher:{group}@{}", self.step),
        }
    }
}
