//! Checkpoint format: round trip, atomic write, refusal of corrupt and foreign files, PS shards.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use tandem::compute::checkpoint::{
    self, Checkpoint, CheckpointError, CheckpointMeta, FORMAT_VERSION, NamedTensor,
};
use tandem::compute::data::DataCursor;
use tandem::compute::optim::Optimizer;
use tandem_api::{OptimizerKind, OptimizerSpec};

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
        cursor: Some(DataCursor { epoch: 3, batch: 7 }),
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
