//! Real training through real `tandem ps` processes: worker groups of tcp-connected ranks
//! (threads here) use `worker::ps_step::PsStep` with the compute layer's trainer.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::ps_common;

use std::path::Path;
use std::sync::{Arc, Barrier};

use crate::ps_common::{Job, addrs, worker_config};
use tandem::worker::ps_step::PsStep;
use tandem_api::PsMode;
use tandem_api::TrainingJobSpec;
use tandem_comm::tcp::{self, TcpComm, TcpConfig};
use tandem_compute::optim::Optimizer;
use tandem_compute::train::{LocalStep, Trainer};
use tandem_ps::client::PsClient;

fn spec(algorithm: &str, steps: u64, replicas: u32) -> serde_json::Value {
    serde_json::json!({
        "model": {"kind": "mlp", "hidden": [32]},
        "data": {"source": "synthetic", "batchSize": 16, "syntheticSamples": 1200},
        "training": {
            "algorithm": algorithm,
            "steps": steps,
            "optimizer": {"kind": "sgd", "learningRate": 0.05, "momentum": 0.9},
            "easgd": {"alpha": 0.45, "tau": 2},
            "checkpoint": {"everySteps": 0}
        },
        "parameterServers": {"replicas": replicas}
    })
}

/// The job config the servers read for `groups` groups of `size` ranks: they refuse a worker's
/// group or rank beyond it.
fn for_groups(mut json: serde_json::Value, groups: u32, size: u32) -> serde_json::Value {
    json["workers"] =
        serde_json::json!({"groups": groups, "groupSize": size, "minGroups": 1, "maxGroups": groups});
    json
}

fn trainer(spec: &TrainingJobSpec, rank: usize, world: usize) -> Trainer {
    let data = tandem_input::load(&spec.data, Path::new("unused"), spec.training.seed).unwrap();
    crate::trainer_support::trainer_of(spec, data, rank, world)
}

