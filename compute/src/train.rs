//! The training loop as a library type: a [`Trainer`] computes the flat gradient of one batch and
//! hands it, with the flat parameters, to a [`GradientStep`] that decides how gradients are combined
//! and applied — [`LocalStep`] runs the optimizer in-process; distributed roles (allreduce groups,
//! parameter-server clients) implement the same trait around their communication.
//!
//! Expected flow: [`Trainer::new`] → optionally [`Trainer::resume`] → [`Trainer::run`] (or your own
//! loop of [`Trainer::step`], [`Trainer::evaluate`], [`Trainer::checkpoint`]).
//!
//! [`Trainer::run`] is the one training loop of every job, as burn's learner owns its loop: it
//! owns the cadence ([`Cadence`]: report, evaluate, checkpoint, stop at the job's step count) and
//! the [`GradientStep`] plugged into it is the variable part — [`LocalStep`] in `tandem train`,
//! the allreduce and parameter-server steps of `crate::worker` in a group, which also say which
//! rank leads and how the group sums its report.
//!
//! Guarantees: the state that determines the weights is (flat parameters, optimizer state, step, data
//! cursor, RNG state); a checkpoint holds all of it, so resuming at step k and running to step n gives
//! bit-for-bit the weights of an uninterrupted run to n (same build, same thread count — candle's CPU
//! kernels are deterministic for a fixed thread count). The trainer's parameter buffer and the model's
//! tensors are equal after every step.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use tandem_api::contract::GroupReport;
use tandem_api::{ExitClass, JobPlan, TrainingJobSpec};

use crate::checkpoint::{self, Checkpoint, CheckpointError, CheckpointMeta, NamedTensor};
use crate::device::Device;
use crate::mirror::Mirror;
use crate::model::{self, Batch, BatchStats, Model, ModelError};
use crate::optim::{LrSchedule, OptimError, Optimizer, OptimizerState};
use crate::params::{FlatError, FlatLayout, ParamStore};
use tandem_input::{DataCursor, DataError, Dataset, InputShape, JobData, Source};
use tandem_kernels::net::NetError;

/// Errors of training.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// Model construction or compute.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// Data loading or batching.
    #[error(transparent)]
    Data(#[from] DataError),
    /// Optimizer.
    #[error(transparent)]
    Optim(#[from] OptimError),
    /// Checkpoint I/O.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// A flat buffer does not fit the model.
    #[error(transparent)]
    Flat(#[from] FlatError),
    /// The job cannot be trained as configured.
    #[error("{0}")]
    Config(String),
    /// Training diverged.
    #[error("training diverged at step {step}: the loss is {loss}; lower training.optimizer.learningRate")]
    Diverged {
        /// Step.
        step: u64,
        /// The non-finite loss.
        loss: f32,
    },
    /// A parameter server refused the update of this rank's group because it holds a NaN or an
    /// infinity: the model diverged (with a finite loss). Permanent, as [`TrainError::Diverged`]:
    /// a restart from the same weights diverges again.
    #[error(
        "training diverged at step {step}: {refusal} (a permanent failure: a restart from the same weights would diverge again)"
    )]
    NonFinite {
        /// Step.
        step: u64,
        /// The server's refusal, naming the group, the step and the value.
        refusal: String,
    },
    /// A gradient step implementation failed (a collective, a parameter server, …); `class` says
    /// whether another process of the job was lost ([`ExitClass::PeerLost`], retryable) or the
    /// step itself failed ([`ExitClass::Permanent`]), as its origin classified it.
    #[error("{source}")]
    Step {
        /// How a process that this error ends exits.
        class: ExitClass,
        /// The failure.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The run stopped at a step boundary because [`Cadence::stop`] was set on some rank (SIGTERM:
    /// an eviction, a preemption, a node drain), after the leader checkpointed that step when the
    /// cadence has a checkpoint folder. Retryable: a restart resumes at `step`.
    #[error("stopped at step {step} of {total} on SIGTERM (preempted or evicted){}", match checkpoint {
        Some(path) => format!(", after checkpointing it to {}", path.display()),
        None => String::new(),
    })]
    Preempted {
        /// The last completed step.
        step: u64,
        /// The run's step count.
        total: u64,
        /// The checkpoint of `step` this rank wrote, if it wrote one.
        checkpoint: Option<PathBuf>,
    },
}

impl TrainError {
    /// A failed gradient step of class `class`.
    pub fn step(class: ExitClass, source: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        TrainError::Step { class, source: source.into() }
    }

    /// How a process that this error ends exits: a step's own class, [`ExitClass::Preempted`]
    /// for a stop on SIGTERM, [`ExitClass::PeerLost`] for a split model's lost group peer, and
    /// [`ExitClass::Permanent`] for everything else (bad configuration, data or checkpoints, a
    /// diverged model).
    pub fn exit_class(&self) -> ExitClass {
        match self {
            TrainError::Step { class, .. } => *class,
            TrainError::Preempted { .. } => ExitClass::Preempted,
            TrainError::Model(ModelError::Engine(NetError::Group(e))) if e.peer_lost => ExitClass::PeerLost,
            _ => ExitClass::Permanent,
        }
    }
}

