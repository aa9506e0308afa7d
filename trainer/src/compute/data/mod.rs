//! Training data: MNIST IDX and CSV readers, the built-in data sets (MNIST-5k, scikit-learn's 8×8
//! digits), seeded synthetic data, the deterministic train/test split, and sharded, shuffled batching.
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

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use tandem_api::{DataSource, DataSpec};

use crate::compute::rng::Rng;

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

/// A labelled image classification data set held in memory.
#[derive(Clone, Debug, PartialEq)]
pub struct Dataset {
    /// Where it came from, for messages.
    pub name: String,
    /// Sample shape.
    pub shape: InputShape,
    /// Number of classes; every label is below it.
    pub classes: usize,
    /// `len() × shape.features()` values, sample-major.
    pub features: Vec<f32>,
    /// One label per sample.
    pub labels: Vec<u32>,
}

impl Dataset {
    /// Number of samples.
    pub fn len(&self) -> usize {
        self.labels.len()
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
            out.labels.push(self.labels[i as usize]);
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
        }
    }
}

/// How to read a CSV file.
#[derive(Clone, Debug, PartialEq)]
pub struct CsvOptions {
    /// Zero-based label column; `None` means the last one.
    pub label_column: Option<usize>,
    /// Number of classes; labels must lie in `[0, classes)`. `None`: labels must lie in
    /// `[0, MAX_CLASSES)` and the class count is the largest label + 1.
    pub classes: Option<usize>,
    /// Divide feature values by this (e.g. 255 for 8-bit pixels).
    pub scale: f32,
    /// Sample shape; `None`: a square image when the feature count is a square, else 1×1×n.
    pub shape: Option<InputShape>,
}

/// Largest class count accepted when a CSV's classes are not known in advance.
pub const MAX_CLASSES: usize = 1000;

fn format_err(path: &Path, place: String, message: impl Into<String>) -> DataError {
    DataError::Format { path: path.to_owned(), place, message: message.into() }
}

