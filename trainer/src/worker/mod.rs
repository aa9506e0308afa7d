//! One worker rank of a multi-process job: trains its group's share of every step through the
//! group's [`Communicator`] (`tcp` or `mpi`), with the parameter servers (`ps-sync`, `ps-async`,
//! `hybrid`, `easgd`, through [`ps_step::PsStep`]) or without (`allreduce`, through
//! [`allreduce::AllreduceStep`]).
//!
//! Expected flow: form the group's communicator ([`connect_tcp`], or MPI's world communicator
//! for ranks that `mpirun` started), then [`run`] with the job config and this rank's place; it
//! returns after the job's step count.
//!
//! Guarantees:
//! - Data: global rank `group × groupSize + rank` of `groups × groupSize` ranks
//!   ([`tandem_input`]), so one group of p ranks sees at every step exactly the batch of one
//!   process with the p× batch.
//! - A restarted group of a PS job continues its step count from the PS
//!   ([`ps_step::PsStep::start_step`]) with the learning-rate schedule and data stream of
//!   that step, so the job ends at its step count, not later.
//! - Cadence: the one loop of [`Trainer::run`] with the job's [`Cadence`], reporting every
//!   [`PROGRESS_EVERY`] steps: at every report the group averages its training loss since the
//!   previous one (a collective, so every rank takes part); rank 0 passes it to `on_progress`
//!   (with the test accuracy at evaluation steps and the last step) and, in PS jobs, reports it
//!   to every PS shard, where `tandem ps`'s status shows it.
//! - `allreduce`: every `checkpoint.everySteps` and at the end, rank 0 writes the group's state
//!   (weights, the model's non-trainable state, the gathered optimizer state, the step) as a
//!   worker checkpoint into
//!   `<output>/checkpoints/` (the layout `tandem train` uses; the newest
//!   [`tandem_compute::train::KEEP_CHECKPOINTS`] are kept). A group that starts while rank 0's folder holds one resumes from the newest intact one (a damaged newest falls back to the one before), so a
//!   restarted group continues at its last checkpoint and ends with the model of an uninterrupted
//!   run.
//! - Preemption: with [`Place::stop_on_sigterm`], after SIGTERM to any rank during training the
//!   group stops at the next step boundary (every rank learns it from a one-value sum after each
//!   step); an `allreduce`
//!   group's rank 0 first checkpoints that step, a PS job's state is already on the servers. The
//!   restarted group resumes at exactly that step.
//! - Errors name the failed part (collective peer, PS index and address, data, model, checkpoint).
//!
//! - Non-trainable model state: averaged over the group's ranks after every step; an
//!   `allreduce` group keeps it in rank 0's checkpoints, a PS job on shard 0 (the groups' mean,
//!   see [`ps_step`]).
//!
//! Caveats: on Kubernetes rank 0's output folder outlives its pod only on a volume
//! (`checkpoint.claimName`); with an emptyDir a recreated group starts again from step 0.

pub mod allreduce;
pub mod ps_step;
pub mod shared;

use std::path::{Path, PathBuf};

use tandem_api::contract::JobConfig;
use tandem_api::{ExitClass, JobPlan};

use allreduce::AllreduceStep;
use ps_step::PsStep;
pub use shared::Shared;
use tandem_api::contract::GroupReport;
use tandem_comm::tcp::{self, TcpComm, TcpConfig};
use tandem_comm::{CommError, Communicator};
use tandem_compute::checkpoint;
use tandem_compute::device::Device;
use tandem_compute::mirror::Mirror;
use tandem_compute::model;
use tandem_compute::train::{Cadence, GradientStep, TrainError, Trainer};
use tandem_kernels::split::Group;
use tandem_ps::client::{ClientConfig, PsClient};

/// Steps between the light progress reports (step, loss, samples; no evaluation).
pub const PROGRESS_EVERY: u64 = 10;

/// Most batches a restarted PS-job group reads ahead from its last report's data cursor to the
/// step it resumes at (see [`ps_step::PsStep::resume_cursor`]).
pub const READ_AHEAD: u64 = 10 * PROGRESS_EVERY;

