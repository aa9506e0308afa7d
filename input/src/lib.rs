//! Training data: where a rank's batches come from ([`Source`]: a shuffled table in memory,
//! [`table::Loader`], a stream of shard files, [`stream::ShardStream`], or images decoded and
//! augmented ([`augment`]) by the prefetching [`pipeline`]), the readers ([`csv`], [`idx`]), the
//! data sets a spec names ([`builtin`]: MNIST-5k, scikit-learn's 8×8 digits, a user's files and
//! texts), seeded [`mod@synthetic`] data and the deterministic train/test [`mod@split`].
//!
//! Guarantees:
//! - A file that is truncated, has the wrong number of columns, a value that is not a number, or a label
//!   out of range is refused with an error naming the file and the line (CSV) or record (IDX).
//! - The train/test split depends only on the data set (a fixed seed), never on the training seed, so
//!   every run and every rank evaluates on the same test set. MNIST-5k splits 4,000/1,000.
//! - Batches are a pure function of (seed, epoch, rank, world, batch index): each epoch the training set
//!   is permuted by a generator derived from (seed, epoch) and cut into *global* batches of
//!   `world × batch` samples; rank r of w takes the r-th `batch` samples of each global batch. So at
//!   every step the union of the w ranks' batches is exactly the batch of one process training with
//!   the w× batch (synchronous data-parallel SGD is batch-equivalent), and one rank (w = 1) sees
//!   plain consecutive batches of the permutation. The samples that do not fill a global batch are
//!   left out that epoch (differently each epoch). A [`DataCursor`] is therefore all a checkpoint
//!   needs to resume the exact sequence.
//! - Pixel values are scaled to [0, 1].

pub mod augment;
pub mod builtin;
pub mod csv;
pub mod idx;
pub mod images;
pub(crate) mod pipeline;
pub mod shards;
pub mod split;
pub mod store;
pub mod stream;
pub mod synthetic;
pub mod table;
pub mod text;

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

pub use builtin::{
    DIGITS_FILE, FASHION_MNIST_DIR, MNIST5K_FILE, SHAKESPEARE_FILE, load, load_job, load_path, open_job,
};
pub use csv::{CsvOptions, MAX_CLASSES, read_csv};
pub use idx::read_idx;
pub use images::{ImageFolder, ImageSet};
pub use shards::{ShardReader, ShardSet};
pub use split::{Splits, split};
pub use stream::ShardStream;
pub use synthetic::synthetic;
pub use table::Loader;
/// Sources return it; checkpoints, the PS wire and the group's gathers carry it.
pub use tandem_api::DataCursor;

/// Shape of one input sample: channels × height × width (an MLP sees it flattened).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct InputShape {
    /// Channels.
    pub channels: usize,
    /// Height in pixels.
    pub height: usize,
    /// Width in pixels.
    pub width: usize,
}

impl InputShape {
    /// Values per sample.
    pub fn features(&self) -> usize {
        self.channels * self.height * self.width
    }
}

/// Errors while reading or batching data.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// A built-in data file is not there.
    #[error(
        "data file {path} is missing: run `make data` (scripts/fetch-data.sh) to fetch the built-in data sets"
    )]
    Missing {
        /// The expected path.
        path: PathBuf,
    },
    /// The file could not be read.
    #[error("reading {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The content is malformed.
    #[error("{path}: {place}: {message}")]
    Format {
        /// The file.
        path: PathBuf,
        /// `line N` or `record N` (1-based).
        place: String,
        /// What is wrong.
        message: String,
    },
    /// The data set cannot be used as configured.
    #[error("{0}")]
    Config(String),
}

/// A labelled data set held in memory: images with one class each, or windows of a text's
/// tokens with the next token as the target at every position.
#[derive(Clone, Debug, PartialEq)]
pub struct Dataset {
    /// Where it came from, for messages.
    pub name: String,
    /// Sample shape (a text's windows are `1 × 1 × context` token ids).
    pub shape: InputShape,
    /// Number of classes (a text's vocabulary); every label is below it.
    pub classes: usize,
    /// `len() × shape.features()` values, sample-major.
    pub features: Vec<f32>,
    /// `positions` labels per sample, sample-major.
    pub labels: Vec<u32>,
    /// Targets per sample: 1 for a classifier, the context for a text (the next token at every
    /// position).
    pub positions: usize,
}

impl Dataset {
    /// A classification data set: one label per sample.
    pub fn classified(
        name: String,
        shape: InputShape,
        classes: usize,
        features: Vec<f32>,
        labels: Vec<u32>,
    ) -> Self {
        Self { name, shape, classes, features, labels, positions: 1 }
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.labels.len() / self.positions.max(1)
    }

    /// The targets of sample `i` (its label, or the next token at each position).
    pub fn targets(&self, i: usize) -> &[u32] {
        let k = self.positions.max(1);
        &self.labels[i * k..(i + 1) * k]
    }

