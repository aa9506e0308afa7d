//! Resuming at step k from a checkpoint ends with bit-for-bit the weights of an uninterrupted run.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use crate::trainer_support;

use tandem_api::TrainingJobSpec;
use tandem_compute::optim::Optimizer;
use tandem_compute::train::{LocalStep, Trainer};
use tandem_input as data;

fn trainer(spec: &TrainingJobSpec) -> (Trainer, LocalStep) {
    let splits = data::load(&spec.data, &trainer_support::data_dir(), spec.training.seed).unwrap();
    let t = trainer_support::trainer_of(spec, splits, 0, 1);
    let u = LocalStep::new(Optimizer::new(&spec.training.optimizer, t.params().len()));
    (t, u)
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn check(spec: TrainingJobSpec, k: u64) {
    let n = spec.training.steps.unwrap();
    let (mut straight, mut su) = trainer(&spec);
    for _ in 0..n {
        straight.step(&mut su).unwrap();
    }

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("k.safetensors");
    let (mut first, mut fu) = trainer(&spec);
    for _ in 0..k {
        first.step(&mut fu).unwrap();
    }
    first.save(&fu, &path).unwrap();
    drop(first);

    let (mut resumed, mut ru) = trainer(&spec);
    resumed.resume(&mut ru, &path).unwrap();
    assert_eq!(resumed.step_count(), k);
    while resumed.step_count() < n {
        resumed.step(&mut ru).unwrap();
    }
    assert_eq!(bits(resumed.params()), bits(straight.params()));
    assert_ne!(bits(straight.params()), bits(trainer(&spec).0.params()), "training must change the weights");

    // A job with another configuration refuses this checkpoint.
    let mut other = spec.clone();
    other.training.optimizer.learning_rate *= 2.0;
    let (mut o, mut ou) = trainer(&other);
    let err = o.resume(&mut ou, &path).unwrap_err().to_string();
    assert!(err.contains("another configuration"), "{err}");
}

// The straight and the resumed runs share this process's thread count (candle reads
// RAYON_NUM_THREADS, which nothing changes while tests run), for which candle's CPU kernels are
// deterministic; the test binary's other tests do not change it either.
#[test]
fn resuming_gives_bitwise_identical_weights() {
    // k falls inside the second epoch (digits: 1,437 / 32 = 44 batches), so the cursor matters.
    check(
        trainer_support::small_job(
            "{kind: mlp, hidden: [32]}",
            "{source: digits, batchSize: 32}",
            "{kind: sgd, learningRate: 0.1, momentum: 0.9, nesterov: true, weightDecay: 0.001}",
            70,
        ),
        53,
    );
    check(
        trainer_support::small_job(
            "{kind: cnn, channels: [4, 8], hidden: [16]}",
            "{source: digits, batchSize: 32}",
            "{kind: adamw, learningRate: 0.003, weightDecay: 0.01, schedule: {kind: cosine, warmupSteps: 5}}",
            50,
        ),
        47,
    );
}