/// A worker that cannot run.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// The job config does not describe this worker.
    #[error("{0}")]
    Config(String),
    /// Data, model, collectives or PS failed.
    #[error(transparent)]
    Train(#[from] TrainError),
    /// The group could not be formed.
    #[error("forming group {group}: {source}")]
    Comm {
        /// Group index.
        group: u32,
        /// Cause.
        source: tandem_comm::CommError,
    },
    /// The parameter servers could not be reached.
    #[error(transparent)]
    Ps(#[from] tandem_ps::client::ClientError),
}

impl WorkerError {
    /// How `tandem worker` exits after this error ([`ExitClass::code`]): [`ExitClass::PeerLost`]
    /// when another process of the job was lost (a peer rank, a parameter server), not through
    /// its own fault, which restart policies retry; [`ExitClass::Preempted`] after a stop on
    /// SIGTERM; [`ExitClass::Permanent`] otherwise. Each cause was classified where it was raised.
    pub fn exit_class(&self) -> ExitClass {
        match self {
            WorkerError::Comm { source, .. } => source.exit_class(),
            WorkerError::Ps(e) => e.exit_class(),
            WorkerError::Train(e) => e.exit_class(),
            WorkerError::Config(_) => ExitClass::Permanent,
        }
    }
}

/// Where this rank stands in the job.
#[derive(Clone, Debug)]
pub struct Place {
    /// Group index.
    pub group: u32,
    /// Rank inside the group.
    pub rank: u32,
    /// Restart attempt of the group.
    pub attempt: u32,
    /// Address to bind the collective endpoint to.
    pub bind: String,
    /// The job's output folder (`allreduce` checkpoints go to its `checkpoints/`).
    pub output: PathBuf,
    /// Whether SIGTERM stops the group at a step boundary ([`tandem_util::signal::stop_flag`],
    /// installed as the training loop starts; before it SIGTERM ends the process as usual, with no
    /// step of this attempt done): on any rank, the group stops at the next step boundary,
    /// `allreduce`'s rank 0 checkpoints that step, and [`run`] fails with
    /// [`TrainError::Preempted`].
    pub stop_on_sigterm: bool,
}

/// What a finished worker reports.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    /// The step this rank's group ended at (the job's step count; in a run in epochs, the steps
    /// of its shares of the job's epoch plan).
    pub steps: u64,
    /// The step it started from (above 0 for a restarted group that resumed).
    pub start_step: u64,
    /// Final test accuracy of this rank's model.
    pub accuracy: f64,
}

/// A failed group collective as a training error of the collective's class
/// ([`ExitClass::PeerLost`] when a peer rank was lost, retryable).
pub fn collective(e: CommError) -> TrainError {
    TrainError::step(e.exit_class(), format!("group collective: {e}"))
}

/// Forms group `place.group`'s `tcp` communicator from the job config's peer list: every peer
/// must resolve, connect and authenticate within `connect_timeout`, or the error names the ones
/// that did not (the group's "peers reachable" gate). `host`, when given, is this rank's host
/// identity for shared memory ([`tandem_comm::host::HOST_ID_ENV`]).
pub fn connect_tcp(
    job: &JobConfig,
    place: &Place,
    token: &str,
    connect_timeout: std::time::Duration,
    host: Option<String>,
) -> Result<TcpComm, WorkerError> {
    tcp::connect_from_contract(
        job,
        place.group,
        place.rank as usize,
        &place.bind,
        token.as_bytes(),
        TcpConfig { connect_timeout, host, ..TcpConfig::default() },
    )
    .map_err(|source| WorkerError::Comm { group: place.group, source })
}

/// The step rule of this rank's algorithm.
enum Update<C: Communicator> {
    Ps(Box<PsStep<C>>),
    Allreduce(AllreduceStep<C>),
}

impl<C: Communicator> Update<C> {
    fn step(&mut self) -> &mut dyn GradientStep {
        match self {
            Update::Ps(s) => s.as_mut(),
            Update::Allreduce(s) => s,
        }
    }
}

