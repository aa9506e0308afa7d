//! Every manifest in `examples/` parses into the api types with the topology its comment promises.
#![allow(clippy::expect_used, clippy::unwrap_used)] // tests fail loudly by design

mod common;

use tandem_api::{Algorithm, Backend, TrainingJob};

fn example(name: &str) -> TrainingJob {
    let path = common::workspace().join("examples").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn all_examples_parse_and_validate() {
    for (path, text) in common::examples() {
        let job: TrainingJob =
            serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        job.spec.validate().unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let stem = path.file_stem().and_then(|s| s.to_str()).expect("file name");
        assert_eq!(
            job.metadata.name.as_deref(),
            Some(stem),
            "{}: metadata.name should match the file",
            path.display()
        );
    }
}

#[test]
fn mlp_is_one_worker_without_ps() {
    let job = example("mnist-mlp.yaml");
    assert_eq!((job.spec.workers.groups, job.spec.workers.group_size), (1, 1));
    assert_eq!(job.spec.parameter_servers.replicas, 0);
}

#[test]
fn allreduce_is_one_group_of_four_without_ps() {
    let job = example("mnist-allreduce.yaml");
    assert_eq!(job.spec.training.algorithm, Algorithm::Allreduce);
    assert_eq!((job.spec.workers.groups, job.spec.workers.group_size), (1, 4));
    assert_eq!(job.spec.parameter_servers.replicas, 0);
}

#[test]
fn hybrid_is_two_ps_and_two_groups_of_two() {
    let job = example("mnist-hybrid.yaml");
    assert_eq!(job.spec.training.algorithm, Algorithm::Hybrid);
    assert_eq!(job.spec.parameter_servers.replicas, 2);
    assert_eq!((job.spec.workers.groups, job.spec.workers.group_size), (2, 2));
    assert_eq!(job.spec.workers.backend, Backend::Tcp);
}

#[test]
fn easgd_exchanges_every_tau_steps() {
    let job = example("mnist-easgd.yaml");
    assert_eq!(job.spec.training.algorithm, Algorithm::Easgd);
    assert!(job.spec.training.easgd.tau >= 1);
    assert!(job.spec.parameter_servers.replicas >= 1);
}
