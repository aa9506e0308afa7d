//! A model's non-trainable state (batch-norm running statistics and the like) beside its
//! parameters: kept in worker checkpoints, shared by an allreduce group and resumed from rank 0,
//! held by the parameter servers (the groups' mean) and kept across a PS restart.
//!
//! Today's model families have no state, so the tests wrap the MLP in a model that keeps a
//! running mean of its inputs, updated by every training batch as batch normalisation updates its
//! statistics.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use std::time::Duration;

use crate::ps_common::{Job, addrs, worker_config};
use crate::trainer_support;

use tandem::worker::allreduce::AllreduceStep;
use tandem::worker::ps_step::PsStep;
use tandem_api::TrainingJobSpec;
use tandem_comm::algo::{AlgoConfig, Collectives};
use tandem_comm::transport::LocalTransport;
use tandem_compute::checkpoint::Checkpoint;
use tandem_compute::device::Device;
use tandem_compute::model::{self, Batch, BatchStats, Model, ModelError};
use tandem_compute::optim::Optimizer;
use tandem_compute::params::FlatLayout;
use tandem_compute::train::{LocalStep, Trainer};
use tandem_input::{Dataset, InputShape, Loader, synthetic};
use tandem_ps::client::PsClient;

const SHAPE: InputShape = InputShape { channels: 1, height: 2, width: 2 };
const FEATURES: usize = 4;
const CLASSES: usize = 3;

/// The MLP with a running mean of each input feature as its state (momentum 0.1).
#[derive(Debug)]
struct WithRunningMean {
    inner: Box<dyn Model>,
    state_layout: FlatLayout,
}

impl Model for WithRunningMean {
    fn layout(&self) -> &FlatLayout {
        self.inner.layout()
    }
    fn state_layout(&self) -> &FlatLayout {
        &self.state_layout
    }
    fn classes(&self) -> usize {
        self.inner.classes()
    }
    fn device(&self) -> &Device {
        self.inner.device()
    }
    fn init(&self, params: &mut [f32], state: &mut [f32]) -> Result<(), ModelError> {
        state.fill(0.0);
        self.inner.init(params, &mut [])
    }
    fn forward_backward(
        &mut self,
        params: &[f32],
        state: &mut [f32],
        grads: &mut [f32],
        batch: Batch<'_>,
    ) -> Result<BatchStats, ModelError> {
        let n = batch.labels.len().max(1);
        for (j, s) in state.iter_mut().enumerate() {
            let mean = batch.features.iter().skip(j).step_by(FEATURES).sum::<f32>() / n as f32;
            *s = 0.9 * *s + 0.1 * mean;
        }
        self.inner.forward_backward(params, &mut [], grads, batch)
    }
    fn evaluate(
        &mut self,
        params: &[f32],
        _state: &[f32],
        batch: Batch<'_>,
    ) -> Result<BatchStats, ModelError> {
        self.inner.evaluate(params, &[], batch)
    }
}

fn job() -> TrainingJobSpec {
    trainer_support::small_job(
        "{kind: mlp, hidden: [8]}",
        "{source: synthetic, batchSize: 16}",
        "{kind: sgd, learningRate: 0.1, momentum: 0.9}",
        12,
    )
}

fn sets() -> (Dataset, Dataset) {
    (synthetic(640, SHAPE, CLASSES, 1), synthetic(64, SHAPE, CLASSES, 2))
}

/// A trainer of the stateful model (or of the plain MLP), as `rank` of `world`.
fn trainer(spec: &TrainingJobSpec, stateful: bool, rank: usize, world: usize) -> Trainer {
    let (train, test) = sets();
    let seed = spec.training.seed;
    let net = model::build(&spec.model, SHAPE, CLASSES, seed, &Device::Cpu).unwrap();
    let model: Box<dyn Model> = if stateful {
        let state_layout = FlatLayout::new([("input.running_mean", &[FEATURES][..])]);
        Box::new(WithRunningMean { inner: net, state_layout })
    } else {
        net
    };
    let plan = trainer_support::plan(spec, train.len() as u64, world);
    let loader = Loader::new(train, spec.data.batch_size as usize, seed, rank, world).unwrap();
    Trainer::with_parts(spec, &plan, model, Box::new(loader), test).unwrap()
}