/// Which part of an epoch's training data a rank trains on ([`GradientStep::epoch_share`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EpochShare {
    /// The share the trainer was built with, in every epoch (one group: nothing to plan).
    AsBuilt,
    /// Rank `rank` of the `world` ranks that split this epoch (the job's epoch plan).
    Slice {
        /// This rank's place among them.
        rank: usize,
        /// Ranks that split the epoch.
        world: usize,
    },
    /// None: the job's plan split this epoch over groups without this rank's (it was removed
    /// by scaling before the epoch was planned).
    Out,
}

/// How a computed gradient becomes new parameters: apply it locally, or combine it with other ranks
/// or a parameter server first.
pub trait GradientStep {
    /// Turns `grads` (the flat gradient of this rank's batch, which may be overwritten) into updated
    /// `params` for global step `step` with learning rate `lr`.
    fn apply(&mut self, step: u64, lr: f64, params: &mut [f32], grads: &mut [f32]) -> Result<(), TrainError>;

    /// Optimizer state to keep in a worker checkpoint, if this side owns the optimizer.
    fn optimizer_state(&self) -> Option<OptimizerState>;

    /// Restores what [`GradientStep::optimizer_state`] returned.
    fn restore_optimizer(&mut self, state: &OptimizerState) -> Result<(), TrainError>;

    /// Brings the model's non-trainable state (e.g. batch-norm running statistics, which each
    /// rank moved towards its own batch) to what the replicas share after the step: a group
    /// averages it over its ranks. Called after [`GradientStep::apply`], only for a model that
    /// has state; a single process keeps its own.
    fn sync_state(&mut self, _state: &mut [f32]) -> Result<(), TrainError> {
        Ok(())
    }

    /// Makes `params` whole on this rank before an evaluation or a checkpoint: a model-parallel
    /// group whose ranks update their split rows alone gathers them (a collective at every
    /// evaluation and checkpoint step). Nothing to do for every other step.
    fn whole_params(&mut self, _params: &mut [f32]) -> Result<(), TrainError> {
        Ok(())
    }

    /// Whether this rank evaluates, reports and writes checkpoints: a single process, rank 0 of
    /// a group.
    fn leader(&self) -> bool {
        true
    }

    /// Sums `sums` (the training loss × samples and the samples since the last report) over the
    /// group's ranks; a collective at every report step.
    fn sum_over_group(&mut self, _sums: &mut [f32]) -> Result<(), TrainError> {
        Ok(())
    }

    /// Collects what the leader's checkpoint needs from the other ranks (e.g. their blocks of
    /// the optimizer state) for the whole vector of `len` values; a collective at every
    /// checkpoint step.
    fn prepare_checkpoint(&mut self, _len: usize) -> Result<(), TrainError> {
        Ok(())
    }

    /// Every rank's data cursor for the leader's checkpoint, in rank order, given this rank's
    /// `mine` (a collective at every checkpoint step): a stream that skipped unreadable samples
    /// is at a different position on each rank, and each continues from its own.
    fn gather_cursors(&mut self, mine: DataCursor) -> Result<Vec<DataCursor>, TrainError> {
        Ok(vec![mine])
    }

    /// Whether [`GradientStep::report`] wants every rank's data cursor at each report (a PS
    /// step keeps them on the servers, for a restarted group); gathering them is a collective.
    fn reports_cursors(&self) -> bool {
        false
    }

    /// Passes the leader's report on beyond the caller (a PS step tells the servers), with every
    /// rank's data cursor after the reported step when [`GradientStep::reports_cursors`] (else
    /// none).
    fn report(&mut self, _report: &GroupReport, _cursors: &[DataCursor]) -> Result<(), TrainError> {
        Ok(())
    }

    /// Which part of epoch `epoch`'s data this rank trains on: a PS group's share follows the
    /// job's epoch plan, so the epoch is split over the groups the job had when it was planned
    /// (a collective when the epoch is new to the group: every rank asks at the same step).
    fn epoch_share(&mut self, _epoch: u64) -> Result<EpochShare, TrainError> {
        Ok(EpochShare::AsBuilt)
    }

    /// The run ended at its last step (a PS step leaves the servers' membership).
    fn finish(&mut self) -> Result<(), TrainError> {
        Ok(())
    }
}

/// Single-process training: the optimizer runs here over the whole flat vector.
#[derive(Debug)]
pub struct LocalStep {
    optimizer: Optimizer,
}

impl LocalStep {
    /// Local updates with `optimizer`.
    pub fn new(optimizer: Optimizer) -> Self {
        Self { optimizer }
    }
}

