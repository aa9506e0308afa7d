//! Checkpoints: named `f32` tensors in a safetensors file, with Tandem's JSON metadata (step, epoch,
//! optimizer scalars, RNG state, data cursor, config hash, flat range) and a SHA-256 checksum in the
//! file's `__metadata__`. Workers store the whole flat vector; a parameter-server replica stores its
//! shard (`range`) with the same format.
//!
//! Expected flow: a writer that starts calls [`remove_partial`] on its folder, builds a
//! [`Checkpoint`] and [`Checkpoint::write_atomic`]s it at [`step_path`]; a resume takes
//! [`newest_intact`] and checks it with [`Checkpoint::expect`] against the config hash the reader
//! expects.
//!
//! Guarantees:
//! - Atomic: the file is written to a temporary name in the same folder, fsynced, renamed over the
//!   target and the folder fsynced, so a crash leaves the old checkpoint or the new one, never a
//!   torn one; a failed write (a full disk) leaves no temporary file, and [`remove_partial`]
//!   removes those of a writer killed mid-write.
//! - Verified: the checksum covers the metadata and every tensor's name, shape and bytes; a file that
//!   fails to parse, fails the checksum, holds counts beyond any run ([`MAX_COUNT`]), or was written
//!   by a job with another config hash or kind is refused with an error saying which and what to
//!   do — never half-loaded, never an overflow or a panic.
//! - Resume falls back: [`newest_intact`] skips a damaged newest file for the one before, by the
//!   same rule as the parameter server's checkpoints ([`fs::newest_intact`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use sha2::{Digest, Sha256};

use crate::optim::OptimizerState;
use tandem_input::DataCursor;
use tandem_util::fs;
use tandem_util::token::hex;

/// Version of the metadata layout; bumped on incompatible change.
pub const FORMAT_VERSION: u32 = 1;
/// The largest count (step, epoch, update, sample or vector length) a checkpoint may hold: 2^48,
/// beyond any run (a billion steps a day for 700 years) and the range a group's step travels in
/// (two 24-bit halves). Larger ones come from a damaged or crafted file; refusing them keeps every
/// later `+ 1` from overflowing.
pub const MAX_COUNT: u64 = 1 << 48;
const META_KEY: &str = "tandem.meta";
const SUM_KEY: &str = "tandem.sha256";

/// Errors of checkpoint I/O.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// File system error.
    #[error("checkpoint {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// Not a readable Tandem checkpoint, or damaged.
    #[error(
        "checkpoint {path} is corrupt and was not loaded: {reason}; delete it to resume from an older one or start afresh"
    )]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What failed.
        reason: String,
    },
    /// A valid checkpoint of something else.
    #[error("checkpoint {path} does not belong to this job and was not loaded: {reason}")]
    Mismatch {
        /// The file.
        path: PathBuf,
        /// What differs.
        reason: String,
    },
    /// The checkpoint cannot be built.
    #[error("cannot write checkpoint: {0}")]
    Invalid(String),
    /// Checkpoints exist but none is intact.
    #[error(
        "no intact checkpoint in {dir}: all {found} failed their checks (the newest: {newest}); restore them, or move them away to start afresh"
    )]
    NoneIntact {
        /// The folder.
        dir: PathBuf,
        /// Files tried.
        found: usize,
        /// The newest file's problem.
        newest: String,
    },
}

impl CheckpointError {
    /// Whether the file is damaged (unreadable, torn, failing its checks) rather than intact and
    /// refused: a resume then tries the one before.
    pub fn is_damage(&self) -> bool {
        matches!(self, CheckpointError::Io { .. } | CheckpointError::Corrupt { .. })
    }
}