    /// Whether there is no sample.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// The features of sample `i`.
    pub fn sample(&self, i: usize) -> &[f32] {
        let d = self.shape.features();
        &self.features[i * d..(i + 1) * d]
    }

    /// The samples at `indices`, in that order.
    pub fn select(&self, indices: &[u32]) -> Dataset {
        let mut out = Dataset { features: Vec::new(), labels: Vec::new(), ..self.clone_meta() };
        out.features.reserve(indices.len() * self.shape.features());
        for &i in indices {
            out.features.extend_from_slice(self.sample(i as usize));
            out.labels.extend_from_slice(self.targets(i as usize));
        }
        out
    }

    fn clone_meta(&self) -> Dataset {
        Dataset {
            name: self.name.clone(),
            shape: self.shape,
            classes: self.classes,
            features: Vec::new(),
            labels: Vec::new(),
            positions: self.positions,
        }
    }
}

pub(crate) fn format_err(path: &Path, place: String, message: impl Into<String>) -> DataError {
    DataError::Format { path: path.to_owned(), place, message: message.into() }
}

/// Opens a file, decompressing it when its name ends in `.gz`.
pub(crate) fn open(path: &Path) -> Result<Box<dyn Read + Send>, DataError> {
    if store::is_remote(path) {
        let (object, _) = store::open(path)?;
        let read: Box<dyn Read + Send> = if path.extension().is_some_and(|e| e == "gz") {
            Box::new(flate2::read::GzDecoder::new(object))
        } else {
            object
        };
        return Ok(read);
    }
    let f = File::open(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            DataError::Missing { path: path.to_owned() }
        } else {
            DataError::Io { path: path.to_owned(), source: e }
        }
    })?;
    if path.extension().is_some_and(|e| e == "gz") {
        Ok(Box::new(flate2::read::GzDecoder::new(BufReader::new(f))))
    } else {
        Ok(Box::new(f))
    }
}

/// Where a rank's training batches come from: a shuffled table in memory ([`Loader`]) or a stream
/// of files read as it goes ([`ShardStream`]).
///
/// Guarantees every implementation gives: batches are a pure function of (seed, epoch, rank,
/// world, batch index), each of `batch size` samples, and a sample is used at most once per epoch
/// by exactly one rank; after [`Source::seek`] to a [`Source::cursor`] the batches continue as
/// they would have. Tables, CSV streams and image folders also give batch equivalence: rank r of
/// w takes the r-th slice of each global batch of w × batch samples, so p ranks step like one
/// process with the p× batch. Tar shards ([`ShardReader`]) give each rank a contiguous run of the
/// epoch's sequence instead, so that a rank reads only its own shards. The image sources skip an
/// unreadable sample and take the next of the rank's sequence in its place; their cursor then
/// records the position of the next unseen sample ([`DataCursor::sample`]), so seeking to it
/// continues exactly, with no sample seen twice or left out.
pub trait Source: std::fmt::Debug + Send {
    /// Where the samples come from, for messages.
    fn name(&self) -> &str;
    /// Shape of one sample.
    fn shape(&self) -> InputShape;
    /// Number of classes; every label is below it.
    fn classes(&self) -> usize;
    /// Training samples over all ranks (what the job plan turns into steps per epoch).
    fn samples(&self) -> u64;
    /// Full batches per epoch on this rank.
    fn batches_per_epoch(&self) -> u64;
    /// Where the next batch comes from.
    fn cursor(&self) -> DataCursor;
    /// Continues from `cursor` (from a checkpoint, or the step a restarted group resumes at).
    fn seek(&mut self, cursor: DataCursor) -> Result<(), DataError>;
    /// Fills `x` and `y` with the next batch and advances the cursor; returns the batch's cursor.
    fn next_batch(&mut self, x: &mut Vec<f32>, y: &mut Vec<u32>) -> Result<DataCursor, DataError>;
    /// Makes this rank `rank` of `world` and continues at `at`: the job's plan splits the epoch
    /// from `at` on over another world (groups were added or removed). Batches being a pure
    /// function of (seed, epoch, rank, world, batch index), epochs served before are unchanged.
    fn set_share(&mut self, rank: usize, world: usize, at: DataCursor) -> Result<(), DataError>;
    /// Samples skipped so far because they could not be read (each named in a warning).
    fn skipped(&self) -> u64 {
        0
    }
    /// Time [`Source::next_batch`] waited for data that was not ready (decoding behind the step).
    fn waited(&self) -> std::time::Duration {
        std::time::Duration::ZERO
    }
}

/// A job's data: the training set (a table in memory, or files read as batches need them) and
/// the test set, in memory.
#[derive(Debug)]
pub struct JobData {
    /// Training samples.
    pub train: TrainSet,
    /// Held-out samples.
    pub test: Dataset,
}

impl From<Splits> for JobData {
    fn from(s: Splits) -> Self {
        JobData { train: TrainSet::Table(s.train), test: s.test }
    }
}