impl GradientStep for LocalStep {
    fn apply(
        &mut self,
        _step: u64,
        lr: f64,
        params: &mut [f32],
        grads: &mut [f32],
    ) -> Result<(), TrainError> {
        Ok(self.optimizer.step(params, grads, lr)?)
    }

    fn optimizer_state(&self) -> Option<OptimizerState> {
        Some(self.optimizer.state())
    }

    fn restore_optimizer(&mut self, state: &OptimizerState) -> Result<(), TrainError> {
        Ok(self.optimizer.restore(state)?)
    }
}

/// Kind recorded in worker checkpoints.
pub const WORKER_CHECKPOINT: &str = "worker";

/// Prefix of the non-trainable state's tensor names in a worker checkpoint (`state.bn1.running_mean`).
pub const STATE_PREFIX: &str = "state.";

/// The result of one step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepReport {
    /// Steps completed after this one.
    pub step: u64,
    /// Epoch of the batch.
    pub epoch: u64,
    /// Learning rate used.
    pub lr: f64,
    /// Loss and accuracy of the batch.
    pub batch: BatchStats,
}

/// Test-set loss and accuracy.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Evaluation {
    /// Mean cross-entropy.
    pub loss: f64,
    /// Fraction classified correctly.
    pub accuracy: f64,
}

/// When [`Trainer::run`] reports, evaluates and checkpoints: the one cadence of every job, a
/// single process or a rank of a group.
///
/// Rules, at step `k` of `total`:
/// - report (the mean training loss since the last report) at every `report_every` multiple,
///   every evaluation step and the last step;
/// - evaluate on the test set at every `eval_every` multiple and at the last step (on the leader);
/// - checkpoint into `checkpoint_dir` at every `checkpoint_every` multiple and at the last step
///   (`checkpoint_every: 0` disables the periodic ones, not the last), keeping the newest
///   `keep_checkpoints`;
/// - with a `stop` flag, after every step the group learns whether any rank's flag is set (a
///   one-value sum over the group, [`GradientStep::sum_over_group`]) and, if so, checkpoints that
///   step (when `checkpoint_dir` is set) and ends with [`TrainError::Preempted`].
#[derive(Clone, Debug, Default)]
pub struct Cadence {
    /// Steps between reports; 0 chooses one from the run length (about 100 reports, 1 to 50 steps).
    pub report_every: u64,
    /// Steps between evaluations; 0 evaluates only at the end.
    pub eval_every: u64,
    /// Steps between checkpoints; 0 writes only the last.
    pub checkpoint_every: u64,
    /// Folder for checkpoints; `None` writes none (e.g. the parameter servers keep the state).
    pub checkpoint_dir: Option<PathBuf>,
    /// Checkpoints kept in the folder (older ones are deleted); 0 keeps all.
    pub keep_checkpoints: usize,
    /// Object storage that keeps a copy of the folder (`training.checkpoint.url`), updated after
    /// every checkpoint.
    pub mirror: Option<Mirror>,
    /// Set asynchronously (by SIGTERM, [`tandem_util::signal::stop_flag`]) to stop the run at the
    /// next step boundary with its state saved; `None` never stops early.
    pub stop: Option<&'static AtomicBool>,
}

/// Checkpoints kept by default (`tandem train` and an `allreduce` group's rank 0 alike).
pub const KEEP_CHECKPOINTS: usize = 3;

impl Cadence {
    /// The spec's cadence (`evalEverySteps`, `checkpoint.everySteps`) with checkpoints into `dir`.
    pub fn of(spec: &TrainingJobSpec, checkpoint_dir: Option<PathBuf>) -> Self {
        Self {
            report_every: 0,
            eval_every: spec.training.eval_every_steps,
            checkpoint_every: spec.training.checkpoint.every_steps,
            checkpoint_dir,
            keep_checkpoints: KEEP_CHECKPOINTS,
            mirror: None,
            stop: None,
        }
    }

    fn report_every(&self, total: u64) -> u64 {
        if self.report_every > 0 { self.report_every } else { (total / 100).clamp(1, 50) }
    }

    fn evaluates_at(&self, k: u64, total: u64) -> bool {
        k == total || (self.eval_every > 0 && k.is_multiple_of(self.eval_every))
    }

    fn checkpoints_at(&self, k: u64, total: u64) -> Option<&Path> {
        let due = k == total || (self.checkpoint_every > 0 && k.is_multiple_of(self.checkpoint_every));
        self.checkpoint_dir.as_deref().filter(|_| due)
    }
}

/// What [`Trainer::run`] returns.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RunSummary {
    /// The step the run ended at (the job's step count; in a run in epochs, as its epoch plan
    /// counted it).
    pub steps: u64,
    /// The step it started from (above 0 after a resume).
    pub start_step: u64,
    /// Test-set loss and accuracy of the final model.
    pub evaluation: Evaluation,
    /// Training samples per second on this rank (steps run here × batch / training time).
    pub samples_per_second: f64,
    /// Wall time of the run, evaluation and checkpoints included.
    pub wall_seconds: f64,
}

