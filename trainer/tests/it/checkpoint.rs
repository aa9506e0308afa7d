//! Checkpoint format: round trip, atomic write, refusal of corrupt and foreign files, PS shards.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use tandem_api::{OptimizerKind, OptimizerSpec};
use tandem_compute::checkpoint::{
    self, Checkpoint, CheckpointError, CheckpointMeta, FORMAT_VERSION, NamedTensor,
};
use tandem_compute::optim::Optimizer;
use tandem_input::DataCursor;

fn sample(kind: &str, range: Option<(usize, usize)>) -> Checkpoint {
    let mut opt =
        Optimizer::new(&OptimizerSpec { kind: OptimizerKind::Adamw, ..OptimizerSpec::default() }, 6);
    let mut p = [0.5f32; 6];
    opt.step(&mut p, &[1.0, -1.0, 0.5, 0.0, 2.0, 3.0], 0.01).unwrap();
    let meta = CheckpointMeta {
        format: FORMAT_VERSION,
        kind: kind.into(),
        step: 42,
        epoch: 3,
        config_hash: checkpoint::config_hash(&serde_json::json!({"model": "x"})),
        rng: Some([1, 2, 3, 4]),
        cursor: Some(DataCursor::at(3, 7)),
        cursors: vec![DataCursor::at(3, 7), DataCursor { epoch: 3, batch: 7, sample: Some(60) }],
        optimizer: Some(opt.state()),
        range,
        extra: serde_json::json!({"note": "hi"}),
        tensors: vec![],
    };
    let tensors = vec![
        NamedTensor { name: "fc1.weight".into(), shape: vec![2, 3], values: p.to_vec() },
        NamedTensor { name: "fc1.bias".into(), shape: vec![2], values: vec![f32::MIN_POSITIVE, -0.0] },
    ];
    Checkpoint::new(meta, tensors).unwrap()
}

#[test]
fn round_trip_is_exact_and_leaves_no_temp_files() {
    let dir = tempfile::tempdir().unwrap();
    let c = sample("worker", None);
    let path = checkpoint::step_path(dir.path(), 42);
    c.write_atomic(&path).unwrap();
    let back = Checkpoint::read(&path).unwrap();
    assert_eq!(back, c);
    assert_eq!(back.optimizer_state().unwrap().buffers.len(), 2);
    assert_eq!(
        back.optimizer_state(),
        Some({
            let mut s = c.meta.optimizer.clone().unwrap();
            s.buffers = back.optimizer_state().unwrap().buffers;
            s
        })
    );
    back.expect(&path, "worker", &c.meta.config_hash).unwrap();
    let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names.len(), 1, "only the checkpoint itself: {names:?}");
    // It is a plain safetensors file that other tools read.
    let bytes = std::fs::read(&path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(st.tensor("fc1.weight").unwrap().shape(), [2, 3]);
}

#[test]
fn any_flipped_byte_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.safetensors");
    sample("worker", None).write_atomic(&path).unwrap();
    let good = std::fs::read(&path).unwrap();
    // Flip one byte at many positions: header, metadata and tensor data.
    for pos in (0..good.len()).step_by(7).chain([good.len() - 1]) {
        let mut bad = good.clone();
        bad[pos] ^= 0x5a;
        match Checkpoint::from_bytes(&path, &bad) {
            Err(CheckpointError::Corrupt { .. } | CheckpointError::Mismatch { .. }) => {}
            Ok(_) => panic!("flipping byte {pos} went unnoticed"),
            Err(e) => panic!("unexpected error kind at {pos}: {e}"),
        }
    }
    let err = Checkpoint::from_bytes(&path, &good[..good.len() - 3]).unwrap_err().to_string();
    assert!(err.contains("corrupt") && err.contains("c.safetensors"), "{err}");
}

#[test]
fn checkpoints_of_other_jobs_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.safetensors");
    let c = sample("worker", None);
    c.write_atomic(&path).unwrap();
    let back = Checkpoint::read(&path).unwrap();
    let err = back.expect(&path, "worker", "0123456789abcdef").unwrap_err().to_string();
    assert!(err.contains("another configuration"), "{err}");
    let err = back.expect(&path, "ps-shard", &c.meta.config_hash).unwrap_err().to_string();
    assert!(err.contains("ps-shard"), "{err}");
}

