//! Image folders (`source: images`): the ImageFolder layout `<root>/<class>/<file>.jpg|jpeg|png`,
//! classes numbered in the order of their names, decoded with the `image` crate as batches need
//! the files, so only the list of files is held in memory. The root is a local folder or an
//! `s3://<bucket>/<prefix>` whose keys have that layout ([`super::store`] lists and reads both).
//!
//! Expected flow: [`open`] lists the classes and files and reads every file's header (size and
//! colour, not its pixels) to fix the sample shape; [`ImageFolder`] then serves batches, its
//! files decoded and augmented ahead of the step by the [`super::pipeline`].
//!
//! Guarantees:
//! - The sample shape comes from the data: grey images give one channel, and three (RGB, alpha
//!   dropped) as soon as one image has colour; height and width are the images' own, or
//!   `data.imageSize` (every image resized to it), which images of different sizes require — a
//!   clear error says so, naming two files that differ.
//! - Pixels are scaled to [0, 1], channel-major (C × H × W), as every model reads them.
//! - Sharding is [`super::Loader`]'s: each epoch permutes the files by (seed, epoch) and rank r of w
//!   decodes the r-th slice of every global batch, so each file is used once per epoch by exactly one
//!   rank and p ranks step like one process with the p× batch.
//! - A file that cannot be read or decoded is skipped with a warning naming it, and counted
//!   ([`Source::skipped`]), never an error: at the scan it leaves the list; during training its
//!   place in the batch goes to the next file of the rank's epoch order (wrapping to its start),
//!   and the cursor records where the order continues, so a resumed stream sees no file twice.
//! - The test set is `data.testPath` if given, else the folder's `test/` (or `val/`) subfolder
//!   when the classes sit under `train/`, else a fixed fifth of the files (the split that
//!   [`super::split()`] uses, so it never depends on the training seed). It is decoded into memory.

use std::io::{BufRead, Cursor, Read, Seek};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use image::{DynamicImage, ImageDecoder, ImageReader};

use super::augment::Transform;
use super::pipeline::{Decode, Feed, Flow, Item, Load, Pipeline, Plan, Producer};
use super::split::held_out;
use super::store;
use super::table::rank_indices;
use super::{DataCursor, DataError, Dataset, InputShape, Prep, Source};

/// The file name extensions read as images (case-insensitive).
pub const IMAGE_EXTENSIONS: [&str; 3] = ["jpg", "jpeg", "png"];

/// One image of a folder: its file and class.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageFile {
    /// The file.
    pub path: PathBuf,
    /// Its class: the position of its folder's name among the sorted class names.
    pub label: u32,
}

/// An image folder's index: the classes, the files and the shape they are decoded to.
#[derive(Clone, Debug)]
pub struct ImageSet {
    /// Where it came from, for messages.
    pub name: String,
    /// Class names, sorted; a label is a position in this list.
    pub classes: Vec<String>,
    /// The readable files, class by class, each class's files sorted by name.
    pub files: Vec<ImageFile>,
    /// What every image is decoded to.
    pub shape: InputShape,
    /// Files left out at the scan because their header could not be read.
    pub skipped: u64,
}

/// An image folder's training and test images (see the module documentation for the layout).
#[derive(Clone, Debug)]
pub struct FolderSplits {
    /// Training images.
    pub train: ImageSet,
    /// Test images (not decoded yet).
    pub test: ImageSet,
}

/// A file's header: its size and whether it has colour.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Header {
    pub(crate) width: u32,
    pub(crate) height: u32,
    pub(crate) color: bool,
}

/// The size images are decoded to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sizing {
    /// Every image resized to (height, width).
    Fixed(u32, u32),
    /// The images' own size, which must be the same for all.
    Own,
    /// The first image's size, the others resized to it (for tools that only list the files).
    First,
}

impl Sizing {
    /// `Fixed` for a given (height, width), else `Own`.
    pub fn of(size: Option<(u32, u32)>) -> Self {
        size.map_or(Sizing::Own, |(h, w)| Sizing::Fixed(h, w))
    }
}