/// Single-rank training state: model, data, flat buffers, schedule, position.
#[derive(Debug)]
pub struct Trainer {
    model: Box<dyn Model>,
    loader: Box<dyn Source>,
    test: Dataset,
    store: ParamStore,
    schedule: LrSchedule,
    step: u64,
    total_steps: u64,
    /// The run's length in epochs (a job given in epochs), which its step count follows as the
    /// epoch plan changes the steps an epoch takes.
    epochs: Option<u64>,
    /// The epoch whose share the data source serves ([`GradientStep::epoch_share`]), and the share.
    planned: Option<(u64, EpochShare)>,
    batch_size: usize,
    config_hash: String,
    x: Vec<f32>,
    y: Vec<u32>,
    /// Every group rank's cursor at the checkpoint being written ([`GradientStep::gather_cursors`]).
    group_cursors: Vec<DataCursor>,
}

impl Trainer {
    /// A trainer for `spec` on `data`, as data-parallel rank `rank` of the `plan`'s world, for the
    /// plan's steps. The caller resolves the plan once from the same data ([`JobPlan::resolve`])
    /// and hands the same plan to whatever else needs the job's shape (the PS client's hello).
    pub fn new(
        spec: &TrainingJobSpec,
        plan: &JobPlan,
        data: impl Into<JobData>,
        device: &Device,
        rank: usize,
    ) -> Result<Self, TrainError> {
        Self::with_model(spec, plan, data, rank, |input, classes| {
            model::build(&spec.model, input, classes, spec.training.seed, device)
        })
    }

    /// [`Trainer::new`] with the model that `build` makes for the data's input shape and classes
    /// (a model-parallel worker's, which holds its group).
    pub fn with_model(
        spec: &TrainingJobSpec,
        plan: &JobPlan,
        data: impl Into<JobData>,
        rank: usize,
        build: impl FnOnce(InputShape, usize) -> Result<Box<dyn Model>, ModelError>,
    ) -> Result<Self, TrainError> {
        let JobData { train, test } = data.into();
        let classes = train.classes().max(test.classes);
        let model = build(train.shape(), classes)?;
        let loader = train.source(&spec.data, spec.training.seed, rank, plan.world as usize)?;
        Self::with_parts(spec, plan, model, loader, test)
    }

    /// A trainer for `spec` with its parts given: the model, this rank's training batches (a
    /// source opened for the plan's world) and the test set.
    pub fn with_parts(
        spec: &TrainingJobSpec,
        plan: &JobPlan,
        model: Box<dyn Model>,
        loader: Box<dyn Source>,
        test: Dataset,
    ) -> Result<Self, TrainError> {
        let t = &spec.training;
        if loader.batches_per_epoch() != plan.steps_per_epoch {
            return Err(TrainError::Config(format!(
                "the training data gives {} batches per epoch on each rank, the job plan {}: the plan was \
                 resolved for other data or another world; resolve it from this data \
                 (JobPlan::resolve with its sample count)",
                loader.batches_per_epoch(),
                plan.steps_per_epoch
            )));
        }
        let (total_steps, world) = (plan.total_steps, plan.world);
        let batch_size = plan.batch_size as usize;
        let mut store = ParamStore::new(model.layout().clone(), model.state_layout().clone());
        let parts = store.parts();
        model.init(parts.params, parts.state)?;
        let config = serde_json::json!({
            "model": spec.model,
            "data": spec.data.identity(),
            "optimizer": t.optimizer,
            "algorithm": t.algorithm,
            "seed": t.seed,
            "total_steps": total_steps,
            // Not the rank: the ranks of an allreduce group share one state, and rank 0's
            // checkpoint resumes all of them.
            "world": world,
        });
        Ok(Self {
            store,
            schedule: LrSchedule::new(t.optimizer.learning_rate, &t.optimizer.schedule, total_steps),
            model,
            loader,
            test,
            step: 0,
            total_steps,
            epochs: t.epochs.map(u64::from),
            planned: None,
            batch_size,
            config_hash: checkpoint::config_hash(&config),
            x: Vec::new(),
            y: Vec::new(),
            group_cursors: Vec::new(),
        })
    }

    /// The model.
    pub fn model(&self) -> &dyn Model {
        self.model.as_ref()
    }

    /// The flat parameters, state and gradients.
    pub fn store(&self) -> &ParamStore {
        &self.store
    }

    /// The flat parameters.
    pub fn params(&self) -> &[f32] {
        self.store.params()
    }

    /// Replaces the parameters (e.g. weights pulled from a parameter server); the state stays.
    pub fn set_params(&mut self, src: &[f32]) -> Result<(), TrainError> {
        let state = self.store.state().to_vec();
        Ok(self.store.set(src, &state)?)
    }