#[test]
fn a_parameter_server_shard_uses_the_same_format() {
    let dir = tempfile::tempdir().unwrap();
    let c = sample("ps-shard", Some((100, 106)));
    let path = dir.path().join("shard-1.safetensors");
    c.write_atomic(&path).unwrap();
    assert_eq!(Checkpoint::read(&path).unwrap().meta.range, Some((100, 106)));
}

#[test]
fn latest_and_prune_follow_the_step_number() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(checkpoint::latest(dir.path()).unwrap(), None);
    for step in [5, 100, 20] {
        sample("worker", None).write_atomic(&checkpoint::step_path(dir.path(), step)).unwrap();
    }
    assert_eq!(checkpoint::latest(dir.path()).unwrap(), Some(checkpoint::step_path(dir.path(), 100)));
    checkpoint::prune(dir.path(), 2).unwrap();
    assert!(!checkpoint::step_path(dir.path(), 5).exists());
    assert!(checkpoint::step_path(dir.path(), 20).exists());
}

#[test]
fn inconsistent_tensors_are_not_written() {
    let meta = sample("worker", None).meta;
    let bad = vec![NamedTensor { name: "w".into(), shape: vec![2, 2], values: vec![0.0; 3] }];
    assert!(Checkpoint::new(meta, bad).is_err());
}

/// A worker checkpoint of `sample` at `step` whose metadata `edit` changed, with its checksum made
/// right again (a crafted file, not a damaged one).
fn crafted(edit: impl FnOnce(&mut CheckpointMeta)) -> Vec<u8> {
    let mut c = sample("worker", None);
    edit(&mut c.meta);
    c.to_bytes().unwrap()
}

#[test]
fn crafted_counts_are_refused_as_corrupt_instead_of_overflowing() {
    let path = std::path::Path::new("crafted.safetensors");
    type Edit = Box<dyn FnOnce(&mut CheckpointMeta)>;
    let cases: [(&str, Edit); 6] = [
        ("step", Box::new(|m| m.step = u64::MAX)),
        ("epoch", Box::new(|m| m.epoch = u64::MAX)),
        ("data cursor epoch", Box::new(|m| m.cursor = Some(DataCursor::at(u64::MAX, 0)))),
        ("data cursor batch", Box::new(|m| m.cursor = Some(DataCursor::at(0, u64::MAX)))),
        (
            "data cursor sample",
            Box::new(|m| m.cursors[1] = DataCursor { epoch: 0, batch: 0, sample: Some(u64::MAX) }),
        ),
        ("optimizer update count", Box::new(|m| m.optimizer.as_mut().unwrap().updates = u64::MAX)),
    ];
    for (what, edit) in cases {
        match Checkpoint::from_bytes(path, &crafted(edit)) {
            Err(e @ CheckpointError::Corrupt { .. }) => {
                let msg = e.to_string();
                assert!(msg.contains(what) && msg.contains("beyond any run"), "{what}: {msg}");
            }
            other => panic!("{what} = 2^64-1 must be refused as corrupt, got {other:?}"),
        }
    }
    // Counts of a real run still read.
    let real = crafted(|m| m.step = checkpoint::MAX_COUNT);
    assert_eq!(Checkpoint::from_bytes(path, &real).unwrap().meta.step, checkpoint::MAX_COUNT);
}

#[test]
fn newest_intact_falls_back_past_a_damaged_newest_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    assert!(checkpoint::newest_intact(dir.path()).unwrap().is_none());
    for step in [20, 40, 60] {
        let mut c = sample("worker", None);
        c.meta.step = step;
        c.write_atomic(&checkpoint::step_path(dir.path(), step)).unwrap();
    }
    // The newest cut short (a torn copy), the one before with a flipped byte.
    let newest = checkpoint::step_path(dir.path(), 60);
    let bytes = std::fs::read(&newest).unwrap();
    std::fs::write(&newest, &bytes[..bytes.len() / 2]).unwrap();
    let middle = checkpoint::step_path(dir.path(), 40);
    let mut bytes = std::fs::read(&middle).unwrap();
    let at = bytes.len() - 5;
    bytes[at] ^= 0x01;
    std::fs::write(&middle, &bytes).unwrap();
    let found = checkpoint::newest_intact(dir.path()).unwrap().unwrap();
    assert_eq!(
        (found.path, found.checkpoint.meta.step, found.skipped),
        (checkpoint::step_path(dir.path(), 20), 20, 2)
    );
    // All damaged: an error that names the folder and says what to do, not a fresh start.
    std::fs::write(checkpoint::step_path(dir.path(), 20), b"garbage").unwrap();
    let err = checkpoint::newest_intact(dir.path()).unwrap_err();
    assert!(matches!(err, CheckpointError::NoneIntact { found: 3, .. }), "{err}");
    assert!(err.to_string().contains(&dir.path().display().to_string()), "{err}");
}

