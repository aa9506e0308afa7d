//! Shard checkpoints: one file per saved version, written atomically and checksummed.
//!
//! Layout: `b"TPSCKPT1"`, u32 LE header length, a JSON header (shard, replicas, vector length,
//! version, names and lengths of the vectors), the vectors as little-endian f32 (weights first,
//! then optimizer state in header order, then the model's non-trainable state), and a CRC-32 of
//! everything before it.
//!
//! Guarantees: a file is written to a temporary name, fsynced, renamed into place and the folder
//! fsynced, so a process killed at any moment leaves either the previous checkpoint or the new
//! one, never a torn file under a checkpoint name. [`latest`] skips files that fail their
//! checksum (logging them) and falls back to the newest good one; the two newest files are kept.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use tandem_api::OptimizerKind;

use super::state::Snapshot;
use crate::compute::optim::OptimizerState;
use crate::ps::wire::Progress;
use crate::util::fs;

const MAGIC: &[u8; 8] = b"TPSCKPT1";
const KEEP: usize = 2;

/// A checkpoint that cannot be written or read.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// Writing failed.
    #[error(
        "cannot write PS checkpoint {path}: {source}; check that the checkpoint volume is mounted and has space"
    )]
    Write {
        /// File or folder.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// Reading the folder failed.
    #[error("cannot read PS checkpoint folder {path}: {source}")]
    Read {
        /// Folder.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// Files exist but none is intact.
    #[error(
        "no intact checkpoint for shard {index} in {dir} ({found} files failed their checks: {first}); restore the volume or remove the files to start over"
    )]
    NoneIntact {
        /// Folder.
        dir: PathBuf,
        /// Shard index.
        index: u32,
        /// Files tried.
        found: usize,
        /// The first file's problem.
        first: String,
    },
}

#[derive(Serialize, Deserialize)]
struct Header {
    index: u32,
    replicas: u32,
    total_len: u64,
    /// Steps the schedule spans; absent in checkpoints written before it was kept.
    #[serde(default)]
    total_steps: u64,
    version: u64,
    values: u64,
    optimizer_kind: OptimizerKind,
    optimizer_updates: u64,
    optimizer: Vec<(String, u64)>,
    /// Each group's reported progress; absent in checkpoints written before it was kept.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    groups: Vec<GroupProgress>,
    /// Length of the model's non-trainable state (shard 0), whose values follow the optimizer
    /// state's; absent when 0 and in checkpoints written before it was kept.
    #[serde(default, skip_serializing_if = "is_zero")]
    model_state: u64,
}

/// A group's reported progress in the header.
#[derive(Serialize, Deserialize)]
struct GroupProgress {
    group: u32,
    step: u64,
    #[serde(default)]
    loss: Option<f32>,
    #[serde(default)]
    accuracy: Option<f32>,
    #[serde(default)]
    samples: u64,
    #[serde(default)]
    epoch: u32,
}

fn file_name(index: u32, version: u64) -> String {
    format!("shard-{index}-v{version:012}.ckpt")
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn parse_name(name: &str, index: u32) -> Option<u64> {
    let rest = name.strip_prefix(&format!("shard-{index}-v"))?;
    rest.strip_suffix(".ckpt")?.parse().ok()
}

/// Encodes a snapshot as checkpoint bytes.
pub fn encode(snapshot: &Snapshot) -> Vec<u8> {
    let header = Header {
        index: snapshot.index,
        replicas: snapshot.replicas,
        total_len: snapshot.total_len,
        total_steps: snapshot.total_steps,
        version: snapshot.version,
        values: snapshot.values.len() as u64,
        optimizer_kind: snapshot.optimizer.kind,
        optimizer_updates: snapshot.optimizer.updates,
        optimizer: snapshot.optimizer.buffers.iter().map(|(n, v)| (n.clone(), v.len() as u64)).collect(),
        groups: snapshot
            .groups
            .iter()
            .map(|&(group, p)| GroupProgress {
                group,
                step: p.step,
                loss: p.loss,
                accuracy: p.accuracy,
                samples: p.samples,
                epoch: p.epoch,
            })
            .collect(),
        model_state: snapshot.model_state.len() as u64,
    };
    // A struct of numbers and strings always serialises.
    let json = serde_json::to_vec(&header).unwrap_or_default();
    let buffers = &snapshot.optimizer.buffers;
    let floats = snapshot.values.len()
        + buffers.iter().map(|(_, v)| v.len()).sum::<usize>()
        + snapshot.model_state.len();
    let mut out = Vec::with_capacity(MAGIC.len() + 4 + json.len() + floats * 4 + 4);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(json.len() as u32).to_le_bytes());
    out.extend_from_slice(&json);
    let model_state = snapshot.model_state.iter();
    for v in snapshot.values.iter().chain(buffers.iter().flat_map(|(_, v)| v)).chain(model_state) {
        out.extend_from_slice(&v.to_le_bytes());
    }
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Decodes checkpoint bytes, checking magic, checksum and lengths.
pub fn decode(bytes: &[u8]) -> Result<Snapshot, String> {
    if bytes.len() < MAGIC.len() + 8 || &bytes[..MAGIC.len()] != MAGIC {
        return Err("not a Tandem PS checkpoint (bad magic or too short)".into());
    }
    let (body, crc) = bytes.split_at(bytes.len() - 4);
    let want = u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]);
    if crc32fast::hash(body) != want {
        return Err("checksum mismatch: the file is corrupt or was cut short".into());
    }
    let rest = &body[MAGIC.len()..];
    let hlen = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
    let rest = &rest[4..];
    if rest.len() < hlen {
        return Err("header longer than the file".into());
    }
    let header: Header = serde_json::from_slice(&rest[..hlen]).map_err(|e| format!("bad header: {e}"))?;
    let mut floats = rest[hlen..].chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]));
    let expected = header.values + header.optimizer.iter().map(|(_, n)| n).sum::<u64>() + header.model_state;
    if (rest.len() - hlen) as u64 != expected * 4 {
        return Err(format!("holds {} bytes of values, header says {expected} floats", rest.len() - hlen));
    }
    let values: Vec<f32> = floats.by_ref().take(header.values as usize).collect();
    let buffers = header
        .optimizer
        .into_iter()
        .map(|(name, n)| (name, floats.by_ref().take(n as usize).collect()))
        .collect();
    let optimizer =
        OptimizerState { kind: header.optimizer_kind, updates: header.optimizer_updates, buffers };
    let model_state = floats.by_ref().take(header.model_state as usize).collect();
    Ok(Snapshot {
        index: header.index,
        replicas: header.replicas,
        total_len: header.total_len,
        total_steps: header.total_steps,
        version: header.version,
        values,
        optimizer,
        groups: header
            .groups
            .into_iter()
            .map(|g| {
                let GroupProgress { group, step, loss, accuracy, samples, epoch } = g;
                (group, Progress { step, loss, accuracy, samples, epoch })
            })
            .collect(),
        model_state,
    })
}

