//! `algorithm: allreduce` through `tandem train` with real `tandem worker` processes on loopback:
//! one group of 4 ranks (PCL-DNN: reduce-scatter, shard update, allgather) trains exactly like one
//! process with the 4× batch, over the built-in `tcp` collectives and over MPI (`mpirun`), and the
//! example manifest reaches the accuracy target.
//!
//! Needs the MNIST-5k sample in `data/` (`make data`), and OpenMPI's `mpirun` for the MPI case.
//! The jobs run one at a time: each one already keeps four processes busy.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use tandem::checkpoint::{self, Checkpoint};

static ONE_JOB_AT_A_TIME: Mutex<()> = Mutex::new(());

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn data_dir() -> PathBuf {
    let dir = repo().join("data");
    assert!(
        dir.join("mnist_5k.csv.gz").exists(),
        "{} has no mnist_5k.csv.gz; run `make data` first",
        dir.display()
    );
    dir
}

/// The allreduce example with `edit` applied to its YAML, written into `dir` as `name`.
fn manifest(dir: &Path, name: &str, edit: impl FnOnce(&mut serde_yaml::Value)) -> PathBuf {
    let text = std::fs::read_to_string(repo().join("examples/mnist-allreduce.yaml")).unwrap();
    let mut doc: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
    edit(&mut doc);
    let path = dir.join(name);
    std::fs::write(&path, serde_yaml::to_string(&doc).unwrap()).unwrap();
    path
}

/// `tandem train --output json`; returns its events, asserting success.
fn train(manifest: &Path, out: &Path) -> Vec<serde_json::Value> {
    let output = Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args(["train", "--output", "json", "--device", "cpu", "-f"])
        .arg(manifest)
        .arg("--output-dir")
        .arg(out)
        .arg("--data-dir")
        .arg(data_dir())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "tandem train {} failed:\n{stderr}", manifest.display());
    let events: Vec<serde_json::Value> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("stdout line {l:?} is not JSON: {e}")))
        .collect();
    assert_eq!(events.last().map(|e| &e["event"]), Some(&"finished".into()), "stderr:\n{stderr}");
    events
}

const STEPS: u64 = 30;

/// The model and optimizer state after `STEPS` steps of the allreduce example with `groupSize`
/// ranks of `batch` samples each over `backend`.
fn final_state(dir: &Path, name: &str, group_size: u32, batch: u32, backend: &str) -> Checkpoint {
    let file = manifest(dir, &format!("{name}.yaml"), |doc| {
        let spec = &mut doc["spec"];
        spec["data"]["batchSize"] = batch.into();
        spec["training"]["steps"] = STEPS.into();
        spec["training"]["evalEverySteps"] = 0.into();
        spec["training"]["checkpoint"] = serde_yaml::from_str(&format!("{{everySteps: {STEPS}}}")).unwrap();
        spec["workers"]["groupSize"] = group_size.into();
        spec["workers"]["backend"] = backend.into();
    });
    let out = dir.join(name);
    let events = train(&file, &out);
    let done = events.last().unwrap();
    assert_eq!(done["steps"], STEPS, "{done}");
    let path = checkpoint::latest(&out.join("checkpoints")).unwrap().expect("the run wrote its final model");
    assert!(path.ends_with(checkpoint::step_path(Path::new(""), STEPS)), "{}", path.display());
    Checkpoint::read(&path).unwrap()
}

/// Largest |a − b| over every tensor the two checkpoints share; asserts they share the model's.
fn max_difference(a: &Checkpoint, b: &Checkpoint) -> (f32, f32) {
    let names: Vec<&str> = a.meta.tensors.iter().map(String::as_str).collect();
    assert!(names.iter().any(|n| n.starts_with("optim.")), "the optimizer state is saved: {names:?}");
    let (mut diff, mut scale) = (0f32, 0f32);
    for name in names {
        let (x, y) = (a.tensor(name).unwrap(), b.tensor(name).unwrap_or_else(|| panic!("no {name}")));
        assert_eq!(x.shape, y.shape, "{name}");
        for (p, q) in x.values.iter().zip(&y.values) {
            diff = diff.max((p - q).abs());
            scale = scale.max(p.abs());
        }
    }
    (diff, scale)
}

fn assert_batch_equivalent(backend: &str) {
    let _one = ONE_JOB_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().unwrap();
    let single = final_state(tmp.path(), "single", 1, 128, "tcp");
    let group = final_state(tmp.path(), "group", 4, 32, backend);
    let (diff, scale) = max_difference(&single, &group);
    assert!(scale > 0.01, "the weights are not trivially zero ({scale})");
    assert!(
        diff < 2e-4,
        "4 ranks × 32 over {backend} must train like 1 process × 128: weights and momentum differ by up to \
         {diff} (largest magnitude {scale})"
    );
    // A control: the group's run is not the single process's unless the batches are the same.
    let other = final_state(tmp.path(), "other", 4, 16, backend);
    let (diff, _) = max_difference(&single, &other);
    assert!(diff > 1e-2, "a group with a different global batch differs ({diff})");
}

#[test]
fn a_group_of_4_over_tcp_trains_like_one_process_with_the_4x_batch() {
    assert_batch_equivalent("tcp");
}

#[test]
fn a_group_of_4_over_mpi_trains_like_one_process_with_the_4x_batch() {
    assert_batch_equivalent("mpi");
}

#[test]
fn the_allreduce_example_reaches_the_target_accuracy() {
    let _one = ONE_JOB_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().unwrap();
    let events = train(&repo().join("examples/mnist-allreduce.yaml"), &tmp.path().join("out"));
    let done = events.last().unwrap();
    assert!(done["test_accuracy"].as_f64().unwrap() >= 0.90, "{done}");
    assert_eq!(done["steps"], 600, "{done}");
    assert_eq!(
        events.iter().filter(|e| e["event"] == "started").map(|e| &e["processes"]).next(),
        Some(&4.into())
    );
    let steps: Vec<u64> =
        events.iter().filter(|e| e["event"] == "progress").filter_map(|e| e["group_step"].as_u64()).collect();
    assert!(steps.windows(2).all(|w| w[0] < w[1]) && steps.len() >= 60, "a line every 10 steps: {steps:?}");
}
