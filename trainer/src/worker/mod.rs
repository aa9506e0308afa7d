//! One worker rank of a parameter-server job (`ps-sync`, `ps-async`, `hybrid`, `easgd`): forms its
//! group's communicator, joins the parameter servers and trains with [`crate::ps::step::PsStep`].
//!
//! Expected flow: [`run`] with the job config, this rank's place and the job token; it returns
//! after the job's step count. A restarted group starts from the PS weights but runs the full
//! count again (resuming the step count is the local runner's and operator's follow-up).
//!
//! Guarantees: rank 0 of each group reports its progress (step, loss, test accuracy) to every PS
//! shard, where `tandem ps`'s status frame shows it; errors name the failed part (collective peer,
//! PS index and address, data, model).

use std::path::Path;

use candle_core::Device;
use tandem_api::Algorithm;
use tandem_api::contract::JobConfig;

use crate::comm::tcp::{self, TcpConfig};
use crate::ps::client::{ClientConfig, PsClient};
use crate::ps::step::{Exchange, PsStep};
use crate::ps::wire::Progress;
use crate::train::{TrainError, Trainer};

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
        source: crate::comm::CommError,
    },
    /// The parameter servers could not be reached.
    #[error(transparent)]
    Ps(#[from] crate::ps::client::ClientError),
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
}

/// What a finished worker reports.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    /// Steps this rank ran.
    pub steps: u64,
    /// Final test accuracy of this rank's model.
    pub accuracy: f64,
}

/// Trains this rank to the end of the job. `on_progress` sees every report rank 0 sends.
pub fn run(
    job: &JobConfig,
    place: &Place,
    token: &str,
    data_dir: &Path,
    device: &Device,
    mut on_progress: impl FnMut(&Progress),
) -> Result<Summary, WorkerError> {
    let spec = &job.spec;
    let training = &spec.training;
    let exchange = match training.algorithm {
        Algorithm::PsSync | Algorithm::PsAsync | Algorithm::Hybrid => Exchange::Gradient,
        Algorithm::Easgd => Exchange::Elastic {
            alpha: training.easgd.alpha as f32,
            tau: u64::from(training.easgd.tau),
            optimizer: training.optimizer.clone(),
        },
        Algorithm::Allreduce => {
            return Err(WorkerError::Config(
                "algorithm allreduce has no parameter server; this worker only runs ps-sync, ps-async, \
                 hybrid and easgd"
                    .into(),
            ));
        }
    };
    let topology = job.group(place.group).ok_or_else(|| {
        WorkerError::Config(format!("the job config has no group {}; it is stale", place.group))
    })?;
    let size = topology.peers.len();
    if place.rank as usize >= size {
        return Err(WorkerError::Config(format!(
            "rank {} is not in group {} of {size} ranks",
            place.rank, place.group
        )));
    }
    let world = (spec.workers.groups * spec.workers.group_size).max(1) as usize;
    let global = (place.group as usize * size + place.rank as usize) % world;
    let data = crate::data::load(&spec.data, data_dir, training.seed).map_err(TrainError::from)?;
    let mut trainer = Trainer::new(spec, data, device, global, world)?;
    let servers: Vec<String> = job.parameter_servers.iter().map(|e| e.to_string()).collect();
    let total = trainer.params().len() as u64;
    let client = PsClient::connect(ClientConfig::worker(
        servers,
        token,
        place.group,
        place.rank,
        place.attempt,
        total,
    ))?;
    let comm = tcp::connect(
        place.rank as usize,
        &topology.peers,
        &place.bind,
        token.as_bytes(),
        TcpConfig::default(),
    )
    .map_err(|source| WorkerError::Comm { group: place.group, source })?;
    let mut params = trainer.params().to_vec();
    let mut step = PsStep::start(comm, client, exchange, &mut params)?;
    trainer.set_params(&params)?;
    let steps = trainer.total_steps();
    let eval_every = training.eval_every_steps;
    let mut accuracy = None;
    for k in 1..=steps {
        let report = trainer.step(&mut step)?;
        let last = k == steps;
        if place.rank == 0 && (last || (eval_every > 0 && k % eval_every == 0)) {
            accuracy = Some(trainer.evaluate()?.accuracy);
            let progress = Progress {
                step: k,
                loss: Some(report.batch.loss),
                accuracy: accuracy.map(|a| a as f32),
                samples: k * spec.data.batch_size as u64 * size as u64,
            };
            step.client().report(progress)?;
            on_progress(&progress);
        }
    }
    let accuracy = match accuracy {
        Some(a) => a,
        None => trainer.evaluate()?.accuracy,
    };
    step.leave()?;
    Ok(Summary { steps, accuracy })
}
