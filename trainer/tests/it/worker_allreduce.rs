//! `algorithm: allreduce` through `tandem train` with real `tandem worker` processes on loopback:
//! one group of 4 ranks (PCL-DNN: reduce-scatter, shard update, allgather) trains exactly like one
//! process with the 4× batch, over the built-in `tcp` collectives and over MPI (`mpirun`), and the
//! example manifest reaches the accuracy target.
//!
//! Needs the MNIST-5k sample in `data/` (`make data`), and OpenMPI's `mpirun` for the MPI case.
//! The jobs run one at a time: each one already keeps four processes busy.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use crate::runner_support::{
    Run, data_dir, example, example_yaml, manifest_as, one_job_at_a_time, set, train,
};
use tandem_compute::checkpoint::{self, Checkpoint};

/// `tandem train --output json`, asserting that it succeeded and ended with the finished event.
fn train_ok(manifest: &Path, out: &Path) -> Run {
    let run = train(manifest, out, &[]);
    assert!(run.success, "tandem train {} failed:\n{}", manifest.display(), run.stderr);
    run.finished();
    run
}

const STEPS: u64 = 30;

/// The allreduce example as `<dir>/<name>.yaml` with `groupSize` ranks of `batch` samples each over
/// `backend`, `steps` steps, a checkpoint every `every` steps, no evaluation and a 1-second restart
/// backoff.
fn allreduce_job(
    dir: &Path,
    name: &str,
    group_size: u32,
    batch: u32,
    backend: &str,
    steps: u64,
    every: u64,
) -> PathBuf {
    manifest_as(dir, "mnist-allreduce.yaml", &format!("{name}.yaml"), |doc| {
        let spec = &mut doc["spec"];
        spec["data"]["batchSize"] = batch.into();
        spec["training"]["steps"] = steps.into();
        spec["training"]["evalEverySteps"] = 0.into();
        spec["training"]["checkpoint"] = serde_yaml::from_str(&format!("{{everySteps: {every}}}")).unwrap();
        spec["workers"]["groupSize"] = group_size.into();
        spec["workers"]["backend"] = backend.into();
        spec["runPolicy"] = serde_yaml::from_str("{backoffSeconds: 1}").unwrap();
    })
}

/// The final checkpoint in `out` of a run that ended at `steps`.
fn final_checkpoint(out: &Path, steps: u64) -> Checkpoint {
    let path = checkpoint::latest(&out.join("checkpoints")).unwrap().expect("the run wrote its final model");
    assert!(path.ends_with(checkpoint::step_path(Path::new(""), steps)), "{}", path.display());
    Checkpoint::read(&path).unwrap()
}

/// The model and optimizer state after `STEPS` steps of the allreduce example with `groupSize`
/// ranks of `batch` samples each over `backend`.
fn final_state(dir: &Path, name: &str, group_size: u32, batch: u32, backend: &str) -> Checkpoint {
    let file = allreduce_job(dir, name, group_size, batch, backend, STEPS, STEPS);
    let out = dir.join(name);
    let run = train_ok(&file, &out);
    let done = run.finished();
    assert_eq!(done["steps"], STEPS, "{done}");
    final_checkpoint(&out, STEPS)
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
    let _one = one_job_at_a_time();
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
    let _one = one_job_at_a_time();
    let tmp = tempfile::tempdir().unwrap();
    let run = train_ok(&example("mnist-allreduce.yaml"), &tmp.path().join("out"));
    let done = run.finished();
    assert!(done["test_accuracy"].as_f64().unwrap() >= 0.90, "{done}");
    assert_eq!(done["steps"], 600, "{done}");
    assert_eq!(run.of("started").iter().map(|e| &e["processes"]).next(), Some(&4.into()));
    let steps: Vec<u64> = run.of("progress").iter().filter_map(|e| e["group_step"].as_u64()).collect();
    assert!(steps.windows(2).all(|w| w[0] < w[1]) && steps.len() >= 60, "a line every 10 steps: {steps:?}");
}