/// Lists the training and test images of the folder `root` (with `test` as the test set's folder
/// when given), to be decoded at the size `sizing` says.
pub fn open(root: &Path, test: Option<&Path>, sizing: Sizing) -> Result<FolderSplits, DataError> {
    let (train_root, test_root) = match test {
        Some(t) => (root.to_owned(), Some(t.to_owned())),
        None => {
            match ["test", "val"].iter().map(|n| root.join(n)).find(|p| store::is_dir(p).unwrap_or(false)) {
                Some(t) if store::is_dir(&root.join("train")).unwrap_or(false) => {
                    (root.join("train"), Some(t))
                }
                _ => (root.to_owned(), None),
            }
        }
    };
    let classes = class_names(&train_root)?;
    let (train_files, train_headers, train_skipped) = scan(&train_root, &classes)?;
    let (test_files, test_headers, test_skipped) = match &test_root {
        Some(t) => {
            let names = class_names(t)?;
            if let Some(extra) = names.iter().find(|n| !classes.contains(n)) {
                return Err(DataError::Config(format!(
                    "test images {}: class folder {extra:?} is not a class of the training images in {} \
                     (whose classes are {classes:?}); give both folders the same classes",
                    t.display(),
                    train_root.display()
                )));
            }
            scan(t, &classes)?
        }
        None => (Vec::new(), Vec::new(), 0),
    };
    let headers: Vec<(&Path, Header)> = train_files
        .iter()
        .zip(&train_headers)
        .chain(test_files.iter().zip(&test_headers))
        .map(|(f, h)| (f.path.as_path(), *h))
        .collect();
    let shape = shape_of(&train_root, &headers, sizing)?;
    let set = |name: String, files: Vec<ImageFile>, skipped: u64| ImageSet {
        name,
        classes: classes.clone(),
        files,
        shape,
        skipped,
    };
    let (train, test) = match test_root {
        Some(t) => (
            set(train_root.display().to_string(), train_files, train_skipped),
            set(t.display().to_string(), test_files, test_skipped),
        ),
        None => {
            let n = train_files.len();
            if n < 2 {
                return Err(DataError::Config(format!(
                    "image folder {}: {n} readable image(s), too few to hold out a test set; add images or \
                     set data.testPath",
                    train_root.display()
                )));
            }
            let (train, test) = held_out(n, (n / 5).max(1));
            let pick = |ix: &[u32]| -> Vec<ImageFile> {
                let mut v: Vec<ImageFile> = ix.iter().map(|&i| train_files[i as usize].clone()).collect();
                v.sort_by(|a, b| (a.label, &a.path).cmp(&(b.label, &b.path)));
                v
            };
            let name = train_root.display().to_string();
            (
                set(format!("{name} (training images)"), pick(&train), train_skipped),
                set(format!("{name} (held-out images)"), pick(&test), 0),
            )
        }
    };
    if train.files.is_empty() {
        return Err(DataError::Config(format!(
            "image folder {}: no readable .jpg, .jpeg or .png file under its class folders",
            train_root.display()
        )));
    }
    Ok(FolderSplits { train, test })
}

/// The class folders of `root`, sorted by name.
fn class_names(root: &Path) -> Result<Vec<String>, DataError> {
    let names: Vec<String> = store::list(root)?.into_iter().filter(|e| e.dir).map(|e| e.name).collect();
    if names.is_empty() {
        return Err(DataError::Config(format!(
            "image folder {} has no class folders: lay it out as {}/<class>/<file>.png (or .jpg), one folder per class",
            root.display(),
            root.display()
        )));
    }
    Ok(names)
}