/// Writes `snapshot` into `dir` atomically and prunes all but the newest files of its shard.
pub fn save(dir: &Path, snapshot: &Snapshot) -> Result<PathBuf, CheckpointError> {
    let path = dir.join(file_name(snapshot.index, snapshot.version));
    fs::write_atomic(&path, &encode(snapshot), None)
        .map_err(|source| CheckpointError::Write { path: path.clone(), source })?;
    let index = snapshot.index;
    // Pruning is best effort: a file left over costs disk, not correctness.
    let _ = fs::keep_newest(dir, KEEP, |name| parse_name(name, index));
    Ok(path)
}

fn versions(dir: &Path, index: u32) -> std::io::Result<Vec<u64>> {
    Ok(fs::numbered(dir, |name| parse_name(name, index))?.into_iter().map(|(v, _)| v).collect())
}

/// The newest intact checkpoint of shard `index` in `dir`; `None` when there is none at all.
pub fn latest(dir: &Path, index: u32) -> Result<Option<Snapshot>, CheckpointError> {
    let mut found = match versions(dir, index) {
        Ok(v) => v,
        Err(source) => return Err(CheckpointError::Read { path: dir.to_path_buf(), source }),
    };
    found.sort_unstable_by(|a, b| b.cmp(a));
    let mut first = None;
    for &v in &found {
        let path = dir.join(file_name(index, v));
        let result = std::fs::read(&path).map_err(|e| e.to_string()).and_then(|b| decode(&b));
        match result {
            Ok(snapshot) => return Ok(Some(snapshot)),
            Err(problem) => {
                tracing::error!(path = %path.display(), %problem, "skipping a PS checkpoint that failed its checks");
                first.get_or_insert(format!("{}: {problem}", path.display()));
            }
        }
    }
    match first {
        None => Ok(None),
        Some(first) => {
            Err(CheckpointError::NoneIntact { dir: dir.to_path_buf(), index, found: found.len(), first })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(version: u64) -> Snapshot {
        Snapshot {
            index: 1,
            replicas: 2,
            total_len: 7,
            total_steps: 100,
            version,
            values: vec![1.0, -2.0, 3.5],
            optimizer: OptimizerState {
                kind: OptimizerKind::Sgd,
                updates: version,
                buffers: vec![("momentum".into(), vec![0.25, 0.5, 0.75])],
            },
            groups: vec![(0, Progress { step: version * 10, loss: Some(0.5), ..Progress::default() })],
            model_state: vec![0.125, -3.0],
        }
    }

    #[test]
    fn save_then_latest_returns_the_newest_and_keeps_two() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        for v in [3, 6, 9] {
            assert!(save(dir.path(), &snap(v)).is_ok());
        }
        let got = latest(dir.path(), 1).ok().flatten();
        assert_eq!(got, Some(snap(9)));
        assert_eq!(versions(dir.path(), 1).map(|v| v.len()).ok(), Some(2));
        assert!(matches!(latest(dir.path(), 0), Ok(None)), "another shard's files are not ours");
    }

    #[test]
    fn a_corrupt_newest_file_falls_back_to_the_previous_one() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        assert!(save(dir.path(), &snap(3)).is_ok());
        let newest = save(dir.path(), &snap(6)).unwrap_or_else(|e| panic!("{e}"));
        let mut bytes = std::fs::read(&newest).unwrap_or_default();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0xff;
        assert!(std::fs::write(&newest, &bytes).is_ok());
        assert_eq!(latest(dir.path(), 1).ok().flatten(), Some(snap(3)));
        assert!(std::fs::write(dir.path().join(file_name(1, 3)), b"garbage").is_ok());
        assert!(matches!(latest(dir.path(), 1), Err(CheckpointError::NoneIntact { found: 2, .. })));
    }

    #[test]
    fn every_truncation_is_detected() {
        let bytes = encode(&snap(1));
        for cut in 0..bytes.len() {
            assert!(decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        assert_eq!(decode(&bytes), Ok(snap(1)));
    }

    #[test]
    fn a_checkpoint_without_group_progress_still_reads() {
        // A header as written before group progress and model state were kept: no such keys.
        let old = Snapshot { groups: Vec::new(), model_state: Vec::new(), ..snap(4) };
        let bytes = encode(&old);
        let hlen = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize;
        let header = std::str::from_utf8(&bytes[12..12 + hlen]).unwrap_or_default();
        assert!(!header.contains("groups") && !header.contains("model_state"), "{header}");
        assert_eq!(decode(&bytes), Ok(old));
    }
}
