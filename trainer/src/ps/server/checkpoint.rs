//! Shard checkpoints: one file per saved version, written atomically, checksummed and stamped
//! with the job they belong to.
//!
//! Layout: `b"TPSCKPT1"`, u32 LE header length, a JSON header (the job's identity, shard,
//! replicas, vector length, version, names and lengths of the vectors), the vectors as
//! little-endian f32 (weights first, then optimizer state in header order, then the model's
//! non-trainable state), and a CRC-32 of everything before it.
//!
//! Expected flow: [`Store::open`] the shard's folder when the server starts (it removes the
//! partial files of a writer killed mid-write), [`Store::latest`] to resume, [`Store::save`] at
//! every checkpoint.
//!
//! Guarantees: a file is written to a temporary name, fsynced, renamed into place and the folder
//! fsynced, so a process killed at any moment leaves either the previous checkpoint or the new
//! one, never a torn file under a checkpoint name; a failed write (a full disk) leaves no
//! temporary file. [`Store::latest`] skips files that fail their checks (logging them) and falls
//! back to the newest good one ([`fs::newest_intact`], the rule worker checkpoints follow too);
//! the two newest files are kept. A file whose lengths or counts do not fit the file or any real
//! run is refused as corrupt, never trusted into an overflow or a huge allocation. A checkpoint of
//! another job — another name or namespace, or the same job with a changed model, data,
//! optimizer, algorithm, seed or length ([`JobIdentity`]) — is refused with both identities
//! named, never resumed from.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use tandem_api::OptimizerKind;
use tandem_api::contract::JobConfig;

use super::state::Snapshot;
use tandem_compute::checkpoint::{MAX_COUNT, config_hash};
use tandem_compute::mirror::Mirror;
use tandem_compute::optim::OptimizerState;
use tandem_input::{DataCursor, DataError};
use tandem_ps::wire::Progress;
use tandem_util::fs::{self, Newest};

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
    /// Copying to or from object storage (`training.checkpoint.url`) failed.
    #[error("PS checkpoints in object storage: {0}")]
    Mirror(#[source] DataError),
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
    /// The snapshot holds what [`decode`] refuses as beyond any run, so it was not written: the
    /// previous checkpoint stays the newest one a restart resumes from.
    #[error(
        "PS checkpoint of version {version} not written: {problem}, which its restore would refuse; the previous checkpoint stays the newest"
    )]
    Unrestorable {
        /// The snapshot's version.
        version: u64,
        /// What is beyond any run.
        problem: String,
    },
    /// The newest intact checkpoint is another job's, or this job's under another configuration.
    #[error("{message}")]
    Foreign {
        /// The file.
        path: PathBuf,
        /// Whose it is, whose this shard is, and what to do.
        message: String,
    },
}

/// Which job a checkpoint belongs to: the TrainingJob's namespace and name, and the hash of the
/// parts of its spec whose change makes the shard's numbers meaningless (the model, the data, the
/// optimizer and its schedule, the algorithm, the seed and the training length — not the number
/// of groups, which scaling changes). By name rather than UID, so that a job deleted and applied
/// again with the same manifest resumes from its checkpoint claim, as a worker checkpoint does.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobIdentity {
    /// `<namespace>/<name>`.
    pub job: String,
    /// [`config_hash`] of the spec's fields above.
    pub config_hash: String,
}

impl JobIdentity {
    /// The identity of the job `config` describes.
    pub fn of(config: &JobConfig) -> Self {
        let (spec, t) = (&config.spec, &config.spec.training);
        let fields = serde_json::json!({
            "model": spec.model,
            "data": spec.data.identity(),
            "optimizer": t.optimizer,
            "algorithm": t.algorithm,
            "seed": t.seed,
            "steps": t.steps,
            "epochs": t.epochs,
        });
        Self { job: format!("{}/{}", config.namespace, config.job_name), config_hash: config_hash(&fields) }
    }
}

impl std::fmt::Display for JobIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hash = &self.config_hash[..self.config_hash.len().min(12)];
        write!(f, "job {} (config hash {hash}…)", self.job)
    }
}