    /// The non-trainable state.
    pub fn state(&self) -> &[f32] {
        self.store.state()
    }

    /// Replaces the non-trainable state (e.g. rank 0's, when a group resumes); the parameters stay.
    pub fn set_state(&mut self, src: &[f32]) -> Result<(), TrainError> {
        let params = self.store.params().to_vec();
        Ok(self.store.set(&params, src)?)
    }

    /// The flat gradient of the last computed batch.
    pub fn grads(&self) -> &[f32] {
        self.store.grads()
    }

    /// Steps completed.
    pub fn step_count(&self) -> u64 {
        self.step
    }

    /// Steps of the whole run (for a run in epochs, as counted at the latest epoch planned).
    pub fn total_steps(&self) -> u64 {
        self.total_steps
    }

    /// The run's length in epochs, for a job given in epochs.
    pub fn epochs(&self) -> Option<u64> {
        self.epochs
    }

    /// Makes the run `total_steps` steps long, with the learning-rate schedule spread over them: the
    /// length a PS job's servers keep when this rank's own plan counts differently (a group added
    /// by scaling an `epochs` job splits each epoch over more ranks, so its plan has fewer steps).
    /// A run in epochs counts its steps again at each epoch it plans; the schedule keeps this span.
    pub fn set_total_steps(&mut self, total_steps: u64) {
        self.total_steps = total_steps;
        self.schedule = self.schedule.over(total_steps);
    }

    /// Where the data stream continues.
    pub fn cursor(&self) -> DataCursor {
        self.loader.cursor()
    }

    /// Batches per epoch on this rank.
    pub fn steps_per_epoch(&self) -> u64 {
        self.loader.batches_per_epoch()
    }

    /// Hash of the configuration, recorded in checkpoints.
    pub fn config_hash(&self) -> &str {
        &self.config_hash
    }

    /// Learning rate of the next step.
    pub fn learning_rate(&self) -> f64 {
        self.schedule.at(self.step)
    }

    /// Computes the loss and flat gradient of the next batch (available through [`Trainer::grads`])
    /// without changing the parameters.
    pub fn compute_gradient(&mut self) -> Result<(BatchStats, DataCursor), TrainError> {
        let at = self.loader.next_batch(&mut self.x, &mut self.y)?;
        let parts = self.store.parts();
        let batch = Batch { features: &self.x, labels: &self.y };
        let stats = self.model.forward_backward(parts.params, parts.state, parts.grads, batch)?;
        if !stats.loss.is_finite() {
            return Err(TrainError::Diverged { step: self.step, loss: stats.loss });
        }
        Ok((stats, at))
    }

    /// Places the data source on this rank's share of the epoch its cursor is in
    /// ([`GradientStep::epoch_share`]), moving on past the epochs the rank sits out; `false` when
    /// no epoch of the run is left to it. A run given in epochs then counts its steps anew: those
    /// done, plus this epoch's share for this and every later epoch.
    fn plan_epoch(&mut self, update: &mut dyn GradientStep) -> Result<bool, TrainError> {
        loop {
            let at = self.loader.cursor();
            if self.planned.is_some_and(|(e, _)| e == at.epoch) {
                return Ok(true);
            }
            if self.epochs.is_some_and(|n| at.epoch >= n) {
                self.total_steps = self.step;
                return Ok(false);
            }
            let share = update.epoch_share(at.epoch)?;
            if share != EpochShare::Out {
                self.take_share(share, at)?;
                return Ok(true);
            }
            self.planned = Some((at.epoch, share));
            tracing::info!(
                epoch = at.epoch,
                "the job's plan splits this epoch over other groups; skipping it"
            );
            self.loader.seek(DataCursor::at(at.epoch + 1, 0))?;
        }
    }

    /// Serves `share` of the epoch of `at` from `at` on (the source's share changes only when
    /// the plan's does), and counts a run in epochs anew: the steps done before the epoch, plus
    /// this share for it and every later epoch.
    fn take_share(&mut self, share: EpochShare, at: DataCursor) -> Result<(), TrainError> {
        let before = self.planned.map(|(_, s)| s);
        self.planned = Some((at.epoch, share));
        let EpochShare::Slice { rank, world } = share else { return Ok(()) };
        if before != Some(share) {
            self.loader.set_share(rank, world, at)?;
        }
        if let Some(n) = self.epochs {
            let done = self.step.saturating_sub(at.batch);
            self.total_steps = done + self.loader.batches_per_epoch() * (n - at.epoch);
        }
        Ok(())
    }

    /// One training step: gradient of the next batch, then `update` turns it into new parameters.
    pub fn step(&mut self, update: &mut dyn GradientStep) -> Result<StepReport, TrainError> {
        if !self.plan_epoch(update)? {
            return Err(TrainError::Config(format!(
                "no step is left: the run's epochs ended at step {}",
                self.step
            )));
        }
        self.planned_step(update)
    }