/// The image files of each class folder of `root` (as numbered by `classes`) with their headers,
/// and how many files were skipped because their header could not be read.
fn scan(root: &Path, classes: &[String]) -> Result<(Vec<ImageFile>, Vec<Header>, u64), DataError> {
    let (mut files, mut headers, mut skipped) = (Vec::new(), Vec::new(), 0u64);
    for name in class_names(root)? {
        let Some(label) = classes.iter().position(|c| *c == name) else { continue };
        let dir = root.join(&name);
        let paths: Vec<PathBuf> =
            store::list(&dir)?.into_iter().map(|e| e.path).filter(|p| is_image(p)).collect();
        for (path, reader) in paths.clone().into_iter().zip(store::readers(paths)) {
            match reader.map_err(|e| e.to_string()).and_then(|r| header_of(ImageReader::new(r))) {
                Ok(h) => {
                    files.push(ImageFile { path, label: label as u32 });
                    headers.push(h);
                }
                Err(e) => {
                    skipped += 1;
                    tracing::warn!(
                        "skipping unreadable image {}: {e} ({skipped} skipped in {})",
                        path.display(),
                        root.display()
                    );
                }
            }
        }
    }
    Ok((files, headers, skipped))
}

/// Whether `path` has an image extension.
pub fn is_image(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| IMAGE_EXTENSIONS.iter().any(|x| x.eq_ignore_ascii_case(e)))
}

pub(crate) fn header_of<R: BufRead + Seek>(reader: ImageReader<R>) -> Result<Header, String> {
    let decoder =
        reader.with_guessed_format().map_err(|e| e.to_string())?.into_decoder().map_err(|e| e.to_string())?;
    let (width, height) = decoder.dimensions();
    Ok(Header { width, height, color: decoder.color_type().has_color() })
}

/// The shape of the images `headers` decode to, resized to `size` when given.
fn shape_of(root: &Path, headers: &[(&Path, Header)], sizing: Sizing) -> Result<InputShape, DataError> {
    let channels = if headers.iter().any(|(_, h)| h.color) { 3 } else { 1 };
    let (height, width) = match sizing {
        Sizing::Fixed(h, w) => (h, w),
        Sizing::Own | Sizing::First => {
            let Some(&(first, h0)) = headers.first() else {
                return Err(DataError::Config(format!("image folder {}: no readable image", root.display())));
            };
            if sizing == Sizing::Own
                && let Some((other, h)) =
                    headers.iter().find(|(_, h)| (h.width, h.height) != (h0.width, h0.height))
            {
                return Err(DataError::Config(format!(
                    "image folder {}: images differ in size ({} is {}×{}, {} is {}×{}); set data.imageSize: \
                     [height, width] to resize them all",
                    root.display(),
                    first.display(),
                    h0.width,
                    h0.height,
                    other.display(),
                    h.width,
                    h.height
                )));
            }
            (h0.height, h0.width)
        }
    };
    Ok(InputShape { channels, height: height as usize, width: width as usize })
}

/// Decodes the image that `reader` reads.
pub fn decode_image<R: BufRead + Seek>(reader: ImageReader<R>) -> Result<DynamicImage, String> {
    reader.with_guessed_format().map_err(|e| e.to_string())?.decode().map_err(|e| e.to_string())
}

/// Decodes the image that `reader` reads into `out` (appended) as `shape`: resized when its size
/// differs, grey or RGB by `shape.channels`, channel-major, scaled to [0, 1].
pub fn decode<R: BufRead + Seek>(
    reader: ImageReader<R>,
    shape: InputShape,
    out: &mut Vec<f32>,
) -> Result<(), String> {
    Transform::plain(shape).eval(decode_image(reader)?, out);
    Ok(())
}

/// Decodes the file (or object) `path` into `out` as `shape` (see [`decode`]).
pub fn decode_file(path: &Path, shape: InputShape, out: &mut Vec<f32>) -> Result<(), String> {
    decode(ImageReader::new(store::reader(path).map_err(|e| e.to_string())?), shape, out)
}