/// Opens a file, decompressing it when its name ends in `.gz`.
fn open(path: &Path) -> Result<Box<dyn Read>, DataError> {
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

fn square_shape(features: usize) -> InputShape {
    let side = (features as f64).sqrt().round() as usize;
    if side * side == features {
        InputShape { channels: 1, height: side, width: side }
    } else {
        InputShape { channels: 1, height: 1, width: features }
    }
}

/// Reads a CSV file (optionally gzipped) of numeric features and an integer label per line. A first
/// line that is not all numbers is taken as a header and skipped; empty lines are skipped.
pub fn read_csv(path: &Path, opts: &CsvOptions) -> Result<Dataset, DataError> {
    let reader = BufReader::new(open(path)?);
    let mut features = Vec::new();
    let mut labels = Vec::new();
    let mut columns: Option<usize> = opts.shape.map(|s| s.features() + 1);
    let max_classes = opts.classes.unwrap_or(MAX_CLASSES);
    let mut row = Vec::new();
    for (i, line) in reader.lines().enumerate() {
        let n = i + 1;
        let place = || format!("line {n}");
        let line = line.map_err(|e| {
            let why = if e.kind() == std::io::ErrorKind::UnexpectedEof {
                "file ends early (truncated download?); delete it and run `make data` again".to_owned()
            } else {
                e.to_string()
            };
            format_err(path, place(), why)
        })?;
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        row.clear();
        let mut bad = None;
        for (c, field) in line.split(',').enumerate() {
            match field.trim().parse::<f32>() {
                Ok(v) if v.is_finite() => row.push(v),
                _ => {
                    bad = Some((c, field.to_owned()));
                    break;
                }
            }
        }
        if let Some((c, field)) = bad {
            if n == 1 && labels.is_empty() {
                continue; // header
            }
            return Err(format_err(path, place(), format!("column {} is {field:?}, not a number", c + 1)));
        }
        let expected = *columns.get_or_insert(row.len());
        if row.len() != expected {
            return Err(format_err(
                path,
                place(),
                format!(
                    "has {} columns, expected {expected} like the lines before (truncated file?)",
                    row.len()
                ),
            ));
        }
        if expected < 2 {
            return Err(format_err(path, place(), "needs at least one feature column and a label column"));
        }
        let lc = opts.label_column.unwrap_or(expected - 1);
        if lc >= expected {
            return Err(DataError::Config(format!(
                "{}: label column {lc} does not exist, lines have {expected} columns (0-based index)",
                path.display()
            )));
        }
        let label = row[lc];
        if label < 0.0 || label.fract() != 0.0 || label as usize >= max_classes {
            return Err(format_err(
                path,
                place(),
                format!(
                    "label {label} in column {} is out of range: labels are integers in [0, {max_classes})",
                    lc + 1
                ),
            ));
        }
        labels.push(label as u32);
        features.extend(row.iter().enumerate().filter(|&(c, _)| c != lc).map(|(_, &v)| v / opts.scale));
    }
    let Some(columns) = columns.filter(|_| !labels.is_empty()) else {
        return Err(format_err(path, "line 1".into(), "no data rows"));
    };
    let shape = opts.shape.unwrap_or_else(|| square_shape(columns - 1));
    let classes = opts.classes.unwrap_or_else(|| labels.iter().max().map_or(0, |&m| m as usize + 1));
    Ok(Dataset { name: path.display().to_string(), shape, classes, features, labels })
}

/// IDX magic numbers (big-endian): unsigned bytes, 3 dimensions (images) or 1 (labels).
const IDX_IMAGES: u32 = 0x0000_0803;
const IDX_LABELS: u32 = 0x0000_0801;

fn read_idx_file(path: &Path, magic: u32) -> Result<(Vec<usize>, Vec<u8>), DataError> {
    let mut bytes = Vec::new();
    open(path)?.read_to_end(&mut bytes).map_err(|e| {
        format_err(path, "record 1".into(), format!("cannot decompress ({e}): truncated or corrupt file"))
    })?;
    let word = |i: usize| -> Option<u32> {
        bytes.get(4 * i..4 * i + 4).map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    };
    let found = word(0).ok_or_else(|| format_err(path, "header".into(), "shorter than an IDX header"))?;
    if found != magic {
        return Err(format_err(
            path,
            "header".into(),
            format!(
                "magic number {found:#010x}, expected {magic:#010x} (IDX {})",
                if magic == IDX_IMAGES { "images" } else { "labels" }
            ),
        ));
    }
    let ndims = (magic & 0xff) as usize;
    let dims: Vec<usize> = (1..=ndims)
        .map(|i| word(i).map(|d| d as usize))
        .collect::<Option<_>>()
        .ok_or_else(|| format_err(path, "header".into(), "header ends before its dimensions"))?;
    let start = 4 * (1 + ndims);
    let record: usize = dims[1..].iter().product();
    let body = &bytes[start..];
    if body.len() < dims[0] * record {
        let complete = body.len() / record.max(1);
        return Err(format_err(
            path,
            format!("record {}", complete + 1),
            format!(
                "file ends early: header promises {} records, only {complete} are complete (truncated?)",
                dims[0]
            ),
        ));
    }
    let body = body[..dims[0] * record].to_vec();
    Ok((dims, body))
}

/// Reads an MNIST-format pair of IDX files (optionally gzipped): images (magic 2051, u8 N×H×W) and
/// labels (magic 2049, u8 N), with `classes` classes.
pub fn read_idx(images: &Path, labels: &Path, classes: usize) -> Result<Dataset, DataError> {
    let (dims, pixels) = read_idx_file(images, IDX_IMAGES)?;
    let (ldims, lab) = read_idx_file(labels, IDX_LABELS)?;
    if ldims[0] != dims[0] {
        return Err(DataError::Config(format!(
            "{} has {} images but {} has {} labels",
            images.display(),
            dims[0],
            labels.display(),
            ldims[0]
        )));
    }
    if let Some(i) = lab.iter().position(|&l| l as usize >= classes) {
        return Err(format_err(
            labels,
            format!("record {}", i + 1),
            format!("label {} is out of range [0, {classes})", lab[i]),
        ));
    }
    Ok(Dataset {
        name: images.display().to_string(),
        shape: InputShape { channels: 1, height: dims[1], width: dims[2] },
        classes,
        features: pixels.iter().map(|&p| p as f32 / 255.0).collect(),
        labels: lab.iter().map(|&l| l as u32).collect(),
    })
}

/// Seeded synthetic classification data: each class has a random prototype image, each sample is its
/// class's prototype plus Gaussian noise. Same seed, same data.
pub fn synthetic(samples: usize, shape: InputShape, classes: usize, seed: u64) -> Dataset {
    let d = shape.features();
    let mut rng = Rng::derive(seed, 0x5157);
    let protos: Vec<f32> = (0..classes * d).map(|_| rng.next_f32()).collect();
    let mut features = Vec::with_capacity(samples * d);
    let mut labels = Vec::with_capacity(samples);
    for _ in 0..samples {
        let c = rng.below(classes as u64) as usize;
        labels.push(c as u32);
        features.extend(protos[c * d..(c + 1) * d].iter().map(|&p| p + 0.5 * rng.normal()));
    }
    Dataset { name: format!("synthetic(seed {seed})"), shape, classes, features, labels }
}

/// A data set split into training and test samples.
#[derive(Clone, Debug)]
pub struct Splits {
    /// Training samples.
    pub train: Dataset,
    /// Held-out samples.
    pub test: Dataset,
}

/// Seed of every train/test split: fixed, so the test set never depends on the training seed.
const SPLIT_SEED: u64 = 0x7e57;

/// Splits `data` into `len − test` training and `test` test samples, by a fixed permutation.
pub fn split(data: &Dataset, test: usize) -> Result<Splits, DataError> {
    if test == 0 || test >= data.len() {
        return Err(DataError::Config(format!(
            "{}: cannot hold out {test} of {} samples for testing",
            data.name,
            data.len()
        )));
    }
    let mut order: Vec<u32> = (0..data.len() as u32).collect();
    Rng::new(SPLIT_SEED).shuffle(&mut order);
    let (train, test) = order.split_at(data.len() - test);
    Ok(Splits { train: data.select(train), test: data.select(test) })
}

/// File of the MNIST-5k built-in set inside the data folder.
pub const MNIST5K_FILE: &str = "mnist_5k.csv.gz";
/// File of the 8×8 digits built-in set inside the data folder.
pub const DIGITS_FILE: &str = "digits.csv.gz";

/// Loads the training and test sets that `spec` names; built-in files are read from `data_dir`.
pub fn load(spec: &DataSpec, data_dir: &Path, seed: u64) -> Result<Splits, DataError> {
    let label_column = spec.label_column.map(|c| c as usize);
    match spec.source {
        DataSource::Mnist5k => {
            let shape = InputShape { channels: 1, height: 28, width: 28 };
            let opts = CsvOptions { label_column, classes: Some(10), scale: 255.0, shape: Some(shape) };
            split(&read_csv(&data_dir.join(MNIST5K_FILE), &opts)?, 1000)
        }
        DataSource::Digits => {
            let shape = InputShape { channels: 1, height: 8, width: 8 };
            let opts = CsvOptions { label_column, classes: Some(10), scale: 16.0, shape: Some(shape) };
            split(&read_csv(&data_dir.join(DIGITS_FILE), &opts)?, 360)
        }
        DataSource::Synthetic => {
            let n = spec.synthetic_samples.unwrap_or(10_000) as usize;
            let shape = InputShape { channels: 1, height: 28, width: 28 };
            let data = synthetic(n, shape, 10, seed);
            split(&data, (n / 5).max(1))
        }
        DataSource::Path => {
            let path = PathBuf::from(spec.path.as_deref().unwrap_or_default());
            load_path(&path, label_column)
        }
    }
}

/// Loads a user-supplied data set: a CSV file (20% held out for testing), an IDX images file whose
/// labels file has the same name with `labels-idx1` for `images-idx3`, or a folder with MNIST's four
/// standard files (`train-…` for training, `t10k-…` for testing).
pub fn load_path(path: &Path, label_column: Option<usize>) -> Result<Splits, DataError> {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    if path.is_dir() {
        let find = |prefix: &str, kind: &str| -> Result<PathBuf, DataError> {
            for ext in ["", ".gz"] {
                let p = path.join(format!("{prefix}-{kind}-ubyte{ext}"));
                if p.exists() {
                    return Ok(p);
                }
            }
            Err(DataError::Missing { path: path.join(format!("{prefix}-{kind}-ubyte[.gz]")) })
        };
        let train = read_idx(&find("train", "images-idx3")?, &find("train", "labels-idx1")?, 10)?;
        let test = read_idx(&find("t10k", "images-idx3")?, &find("t10k", "labels-idx1")?, 10)?;
        return Ok(Splits { train, test });
    }
    if name.contains("images-idx3") {
        let labels = path.with_file_name(name.replace("images-idx3", "labels-idx1"));
        let data = read_idx(path, &labels, 10)?;
        return split(&data, (data.len() / 5).max(1));
    }
    let opts = CsvOptions { label_column, classes: None, scale: 1.0, shape: None };
    let data = read_csv(path, &opts)?;
    split(&data, (data.len() / 5).max(1))
}

/// Position in the stream of batches: enough to resume it exactly.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DataCursor {
    /// Epoch (0-based).
    pub epoch: u64,
    /// Next batch within the epoch (0-based).
    pub batch: u64,
}