#[test]
fn a_trainer_refuses_a_plan_resolved_for_another_world() {
    let spec = job();
    let (train, test) = sets();
    let plan = trainer_support::plan(&spec, train.len() as u64, 2);
    let net = model::build(&spec.model, SHAPE, CLASSES, spec.training.seed, &Device::Cpu).unwrap();
    let loader = Loader::new(train, spec.data.batch_size as usize, spec.training.seed, 0, 1).unwrap();
    let Err(err) = Trainer::with_parts(&spec, &plan, net, Box::new(loader), test) else {
        panic!("a one-rank source under a two-rank plan was accepted");
    };
    let err = err.to_string();
    assert!(err.contains("gives 40 batches per epoch on each rank, the job plan 20"), "{err}");
}

fn local_step(t: &Trainer, spec: &TrainingJobSpec) -> LocalStep {
    LocalStep::new(Optimizer::new(&spec.training.optimizer, t.params().len()))
}

#[test]
fn state_is_kept_in_worker_checkpoints_and_resumes_bit_for_bit() {
    let spec = job();
    let dir = tempfile::tempdir().unwrap();
    let mut straight = trainer(&spec, true, 0, 1);
    let mut su = local_step(&straight, &spec);
    for _ in 0..12 {
        straight.step(&mut su).unwrap();
    }
    assert!(straight.state().iter().all(|&s| s != 0.0), "training moved the state: {:?}", straight.state());

    let mut first = trainer(&spec, true, 0, 1);
    let mut fu = local_step(&first, &spec);
    for _ in 0..5 {
        first.step(&mut fu).unwrap();
    }
    let path = dir.path().join("k.safetensors");
    first.save(&fu, &path).unwrap();
    let saved = Checkpoint::read(&path).unwrap();
    assert_eq!(saved.tensor("state.input.running_mean").unwrap().values, first.state());

    let mut resumed = trainer(&spec, true, 0, 1);
    let mut ru = local_step(&resumed, &spec);
    resumed.resume(&mut ru, &path).unwrap();
    assert_eq!(resumed.state(), first.state());
    while resumed.step_count() < 12 {
        resumed.step(&mut ru).unwrap();
    }
    assert_eq!(resumed.params(), straight.params());
    assert_eq!(resumed.state(), straight.state(), "the resumed run's state is the uninterrupted run's");

    // A checkpoint of the same job without the state cannot resume the stateful model.
    let plain = trainer(&spec, false, 0, 1);
    let plain_path = dir.path().join("plain.safetensors");
    plain.save(&local_step(&plain, &spec), &plain_path).unwrap();
    let mut other = trainer(&spec, true, 0, 1);
    let mut ou = local_step(&other, &spec);
    let err = other.resume(&mut ou, &plain_path).unwrap_err().to_string();
    assert!(err.contains("no tensor state.input.running_mean"), "{err}");
}

