//! The real architectures learn the real data sets (needs `make data`), sized for a 2-core
//! machine: a small CIFAR-style ResNet and the MLP reach ≥ 0.85 test accuracy on Fashion-MNIST,
//! and a small GPT's validation loss on Shakespeare drops below 2.3 nats per character (the
//! text's character frequencies give 3.33 nats, the previous character 2.50, the previous two
//! 1.97: below 2.3 the model must use more than the last character).
//!
//! The Fashion-MNIST runs train on the first part of the 60,000 training images and test on the
//! first 2,000 of the 10,000 test images, so that each run takes well under a minute; the full
//! runs are the examples (`examples/fashion-resnet.yaml`, `examples/shakespeare-gpt.yaml`).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use crate::trainer_support;

use tandem_api::TrainingJobSpec;
use tandem_compute::optim::Optimizer;
use tandem_compute::train::{Cadence, LocalStep, RunSummary};
use tandem_input::{self as data, Splits};

/// Trains `spec` on the first `train` training and `test` test samples of its data.
fn train(spec: &TrainingJobSpec, train: usize, test: usize) -> RunSummary {
    let Splits { train: all_train, test: all_test } =
        data::load_job(spec, &trainer_support::data_dir()).unwrap();
    let first = |n: usize, len: usize| (0..n.min(len) as u32).collect::<Vec<u32>>();
    let splits = Splits {
        train: all_train.select(&first(train, all_train.len())),
        test: all_test.select(&first(test, all_test.len())),
    };
    let mut t = trainer_support::trainer_of(spec, splits, 0, 1);
    let mut u = LocalStep::new(Optimizer::new(&spec.training.optimizer, t.params().len()));
    t.run(&mut u, &Cadence::default(), &mut |_| {}).unwrap()
}

#[test]
fn fashion_mnist_is_60000_and_10000_images_of_10_classes() {
    let spec = trainer_support::small_job("{kind: mlp}", "{source: fashion-mnist}", "{kind: sgd}", 1);
    let Splits { train, test } = data::load_job(&spec, &trainer_support::data_dir()).unwrap();
    assert_eq!((train.len(), test.len(), train.classes), (60_000, 10_000, 10));
    assert_eq!((train.shape.channels, train.shape.height, train.shape.width), (1, 28, 28));
    let mut per_class = [0usize; 10];
    for &l in &test.labels {
        per_class[l as usize] += 1;
    }
    assert_eq!(per_class, [1000; 10], "Fashion-MNIST's test set is balanced");
}

#[test]
fn a_small_resnet_reaches_85_percent_on_fashion_mnist() {
    let spec = trainer_support::small_job(
        "{kind: resnet, depth: 8, width: 8}",
        "{source: fashion-mnist, batchSize: 64}",
        "{kind: sgd, learningRate: 0.1, momentum: 0.9, nesterov: true, schedule: {kind: cosine, warmupSteps: 30}}",
        700,
    );
    let s = train(&spec, 60_000, 2_000);
    let acc = s.evaluation.accuracy;
    assert!(acc >= 0.85, "ResNet-8 test accuracy {acc:.4} < 0.85 after {} steps", s.steps);
}

#[test]
fn the_mlp_reaches_85_percent_on_fashion_mnist() {
    let spec = trainer_support::small_job(
        "{kind: mlp, hidden: [256, 128]}",
        "{source: fashion-mnist, batchSize: 64}",
        "{kind: sgd, learningRate: 0.05, momentum: 0.9}",
        1500,
    );
    let s = train(&spec, 60_000, 2_000);
    let acc = s.evaluation.accuracy;
    assert!(acc >= 0.85, "MLP test accuracy {acc:.4} < 0.85 after {} steps", s.steps);
}

#[test]
fn a_small_gpt_drops_its_validation_loss_below_2_3_nats_on_shakespeare() {
    let spec = trainer_support::small_job(
        "{kind: gpt, layers: 2, heads: 4, dim: 64, context: 64}",
        "{source: shakespeare, batchSize: 32}",
        "{kind: adamw, learningRate: 0.008, beta2: 0.99, schedule: {kind: cosine, warmupSteps: 50}}",
        1500,
    );
    let s = train(&spec, usize::MAX, 128);
    let loss = s.evaluation.loss;
    assert!(loss < 2.3, "GPT validation loss {loss:.3} nats per character is not below 2.3");
}