/// Trains this rank to the end of the job over the group communicator `comm` (whose rank and
/// size must be `place.rank` and the group's size). `on_progress` sees every report of rank 0.
/// A job whose model splits layers over the group (`model.parallelism` hybrid or model) needs
/// `model_group`, a handle on the same communicator for the model ([`Shared::model_group`]).
#[allow(clippy::too_many_arguments)]
pub fn run<C: Communicator>(
    job: &JobConfig,
    place: &Place,
    token: &str,
    data_dir: &Path,
    device: &Device,
    comm: C,
    model_group: Option<Box<dyn Group>>,
    mut on_progress: impl FnMut(&GroupReport),
) -> Result<Summary, WorkerError> {
    let spec = &job.spec;
    let training = &spec.training;
    let size = spec.workers.group_size.max(1) as usize;
    check_place(job, place, &comm)?;
    let data = tandem_input::open_job(spec, data_dir).map_err(TrainError::from)?;
    // The job's facts, decided once and passed down: the world, the batches and the run's length
    // (the trainer's loop and schedule, the servers' schedule through the hello), what the servers do.
    let plan =
        JobPlan::resolve(spec, data.train.samples()).map_err(|e| WorkerError::Config(e.to_string()))?;
    let global = (place.group as usize * size + place.rank as usize) % plan.world as usize;
    let mut trainer = if spec.model.parallelism.is_data() {
        Trainer::new(spec, &plan, data, device, global)?
    } else {
        let group = model_group.ok_or_else(|| {
            WorkerError::Config(format!(
                "model.parallelism hybrid and model split layers over the group's tcp collectives, and this \
                 rank's group runs over {}; set workers.backend to tcp",
                comm.backend()
            ))
        })?;
        if !device.is_host() {
            return Err(WorkerError::Config(
                "model.parallelism hybrid and model run on the CPU engine; train with --device cpu".into(),
            ));
        }
        let threads = model::engine::threads().map_err(TrainError::from)?;
        Trainer::with_model(spec, &plan, data, global, |input, classes| {
            let m = model::Split::new(&spec.model, input, classes, training.seed, threads, group)?;
            Ok(Box::new(m) as Box<dyn model::Model>)
        })?
    };
    let mut params = trainer.params().to_vec();
    let checkpoints = place.output.join("checkpoints");
    let mirror = Mirror::of(&job.spec, &job.job_name, &place.output);
    let mut update = match plan.ps_mode {
        None => {
            let partition = trainer.model().partition();
            Update::Allreduce(AllreduceStep::start(
                comm,
                &training.optimizer,
                &mut params,
                partition.as_ref(),
            )?)
        }
        Some(mode) => {
            let servers: Vec<String> = job.parameter_servers.iter().map(|e| e.to_string()).collect();
            let config = ClientConfig::worker(
                servers,
                token,
                place.group,
                place.rank,
                place.attempt,
                params.len() as u64,
            )
            .run(plan.total_steps, mode);
            let client = PsClient::connect(config)?;
            // The servers keep the run's length as first planned, over which the learning-rate
            // schedule runs: a group added by scaling an `epochs` job counts another with its
            // config, and takes the servers'. How many steps it runs follows the job's epoch
            // plan ([`Trainer::run`]).
            let run = client.run_steps();
            if run != 0 && run != plan.total_steps {
                tracing::info!(
                    group = place.group,
                    steps = run,
                    own_plan = plan.total_steps,
                    "the parameter servers' schedule spans more (or fewer) steps than this group's plan \
                     counts with the job's present group count; taking theirs"
                );
                trainer.set_total_steps(run);
            }
            let mut step = PsStep::start(comm, client, &training.optimizer, &mut params)?;
            let mut state = trainer.state().to_vec();
            step.take_state(&mut state)?;
            trainer.set_state(&state)?;
            Update::Ps(Box::new(step))
        }
    };
    trainer.set_params(&params)?;
    let steps = trainer.total_steps();
    let start = continue_at(&mut update, &mut trainer, place, &checkpoints, mirror.as_ref(), steps)?;
    // One loop for every job: the cadence is the job's, the step is this rank's algorithm. Only
    // an `allreduce` group checkpoints (rank 0, into its output folder): the servers keep a PS
    // job's state.
    let dir = matches!(update, Update::Allreduce(_)).then_some(checkpoints);
    let stop = place.stop_on_sigterm.then(tandem_util::signal::stop_flag);
    let mirror = dir.as_ref().and(mirror);
    let cadence = Cadence { report_every: PROGRESS_EVERY, stop, mirror, ..Cadence::of(spec, dir) };
    let summary = trainer.run(update.step(), &cadence, &mut on_progress)?;
    // The steps it ran to: a run in epochs counts them as the job's epoch plan split each epoch.
    Ok(Summary { steps: summary.steps, start_step: start, accuracy: summary.evaluation.accuracy })
}