/// What a checkpoint file holds.
#[derive(Clone, Debug, PartialEq)]
pub struct Stored {
    /// Whose it is; `None` in files written before checkpoints carried it.
    pub job: Option<JobIdentity>,
    /// The shard's state.
    pub snapshot: Snapshot,
}

#[derive(Serialize, Deserialize)]
struct Header {
    /// Whose checkpoint it is; absent in checkpoints written before it was kept.
    #[serde(default)]
    job: Option<JobIdentity>,
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
    /// Each group's steps this shard applied whole, as `[group, steps]`; absent in checkpoints
    /// written before it was kept (a restarted group then continues at its last report).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    contributed: Vec<(u32, u64)>,
    /// The epoch plan fixed so far (shard 0): groups per epoch; absent when none was fixed and in
    /// checkpoints written before it was kept.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    epochs: Vec<u32>,
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
    /// Each rank's data cursor after `step`; absent when the group sent none and in checkpoints
    /// written before they were kept.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    cursors: Vec<DataCursor>,
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

/// The checkpoint files of any shard in `dir` (none when it does not exist).
pub fn files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let any_shard = |name: &str| {
        let (index, _) = name.strip_prefix("shard-")?.split_once("-v")?;
        parse_name(name, index.parse().ok()?)
    };
    Ok(fs::numbered(dir, any_shard)?.into_iter().map(|(_, path)| path).collect())
}

/// Encodes a snapshot of `job`'s shard as checkpoint bytes.
pub fn encode(job: &JobIdentity, snapshot: &Snapshot) -> Vec<u8> {
    encode_header(&header(job, snapshot), snapshot)
}

/// The header of `snapshot`'s checkpoint.
fn header(job: &JobIdentity, snapshot: &Snapshot) -> Header {
    Header {
        job: Some(job.clone()),
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
            .map(|(group, p)| GroupProgress {
                group: *group,
                step: p.step,
                loss: p.loss,
                accuracy: p.accuracy,
                samples: p.samples,
                epoch: p.epoch,
                cursors: p.cursors.clone(),
            })
            .collect(),
        contributed: snapshot.contributed.clone(),
        epochs: snapshot.epochs.clone(),
        model_state: snapshot.model_state.len() as u64,
    }
}

fn encode_header(header: &Header, snapshot: &Snapshot) -> Vec<u8> {
    // A struct of numbers and strings always serialises.
    let json = serde_json::to_vec(header).unwrap_or_default();
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

/// Decodes checkpoint bytes, checking magic, checksum, lengths against the file's size and counts
/// against [`MAX_COUNT`].
pub fn decode(bytes: &[u8]) -> Result<Stored, String> {
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
        return Err(format!("header of {hlen} bytes, but only {} bytes follow", rest.len()));
    }
    let header: Header = serde_json::from_slice(&rest[..hlen]).map_err(|e| format!("bad header: {e}"))?;
    check_counts(&header)?;
    let payload = &rest[hlen..];
    // Every length is checked against the payload, so a crafted one cannot overflow the sum or
    // make a large allocation.
    let mut lengths = std::iter::once(header.values)
        .chain(header.optimizer.iter().map(|(_, n)| *n))
        .chain(std::iter::once(header.model_state));
    let floats = lengths.try_fold(0u64, u64::checked_add);
    if floats.and_then(|n| n.checked_mul(4)) != Some(payload.len() as u64) {
        let floats = floats.map_or_else(|| "more than 2^64".to_owned(), |n| n.to_string());
        return Err(format!("holds {} bytes of values, header says {floats} floats", payload.len()));
    }
    let mut floats = payload.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]));
    let values: Vec<f32> = floats.by_ref().take(header.values as usize).collect();
    let buffers = header
        .optimizer
        .into_iter()
        .map(|(name, n)| (name, floats.by_ref().take(n as usize).collect()))
        .collect();
    let optimizer =
        OptimizerState { kind: header.optimizer_kind, updates: header.optimizer_updates, buffers };
    let model_state = floats.by_ref().take(header.model_state as usize).collect();
    let snapshot = Snapshot {
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
                let GroupProgress { group, step, loss, accuracy, samples, epoch, cursors } = g;
                (group, Progress { step, loss, accuracy, samples, epoch, cursors, ..Progress::default() })
            })
            .collect(),
        contributed: header.contributed,
        epochs: header.epochs,
        model_state,
    };
    Ok(Stored { job: header.job, snapshot })
}

