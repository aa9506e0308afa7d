//! A run whose epochs the job's plan splits over changing worlds: each epoch's share follows the
//! plan, a run in epochs counts its steps as the plan goes, and a resume lands where the run was.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use crate::trainer_support;

use tandem_api::TrainingJobSpec;
use tandem_compute::optim::{Optimizer, OptimizerState};
use tandem_compute::train::{Cadence, EpochShare, GradientStep, LocalStep, TrainError, Trainer};
use tandem_input::{self as data, DataCursor};

/// A local step whose epochs are split as `plan` says (epochs past its end: sat out).
struct Planned {
    inner: LocalStep,
    plan: Vec<EpochShare>,
    asked: Vec<u64>,
}

impl GradientStep for Planned {
    fn apply(&mut self, step: u64, lr: f64, params: &mut [f32], grads: &mut [f32]) -> Result<(), TrainError> {
        self.inner.apply(step, lr, params, grads)
    }
    fn optimizer_state(&self) -> Option<OptimizerState> {
        self.inner.optimizer_state()
    }
    fn restore_optimizer(&mut self, state: &OptimizerState) -> Result<(), TrainError> {
        self.inner.restore_optimizer(state)
    }
    fn epoch_share(&mut self, epoch: u64) -> Result<EpochShare, TrainError> {
        self.asked.push(epoch);
        Ok(self.plan.get(epoch as usize).copied().unwrap_or(EpochShare::Out))
    }
}

fn spec(epochs: u32) -> TrainingJobSpec {
    let mut spec = trainer_support::small_job(
        "{kind: mlp, hidden: [16]}",
        "{source: digits, batchSize: 32}",
        "{kind: sgd, learningRate: 0.05}",
        1,
    );
    spec.training.steps = None;
    spec.training.epochs = Some(epochs);
    spec
}

fn trainer(spec: &TrainingJobSpec, plan: &[EpochShare]) -> (Trainer, Planned) {
    let splits = data::load(&spec.data, &trainer_support::data_dir(), spec.training.seed).unwrap();
    let t = trainer_support::trainer_of(spec, splits, 0, 1);
    let inner = LocalStep::new(Optimizer::new(&spec.training.optimizer, t.params().len()));
    (t, Planned { inner, plan: plan.to_vec(), asked: Vec::new() })
}

// Digits: 1,437 training samples in batches of 32 give 44 batches an epoch on one rank, 22 on
// each of 2, 14 on each of 3.
const PLAN: [EpochShare; 4] = [
    EpochShare::Slice { rank: 0, world: 1 },
    EpochShare::Slice { rank: 1, world: 2 },
    EpochShare::Out,
    EpochShare::Slice { rank: 2, world: 3 },
];

#[test]
fn a_run_in_epochs_takes_each_epochs_share_of_the_plan_and_counts_its_steps_by_it() {
    let spec = spec(4);
    let (mut t, mut u) = trainer(&spec, &PLAN);
    assert_eq!(t.total_steps(), 4 * 44, "before any plan, the job's own count");
    for _ in 0..44 {
        t.step(&mut u).unwrap();
    }
    assert_eq!(t.cursor(), DataCursor { epoch: 1, batch: 0, ..t.cursor() });
    t.step(&mut u).unwrap();
    assert_eq!((t.cursor().epoch, t.cursor().batch), (1, 1), "epoch 1 on the plan's world of 2");
    assert_eq!(t.total_steps(), 44 + 3 * 22, "counted with epoch 1's share for the epochs left");
    for _ in 45..44 + 22 {
        t.step(&mut u).unwrap();
    }
    // The cursor a report at the end of epoch 1 carries: epoch 2, which this rank sits out.
    let end_of_1 = t.cursor();
    assert_eq!((end_of_1.epoch, end_of_1.batch), (2, 0));
    let summary = t.run(&mut u, &Cadence::of(&spec, None), &mut |_| {}).unwrap();
    assert_eq!(summary.steps, 44 + 22 + 14, "epoch 2 sat out, epoch 3 a third");
    assert_eq!(t.total_steps(), summary.steps);
    assert_eq!(u.asked, [0, 1, 2, 3], "each epoch planned once");

    // A run that resumes at a step finds its place through the same plan.
    // (step, where it is, the steps counted there: done + that epoch's share for the epochs left)
    for (step, at, total) in
        [(44 + 5, (1, 5), 44 + 3 * 22), (44 + 22, (3, 0), 80), (44 + 22 + 13, (3, 13), 80)]
    {
        let (mut again, mut u) = trainer(&spec, &PLAN);
        again.skip_to(&mut u, step).unwrap();
        assert_eq!((again.cursor().epoch, again.cursor().batch), at, "step {step}");
        assert_eq!(again.step_count(), step);
        assert_eq!(again.total_steps(), total, "step {step}");
        if step == 44 + 22 {
            // A restarted group continues its stream from that report's cursor.
            again.seek_data(end_of_1).unwrap();
            assert_eq!((again.cursor().epoch, again.cursor().batch), (3, 0));
        }
        let summary = again.run(&mut u, &Cadence::of(&spec, None), &mut |_| {}).unwrap();
        assert_eq!(summary.steps, 44 + 22 + 14, "resumed at {step}");
    }
}

#[test]
fn a_run_in_steps_keeps_its_step_count_and_crosses_epochs_as_the_plan_splits_them() {
    let mut spec = spec(1);
    spec.training.epochs = None;
    spec.training.steps = Some(44 + 22 + 3);
    let (mut t, mut u) = trainer(&spec, &PLAN);
    let summary = t.run(&mut u, &Cadence::of(&spec, None), &mut |_| {}).unwrap();
    assert_eq!(summary.steps, 69);
    assert_eq!((t.cursor().epoch, t.cursor().batch), (3, 3), "epoch 2 sat out");
}
