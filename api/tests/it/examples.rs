//! Every manifest in `examples/` parses into the api types with the topology its comment promises.
#![allow(clippy::expect_used, clippy::unwrap_used)] // tests fail loudly by design

use crate::common;

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

#[test]
fn ps_sync_and_ps_async_are_four_single_rank_clients_of_one_ps() {
    for (name, algorithm) in
        [("mnist-ps-sync.yaml", Algorithm::PsSync), ("mnist-ps-async.yaml", Algorithm::PsAsync)]
    {
        let job = example(name);
        assert_eq!(job.spec.training.algorithm, algorithm, "{name}");
        assert_eq!((job.spec.workers.groups, job.spec.workers.group_size), (4, 1), "{name}");
        assert!(job.spec.parameter_servers.replicas >= 1, "{name}");
    }
    assert!(example("mnist-ps-async.yaml").spec.training.staleness > 0, "ps-async bounds staleness");
}

/// The time-to-accuracy benchmark (bench/tta.sh) compares the algorithms on these manifests: the
/// same model, data and batch, and the same 4 worker processes.
#[test]
fn algorithm_examples_compare_the_same_four_workers_and_data() {
    let names = [
        "mnist-ps-sync.yaml",
        "mnist-ps-async.yaml",
        "mnist-hybrid.yaml",
        "mnist-easgd.yaml",
        "mnist-allreduce.yaml",
    ];
    let first = example(names[0]);
    let mut algorithms = Vec::new();
    for name in names {
        let job = example(name);
        assert_eq!(job.spec.workers.groups * job.spec.workers.group_size, 4, "{name}: 4 worker processes");
        assert_eq!(job.spec.model, first.spec.model, "{name}: same model");
        assert_eq!(job.spec.data, first.spec.data, "{name}: same data and batch");
        assert_eq!(job.spec.training.seed, first.spec.training.seed, "{name}: same seed");
        algorithms.push(job.spec.training.algorithm);
    }
    algorithms.sort_by_key(|a| format!("{a:?}"));
    algorithms.dedup();
    assert_eq!(algorithms.len(), names.len(), "one manifest per algorithm");
}

#[test]
fn the_pytorch_example_runs_its_script_beside_it_as_two_groups_of_two() {
    let path = common::workspace().join("examples/pytorch/job.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let job = tandem_api::manifest::parse(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    // The decoded spec, written back with its defaults, passes the rules about workers.command as
    // the operator checks it: no default reads as a field the user set.
    job.spec.validate().unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(job.spec.workers.command.as_deref(), Some(&["python3".to_owned(), "train.py".to_owned()][..]));
    assert_eq!((job.spec.workers.groups, job.spec.workers.group_size), (2, 2));
    assert_eq!(job.spec.parameter_servers.replicas, 0);
    assert!(common::workspace().join("examples/pytorch/train.py").exists());
}