/// Where a job's training samples are: what each rank opens its [`Source`] on.
#[derive(Debug)]
pub enum TrainSet {
    /// A table in memory.
    Table(Dataset),
    /// An image folder's files.
    Images(ImageSet),
    /// Tar shards.
    Shards(ShardSet),
}

impl TrainSet {
    /// Training samples over all ranks.
    pub fn samples(&self) -> u64 {
        match self {
            TrainSet::Table(d) => d.len() as u64,
            TrainSet::Images(s) => s.files.len() as u64,
            TrainSet::Shards(s) => s.total(),
        }
    }

    /// Shape of one sample.
    pub fn shape(&self) -> InputShape {
        match self {
            TrainSet::Table(d) => d.shape,
            TrainSet::Images(s) => s.shape,
            TrainSet::Shards(s) => s.shape,
        }
    }

    /// Number of classes.
    pub fn classes(&self) -> usize {
        match self {
            TrainSet::Table(d) => d.classes,
            TrainSet::Images(s) => s.classes.len(),
            TrainSet::Shards(s) => s.classes,
        }
    }

    /// Rank `rank` of `world`'s batches of `spec.batchSize`, shuffled by `seed`; images are
    /// transformed and prepared as `spec` says ([`Prep::of`]).
    pub fn source(
        self,
        spec: &tandem_api::DataSpec,
        seed: u64,
        rank: usize,
        world: usize,
    ) -> Result<Box<dyn Source>, DataError> {
        let batch_size = spec.batch_size as usize;
        Ok(match self {
            TrainSet::Table(d) => Box::new(Loader::new(d, batch_size, seed, rank, world)?),
            TrainSet::Images(s) => {
                let prep = Prep::of(spec, s.shape, seed)?;
                Box::new(ImageFolder::new(s, batch_size, seed, rank, world)?.with_prep(prep))
            }
            TrainSet::Shards(s) => {
                let prep = Prep::of(spec, s.shape, seed)?;
                Box::new(ShardReader::new(s, batch_size, seed, rank, world)?.with_prep(prep))
            }
        })
    }
}

/// How an image source prepares its batches: the transforms and the pipeline's size.
#[derive(Clone, Debug)]
pub struct Prep {
    /// What is done to each image.
    pub transform: std::sync::Arc<augment::Transform>,
    /// Decoding threads.
    pub threads: usize,
    /// Ready batches queued ahead of the step.
    pub prefetch: usize,
}

impl Prep {
    /// Decoding only (images resized to `shape`), on the default threads, two batches ahead.
    pub fn plain(shape: InputShape) -> Self {
        Self {
            transform: std::sync::Arc::new(augment::Transform::plain(shape)),
            threads: pipeline::default_threads(),
            prefetch: 2,
        }
    }

    /// What `spec` asks for (`augment`, `normalize`, `evalResize`, `loader`) for samples of
    /// `shape`, augmentation seeded by `seed`.
    pub fn of(spec: &tandem_api::DataSpec, shape: InputShape, seed: u64) -> Result<Self, DataError> {
        let loader = spec.loader.clone().unwrap_or_default();
        Ok(Self {
            transform: std::sync::Arc::new(augment::Transform::of(spec, shape, seed)?),
            threads: loader.threads.map_or_else(pipeline::default_threads, |t| t as usize),
            prefetch: loader.prefetch_batches.unwrap_or(2) as usize,
        })
    }
}

/// Refuses a rank outside the world, or fewer than one batch of `batch` per rank of `samples`
/// (what every [`Source`] checks when it opens).
pub(crate) fn check_batches(
    name: &str,
    samples: u64,
    batch: usize,
    rank: usize,
    world: usize,
) -> Result<(), DataError> {
    if world == 0 || rank >= world {
        return Err(DataError::Config(format!("rank {rank} is not in a world of {world}")));
    }
    let per_rank = samples / world as u64;
    if batch == 0 || per_rank < batch as u64 {
        return Err(DataError::Config(format!(
            "{name}: {samples} training samples over {world} rank(s) give {per_rank} per rank, fewer than one batch of \
             {batch}; lower data.batchSize"
        )));
    }
    Ok(())
}

/// Refuses a cursor past the `batches` of an epoch.
pub(crate) fn check_seek(cursor: DataCursor, batches: u64) -> Result<(), DataError> {
    if cursor.batch >= batches {
        return Err(DataError::Config(format!(
            "data cursor batch {} is past the {batches} batches of an epoch: the checkpoint was written for other data",
            cursor.batch
        )));
    }
    Ok(())
}

/// The cursor after `at` in epochs of `batches` batches.
pub(crate) fn after(at: DataCursor, batches: u64) -> DataCursor {
    if at.batch + 1 == batches {
        DataCursor::at(at.epoch + 1, 0)
    } else {
        DataCursor::at(at.epoch, at.batch + 1)
    }
}
