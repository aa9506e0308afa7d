//! The resolved job plan: the facts every process of a job derives from its spec, decided once
//! here so that parameter servers and workers cannot disagree on them.
//!
//! Expected flow: a parameter server reads [`PsMode::of`] from the spec; a worker (or the
//! single-process trainer) loads its data and calls [`JobPlan::resolve`] with the number of
//! training samples, then tells the parameter servers the plan's step count in its hello, so a
//! shard's learning-rate schedule spans the worker's run ([`JobPlan::total_steps`]).
//!
//! Guarantees: pure functions of the spec (and the data size); [`JobPlan::resolve`] refuses a job
//! that cannot take a single step with an error that says what to change.

pub mod memory;
pub mod shape;

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::job::{Algorithm, TrainingJobSpec, TrainingSpec};

/// What the parameter servers of a job do with what the groups push: the one decision behind
/// `training.algorithm` (with `staleness` and `easgd`). A job without parameter servers
/// (`allreduce`) has no mode.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum PsMode {
    /// Groups push gradients; one averaged update per step from every member group (`ps-sync`,
    /// `hybrid` with staleness 0).
    Sync,
    /// Groups push gradients, each applied at once; with `staleness: Some(s)` a group more than `s`
    /// steps ahead of the slowest member waits (stale synchronous parallel), `None` never waits
    /// (`ps-async`, `hybrid`).
    Async {
        /// The bound `s`, or `None` for unbounded.
        staleness: Option<u64>,
    },
    /// EASGD: groups take local steps and every `tau` steps push an elastic difference
    /// `alpha · (x − centre)`, which the servers add to the centre variable (`easgd`).
    Elastic {
        /// Moving rate α.
        alpha: f64,
        /// Steps between exchanges τ (at least 1).
        tau: u64,
    },
}

impl PsMode {
    /// The mode `training` asks of its parameter servers; `None` for `allreduce`, which has none.
    pub fn of(training: &TrainingSpec) -> Option<Self> {
        match training.algorithm {
            Algorithm::Allreduce => None,
            Algorithm::PsSync => Some(PsMode::Sync),
            Algorithm::Hybrid if training.staleness == 0 => Some(PsMode::Sync),
            Algorithm::PsAsync | Algorithm::Hybrid => {
                Some(PsMode::Async { staleness: Some(u64::from(training.staleness)) })
            }
            Algorithm::Easgd => Some(PsMode::Elastic {
                alpha: training.easgd.alpha,
                tau: u64::from(training.easgd.tau).max(1),
            }),
        }
    }

    /// Whether groups push gradients (which the servers' optimizer applies) rather than elastic
    /// differences (which the servers add).
    pub fn pushes_gradients(self) -> bool {
        !matches!(self, PsMode::Elastic { .. })
    }
}

impl fmt::Display for PsMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PsMode::Sync => write!(f, "sync"),
            PsMode::Async { staleness: Some(s) } => write!(f, "async (staleness {s})"),
            PsMode::Async { staleness: None } => write!(f, "async (unbounded)"),
            PsMode::Elastic { .. } => write!(f, "elastic (EASGD centre)"),
        }
    }
}

/// Everything a training process needs to know about the job's shape and length.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobPlan {
    /// What the parameter servers do; `None` without parameter servers (`allreduce`).
    pub ps_mode: Option<PsMode>,
    /// Data-parallel ranks over all groups (`groups × groupSize`, at least 1).
    pub world: u64,
    /// Samples per rank per step (`data.batchSize`).
    pub batch_size: u64,
    /// Full batches per epoch on each rank.
    pub steps_per_epoch: u64,
    /// Steps of the whole run (per group): `training.steps`, or `training.epochs` × the steps per
    /// epoch. Decaying learning-rate schedules span exactly this many steps on workers and
    /// parameter servers alike.
    pub total_steps: u64,
}

/// A job that cannot be planned.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PlanError {
    /// Neither or both of `training.steps` and `training.epochs`.
    #[error("set exactly one of training.steps and training.epochs")]
    Length,
    /// `data.batchSize: 0` (the CRD's schema refuses it; a spec built in code may not have passed it).
    #[error("data.batchSize is 0: set it to at least 1 sample per rank per step")]
    ZeroBatch,
    /// Fewer samples than one step of every rank takes.
    #[error(
        "{samples} training samples over {world} rank(s) give {per_rank} per rank, fewer than one batch of \
         {batch}; lower data.batchSize or use fewer workers"
    )]
    TooFewSamples {
        /// Training samples.
        samples: u64,
        /// Ranks.
        world: u64,
        /// Samples per rank.
        per_rank: u64,
        /// `data.batchSize`.
        batch: u64,
    },
}

impl JobPlan {
    /// The plan of `spec` for a training set of `train_samples` samples, over the job's ranks
    /// (`groups × groupSize`).
    pub fn resolve(spec: &TrainingJobSpec, train_samples: u64) -> Result<Self, PlanError> {
        Self::resolve_for(spec, train_samples, u64::from(spec.workers.ranks()))
    }