/// Tandem's metadata of a checkpoint.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CheckpointMeta {
    /// [`FORMAT_VERSION`].
    pub format: u32,
    /// What wrote it: `worker`, `ps-shard`, ….
    pub kind: String,
    /// Optimizer steps completed.
    pub step: u64,
    /// Epoch at the time.
    pub epoch: u64,
    /// Hash of the configuration that shapes the numbers (see [`config_hash`]).
    pub config_hash: String,
    /// Random generator state, if the writer has one.
    #[serde(default)]
    pub rng: Option<[u64; 4]>,
    /// Where the data stream continues, for workers (the writer's own: rank 0's in a group).
    #[serde(default)]
    pub cursor: Option<DataCursor>,
    /// Where each rank of the writer's group continues, in rank order (a stream that skipped
    /// unreadable samples is at a different position on each).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cursors: Vec<DataCursor>,
    /// Optimizer scalars; its buffers are tensors named `optim.<buffer>`.
    #[serde(default)]
    pub optimizer: Option<OptimizerState>,
    /// `[start, end)` of the flat parameter vector held here (a PS shard); `None`: all of it.
    #[serde(default)]
    pub range: Option<(usize, usize)>,
    /// Anything else the writer wants to keep (e.g. an EASGD centre's clock).
    #[serde(default)]
    pub extra: serde_json::Value,
    /// Tensor names in the order the checksum covers them.
    pub tensors: Vec<String>,
}

/// One named tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct NamedTensor {
    /// Name, unique in the checkpoint.
    pub name: String,
    /// Shape; its product is `values.len()`.
    pub shape: Vec<usize>,
    /// Values, row-major.
    pub values: Vec<f32>,
}

/// A checkpoint in memory.
#[derive(Clone, Debug, PartialEq)]
pub struct Checkpoint {
    /// Metadata; `tensors` is filled in by [`Checkpoint::new`].
    pub meta: CheckpointMeta,
    /// The tensors, in checksum order.
    pub tensors: Vec<NamedTensor>,
}

/// SHA-256 (hex) of a JSON value, used as the config hash: the canonical serde_json text of the
/// configuration whose change would make a checkpoint meaningless.
pub fn config_hash(config: &serde_json::Value) -> String {
    hex(&Sha256::digest(config.to_string().as_bytes()))
}

fn checksum(meta_json: &str, tensors: &[NamedTensor]) -> String {
    let mut h = Sha256::new();
    h.update((meta_json.len() as u64).to_le_bytes());
    h.update(meta_json.as_bytes());
    for t in tensors {
        h.update((t.name.len() as u64).to_le_bytes());
        h.update(t.name.as_bytes());
        h.update((t.shape.len() as u64).to_le_bytes());
        for &d in &t.shape {
            h.update((d as u64).to_le_bytes());
        }
        for v in &t.values {
            h.update(v.to_le_bytes());
        }
    }
    hex(&h.finalize())
}