/// Refuses counts no run reaches (see [`MAX_COUNT`]): they come from a damaged or crafted file,
/// and arithmetic on them would overflow.
fn check_counts(header: &Header) -> Result<(), String> {
    let counts = [
        ("vector length", header.total_len),
        ("step count", header.total_steps),
        ("version", header.version),
        ("optimizer update count", header.optimizer_updates),
    ];
    let groups = header.groups.iter().flat_map(|g| [("group step", g.step), ("group samples", g.samples)]);
    let contributed = header.contributed.iter().map(|&(_, steps)| ("group contributed steps", steps));
    match counts.into_iter().chain(groups).chain(contributed).find(|&(_, n)| n > MAX_COUNT) {
        Some((what, n)) => Err(format!("{what} {n} is beyond any run (at most {MAX_COUNT})")),
        None => Ok(()),
    }
}

/// Why a file of the folder was not resumed from.
enum Problem {
    /// It does not read or fails its checks: the one before is tried.
    Damaged(String),
    /// It is intact but another job's: nothing older is tried.
    Foreign { found: String, changed: &'static str },
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Problem::Damaged(problem) => f.write_str(problem),
            Problem::Foreign { found, .. } => write!(f, "belongs to {found}"),
        }
    }
}

/// The checkpoint folder of one shard of one job, which one server writes.
#[derive(Clone, Debug)]
pub struct Store {
    dir: PathBuf,
    index: u32,
    job: JobIdentity,
    mirror: Option<Mirror>,
}

impl Store {
    /// The folder `dir` of shard `index` of `job`, taken over by this server: the partial files a
    /// writer killed mid-write left there are removed (the folder is created at the first save).
    pub fn open(dir: PathBuf, index: u32, job: JobIdentity) -> Result<Self, CheckpointError> {
        match fs::remove_partial(&dir, |name| parse_name(name, index)) {
            Ok(0) => {}
            Ok(n) => {
                tracing::info!(dir = %dir.display(), shard = index, removed = n, "removed partial checkpoint files of an interrupted write")
            }
            Err(source) => return Err(CheckpointError::Read { path: dir, source }),
        }
        Ok(Self { dir, index, job, mirror: None })
    }