/// Decodes every image of `set` into a data set in memory (the test set) as `transform` prepares
/// a test image, skipping with a warning the files that cannot be decoded.
pub fn decode_all(set: &ImageSet, transform: &Transform) -> Dataset {
    let mut features = Vec::with_capacity(set.files.len() * set.shape.features());
    let mut labels = Vec::with_capacity(set.files.len());
    let mut skipped = set.skipped;
    let readers = store::readers(set.files.iter().map(|f| f.path.clone()));
    for (f, reader) in set.files.iter().zip(readers) {
        match reader.map_err(|e| e.to_string()).and_then(|r| decode_image(ImageReader::new(r))) {
            Ok(image) => {
                transform.eval(image, &mut features);
                labels.push(f.label);
            }
            Err(e) => {
                skipped += 1;
                tracing::warn!(
                    "skipping unreadable image {}: {e} ({skipped} skipped in {})",
                    f.path.display(),
                    set.name
                );
            }
        }
    }
    Dataset::classified(set.name.clone(), set.shape, set.classes.len(), features, labels)
}

/// How the pipeline's threads turn a sample into a training sample: decoded (from a file or an
/// object), then augmented by `transform` for the epoch.
pub(crate) fn train_decoder(transform: Arc<Transform>) -> Decode {
    Arc::new(move |item: &Item, epoch: u64| {
        let image = match &item.load {
            Load::File(path) => {
                decode_image(ImageReader::new(store::reader(path).map_err(|e| e.to_string())?))?
            }
            Load::Bytes(bytes) => decode_image(ImageReader::new(Cursor::new(bytes.as_slice())))?,
            Load::Unreadable(why) => return Err(why.clone()),
        };
        let mut out = Vec::with_capacity(transform.shape.features());
        transform.train(image, epoch, item.id, &mut out);
        Ok(out)
    })
}

/// Batches of an image folder for one rank, decoded and augmented ahead of the step (see the
/// module documentation).
#[derive(Debug)]
pub struct ImageFolder {
    set: Arc<ImageSet>,
    batch_size: usize,
    seed: u64,
    rank: usize,
    world: usize,
    cursor: DataCursor,
    prep: Prep,
    pipeline: Option<Pipeline>,
    skipped: Arc<AtomicU64>,
    /// Waits of the pipelines that a seek replaced.
    waited: Duration,
}

impl ImageFolder {
    /// Batches of `batch_size` images of `set` for rank `rank` of `world`, shuffled by `seed`,
    /// decoded as [`Prep::plain`] says until [`ImageFolder::with_prep`].
    pub fn new(
        set: ImageSet,
        batch_size: usize,
        seed: u64,
        rank: usize,
        world: usize,
    ) -> Result<Self, DataError> {
        super::check_batches(&set.name, set.files.len() as u64, batch_size, rank, world)?;
        let skipped = Arc::new(AtomicU64::new(set.skipped));
        let prep = Prep::plain(set.shape);
        Ok(Self {
            set: Arc::new(set),
            batch_size,
            seed,
            rank,
            world,
            cursor: DataCursor::default(),
            prep,
            pipeline: None,
            skipped,
            waited: Duration::ZERO,
        })
    }

    /// The same batches, transformed and prepared as `prep` says.
    pub fn with_prep(mut self, prep: Prep) -> Self {
        self.prep = prep;
        self.pipeline = None;
        self
    }

    fn start(&mut self) {
        let producer = FolderOrder {
            set: Arc::clone(&self.set),
            batch_size: self.batch_size,
            seed: self.seed,
            rank: self.rank,
            world: self.world,
        };
        let plan = Plan {
            batch: self.batch_size,
            batches: self.batches_per_epoch(),
            features: self.set.shape.features(),
            threads: self.prep.threads,
            prefetch: self.prep.prefetch,
            sequence: (self.set.files.len() / self.world) as u64,
        };
        let decode = train_decoder(Arc::clone(&self.prep.transform));
        self.pipeline = Some(Pipeline::start(producer, decode, plan, self.cursor, Arc::clone(&self.skipped)));
    }
}