/// Runs a two-rank allreduce group for `steps` steps, rank 0 resuming from `from` and writing a
/// checkpoint to `save` at the end; returns each rank's (start step, parameters, state).
fn allreduce_group(
    spec: &TrainingJobSpec,
    steps: u64,
    from: Option<std::path::PathBuf>,
    save: Option<std::path::PathBuf>,
) -> Vec<(u64, Vec<f32>, Vec<f32>)> {
    let handles: Vec<_> = LocalTransport::group(2, Duration::from_secs(60))
        .into_iter()
        .enumerate()
        .map(|(rank, transport)| {
            let (spec, from, save) = (spec.clone(), from.clone(), save.clone());
            std::thread::spawn(move || {
                let comm = Collectives::new(transport, AlgoConfig::default(), "local");
                let mut t = trainer(&spec, true, rank, 2);
                let mut params = t.params().to_vec();
                let mut step =
                    AllreduceStep::start(comm, &spec.training.optimizer, &mut params, None).unwrap();
                t.set_params(&params).unwrap();
                let from = from.filter(|_| rank == 0).map(|p| (Checkpoint::read(&p).unwrap(), p));
                let start = step.resume(&mut t, from.as_ref().map(|(c, p)| (p.as_path(), c))).unwrap();
                while t.step_count() < steps {
                    t.step(&mut step).unwrap();
                }
                if let Some(path) = save {
                    step.gather_state(t.params().len()).unwrap();
                    if rank == 0 {
                        t.save(&step, &path).unwrap();
                    }
                }
                (start, t.params().to_vec(), t.state().to_vec())
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn an_allreduce_group_shares_its_state_and_resumes_it_from_rank_0() {
    let spec = job();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("group.safetensors");
    // The ranks see different batches, so their running means differ unless the group averages them.
    let ranks = allreduce_group(&spec, 6, None, Some(path.clone()));
    assert_eq!(ranks[0].2, ranks[1].2, "both ranks hold the group's state");
    assert!(ranks[0].2.iter().all(|&s| s != 0.0));

    // A restarted group: only rank 0 reads the checkpoint; rank 1 gets the state from it.
    let resumed = allreduce_group(&spec, 6, Some(path), None);
    for (rank, (start, params, state)) in resumed.iter().enumerate() {
        assert_eq!(*start, 6, "rank {rank}");
        assert_eq!(params, &ranks[0].1, "rank {rank}'s weights");
        assert_eq!(state, &ranks[0].2, "rank {rank}'s state comes from rank 0's checkpoint");
    }
}

/// A PS job of `replicas` shards running `ps-async` with plain SGD at rate 0.1.
fn ps_job(replicas: usize) -> Job {
    Job::with_spec(serde_json::json!({
        "training": {
            "algorithm": "ps-async",
            "steps": 1000,
            "optimizer": {"kind": "sgd", "learningRate": 0.1},
            "checkpoint": {"everySteps": 1000}
        },
        "parameterServers": {"replicas": replicas}
    }))
}

/// One group of one rank of the stateful model trains `steps` steps through the PS at `servers`
/// as launch `attempt`; returns the state it started from (after taking the servers') and ended with.
fn ps_group(servers: &[String], group: u32, attempt: u32, steps: u64) -> (Vec<f32>, Vec<f32>) {
    let spec = job();
    let transport = LocalTransport::group(1, Duration::from_secs(60)).pop().unwrap();
    let comm = Collectives::new(transport, AlgoConfig::default(), "local");
    let mut t = trainer(&spec, true, 0, 1);
    let client =
        PsClient::connect(worker_config(servers, group, 0, attempt, t.params().len() as u64)).unwrap();
    let mut params = t.params().to_vec();
    let mut step = PsStep::start(comm, client, &spec.training.optimizer, &mut params).unwrap();
    t.set_params(&params).unwrap();
    let mut state = t.state().to_vec();
    step.take_state(&mut state).unwrap();
    t.set_state(&state).unwrap();
    for _ in 0..steps {
        t.step(&mut step).unwrap();
    }
    (state, t.state().to_vec())
}

#[test]
fn the_parameter_servers_hold_the_groups_mean_state_and_keep_it_across_a_restart() {
    let psj = ps_job(2);
    let mut ps = vec![psj.spawn_ps(0, 0), psj.spawn_ps(1, 0)];
    let servers = addrs(&ps);

    // Group 0 starts with its own (initial) state and puts its state after every step.
    let (started, trained) = ps_group(&servers, 0, 0, 5);
    assert!(started.iter().all(|&s| s == 0.0), "a first group keeps its initial state: {started:?}");
    assert!(trained.iter().all(|&s| s != 0.0), "training moved the state: {trained:?}");
    let mut observer = psj.observer(&servers);
    assert_eq!(observer.get_state().unwrap(), trained, "shard 0 holds the only group's state");

    // A second group's state is averaged in; a state of another length is refused.
    let total = trainer(&job(), true, 0, 1).params().len() as u64;
    let mut other = PsClient::connect(worker_config(&servers, 1, 0, 0, total)).unwrap();
    let doubled: Vec<f32> = trained.iter().map(|s| s * 3.0).collect();
    other.put_state(&doubled).unwrap();
    let mean: Vec<f32> = trained.iter().zip(&doubled).map(|(a, b)| (a + b) / 2.0).collect();
    assert_eq!(observer.get_state().unwrap(), mean);
    let err = other.put_state(&[1.0]).unwrap_err().to_string();
    assert!(err.contains("every group must train the same model"), "{err}");
    drop((observer, other));

    // Both replicas stop (SIGTERM writes a checkpoint) and start again from their checkpoints:
    // a restarted group takes the mean state from the restarted shard 0.
    for p in &mut ps {
        let status = p.terminate();
        assert_eq!(
            status.code(),
            Some(tandem_api::contract::EXIT_PREEMPTED),
            "SIGTERM: a last checkpoint, then the retryable code, not {status:?}:\n{}",
            p.log_text()
        );
    }
    let ps = [psj.spawn_ps(0, ps[0].port()), psj.spawn_ps(1, ps[1].port())];
    let (resumed, _) = ps_group(&servers, 0, 1, 1);
    assert_eq!(resumed, mean, "the state survived the PS restart:\n{}", ps[0].log_text());
}
