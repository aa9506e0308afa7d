//! Helpers shared by the trainer's integration tests.
#![allow(dead_code)]

use std::path::PathBuf;

use tandem_api::{JobPlan, TrainingJob, TrainingJobSpec};
use tandem_compute::device::Device;
use tandem_compute::train::Trainer;
use tandem_input::JobData;

/// The repository's data folder; panics with the command to run when the built-in sets are missing.
pub fn data_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../data");
    for f in [tandem_input::MNIST5K_FILE, tandem_input::DIGITS_FILE] {
        assert!(
            dir.join(f).exists(),
            "{} is missing: run `make data` (scripts/fetch-data.sh) before these tests",
            dir.join(f).display()
        );
    }
    dir
}

/// A spec from a TrainingJob manifest's YAML.
pub fn spec(yaml: &str) -> TrainingJobSpec {
    let job: TrainingJob = serde_yaml::from_str(yaml).unwrap();
    job.spec.validate().unwrap();
    job.spec
}

/// A spec from one of the repository's example manifests.
pub fn example(name: &str) -> TrainingJobSpec {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples").join(name);
    spec(&std::fs::read_to_string(path).unwrap())
}

/// A small single-process job: `model` and `data` are YAML flow mappings.
pub fn small_job(model: &str, data: &str, optimizer: &str, steps: u64) -> TrainingJobSpec {
    spec(&format!(
        "apiVersion: tandem.dev/v1alpha1\nkind: TrainingJob\nmetadata: {{name: t}}\nspec:\n  model: {model}\n  \
         data: {data}\n  training:\n    algorithm: allreduce\n    optimizer: {optimizer}\n    steps: {steps}\n    \
         evalEverySteps: 0\n  workers: {{groups: 1, groupSize: 1, minGroups: 1, maxGroups: 1}}\n"
    ))
}

/// The plan of `spec` trained by `world` ranks on `samples` training samples: a test's trainer
/// stands for one rank of the job, or for a one-process baseline of it.
pub fn plan(spec: &TrainingJobSpec, samples: u64, world: usize) -> JobPlan {
    JobPlan::resolve_for(spec, samples, world as u64).unwrap()
}

/// A CPU trainer for `spec` on `data`, as rank `rank` of `world`, with the plan of that world.
pub fn trainer_of(spec: &TrainingJobSpec, data: impl Into<JobData>, rank: usize, world: usize) -> Trainer {
    let data = data.into();
    let plan = plan(spec, data.train.samples(), world);
    Trainer::new(spec, &plan, data, &Device::Cpu, rank).unwrap()
}