    /// Keeps the shard's checkpoints in `mirror` too (`training.checkpoint.url`): those only the
    /// object store holds are copied into the folder now (a PS rescheduled to another node, a job
    /// re-created), and the folder is copied there after every save.
    pub fn mirrored(mut self, mirror: Option<Mirror>) -> Result<Self, CheckpointError> {
        if let Some(m) = &mirror {
            let index = self.index;
            let restored = m
                .restore(&self.dir, |name| parse_name(name, index).is_some())
                .map_err(CheckpointError::Mirror)?;
            if restored > 0 {
                tracing::info!(dir = %self.dir.display(), shard = index, restored, "restored checkpoints from object storage");
            }
        }
        self.mirror = mirror;
        Ok(self)
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Writes `snapshot` atomically and prunes all but the newest files of the shard.
    /// A snapshot whose counts [`decode`] would refuse is not written
    /// ([`CheckpointError::Unrestorable`]).
    pub fn save(&self, snapshot: &Snapshot) -> Result<PathBuf, CheckpointError> {
        let header = header(&self.job, snapshot);
        check_counts(&header)
            .map_err(|problem| CheckpointError::Unrestorable { version: snapshot.version, problem })?;
        let path = self.dir.join(file_name(snapshot.index, snapshot.version));
        fs::write_atomic(&path, &encode_header(&header, snapshot), None)
            .map_err(|source| CheckpointError::Write { path: path.clone(), source })?;
        let index = snapshot.index;
        // Pruning is best effort: a file left over costs disk, not correctness.
        let _ = fs::keep_newest(&self.dir, KEEP, |name| parse_name(name, index));
        if let Some(m) = &self.mirror {
            m.push(&self.dir, |name| parse_name(name, index).is_some()).map_err(CheckpointError::Mirror)?;
        }
        Ok(path)
    }

    /// The newest intact checkpoint of the shard; `None` when there is none at all. A damaged file
    /// is skipped for the one before; one of another job stops the search with
    /// [`CheckpointError::Foreign`].
    pub fn latest(&self) -> Result<Option<Snapshot>, CheckpointError> {
        let index = self.index;
        let load = |path: &Path| {
            let bytes = std::fs::read(path).map_err(|e| Problem::Damaged(e.to_string()))?;
            let stored = decode(&bytes).map_err(Problem::Damaged)?;
            self.check_job(stored.job.as_ref())?;
            Ok(stored.snapshot)
        };
        let damaged = |p: &Problem| matches!(p, Problem::Damaged(_));
        let newest = fs::newest_intact(&self.dir, |name| parse_name(name, index), load, damaged)
            .map_err(|source| CheckpointError::Read { path: self.dir.clone(), source })?;
        match newest {
            Newest::Nothing => Ok(None),
            Newest::Loaded { value, .. } => Ok(Some(value)),
            Newest::Refused { path, error } => Err(self.refused(path, error)),
            Newest::NoneIntact { found, newest, error } => Err(CheckpointError::NoneIntact {
                dir: self.dir.clone(),
                index,
                found,
                first: format!("{}: {error}", newest.display()),
            }),
        }
    }

    fn check_job(&self, found: Option<&JobIdentity>) -> Result<(), Problem> {
        let changed = match found {
            Some(found) if *found == self.job => return Ok(()),
            Some(found) if found.job == self.job.job => {
                " (the model, data, optimizer, algorithm, seed or training length changed)"
            }
            _ => "",
        };
        let found = found.map_or_else(
            || {
                "no job it names (written by an earlier tandem, before checkpoints named their job)"
                    .to_owned()
            },
            JobIdentity::to_string,
        );
        Err(Problem::Foreign { found, changed })
    }

    fn refused(&self, path: PathBuf, problem: Problem) -> CheckpointError {
        let (found, changed) = match problem {
            Problem::Foreign { found, changed } => (found, changed),
            Problem::Damaged(problem) => (format!("nothing readable ({problem})"), ""),
        };
        let message = format!(
            "PS checkpoint {} belongs to {found}, but this shard is of {}{changed}; it was not loaded. Give \
             this job a checkpoint folder of its own (another output folder or checkpoint claim), or \
             delete {} to start shard {} afresh",
            path.display(),
            self.job,
            self.dir.display(),
            self.index
        );
        CheckpointError::Foreign { path, message }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(name: &str, hash: &str) -> JobIdentity {
        JobIdentity { job: format!("local/{name}"), config_hash: hash.into() }
    }

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
            groups: vec![(
                0,
                Progress {
                    step: version * 10,
                    loss: Some(0.5),
                    cursors: vec![DataCursor { epoch: 1, batch: 2, sample: Some(70) }, DataCursor::at(1, 2)],
                    ..Progress::default()
                },
            )],
            contributed: vec![(0, version * 10 + 3)],
            model_state: vec![0.125, -3.0],
            epochs: vec![2, 2, 3],
        }
    }

    fn store(dir: &Path, name: &str, hash: &str) -> Store {
        Store::open(dir.to_path_buf(), 1, job(name, hash)).unwrap_or_else(|e| panic!("{e}"))
    }

    fn versions(dir: &Path, index: u32) -> Vec<u64> {
        fs::numbered(dir, |name| parse_name(name, index))
            .unwrap_or_default()
            .into_iter()
            .map(|(v, _)| v)
            .collect()
    }

    fn stored(version: u64) -> Stored {
        Stored { job: Some(job("a", "h")), snapshot: snap(version) }
    }