/// Shuffled, sharded mini-batches over a training set for one rank.
#[derive(Debug)]
pub struct Loader {
    data: Dataset,
    batch_size: usize,
    seed: u64,
    rank: usize,
    world: usize,
    cursor: DataCursor,
    order: Vec<u32>,
    order_epoch: Option<u64>,
}

impl Loader {
    /// Batches of `batch_size` for rank `rank` of `world`, shuffled by `seed`.
    pub fn new(
        data: Dataset,
        batch_size: usize,
        seed: u64,
        rank: usize,
        world: usize,
    ) -> Result<Self, DataError> {
        if world == 0 || rank >= world {
            return Err(DataError::Config(format!("rank {rank} is not in a world of {world}")));
        }
        let per_rank = data.len() / world;
        if batch_size == 0 || per_rank < batch_size {
            return Err(DataError::Config(format!(
                "{}: {} training samples over {world} rank(s) give {per_rank} per rank, fewer than one batch of \
                 {batch_size}; lower data.batchSize",
                data.name,
                data.len()
            )));
        }
        Ok(Self {
            data,
            batch_size,
            seed,
            rank,
            world,
            cursor: DataCursor::default(),
            order: vec![],
            order_epoch: None,
        })
    }

    /// Full batches per epoch on this rank.
    pub fn batches_per_epoch(&self) -> u64 {
        ((self.data.len() / self.world) / self.batch_size) as u64
    }