    /// [`Trainer::step`] on a data source already placed by [`Trainer::plan_epoch`].
    fn planned_step(&mut self, update: &mut dyn GradientStep) -> Result<StepReport, TrainError> {
        let (batch, at) = self.compute_gradient()?;
        let lr = self.schedule.at(self.step);
        let parts = self.store.parts();
        update.apply(self.step, lr, parts.params, parts.grads)?;
        if !parts.state.is_empty() {
            update.sync_state(parts.state)?;
        }
        self.step += 1;
        Ok(StepReport { step: self.step, epoch: at.epoch, lr, batch })
    }

    /// Continues a fresh trainer at step `step` with the parameters it holds (e.g. a restarted
    /// worker group that pulled the PS weights): the learning-rate schedule and the data stream
    /// continue where an uninterrupted run would be at `step`. The optimizer state is the caller's.
    /// Where `step` falls follows the epoch plan of `update`, whose epochs may take different
    /// step counts (asked epoch by epoch, a collective for each epoch new to the group).
    pub fn skip_to(&mut self, update: &mut dyn GradientStep, step: u64) -> Result<(), TrainError> {
        let (mut left, mut epoch) = (step, 0u64);
        self.step = step;
        loop {
            if self.epochs.is_some_and(|n| epoch >= n) {
                self.loader.seek(DataCursor::at(epoch, 0))?;
                self.total_steps = step;
                return Ok(());
            }
            let share = update.epoch_share(epoch)?;
            let per_epoch = match share {
                EpochShare::AsBuilt => {
                    let per_epoch = self.loader.batches_per_epoch().max(1);
                    self.loader.seek(DataCursor::at(step / per_epoch, step % per_epoch))?;
                    self.planned = None;
                    return Ok(());
                }
                EpochShare::Slice { world, .. } => self.batches_of(world),
                EpochShare::Out => 0,
            };
            if left < per_epoch {
                self.planned = None;
                return self.take_share(share, DataCursor::at(epoch, left));
            }
            left -= per_epoch;
            epoch += 1;
        }
    }

    /// Full batches an epoch takes on each of `world` ranks.
    fn batches_of(&self, world: usize) -> u64 {
        tandem_api::plan::steps_per_epoch(self.loader.samples(), world as u64, self.batch_size as u64)
    }

    /// Continues the data stream at `cursor` (this rank's own, from the group's checkpoint:
    /// [`CheckpointMeta::cursors`]) after [`Trainer::skip_to`] moved it to where a stream with no
    /// skipped sample would be.
    pub fn seek_data(&mut self, cursor: DataCursor) -> Result<(), TrainError> {
        let here = self.loader.cursor();
        if cursor.batch == 0 && here.batch == 0 && cursor.epoch < here.epoch {
            // Saved at the end of an epoch, which the epoch plan follows with epochs this rank
            // sits out: the stream starts the next epoch it trains, as it would have.
            return Ok(());
        }
        if (cursor.epoch, cursor.batch) != (here.epoch, here.batch) {
            return Err(TrainError::Config(format!(
                "the checkpoint's data cursor (epoch {}, batch {}) is not at its step {}: it was written for other data",
                cursor.epoch, cursor.batch, self.step
            )));
        }
        Ok(self.loader.seek(cursor)?)
    }

    /// Moves the data stream `batches` batches on without training on them, counting them as
    /// steps: a restarted group that continued its stream at the cursor of an earlier step (its
    /// last report's) reads its way to the step it resumes at, so the samples skipped on the way
    /// are skipped again and the stream lands on the next unseen sample.
    pub fn read_ahead(&mut self, update: &mut dyn GradientStep, batches: u64) -> Result<(), TrainError> {
        for _ in 0..batches {
            if !self.plan_epoch(update)? {
                break;
            }
            self.loader.next_batch(&mut self.x, &mut self.y)?;
            self.step += 1;
        }
        Ok(())
    }

    /// Loss and accuracy on the test set (per target: per token for a language model), in
    /// chunks of the training batch size, so evaluation needs no more memory than a step.
    pub fn evaluate(&mut self) -> Result<Evaluation, TrainError> {
        let (d, k) = (self.test.shape.features(), self.test.positions.max(1));
        let (mut loss, mut correct, mut targets) = (0.0f64, 0usize, 0usize);
        let chunk = self.batch_size.max(1);
        for start in (0..self.test.len()).step_by(chunk) {
            let end = (start + chunk).min(self.test.len());
            let batch = Batch {
                features: &self.test.features[start * d..end * d],
                labels: &self.test.labels[start * k..end * k],
            };
            let s = self.model.evaluate(self.store.params(), self.store.state(), batch)?;
            loss += s.loss as f64 * s.samples as f64;
            correct += s.correct;
            targets += s.samples;
        }
        let n = targets.max(1) as f64;
        Ok(Evaluation { loss: loss / n, accuracy: correct as f64 / n })
    }

