//! The example jobs reach their accuracy targets on real MNIST-5k data (needs `make data`):
//! MLP ≥ 0.92 and CNN ≥ 0.95 test accuracy on the 1,000 held-out digits.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use crate::trainer_support;

use tandem_api::contract::GroupReport;
use tandem_compute::optim::Optimizer;
use tandem_compute::train::{Cadence, LocalStep, RunSummary};
use tandem_input as data;

fn train_example(name: &str) -> (RunSummary, Vec<GroupReport>) {
    let spec = trainer_support::example(name);
    let splits = data::load(&spec.data, &trainer_support::data_dir(), spec.training.seed).unwrap();
    let mut t = trainer_support::trainer_of(&spec, splits, 0, 1);
    let mut u = LocalStep::new(Optimizer::new(&spec.training.optimizer, t.params().len()));
    let mut reports = Vec::new();
    let s = t.run(&mut u, &Cadence::default(), &mut |r| reports.push(*r)).unwrap();
    (s, reports)
}

#[test]
fn mlp_example_reaches_92_percent() {
    let (summary, reports) = train_example("mnist-mlp.yaml");
    let acc = summary.evaluation.accuracy;
    assert!(acc >= 0.92, "MLP test accuracy {acc:.4} < 0.92");
    assert_eq!(summary.steps, 8 * (4000 / 64));
    // The last report is the last step's, with the final evaluation.
    let last = reports.last().expect("reports");
    assert_eq!((last.step, last.accuracy), (summary.steps, Some(acc)));
    // Loss falls: the first reported training loss is above the last.
    let losses: Vec<f64> = reports.iter().filter_map(|r| r.loss).collect();
    assert!(losses[0] > 2.0 * losses[losses.len() - 1], "{losses:?}");
}

#[test]
fn cnn_example_reaches_95_percent() {
    let acc = train_example("mnist-cnn.yaml").0.evaluation.accuracy;
    assert!(acc >= 0.95, "CNN test accuracy {acc:.4} < 0.95");
}
