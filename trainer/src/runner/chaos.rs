//! Fault injection for the local runner: `--chaos kill:ps:<i>@<step>` and
//! `--chaos kill:worker:<group>:<rank>@<step>`.
//!
//! Guarantees: a spec parses into exactly one [`Chaos`] or an error that quotes the spec and shows
//! both accepted forms; each chaos fires at most once, the first time the merged progress reaches
//! its step.

use std::fmt;
use std::str::FromStr;

use tandem_api::contract::Role;

/// One process to kill (SIGKILL) when the job reaches a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chaos {
    /// The process: `Role::Ps` or `Role::Worker`.
    pub target: Role,
    /// Merged step at which it is killed.
    pub step: u64,
}

/// A `--chaos` value that does not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "--chaos {spec:?}: {reason}; write kill:ps:<index>@<step> or kill:worker:<group>:<rank>@<step>, \
     e.g. kill:worker:1:0@200"
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
        let target = match parts.as_slice() {
            ["kill", "ps", index] => Role::Ps { index: number(index, "PS index")? },
            ["kill", "worker", group, rank] => {
                Role::Worker { group: number(group, "group")?, rank: number(rank, "rank")? }
            }
            ["kill", "ps", ..] => return Err(fail("a PS is named by one index")),
            ["kill", "worker", ..] => return Err(fail("a worker is named by its group and rank")),
            ["kill", ..] => return Err(fail("the target must be ps or worker")),
            _ => return Err(fail("the only action is kill")),
        };
        Ok(Self { target, step })
    }
}

impl fmt::Display for Chaos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.target {
            Role::Ps { index } => write!(f, "kill:ps:{index}@{}", self.step),
            Role::Worker { group, rank } => write!(f, "kill:worker:{group}:{rank}@{}", self.step),
            Role::Launcher { group } => write!(f, "kill:launcher:{group}@{}", self.step),
        }
    }
}