    /// A checkpoint of the full training state: the parameters under their names, the
    /// non-trainable state under `state.<name>`.
    pub fn checkpoint(&self, update: &dyn GradientStep) -> Result<Checkpoint, TrainError> {
        let named = |layout: &FlatLayout, buf: &[f32], prefix: &str| -> Vec<NamedTensor> {
            (layout.entries().iter().enumerate())
                .map(|(i, e)| NamedTensor {
                    name: format!("{prefix}{}", e.name),
                    shape: e.shape.clone(),
                    values: layout.slice(buf, i).to_vec(),
                })
                .collect()
        };
        let mut tensors = named(self.store.layout(), self.store.params(), "");
        tensors.extend(named(self.store.state_layout(), self.store.state(), STATE_PREFIX));
        let meta = CheckpointMeta {
            format: checkpoint::FORMAT_VERSION,
            kind: WORKER_CHECKPOINT.to_owned(),
            step: self.step,
            epoch: self.loader.cursor().epoch,
            config_hash: self.config_hash.clone(),
            rng: None,
            cursor: Some(self.loader.cursor()),
            cursors: self.group_cursors.clone(),
            optimizer: update.optimizer_state(),
            range: None,
            extra: serde_json::json!({ "layout": self.model.layout() }),
            tensors: vec![],
        };
        Ok(Checkpoint::new(meta, tensors)?)
    }

    /// Writes [`Trainer::checkpoint`] atomically to `path`.
    pub fn save(&self, update: &dyn GradientStep, path: &Path) -> Result<(), TrainError> {
        Ok(self.checkpoint(update)?.write_atomic(path)?)
    }

    /// Restores the state from the checkpoint at `path`, refusing one of another job.
    pub fn resume(&mut self, update: &mut dyn GradientStep, path: &Path) -> Result<(), TrainError> {
        self.restore(update, path, &Checkpoint::read(path)?)
    }

    /// Restores the state from `ckpt`, read from `path`, refusing one of another job.
    pub fn restore(
        &mut self,
        update: &mut dyn GradientStep,
        path: &Path,
        ckpt: &Checkpoint,
    ) -> Result<(), TrainError> {
        ckpt.expect(path, WORKER_CHECKPOINT, &self.config_hash)?;
        let mismatch = |reason: String| CheckpointError::Mismatch { path: path.to_owned(), reason };
        let read = |layout: &FlatLayout, prefix: &str| -> Result<Vec<f32>, CheckpointError> {
            let mut buf = vec![0.0; layout.len()];
            for e in layout.entries() {
                let name = format!("{prefix}{}", e.name);
                let t = ckpt.tensor(&name).ok_or_else(|| mismatch(format!("no tensor {name}")))?;
                if t.shape != e.shape {
                    return Err(mismatch(format!(
                        "tensor {name} has shape {:?}, the model {:?}",
                        t.shape, e.shape
                    )));
                }
                buf[e.offset..e.offset + e.len].copy_from_slice(&t.values);
            }
            Ok(buf)
        };
        let params = read(self.store.layout(), "")?;
        let state = read(self.store.state_layout(), STATE_PREFIX)?;
        let cursor = ckpt.meta.cursor.ok_or_else(|| mismatch("no data cursor".into()))?;
        if let Some(state) = ckpt.optimizer_state() {
            update.restore_optimizer(&state)?;
        }
        self.loader.seek(cursor)?;
        self.store.set(&params, &state)?;
        self.step = ckpt.meta.step;
        Ok(())
    }