impl Checkpoint {
    /// A checkpoint of `tensors` with `meta` (its `tensors` list is set here). Optimizer buffers in
    /// `meta.optimizer` are added as tensors `optim.<name>`.
    pub fn new(mut meta: CheckpointMeta, mut tensors: Vec<NamedTensor>) -> Result<Self, CheckpointError> {
        if let Some(opt) = meta.optimizer.as_mut() {
            for (name, values) in std::mem::take(&mut opt.buffers) {
                tensors.push(NamedTensor {
                    name: format!("optim.{name}"),
                    shape: vec![values.len()],
                    values,
                });
            }
        }
        let mut seen = std::collections::HashSet::new();
        for t in &tensors {
            if !seen.insert(t.name.as_str()) {
                return Err(CheckpointError::Invalid(format!("tensor name {} appears twice", t.name)));
            }
            if t.shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d)) != Some(t.values.len()) {
                return Err(CheckpointError::Invalid(format!(
                    "tensor {} has shape {:?} but {} values",
                    t.name,
                    t.shape,
                    t.values.len()
                )));
            }
        }
        meta.tensors = tensors.iter().map(|t| t.name.clone()).collect();
        Ok(Self { meta, tensors })
    }

    /// The tensor called `name`.
    pub fn tensor(&self, name: &str) -> Option<&NamedTensor> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The optimizer state with its buffers taken from the `optim.*` tensors.
    pub fn optimizer_state(&self) -> Option<OptimizerState> {
        let mut state = self.meta.optimizer.clone()?;
        state.buffers = self
            .tensors
            .iter()
            .filter_map(|t| t.name.strip_prefix("optim.").map(|n| (n.to_owned(), t.values.clone())))
            .collect();
        Some(state)
    }

    /// The bytes of the safetensors file.
    pub fn to_bytes(&self) -> Result<Vec<u8>, CheckpointError> {
        let meta_json = serde_json::to_string(&self.meta)
            .map_err(|e| CheckpointError::Invalid(format!("metadata: {e}")))?;
        let sum = checksum(&meta_json, &self.tensors);
        let bytes: Vec<Vec<u8>> =
            self.tensors.iter().map(|t| t.values.iter().flat_map(|v| v.to_le_bytes()).collect()).collect();
        let views = self
            .tensors
            .iter()
            .zip(&bytes)
            .map(|(t, b)| TensorView::new(Dtype::F32, t.shape.clone(), b).map(|v| (t.name.as_str(), v)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| CheckpointError::Invalid(e.to_string()))?;
        let info = HashMap::from([(META_KEY.to_owned(), meta_json), (SUM_KEY.to_owned(), sum)]);
        safetensors::tensor::serialize(views, Some(info)).map_err(|e| CheckpointError::Invalid(e.to_string()))
    }

    /// Writes the checkpoint to `path` atomically ([`fs::write_atomic`]).
    pub fn write_atomic(&self, path: &Path) -> Result<(), CheckpointError> {
        let bytes = self.to_bytes()?;
        fs::write_atomic(path, &bytes, None)
            .map_err(|source| CheckpointError::Io { path: path.to_owned(), source })
    }

    /// Reads and verifies the checkpoint at `path`.
    pub fn read(path: &Path) -> Result<Self, CheckpointError> {
        let bytes =
            std::fs::read(path).map_err(|source| CheckpointError::Io { path: path.to_owned(), source })?;
        Self::from_bytes(path, &bytes)
    }

    /// Parses and verifies checkpoint bytes (`path` is for messages).
    pub fn from_bytes(path: &Path, bytes: &[u8]) -> Result<Self, CheckpointError> {
        let corrupt = |reason: String| CheckpointError::Corrupt { path: path.to_owned(), reason };
        let st =
            SafeTensors::deserialize(bytes).map_err(|e| corrupt(format!("not a safetensors file ({e})")))?;
        let (_, header) = SafeTensors::read_metadata(bytes).map_err(|e| corrupt(e.to_string()))?;
        let info = header.metadata().clone().unwrap_or_default();
        let (Some(meta_json), Some(sum)) = (info.get(META_KEY), info.get(SUM_KEY)) else {
            return Err(corrupt("no Tandem metadata: not written by Tandem".into()));
        };
        let meta: CheckpointMeta =
            serde_json::from_str(meta_json).map_err(|e| corrupt(format!("metadata is not valid ({e})")))?;
        if meta.format != FORMAT_VERSION {
            return Err(CheckpointError::Mismatch {
                path: path.to_owned(),
                reason: format!("format version {}, this tandem reads version {FORMAT_VERSION}", meta.format),
            });
        }
        check_counts(&meta).map_err(corrupt)?;
        let mut tensors = Vec::with_capacity(meta.tensors.len());
        for name in &meta.tensors {
            let view = st.tensor(name).map_err(|e| corrupt(format!("tensor {name}: {e}")))?;
            if view.dtype() != Dtype::F32 {
                return Err(corrupt(format!("tensor {name} is {:?}, expected F32", view.dtype())));
            }
            let values =
                view.data().chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
            tensors.push(NamedTensor { name: name.clone(), shape: view.shape().to_vec(), values });
        }
        if st.len() != tensors.len() {
            return Err(corrupt(format!(
                "{} tensors in the file, metadata lists {}",
                st.len(),
                tensors.len()
            )));
        }
        let actual = checksum(meta_json, &tensors);
        if &actual != sum {
            return Err(corrupt(format!("checksum mismatch (stored {sum}, computed {actual})")));
        }
        Ok(Self { meta, tensors })
    }

    /// Refuses a checkpoint written by another kind of writer or another configuration.
    pub fn expect(&self, path: &Path, kind: &str, config_hash: &str) -> Result<(), CheckpointError> {
        let mismatch = |reason| Err(CheckpointError::Mismatch { path: path.to_owned(), reason });
        if self.meta.kind != kind {
            return mismatch(format!("written by a {} , expected a {kind} checkpoint", self.meta.kind));
        }
        if self.meta.config_hash != config_hash {
            return mismatch(format!(
                "written for another configuration (config hash {}…, this job's is {}…): the model, data, \
                 optimizer, seed or length changed; use a fresh output folder or restore the old manifest",
                &self.meta.config_hash[..self.meta.config_hash.len().min(12)],
                &config_hash[..config_hash.len().min(12)]
            ));
        }
        Ok(())
    }
}