#[test]
fn partial_files_of_an_interrupted_write_are_removed() {
    let dir = tempfile::tempdir().unwrap();
    sample("worker", None).write_atomic(&checkpoint::step_path(dir.path(), 20)).unwrap();
    let partial = dir.path().join(".ckpt-0000000040.safetensors.tmp-31337");
    std::fs::write(&partial, b"half a checkpoint").unwrap();
    let unrelated = dir.path().join(".notes.tmp-1");
    std::fs::write(&unrelated, b"").unwrap();
    checkpoint::remove_partial(dir.path()).unwrap();
    assert!(!partial.exists() && unrelated.exists());
    assert!(checkpoint::step_path(dir.path(), 20).exists());
}

/// A `tandem ps` of `job` on any port that is expected not to start: its exit and stderr.
fn ps_that_refuses(job: &crate::ps_common::Job) -> (std::process::ExitStatus, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args(["ps", "--port", "0"])
        .envs(job.ps_launch(0).to_vars())
        .output()
        .unwrap();
    (out.status, String::from_utf8_lossy(&out.stderr).into_owned())
}

/// Rewrites `job`'s job.json through `edit`.
fn edit_job(job: &crate::ps_common::Job, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = job.dir.path().join("job.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut config);
    std::fs::write(&path, config.to_string()).unwrap();
}

#[test]
fn a_ps_refuses_the_checkpoint_of_another_job_or_configuration() {
    use crate::ps_common::{Job, worker_config};
    let job = Job::new("ps-async", 0, 1, 1000);
    let mut ps = job.spawn_ps(0, 0);
    let mut client =
        tandem_ps::client::PsClient::connect(worker_config(&[ps.addr.clone()], 0, 0, 0, 4)).unwrap();
    client.init(0, &[1.0; 4]).unwrap();
    client.join().unwrap();
    client.push(0, 0, &[0.25; 4]).unwrap();
    let status = ps.terminate();
    assert_eq!(
        status.code(),
        Some(tandem_api::contract::EXIT_PREEMPTED),
        "SIGTERM writes a last checkpoint and exits retryable, not {status:?}:\n{}",
        ps.log_text()
    );
    drop(client);
    let dir = job.output().join("ps-0");
    let files = || std::fs::read_dir(&dir).unwrap().count();
    assert_eq!(files(), 1);

    // Another job pointed at the same folder (a shared volume, a reused output folder).
    edit_job(&job, |c| c["jobName"] = "another-job".into());
    let (status, stderr) = ps_that_refuses(&job);
    assert!(!status.success(), "another job resumed from ps-test's checkpoint:\n{stderr}");
    for part in [
        "belongs to job local/ps-test (config hash",
        "this shard is of job local/another-job",
        "another output folder or checkpoint claim",
        &format!("delete {}", dir.display()),
    ] {
        assert!(stderr.contains(part), "{part:?} missing from:\n{stderr}");
    }
    // The same job with a changed manifest.
    edit_job(&job, |c| {
        c["jobName"] = "ps-test".into();
        c["spec"]["training"]["optimizer"]["learningRate"] = 0.5.into();
    });
    let (status, stderr) = ps_that_refuses(&job);
    assert!(!status.success() && stderr.contains("training length changed"), "{stderr}");
    assert_eq!(files(), 1, "a refused checkpoint is left as it was");

    // The job's own manifest resumes from it.
    edit_job(&job, |c| c["spec"]["training"]["optimizer"]["learningRate"] = 1.0.into());
    let ps = job.spawn_ps(0, 0);
    let mut observer = job.observer(std::slice::from_ref(&ps.addr));
    assert_eq!(observer.status(0).unwrap()["version"], 1, "{}", ps.log_text());
}