    #[test]
    fn save_then_latest_returns_the_newest_and_keeps_two() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let s = store(dir.path(), "a", "h");
        for v in [3, 6, 9] {
            assert!(s.save(&snap(v)).is_ok());
        }
        assert_eq!(s.latest().ok().flatten(), Some(snap(9)));
        assert_eq!(versions(dir.path(), 1).len(), 2);
        let shard0 =
            Store::open(dir.path().to_path_buf(), 0, job("a", "h")).unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(shard0.latest(), Ok(None)), "another shard's files are not ours");
    }

    #[test]
    fn a_snapshot_its_restore_would_refuse_is_not_written() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let s = store(dir.path(), "a", "h");
        assert!(s.save(&snap(3)).is_ok());
        let mut beyond = snap(6);
        beyond.contributed = vec![(0, u64::MAX)];
        let err = s.save(&beyond).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(
            err.contains("version 6 not written")
                && err.contains(&format!("group contributed steps {} is beyond any run", u64::MAX)),
            "{err}"
        );
        beyond = snap(6);
        beyond.groups[0].1.step = MAX_COUNT + 1;
        assert!(matches!(s.save(&beyond), Err(CheckpointError::Unrestorable { version: 6, .. })));
        // The previous checkpoint stays the newest, and resumes.
        assert_eq!(versions(dir.path(), 1), vec![3]);
        assert_eq!(s.latest().ok().flatten(), Some(snap(3)));
    }

    #[test]
    fn a_corrupt_newest_file_falls_back_to_the_previous_one() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let s = store(dir.path(), "a", "h");
        assert!(s.save(&snap(3)).is_ok());
        let newest = s.save(&snap(6)).unwrap_or_else(|e| panic!("{e}"));
        let mut bytes = std::fs::read(&newest).unwrap_or_default();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0xff;
        assert!(std::fs::write(&newest, &bytes).is_ok());
        assert_eq!(s.latest().ok().flatten(), Some(snap(3)));
        assert!(std::fs::write(dir.path().join(file_name(1, 3)), b"garbage").is_ok());
        assert!(matches!(s.latest(), Err(CheckpointError::NoneIntact { found: 2, .. })));
    }

    #[test]
    fn another_jobs_checkpoint_is_refused_naming_both_jobs() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        assert!(store(dir.path(), "a", "h1").save(&snap(3)).is_ok());
        let err = store(dir.path(), "b", "h1").latest().map(|_| ()).unwrap_err().to_string();
        for part in ["belongs to job local/a (config hash h1…)", "this shard is of job local/b", "delete"] {
            assert!(err.contains(part), "{part:?} missing from: {err}");
        }
        assert!(err.contains(&dir.path().display().to_string()), "{err}");
        let err = store(dir.path(), "a", "h2").latest().map(|_| ()).unwrap_err().to_string();
        assert!(
            err.contains("the model, data, optimizer, algorithm, seed or training length changed"),
            "{err}"
        );
        // An intact foreign newest file is no damage: nothing older is resumed instead.
        let s = store(dir.path(), "a", "h1");
        assert!(s.save(&snap(2)).is_ok());
        assert!(store(dir.path(), "b", "h1").save(&snap(4)).is_ok());
        assert!(matches!(s.latest(), Err(CheckpointError::Foreign { .. })));
    }

    #[test]
    fn a_checkpoint_without_a_job_is_refused() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        // A header as written before checkpoints named their job: no `job` key.
        let bytes = encode(&job("a", "h"), &snap(5));
        let hlen = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize;
        let mut header: serde_json::Value = serde_json::from_slice(&bytes[12..12 + hlen]).unwrap_or_default();
        header.as_object_mut().map(|h| h.remove("job"));
        let old = reencode(&bytes, &header);
        assert_eq!(decode(&old).map(|s| s.job), Ok(None));
        assert!(std::fs::write(dir.path().join(file_name(1, 5)), old).is_ok());
        let err = store(dir.path(), "a", "h").latest().map(|_| ()).unwrap_err().to_string();
        assert!(err.contains("before checkpoints named their job"), "{err}");
    }

    #[test]
    fn partial_files_of_an_interrupted_write_are_removed_when_the_store_opens() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        assert!(store(dir.path(), "a", "h").save(&snap(3)).is_ok());
        // What a process killed between creating and renaming its temporary file leaves.
        let partial = dir.path().join(format!(".{}.tmp-4242", file_name(1, 6)));
        let other_shard = dir.path().join(format!(".{}.tmp-4242", file_name(0, 6)));
        assert!(std::fs::write(&partial, b"TPSCKPT1 half").is_ok());
        assert!(std::fs::write(&other_shard, b"TPSCKPT1 half").is_ok());
        let s = store(dir.path(), "a", "h");
        assert!(!partial.exists(), "the partial file is removed");
        assert!(other_shard.exists(), "another shard's writer owns its own files");
        assert_eq!(s.latest().ok().flatten(), Some(snap(3)));
    }

    #[test]
    fn every_truncation_is_detected() {
        let bytes = encode(&job("a", "h"), &snap(1));
        for cut in 0..bytes.len() {
            assert!(decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        assert_eq!(decode(&bytes), Ok(stored(1)));
    }

    /// `bytes` with its header replaced by `header` and the checksum made right again.
    fn reencode(bytes: &[u8], header: &serde_json::Value) -> Vec<u8> {
        let hlen = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize;
        let json = serde_json::to_vec(header).unwrap_or_default();
        let mut out = bytes[..8].to_vec();
        out.extend_from_slice(&(json.len() as u32).to_le_bytes());
        out.extend_from_slice(&json);
        out.extend_from_slice(&bytes[12 + hlen..bytes.len() - 4]);
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    #[test]
    fn crafted_lengths_and_counts_are_refused_without_overflow() {
        let bytes = encode(&job("a", "h"), &snap(2));
        let hlen = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize;
        let header: serde_json::Value = serde_json::from_slice(&bytes[12..12 + hlen]).unwrap_or_default();
        let crafted = |edit: &dyn Fn(&mut serde_json::Value)| {
            let mut h = header.clone();
            edit(&mut h);
            decode(&reencode(&bytes, &h))
        };
        let max = serde_json::json!(u64::MAX);
        for key in ["values", "model_state", "total_len", "total_steps", "version", "optimizer_updates"] {
            let result = crafted(&|h| h[key] = max.clone());
            assert!(result.is_err(), "{key} = 2^64-1 must be refused, got {result:?}");
        }
        // Lengths that sum past 2^64 (each alone fits), and a buffer longer than the file.
        let sum = crafted(&|h| {
            h["values"] = serde_json::json!(1u64 << 63);
            h["optimizer"] = serde_json::json!([["momentum", 1u64 << 63], ["second", 3]]);
        });
        assert!(sum.as_ref().is_err_and(|e| e.contains("more than 2^64")), "{sum:?}");
        let long = crafted(&|h| h["optimizer"] = serde_json::json!([["momentum", 1u64 << 40]]));
        assert!(long.as_ref().is_err_and(|e| e.contains("header says")), "{long:?}");
        let step = crafted(&|h| h["groups"][0]["step"] = max.clone());
        assert!(step.as_ref().is_err_and(|e| e.contains("group step")), "{step:?}");
        let contributed = crafted(&|h| h["contributed"][0][1] = max.clone());
        assert!(contributed.as_ref().is_err_and(|e| e.contains("contributed steps")), "{contributed:?}");
        // A header length beyond the file.
        let mut long_header = bytes.clone();
        long_header[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        let n = long_header.len() - 4;
        let crc = crc32fast::hash(&long_header[..n]);
        long_header[n..].copy_from_slice(&crc.to_le_bytes());
        assert!(decode(&long_header).is_err_and(|e| e.contains("header of")));
    }

    #[test]
    fn a_checkpoint_without_group_progress_still_reads() {
        // A header as written before group progress and model state were kept: no such keys.
        let old = Snapshot {
            groups: Vec::new(),
            contributed: Vec::new(),
            model_state: Vec::new(),
            epochs: Vec::new(),
            ..snap(4)
        };
        let bytes = encode(&job("a", "h"), &old);
        let hlen = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize;
        let header = std::str::from_utf8(&bytes[12..12 + hlen]).unwrap_or_default();
        assert!(
            ["groups", "contributed", "model_state", "epochs"].iter().all(|k| !header.contains(k)),
            "{header}"
        );
        assert_eq!(decode(&bytes).map(|s| s.snapshot), Ok(old));
    }
}
