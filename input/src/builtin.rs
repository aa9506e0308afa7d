//! The data sets a spec names: the built-in ones (MNIST-5k, scikit-learn's 8×8 digits,
//! Fashion-MNIST, Shakespeare's text, seeded synthetic images or tokens), read from the data
//! folder, and a user's files (`source: path`).
//!
//! Guarantees: MNIST-5k splits 4,000/1,000, the digits 1,437/360 and Fashion-MNIST 60,000/10,000
//! (its own split); pixel values are scaled to [0, 1]; a text is split as [`super::text`] says;
//! a missing built-in file is an error that names the command that fetches it.

use std::path::{Path, PathBuf};

use tandem_api::{DataSource, DataSpec, TrainingJobSpec};

use super::augment::Transform;
use super::csv::{CsvOptions, read_csv};
use super::idx::read_idx;
use super::split::{Splits, split};
use super::synthetic::{synthetic, synthetic_tokens};
use super::text::{BYTE_VOCAB, read_bytes, read_text, split_text};
use super::{DataError, InputShape, JobData, ShardSet, TrainSet, images};

/// The (height, width) of `shape`.
fn shape_size(shape: InputShape) -> (u32, u32) {
    (shape.height as u32, shape.width as u32)
}

/// File of the MNIST-5k built-in set inside the data folder.
pub const MNIST5K_FILE: &str = "mnist_5k.csv.gz";
/// File of the 8×8 digits built-in set inside the data folder.
pub const DIGITS_FILE: &str = "digits.csv.gz";

/// Folder of Fashion-MNIST's four IDX files inside the data folder.
pub const FASHION_MNIST_DIR: &str = "fashion-mnist";
/// File of Shakespeare's works (plain ASCII text) inside the data folder.
pub const SHAKESPEARE_FILE: &str = "shakespeare.txt";

/// Opens the data of the job `spec`: an image folder's files (`source: images`), read as
/// batches need them, with its test set decoded; every other source as [`load_job`] loads it.
pub fn open_job(spec: &TrainingJobSpec, data_dir: &Path) -> Result<JobData, DataError> {
    let data = &spec.data;
    // How its s3:// locations are reached (every file-based source reads through the store).
    super::store::configure(data.s3.as_ref());
    let size = match data.image_size.as_deref() {
        Some(&[h, w]) => Some((h, w)),
        _ => None,
    };
    let test_path = data.test_path.as_deref().map(Path::new);
    match data.source {
        DataSource::Images => {
            let path = Path::new(data.path.as_deref().unwrap_or_default());
            let folder = images::open(path, test_path, images::Sizing::of(size))?;
            let transform = Transform::of(data, folder.test.shape, spec.training.seed)?;
            let test = images::decode_all(&folder.test, &transform);
            Ok(JobData { train: TrainSet::Images(folder.train), test })
        }
        DataSource::Shards => {
            let train = ShardSet::open(data.path.as_deref().unwrap_or_default(), size)?;
            let mut test_set =
                ShardSet::open(data.test_path.as_deref().unwrap_or_default(), Some(shape_size(train.shape)))?;
            test_set.shape = train.shape;
            let transform = Transform::of(data, train.shape, spec.training.seed)?;
            let test = test_set.decode_all(train.classes, &transform)?;
            Ok(JobData { train: TrainSet::Shards(train), test })
        }
        _ => Ok(load_job(spec, data_dir)?.into()),
    }
}

/// Loads the training and test sets of the job `spec`: [`load`]'s for a classifier; for a
/// language model (`model.kind: gpt`) the windows of `model.context` tokens of its text (or of
/// synthetic tokens).
pub fn load_job(spec: &TrainingJobSpec, data_dir: &Path) -> Result<Splits, DataError> {
    if !spec.model.kind.is_language_model() {
        return load(&spec.data, data_dir, spec.training.seed);
    }
    let context = spec.model.context.unwrap_or(0) as usize;
    if context == 0 {
        return Err(DataError::Config("model kind gpt needs model.context, the tokens per sample".into()));
    }
    match spec.data.source {
        DataSource::Shakespeare => {
            let path = data_dir.join(SHAKESPEARE_FILE);
            split_text(&read_bytes(&path)?, context, BYTE_VOCAB, &path.display().to_string())
        }
        DataSource::Text => {
            let path = Path::new(spec.data.path.as_deref().unwrap_or_default());
            let (tokens, vocab) = read_text(path, spec.data.tokens.unwrap_or_default())?;
            split_text(&tokens, context, vocab, &path.display().to_string())
        }
        DataSource::Synthetic => {
            let n = spec.data.synthetic_samples.unwrap_or(10_000) as usize;
            let vocab = spec.data.synthetic_classes.unwrap_or(256) as usize;
            let data = synthetic_tokens(n, context, vocab, spec.training.seed);
            split(&data, (n / 5).max(1))
        }
        other => Err(DataError::Config(format!(
            "model kind gpt trains on a text: data.source {other:?} is not one; use shakespeare, text or synthetic"
        ))),
    }
}

/// Loads the training and test sets that `spec` names for a classifier; built-in files are read
/// from `data_dir`.
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
        DataSource::FashionMnist => load_path(&data_dir.join(FASHION_MNIST_DIR), None),
        DataSource::Shakespeare | DataSource::Text => Err(DataError::Config(
            "data.source shakespeare and text are texts: train them with model.kind gpt".into(),
        )),
        DataSource::Synthetic => {
            let n = spec.synthetic_samples.unwrap_or(10_000) as usize;
            let shape = match spec.synthetic_shape.as_deref() {
                Some(&[c, h, w]) => {
                    InputShape { channels: c as usize, height: h as usize, width: w as usize }
                }
                _ => InputShape { channels: 1, height: 28, width: 28 },
            };
            let data = synthetic(n, shape, spec.synthetic_classes.unwrap_or(10) as usize, seed);
            split(&data, (n / 5).max(1))
        }
        DataSource::Images | DataSource::Shards => Err(DataError::Config(format!(
            "data.source {:?} is read as batches need it: open it with open_job",
            spec.source
        ))),
        DataSource::Path => {
            let path = PathBuf::from(spec.path.as_deref().unwrap_or_default());
            load_path(&path, label_column)
        }
    }
}

/// Loads a user-supplied data set: a CSV file (20% held out for testing), an IDX images file whose
/// labels file has the same name with `labels-idx1` for `images-idx3`, or a folder with MNIST's four
/// standard files (`train-…` for training, `t10k-…` for testing); on a local path or in object
/// storage (`s3://<bucket>/<key or prefix>`).
pub fn load_path(path: &Path, label_column: Option<usize>) -> Result<Splits, DataError> {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    if super::store::is_dir(path)? {
        let find = |prefix: &str, kind: &str| -> Result<PathBuf, DataError> {
            for ext in ["", ".gz"] {
                let p = path.join(format!("{prefix}-{kind}-ubyte{ext}"));
                if super::store::exists(&p)? {
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