    /// The plan of `spec` trained by `world` data-parallel ranks instead of the job's own: a
    /// baseline that runs the same job on fewer ranks (a test's single-process reference).
    pub fn resolve_for(spec: &TrainingJobSpec, train_samples: u64, world: u64) -> Result<Self, PlanError> {
        let world = world.max(1);
        let batch = u64::from(spec.data.batch_size);
        let per_rank = train_samples / world;
        if batch == 0 {
            return Err(PlanError::ZeroBatch);
        }
        if per_rank < batch {
            return Err(PlanError::TooFewSamples { samples: train_samples, world, per_rank, batch });
        }
        let steps_per_epoch = steps_per_epoch(train_samples, world, batch);
        let total_steps = total_steps(&spec.training, steps_per_epoch)?;
        Ok(Self {
            ps_mode: PsMode::of(&spec.training),
            world,
            batch_size: batch,
            steps_per_epoch,
            total_steps,
        })
    }
}

/// Full batches of `batch` samples that each of `world` ranks takes in an epoch of `samples`
/// training samples: every rank gets an equal share and a partial batch is dropped. The one
/// formula for an epoch's length, which the plan and every data source use.
pub fn steps_per_epoch(samples: u64, world: u64, batch: u64) -> u64 {
    (samples / world.max(1)) / batch.max(1)
}

/// Steps of a run of `training` whose ranks take `steps_per_epoch` batches per epoch:
/// `training.steps`, or `training.epochs × steps_per_epoch`.
pub fn total_steps(training: &TrainingSpec, steps_per_epoch: u64) -> Result<u64, PlanError> {
    match (training.steps, training.epochs) {
        (Some(steps), None) => Ok(steps),
        (None, Some(epochs)) => Ok(u64::from(epochs) * steps_per_epoch),
        _ => Err(PlanError::Length),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn spec(yaml: &str) -> TrainingJobSpec {
        serde_yaml::from_str(yaml).unwrap()
    }

    #[test]
    fn every_algorithm_resolves_to_one_mode() {
        let mode = |algorithm: &str, staleness: u32| {
            PsMode::of(
                &spec(&format!(
                    "training: {{algorithm: {algorithm}, steps: 1, staleness: {staleness}, easgd: {{alpha: 0.25, tau: 0}}}}"
                ))
                .training,
            )
        };
        assert_eq!(mode("allreduce", 0), None);
        assert_eq!(mode("ps-sync", 3), Some(PsMode::Sync));
        assert_eq!(mode("hybrid", 0), Some(PsMode::Sync));
        assert_eq!(mode("hybrid", 2), Some(PsMode::Async { staleness: Some(2) }));
        assert_eq!(mode("ps-async", 5), Some(PsMode::Async { staleness: Some(5) }));
        // τ = 0 would never exchange; it is read as 1.
        assert_eq!(mode("easgd", 0), Some(PsMode::Elastic { alpha: 0.25, tau: 1 }));
        assert!(!PsMode::Elastic { alpha: 0.5, tau: 1 }.pushes_gradients());
        assert!(PsMode::Sync.pushes_gradients());
    }

    #[test]
    fn epochs_become_steps_from_the_data_size_and_the_world() {
        let job = spec(
            "data: {batchSize: 32}\ntraining: {algorithm: hybrid, epochs: 3}\nworkers: {groups: 2, groupSize: 2}",
        );
        let plan = JobPlan::resolve(&job, 4000).unwrap();
        // 4000 samples over 4 ranks, 1000 each: 31 batches of 32 per epoch.
        assert_eq!((plan.world, plan.steps_per_epoch, plan.total_steps), (4, 31, 93));
        let steps = spec("data: {batchSize: 32}\ntraining: {steps: 7}");
        assert_eq!(JobPlan::resolve(&steps, 4000).unwrap().total_steps, 7);
    }

    #[test]
    fn a_baseline_on_fewer_ranks_plans_its_own_epochs() {
        let job = spec("data: {batchSize: 32}\ntraining: {epochs: 2}\nworkers: {groups: 2, groupSize: 2}");
        let one = JobPlan::resolve_for(&job, 4000, 1).unwrap();
        assert_eq!((one.world, one.steps_per_epoch, one.total_steps), (1, 125, 250));
        let job_plan = JobPlan::resolve(&job, 4000).unwrap();
        assert_eq!(job_plan.steps_per_epoch, steps_per_epoch(4000, 4, 32));
        // Every rank an equal share; the partial batch dropped.
        assert_eq!(steps_per_epoch(1001, 2, 100), 5);
    }

    #[test]
    fn a_job_that_cannot_take_a_step_is_refused() {
        let job = spec("data: {batchSize: 64}\ntraining: {epochs: 1}\nworkers: {groups: 4, groupSize: 1}");
        let err = JobPlan::resolve(&job, 200).unwrap_err();
        assert_eq!(err, PlanError::TooFewSamples { samples: 200, world: 4, per_rank: 50, batch: 64 });
        assert!(err.to_string().contains("lower data.batchSize"), "{err}");
        let zero = spec("data: {batchSize: 0}\ntraining: {epochs: 1}");
        assert_eq!(JobPlan::resolve(&zero, 1000), Err(PlanError::ZeroBatch));
        assert!(!PlanError::ZeroBatch.to_string().contains("lower"), "a zero batch is raised, not lowered");
        let both = spec("training: {epochs: 1, steps: 3}");
        assert_eq!(JobPlan::resolve(&both, 1000), Err(PlanError::Length));
    }
}