#[test]
fn a_killed_rank_restarts_the_group_from_its_checkpoint_and_ends_with_the_uninterrupted_model() {
    let _one = one_job_at_a_time();
    let tmp = tempfile::tempdir().unwrap();
    let (steps, every) = (60, 10);
    let file = allreduce_job(tmp.path(), "job", 4, 32, "tcp", steps, every);

    let whole = tmp.path().join("whole");
    train_ok(&file, &whole);
    let want = final_checkpoint(&whole, steps);

    let killed = tmp.path().join("killed");
    let run = train(&file, &killed, &["--chaos", "kill:worker:0:2@40"]);
    assert!(run.success, "stderr:\n{}", run.stderr);
    let done = run.finished();
    assert_eq!((done["restarts"].as_u64(), done["steps"].as_u64()), (Some(1), Some(steps)), "{done}");
    // The group came back at its step-40 checkpoint, not at step 0.
    let after = run.events.iter().position(|e| e["event"] == "restart").expect("the group restarted");
    let resumed: Vec<u64> = run.events[after..]
        .iter()
        .filter(|e| e["event"] == "progress")
        .map(|e| e["group_step"].as_u64().unwrap())
        .collect();
    let rank0 = std::fs::read_to_string(killed.join("logs/worker-0-0.1.log")).unwrap();
    // The kill lands a moment after the step-40 report: before the step-50 checkpoint (resumed
    // at 40), or, on a busy machine, after it (resumed at 50). Either is a checkpoint restart.
    let line = rank0.lines().find(|l| l.contains("resumed from checkpoint"));
    let at: Option<u64> = line
        .and_then(|l| l.split_once(" step="))
        .and_then(|(_, r)| r.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok());
    let at =
        at.unwrap_or_else(|| panic!("rank 0's log of the second attempt names no resume step:\n{rank0}"));
    assert!(at == 40 || at == 50, "resumed at step {at}, not at the checkpoint the kill followed");
    assert_eq!(resumed.first(), Some(&(at + 10)), "the restarted group's first report: {resumed:?}");
    let mut kept: Vec<String> = std::fs::read_dir(killed.join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    kept.sort();
    let newest: Vec<String> =
        [40, 50, 60].iter().map(|&s| checkpoint::step_path(Path::new(""), s).display().to_string()).collect();
    assert_eq!(kept, newest, "the three newest checkpoints are kept");

    // Weights and momentum from the resumed run are the uninterrupted run's.
    let got = final_checkpoint(&killed, steps);
    let (diff, scale) = max_difference(&want, &got);
    assert!(scale > 0.01, "the weights are not trivially zero ({scale})");
    assert_eq!(
        diff, 0.0,
        "the resumed run ends with the uninterrupted run's model (largest difference {diff})"
    );
}

#[test]
fn a_rank_whose_peer_dies_exits_with_the_retryable_peer_lost_code() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};
    use tandem_api::contract::{self, LaunchEnv, Role};

    let _one = one_job_at_a_time();
    let tmp = tempfile::tempdir().unwrap();
    let mut doc = example_yaml("mnist-allreduce.yaml");
    set(&mut doc, &["spec", "workers", "groupSize"], 2.into());
    set(&mut doc, &["spec", "training", "steps"], 100_000.into());
    let job: tandem_api::TrainingJob = serde_yaml::from_value(doc).unwrap();
    let config = tandem::runner::local_config("peer-lost", &job.spec).unwrap();
    std::fs::write(tmp.path().join("job.json"), config.to_json()).unwrap();
    std::fs::write(tmp.path().join("token"), "peer-lost-token").unwrap();
    let rank = |rank: u32| {
        let launch = LaunchEnv {
            role: Role::Worker { group: 0, rank },
            config: tmp.path().join("job.json"),
            token_file: tmp.path().join("token"),
            bind: "127.0.0.1".to_owned(),
            output: tmp.path().join("out"),
            attempt: 0,
        };
        Command::new(env!("CARGO_BIN_EXE_tandem"))
            .args(["worker", "--device", "cpu"])
            .envs(launch.to_vars())
            .env("TANDEM_DATA_DIR", data_dir())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (mut survivor, mut victim) = (rank(0), rank(1));
    let mut lines = BufReader::new(survivor.stdout.take().unwrap()).lines();
    assert!(lines.any(|l| l.is_ok_and(|l| l.contains("\"progress\""))), "rank 0 never trained");
    victim.kill().unwrap();
    victim.wait().unwrap();

    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(status) = survivor.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            survivor.kill().unwrap();
            panic!("rank 0 did not stop within 120 s of losing rank 1");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut survivor.stderr.take().unwrap(), &mut stderr).unwrap();
    // Not 1 (permanent): the operator and the local runner retry it like the lost rank's own exit.
    assert_eq!(status.code(), Some(contract::EXIT_PEER_LOST), "{status:?}\nstderr:\n{stderr}");
    assert!(stderr.contains("rank 1"), "the error names the lost peer:\n{stderr}");
}