/// Refuses counts beyond [`MAX_COUNT`]: arithmetic on them would overflow.
fn check_counts(meta: &CheckpointMeta) -> Result<(), String> {
    let cursors = meta.cursor.iter().chain(&meta.cursors).flat_map(|c| {
        [
            ("data cursor epoch", c.epoch),
            ("data cursor batch", c.batch),
            ("data cursor sample", c.sample.unwrap_or(0)),
        ]
    });
    let counts = [("step", meta.step), ("epoch", meta.epoch)]
        .into_iter()
        .chain(cursors)
        .chain(meta.optimizer.as_ref().map(|o| ("optimizer update count", o.updates)))
        .chain(
            meta.range.into_iter().flat_map(|(a, b)| [("range start", a as u64), ("range end", b as u64)]),
        );
    match counts.into_iter().find(|&(_, n)| n > MAX_COUNT) {
        Some((what, n)) => Err(format!("{what} {n} is beyond any run (at most {MAX_COUNT})")),
        None => Ok(()),
    }
}

/// File name of the checkpoint at `step` in a checkpoint folder.
pub fn step_path(dir: &Path, step: u64) -> PathBuf {
    dir.join(format!("ckpt-{step:010}.safetensors"))
}

/// The checkpoint with the highest step in `dir`, if any (unread: [`newest_intact`] reads and
/// verifies).
pub fn latest(dir: &Path) -> Result<Option<PathBuf>, CheckpointError> {
    Ok(list(dir)?.pop().map(|(_, p)| p))
}

/// The checkpoint a resume starts from ([`newest_intact`]).
#[derive(Clone, Debug)]
pub struct Intact {
    /// Its file.
    pub path: PathBuf,
    /// What it holds, verified.
    pub checkpoint: Checkpoint,
    /// Newer files that were damaged and skipped.
    pub skipped: usize,
}

/// The newest checkpoint in `dir` that reads and verifies; `None` when `dir` holds none. A
/// damaged file ([`CheckpointError::is_damage`]) is logged and skipped for the one before; any
/// other refusal stops the search with its error, and so does a folder of damaged files only
/// ([`CheckpointError::NoneIntact`]).
pub fn newest_intact(dir: &Path) -> Result<Option<Intact>, CheckpointError> {
    let io = |source| CheckpointError::Io { path: dir.to_owned(), source };
    match fs::newest_intact(dir, step_of, Checkpoint::read, CheckpointError::is_damage).map_err(io)? {
        fs::Newest::Nothing => Ok(None),
        fs::Newest::Loaded { path, value, skipped } => Ok(Some(Intact { path, checkpoint: value, skipped })),
        fs::Newest::Refused { error, .. } => Err(error),
        fs::Newest::NoneIntact { found, error, .. } => {
            Err(CheckpointError::NoneIntact { dir: dir.to_owned(), found, newest: error.to_string() })
        }
    }
}

/// Removes the partial files a writer killed mid-write left in `dir` (see
/// [`fs::remove_partial`]); a writer calls it when it starts.
pub fn remove_partial(dir: &Path) -> Result<(), CheckpointError> {
    match fs::remove_partial(dir, step_of) {
        Ok(0) => Ok(()),
        Ok(removed) => {
            tracing::info!(dir = %dir.display(), removed, "removed partial checkpoint files of an interrupted write");
            Ok(())
        }
        Err(source) => Err(CheckpointError::Io { path: dir.to_owned(), source }),
    }
}

/// The step of a checkpoint file name of [`step_path`].
/// Whether `name` is a worker checkpoint's file name (`ckpt-<step>.safetensors`).
pub fn is_checkpoint(name: &str) -> bool {
    step_of(name).is_some()
}

fn step_of(name: &str) -> Option<u64> {
    name.strip_prefix("ckpt-")?.strip_suffix(".safetensors")?.parse().ok()
}

/// Checkpoints in `dir`, by step.
fn list(dir: &Path) -> Result<Vec<(u64, PathBuf)>, CheckpointError> {
    fs::numbered(dir, step_of).map_err(|source| CheckpointError::Io { path: dir.to_owned(), source })
}

/// Deletes all but the newest `keep` checkpoints in `dir`.
pub fn prune(dir: &Path, keep: usize) -> Result<(), CheckpointError> {
    fs::keep_newest(dir, keep, step_of).map_err(|source| CheckpointError::Io { path: dir.to_owned(), source })
}