    /// Trains to the last step with `update`, reporting, evaluating and checkpointing as
    /// `cadence` says; the leader ([`GradientStep::leader`]) passes every report to `on_report`
    /// (and to [`GradientStep::report`]). The cadence's collectives
    /// ([`GradientStep::sum_over_group`], [`GradientStep::prepare_checkpoint`]) come at the same
    /// steps on every rank.
    pub fn run(
        &mut self,
        update: &mut dyn GradientStep,
        cadence: &Cadence,
        on_report: &mut dyn FnMut(&GroupReport),
    ) -> Result<RunSummary, TrainError> {
        let started = Instant::now();
        let start = self.step;
        let report_every = cadence.report_every(self.total_steps);
        // Since the last report, summed over the group at a report: batch losses × samples,
        // samples, seconds waited for data, seconds of steps; then the samples skipped so far.
        let mut window = [0.0f32; 5];
        let (mut samples, mut train_time) = (0u64, 0.0f64);
        let mut waited = self.loader.waited();
        let mut metered_wait = waited;
        let mut last_eval = None;
        while self.step < self.total_steps {
            // A run in epochs counts its steps anew as the epoch plan changes an epoch's length.
            if !self.plan_epoch(update)? {
                break;
            }
            let t0 = Instant::now();
            let r = self.planned_step(update)?;
            let total = self.total_steps;
            let elapsed = t0.elapsed();
            let took = elapsed.as_secs_f64();
            train_time += took;
            let metrics = tandem_util::metrics::metrics();
            metrics.record_step(r.step, elapsed, r.batch.samples as u64);
            let now_waited = self.loader.waited();
            metrics.data_wait_seconds.inc_by(now_waited.saturating_sub(metered_wait).as_secs_f64());
            metered_wait = now_waited;
            window[0] += r.batch.loss * r.batch.samples as f32;
            window[1] += r.batch.samples as f32;
            window[3] += took as f32;
            let k = r.step;
            let evaluate = cadence.evaluates_at(k, total);
            let due = cadence.checkpoints_at(k, total);
            if evaluate || due.is_some() {
                update.whole_params(self.store.parts().params)?;
            }
            if let Some(dir) = due {
                self.write_checkpoint(update, dir, cadence)?;
            }
            if k < total && self.stop_agreed(update, cadence)? {
                let checkpoint = match &cadence.checkpoint_dir {
                    Some(dir) => {
                        if due.is_none() {
                            if !evaluate {
                                update.whole_params(self.store.parts().params)?;
                            }
                            self.write_checkpoint(update, dir, cadence)?;
                        }
                        update.leader().then(|| checkpoint::step_path(dir, k))
                    }
                    None => None,
                };
                return Err(TrainError::Preempted { step: k, total, checkpoint });
            }
            if !evaluate && !k.is_multiple_of(report_every) {
                continue;
            }
            let now_waited = self.loader.waited();
            window[2] = now_waited.saturating_sub(waited).as_secs_f32();
            window[4] = self.loader.skipped() as f32;
            waited = now_waited;
            update.sum_over_group(&mut window)?;
            samples += window[1] as u64;
            let loss = window[0] / window[1].max(1.0);
            let data_wait =
                if window[3] > 0.0 { f64::from((window[2] / window[3]).clamp(0.0, 1.0)) } else { 0.0 };
            let skipped = window[4] as u64;
            window = [0.0; 5];
            let cursors = if update.reports_cursors() {
                update.gather_cursors(self.loader.cursor())?
            } else {
                Vec::new()
            };
            if !update.leader() {
                continue;
            }
            let test = if evaluate { Some(self.evaluate()?) } else { None };
            last_eval = test.map(|e| (k, e)).or(last_eval);
            let report = GroupReport {
                step: k,
                loss: Some(f64::from(loss)),
                accuracy: test.map(|e| e.accuracy),
                samples,
                epoch: self.loader.cursor().epoch,
                data_wait,
                skipped,
            };
            update.report(&report, &cursors)?;
            on_report(&report);
        }
        let evaluation = match last_eval {
            Some((k, e)) if k == self.step => e,
            _ => self.evaluate()?,
        };
        update.finish()?;
        let here = (self.step - start) as f64 * self.batch_size as f64;
        Ok(RunSummary {
            steps: self.step,
            start_step: start,
            evaluation,
            samples_per_second: if train_time > 0.0 { here / train_time } else { 0.0 },
            wall_seconds: started.elapsed().as_secs_f64(),
        })
    }

    /// Whether some rank of the group has its [`Cadence::stop`] flag set (a collective at every
    /// step when there is a flag, so every rank stops at the same step).
    fn stop_agreed(&self, update: &mut dyn GradientStep, cadence: &Cadence) -> Result<bool, TrainError> {
        let Some(stop) = cadence.stop else { return Ok(false) };
        let mut flag = [if stop.load(Ordering::SeqCst) { 1.0f32 } else { 0.0 }];
        update.sum_over_group(&mut flag)?;
        Ok(flag[0] > 0.0)
    }

    /// Writes the checkpoint of the current step into `dir` and keeps the newest `keep`
    /// (collective: every rank calls it, [`GradientStep::prepare_checkpoint`] gathers what the
    /// leader writes).
    fn write_checkpoint(
        &mut self,
        update: &mut dyn GradientStep,
        dir: &Path,
        cadence: &Cadence,
    ) -> Result<(), TrainError> {
        update.prepare_checkpoint(self.store.params().len())?;
        self.group_cursors = update.gather_cursors(self.loader.cursor())?;
        if !update.leader() {
            return Ok(());
        }
        std::fs::create_dir_all(dir).map_err(|e| {
            TrainError::Config(format!("cannot create {} for checkpoints: {e}", dir.display()))
        })?;
        self.save(update, &checkpoint::step_path(dir, self.step))?;
        if cadence.keep_checkpoints > 0 {
            checkpoint::prune(dir, cadence.keep_checkpoints)?;
        }
        if let Some(mirror) = &cadence.mirror {
            mirror.push(dir, checkpoint::is_checkpoint)?;
        }
        Ok(())
    }
}
