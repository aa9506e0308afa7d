//! The example jobs reach their accuracy targets on real MNIST-5k data (needs `make data`):
//! MLP ≥ 0.92 and CNN ≥ 0.95 test accuracy on the 1,000 held-out digits.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use crate::trainer_support;

use tandem::compute::data;
use tandem::compute::device::Device;
use tandem::compute::optim::Optimizer;
use tandem::compute::train::{Event, LocalStep, RunOptions, Trainer};

fn train_example(name: &str) -> (f64, Vec<Event>) {
    let spec = trainer_support::example(name);
    let splits = data::load(&spec.data, &trainer_support::data_dir(), spec.training.seed).unwrap();
    let mut t = Trainer::new(&spec, splits, &Device::Cpu, 0, 1).unwrap();
    let mut u = LocalStep::new(Optimizer::new(&spec.training.optimizer, t.params().len()));
    let mut events = Vec::new();
    let e = t.run(&mut u, &RunOptions::default(), &mut |ev| events.push(ev.clone())).unwrap();
    (e.accuracy, events)
}

#[test]
fn mlp_example_reaches_92_percent() {
    let (acc, events) = train_example("mnist-mlp.yaml");
    assert!(acc >= 0.92, "MLP test accuracy {acc:.4} < 0.92");
    let Some(Event::Finished { test_accuracy, steps, .. }) = events.last() else {
        panic!("no finished event")
    };
    assert_eq!(*test_accuracy, acc);
    assert_eq!(*steps, 8 * (4000 / 64));
    // Loss falls: the first logged training loss is above the last.
    let losses: Vec<f64> = events
        .iter()
        .filter_map(|e| if let Event::Train { loss, .. } = e { Some(*loss) } else { None })
        .collect();
    assert!(losses[0] > 2.0 * losses[losses.len() - 1], "{losses:?}");
}

#[test]
fn cnn_example_reaches_95_percent() {
    let (acc, _) = train_example("mnist-cnn.yaml");
    assert!(acc >= 0.95, "CNN test accuracy {acc:.4} < 0.95");
}