/// Runs one group of `size` ranks (threads) for the job's steps; returns each rank's final
/// parameters and the test accuracy rank 0 measured. Ranks wait at `joined` after joining, so
/// that groups of one test start at the same version.
fn run_group(
    spec: &TrainingJobSpec,
    servers: &[String],
    group: u32,
    size: usize,
    world: usize,
    joined: Arc<Barrier>,
) -> (Vec<Vec<f32>>, f64) {
    let peers = crate::ps_common::loopback_endpoints(size);
    let handles: Vec<_> = (0..size)
        .map(|rank| {
            let (spec, servers, peers) = (spec.clone(), servers.to_vec(), peers.clone());
            let joined = joined.clone();
            std::thread::spawn(move || {
                let global = group as usize * size + rank;
                let mut t = trainer(&spec, global, world);
                let comm: TcpComm =
                    tcp::connect(rank, &peers, "127.0.0.1", b"group-token", TcpConfig::default()).unwrap();
                let total = t.params().len() as u64;
                let mode = PsMode::of(&spec.training).unwrap();
                let config = worker_config(&servers, group, rank as u32, 0, total).run(t.total_steps(), mode);
                let client = PsClient::connect(config).unwrap();
                let mut p = t.params().to_vec();
                let mut step = PsStep::start(comm, client, &spec.training.optimizer, &mut p).unwrap();
                t.set_params(&p).unwrap();
                joined.wait();
                for _ in 0..t.total_steps() {
                    t.step(&mut step).unwrap();
                }
                (t.params().to_vec(), t.evaluate().unwrap().accuracy)
            })
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let accuracy = results[0].1;
    (results.into_iter().map(|r| r.0).collect(), accuracy)
}

#[test]
fn ps_sync_with_one_rank_matches_local_training_bit_for_bit() {
    let json = spec("ps-sync", 25, 2);
    let spec: TrainingJobSpec = serde_json::from_value(json.clone()).unwrap();
    let job = Job::with_spec(json);
    let ps = [job.spawn_ps(0, 0), job.spawn_ps(1, 0)];

    let mut local = trainer(&spec, 0, 1);
    let mut update = LocalStep::new(Optimizer::new(&spec.training.optimizer, local.params().len()));
    for _ in 0..25 {
        local.step(&mut update).unwrap();
    }
    let (params, _) = run_group(&spec, &addrs(&ps), 0, 1, 1, Arc::new(Barrier::new(1)));
    // The shards run the same optimizer and schedule elementwise on their ranges: same bits.
    assert_eq!(params[0], local.params(), "training through the PS equals local training");
}

#[test]
fn hybrid_groups_stay_identical_and_learn() {
    let json = spec("hybrid", 40, 2);
    let spec: TrainingJobSpec = serde_json::from_value(json.clone()).unwrap();
    let job = Job::with_spec(for_groups(json, 2, 2));
    let ps = [job.spawn_ps(0, 0), job.spawn_ps(1, 0)];
    let servers = addrs(&ps);
    let before = trainer(&spec, 0, 4).evaluate().unwrap().accuracy;
    let joined = Arc::new(Barrier::new(4));
    let groups: Vec<_> = (0..2u32)
        .map(|g| {
            let (spec, servers, joined) = (spec.clone(), servers.clone(), joined.clone());
            std::thread::spawn(move || run_group(&spec, &servers, g, 2, 4, joined))
        })
        .collect();
    let results: Vec<_> = groups.into_iter().map(|h| h.join().unwrap()).collect();
    let all: Vec<&Vec<f32>> = results.iter().flat_map(|(p, _)| p.iter()).collect();
    assert!(
        all.windows(2).all(|w| w[0] == w[1]),
        "sync hybrid: every rank of every group holds the same weights"
    );
    let after = results[0].1;
    println!("hybrid: accuracy {before:.3} -> {after:.3}");
    assert!(after >= 0.9 && after > before + 0.3, "accuracy {before} -> {after}");
}

#[test]
fn easgd_groups_pull_the_centre_towards_a_model_that_learns() {
    let json = spec("easgd", 40, 1);
    let spec: TrainingJobSpec = serde_json::from_value(json.clone()).unwrap();
    let job = Job::with_spec(for_groups(json, 2, 2));
    let ps = [job.spawn_ps(0, 0)];
    let servers = addrs(&ps);
    let joined = Arc::new(Barrier::new(4));
    let groups: Vec<_> = (0..2u32)
        .map(|g| {
            let (spec, servers, joined) = (spec.clone(), servers.clone(), joined.clone());
            std::thread::spawn(move || run_group(&spec, &servers, g, 2, 4, joined))
        })
        .collect();
    let results: Vec<_> = groups.into_iter().map(|h| h.join().unwrap()).collect();
    for (params, _) in &results {
        assert_eq!(params[0], params[1], "ranks of a group hold the same weights");
    }
    // The centre, read by an observer, is itself a good model.
    let mut observer =
        PsClient::connect(tandem_ps::client::ClientConfig::observer(servers, ps_common::TOKEN)).unwrap();
    let mut centre = vec![0.0; results[0].0[0].len()];
    observer.pull(0, &mut centre).unwrap();
    let mut t = trainer(&spec, 0, 1);
    let before = t.evaluate().unwrap().accuracy;
    t.set_params(&centre).unwrap();
    let after = t.evaluate().unwrap().accuracy;
    println!(
        "easgd centre: accuracy {before:.3} -> {after:.3}; groups {:.3} {:.3}",
        results[0].1, results[1].1
    );
    assert!(after >= 0.9 && after > before + 0.3, "centre accuracy {before} -> {after}");
}

#[test]
fn an_epochs_job_runs_the_same_learning_rate_schedule_on_the_ps_as_on_the_worker() {
    // Sized in epochs, with a decaying schedule: the servers learn the run's step count from the
    // workers' hello. (Given `training.steps`, empty for an epochs job, they once ran cosine over
    // u64::MAX steps — near its peak throughout — while the worker decayed to zero.)
    let mut json = spec("ps-sync", 1, 1);
    let training = json["training"].as_object_mut().unwrap();
    training.remove("steps");
    training.insert("epochs".into(), 2.into());
    training.insert(
        "optimizer".into(),
        serde_json::json!({"kind": "sgd", "learningRate": 0.2, "schedule": {"kind": "cosine", "warmupSteps": 3}}),
    );
    let spec: TrainingJobSpec = serde_json::from_value(json.clone()).unwrap();
    let job = Job::with_spec(json);
    let ps = [job.spawn_ps(0, 0)];

    let mut local = trainer(&spec, 0, 1);
    // 1,200 synthetic samples, 240 held out: 960 / 16 = 60 steps per epoch.
    assert_eq!(local.total_steps(), 120);
    let mut update = LocalStep::new(Optimizer::new(&spec.training.optimizer, local.params().len()));
    while local.step_count() < local.total_steps() {
        local.step(&mut update).unwrap();
    }
    let (params, _) = run_group(&spec, &addrs(&ps), 0, 1, 1, Arc::new(Barrier::new(1)));
    let diff = params[0].iter().zip(local.params()).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert_eq!(diff, 0.0, "the PS's schedule is the worker's: same weights, bit for bit");
}