    /// The training set.
    pub fn dataset(&self) -> &Dataset {
        &self.data
    }

    /// Where the next batch comes from.
    pub fn cursor(&self) -> DataCursor {
        self.cursor
    }

    /// Continues from `cursor` (from a checkpoint).
    pub fn seek(&mut self, cursor: DataCursor) -> Result<(), DataError> {
        if cursor.batch >= self.batches_per_epoch() {
            return Err(DataError::Config(format!(
                "data cursor batch {} is past the {} batches of an epoch: the checkpoint was written for other data",
                cursor.batch,
                self.batches_per_epoch()
            )));
        }
        self.cursor = cursor;
        Ok(())
    }

    /// This rank's `len / world` sample indices for `epoch`, disjoint from every other rank's: first
    /// its part of each global batch, in batch order (what [`Loader::next_batch`] serves), then its
    /// share of the samples that do not fill a global batch (unused that epoch).
    pub fn epoch_indices(&self, epoch: u64) -> Vec<u32> {
        let mut order: Vec<u32> = (0..self.data.len() as u32).collect();
        Rng::derive(self.seed, 0xe90c ^ epoch.wrapping_mul(0x9E37_79B9)).shuffle(&mut order);
        let (b, w, r) = (self.batch_size, self.world, self.rank);
        let batches = self.batches_per_epoch() as usize;
        let per_rank = self.data.len() / w;
        let mut mine = Vec::with_capacity(per_rank);
        for j in 0..batches {
            let start = (j * w + r) * b;
            mine.extend_from_slice(&order[start..start + b]);
        }
        let (rest, tail) = (batches * w * b, per_rank - batches * b);
        mine.extend_from_slice(&order[rest + r * tail..rest + (r + 1) * tail]);
        mine
    }

    /// Fills `x` and `y` with the next batch and advances the cursor; returns the batch's cursor.
    pub fn next_batch(&mut self, x: &mut Vec<f32>, y: &mut Vec<u32>) -> DataCursor {
        let at = self.cursor;
        if self.order_epoch != Some(at.epoch) {
            self.order = self.epoch_indices(at.epoch);
            self.order_epoch = Some(at.epoch);
        }
        x.clear();
        y.clear();
        let start = at.batch as usize * self.batch_size;
        for &i in &self.order[start..start + self.batch_size] {
            x.extend_from_slice(self.data.sample(i as usize));
            y.push(self.data.labels[i as usize]);
        }
        self.cursor = if at.batch + 1 == self.batches_per_epoch() {
            DataCursor { epoch: at.epoch + 1, batch: 0 }
        } else {
            DataCursor { epoch: at.epoch, batch: at.batch + 1 }
        };
        at
    }
}
