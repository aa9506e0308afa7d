//! The runner's restart bookkeeping: restarts so far and each unit's attempt. The decisions are
//! [`tandem_api::policy`]'s, the same the operator applies. Pure: no processes, no clock.

use std::collections::BTreeMap;
use std::time::Duration;

use tandem_api::TrainingJobSpec;
use tandem_api::policy::{self, Failure, Unit, Verdict};

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
    spec: TrainingJobSpec,
    restarts: u32,
    attempts: BTreeMap<Unit, u32>,
}

impl Supervisor {
    /// A supervisor applying the run policy of `spec`.
    pub fn new(spec: TrainingJobSpec) -> Self {
        Self { spec, restarts: 0, attempts: BTreeMap::new() }
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
        let Some(cause) = policy::cause(&self.spec.run_policy, failures) else {
            return Decision::Fail(format!("{unit} failed without a failed process; this is a runner bug"));
        };
        match policy::judge(&self.spec, unit, cause, self.attempt(unit), self.restarts) {
            Verdict::Fail { message, .. } => Decision::Fail(message),
            Verdict::Restart { attempt, restarts, backoff, message } => {
                self.restarts = restarts;
                self.attempts.insert(unit, attempt);
                Decision::Restart { unit, attempt, backoff, message }
            }
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