/// Checks that `comm` and the job config describe this rank.
fn check_place<C: Communicator>(job: &JobConfig, place: &Place, comm: &C) -> Result<(), WorkerError> {
    let size = job.spec.workers.group_size.max(1) as usize;
    if comm.size() != size || comm.rank() != place.rank as usize {
        return Err(WorkerError::Config(format!(
            "this process is rank {} of a {}-rank {} communicator, but the job wants rank {} of group {} \
             with groupSize {size}; start each group's ranks together (mpirun -np {size})",
            comm.rank(),
            comm.size(),
            comm.backend(),
            place.rank,
            place.group
        )));
    }
    if job.group(place.group).is_none() {
        return Err(WorkerError::Config(format!("the job config has no group {}; it is stale", place.group)));
    }
    Ok(())
}

/// The step this rank's group continues from, with `trainer` moved there: the PS's record of
/// the group's progress, or rank 0's newest intact `allreduce` checkpoint in `checkpoints` (0 for
/// a fresh start), after copying those that only `mirror` holds into the folder.
fn continue_at<C: Communicator>(
    update: &mut Update<C>,
    trainer: &mut Trainer,
    place: &Place,
    checkpoints: &Path,
    mirror: Option<&Mirror>,
    steps: u64,
) -> Result<u64, WorkerError> {
    let start = match update {
        Update::Ps(s) => {
            // A run in epochs has as many steps as its epoch plan gives it, which may be more
            // than it counted at the start (groups removed since); a run in steps has its count.
            let start = if trainer.epochs().is_some() { s.start_step() } else { s.start_step().min(steps) };
            match s.resume_cursor() {
                // The stream continues at this rank's cursor of the group's last report and reads
                // its way to `start` (at most [`READ_AHEAD`] batches: a group that the others left
                // far behind takes the step's position instead).
                Some((at, cursor)) if at <= start && start - at <= READ_AHEAD => {
                    trainer.skip_to(s.as_mut(), at)?;
                    trainer.seek_data(cursor)?;
                    trainer.read_ahead(s.as_mut(), start - at)?;
                }
                Some((at, _)) if start > 0 => {
                    tracing::info!(
                        group = place.group,
                        rank = place.rank,
                        reported = at,
                        step = start,
                        "the group's last data position is too far from its step: continuing at the \
                         step's position, which does not count samples skipped since then"
                    );
                    trainer.skip_to(s.as_mut(), start)?;
                }
                _ if start > 0 => trainer.skip_to(s.as_mut(), start)?,
                _ => {}
            }
            start
        }
        Update::Allreduce(s) => {
            // Rank 0 writes the group's checkpoints: it takes the folder over, and resumes from
            // the newest intact one.
            let newest = if place.rank == 0 {
                checkpoint::remove_partial(checkpoints).map_err(TrainError::from)?;
                if let Some(mirror) = mirror {
                    mirror.restore(checkpoints, checkpoint::is_checkpoint).map_err(TrainError::from)?;
                }
                checkpoint::newest_intact(checkpoints).map_err(TrainError::from)?
            } else {
                None
            };
            let start = s.resume(trainer, newest.as_ref().map(|n| (n.path.as_path(), &n.checkpoint)))?;
            if let Some(checkpoint::Intact { path, .. }) = newest.filter(|_| start > 0) {
                tracing::info!(group = place.group, path = %path.display(), step = start, "resumed from checkpoint");
            }
            start
        }
    };
    if start > 0 {
        tracing::info!(
            group = place.group,
            rank = place.rank,
            step = start,
            "resuming the group's step count"
        );
    }
    Ok(start)
}