/// The files of a rank's epoch order ([`rank_indices`]), from a position on, wrapping at its end.
struct FolderOrder {
    set: Arc<ImageSet>,
    batch_size: usize,
    seed: u64,
    rank: usize,
    world: usize,
}

impl Producer for FolderOrder {
    fn epoch(&mut self, epoch: u64, from: u64, feed: &mut Feed) -> Result<bool, DataError> {
        let order =
            rank_indices(self.set.files.len(), self.batch_size, self.seed, epoch, self.rank, self.world);
        if order.is_empty() {
            return Ok(false);
        }
        let n = order.len() as u64;
        // Objects are fetched here, [`store::CONCURRENCY`] ahead of the one sent, so a store's
        // latency overlaps; local files are opened by the decoding threads.
        let mut fetched = self.set.files.first().is_some_and(|f| store::is_remote(&f.path)).then(|| {
            let (set, order) = (Arc::clone(&self.set), order.clone());
            store::readers(
                (from..).map(move |pos| set.files[order[(pos % n) as usize] as usize].path.clone()),
            )
        });
        let mut pos = from;
        loop {
            let i = order[(pos % n) as usize];
            let file = &self.set.files[i as usize];
            let load = match fetched.as_mut().and_then(Iterator::next) {
                None => Load::File(file.path.clone()),
                Some(Ok(mut reader)) => {
                    let mut bytes = Vec::new();
                    match reader.read_to_end(&mut bytes) {
                        Ok(_) => Load::Bytes(bytes),
                        Err(e) => Load::Unreadable(e.to_string()),
                    }
                }
                Some(Err(e)) => Load::Unreadable(e.to_string()),
            };
            let item = Item {
                pos,
                id: u64::from(i),
                label: file.label,
                name: file.path.display().to_string(),
                load,
            };
            match feed.send(item) {
                Flow::Continue => pos += 1,
                Flow::EpochDone => return Ok(true),
                Flow::Gone => return Ok(false),
            }
        }
    }
}

impl Source for ImageFolder {
    fn name(&self) -> &str {
        &self.set.name
    }

    fn shape(&self) -> InputShape {
        self.set.shape
    }

    fn classes(&self) -> usize {
        self.set.classes.len()
    }

    fn samples(&self) -> u64 {
        self.set.files.len() as u64
    }

    fn batches_per_epoch(&self) -> u64 {
        tandem_api::plan::steps_per_epoch(self.samples(), self.world as u64, self.batch_size as u64)
    }

    fn cursor(&self) -> DataCursor {
        self.cursor
    }

    fn seek(&mut self, cursor: DataCursor) -> Result<(), DataError> {
        super::check_seek(cursor, self.batches_per_epoch())?;
        self.cursor = cursor;
        if let Some(p) = self.pipeline.take() {
            self.waited += p.waited();
        }
        Ok(())
    }

    fn skipped(&self) -> u64 {
        self.skipped.load(Ordering::Relaxed)
    }

    fn waited(&self) -> Duration {
        self.waited + self.pipeline.as_ref().map_or(Duration::ZERO, Pipeline::waited)
    }

    fn next_batch(&mut self, x: &mut Vec<f32>, y: &mut Vec<u32>) -> Result<DataCursor, DataError> {
        if self.pipeline.is_none() {
            self.start();
        }
        let Some(pipeline) = self.pipeline.as_mut() else { return Err(super::pipeline::stopped()) };
        let (at, next) = pipeline.next(x, y)?;
        self.cursor = next;
        Ok(at)
    }

    fn set_share(&mut self, rank: usize, world: usize, at: DataCursor) -> Result<(), DataError> {
        super::check_batches(&self.set.name, self.set.files.len() as u64, self.batch_size, rank, world)?;
        (self.rank, self.world) = (rank, world);
        // The seek stops the pipeline, whose batches ahead were the old share's.
        self.seek(at)
    }
}
