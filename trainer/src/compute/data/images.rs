//! Image folders (`source: images`): the ImageFolder layout `<root>/<class>/<file>.jpg|jpeg|png`,
//! classes numbered in the order of their names, decoded with the `image` crate as batches need
//! the files, so only the list of files is held in memory. The root is a local folder or an
//! `s3://<bucket>/<prefix>` whose keys have that layout ([`super::store`] lists and reads both).
//!
//! Expected flow: [`open`] lists the classes and files and reads every file's header (size and
//! colour, not its pixels) to fix the sample shape; [`ImageFolder`] then serves batches, decoding
//! each batch's files.
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
//!   place in the batch goes to the next readable file of the rank's epoch order.
//! - The test set is `data.testPath` if given, else the folder's `test/` (or `val/`) subfolder
//!   when the classes sit under `train/`, else a fixed fifth of the files (the split that
//!   [`super::split()`] uses, so it never depends on the training seed). It is decoded into memory.

use std::collections::BTreeSet;
use std::io::{BufRead, Seek};
use std::path::{Path, PathBuf};

use image::{DynamicImage, ImageDecoder, ImageReader};

use super::split::held_out;
use super::store;
use super::table::rank_indices;
use super::{DataCursor, DataError, Dataset, InputShape, Source};

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

/// Decodes the image that `reader` reads into `out` (appended) as `shape`: resized when its size
/// differs, grey or RGB by `shape.channels`, channel-major, scaled to [0, 1].
pub fn decode<R: BufRead + Seek>(
    reader: ImageReader<R>,
    shape: InputShape,
    out: &mut Vec<f32>,
) -> Result<(), String> {
    let image =
        reader.with_guessed_format().map_err(|e| e.to_string())?.decode().map_err(|e| e.to_string())?;
    let (w, h) = (shape.width as u32, shape.height as u32);
    let image = if (image.width(), image.height()) == (w, h) {
        image
    } else {
        image.resize_exact(w, h, image::imageops::FilterType::Triangle)
    };
    append_pixels(&image, shape.channels, out);
    Ok(())
}

fn append_pixels(image: &DynamicImage, channels: usize, out: &mut Vec<f32>) {
    const SCALE: f32 = 1.0 / 255.0;
    if channels == 1 {
        out.extend(image.to_luma8().as_raw().iter().map(|&v| v as f32 * SCALE));
    } else {
        let rgb = image.to_rgb8();
        for c in 0..3 {
            out.extend(rgb.as_raw().chunks_exact(3).map(|px| px[c] as f32 * SCALE));
        }
    }
}

/// Decodes the file (or object) `path` into `out` as `shape` (see [`decode`]).
pub fn decode_file(path: &Path, shape: InputShape, out: &mut Vec<f32>) -> Result<(), String> {
    decode(ImageReader::new(store::reader(path).map_err(|e| e.to_string())?), shape, out)
}

/// Decodes every image of `set` into a data set in memory (the test set), skipping with a
/// warning the files that cannot be decoded.
pub fn decode_all(set: &ImageSet) -> Dataset {
    let mut features = Vec::with_capacity(set.files.len() * set.shape.features());
    let mut labels = Vec::with_capacity(set.files.len());
    let mut skipped = set.skipped;
    let readers = store::readers(set.files.iter().map(|f| f.path.clone()).collect());
    for (f, reader) in set.files.iter().zip(readers) {
        let before = features.len();
        let decoded = reader
            .map_err(|e| e.to_string())
            .and_then(|r| decode(ImageReader::new(r), set.shape, &mut features));
        match decoded {
            Ok(()) => labels.push(f.label),
            Err(e) => {
                features.truncate(before);
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

/// Batches of an image folder for one rank, decoded as they are served (see the module
/// documentation).
#[derive(Debug)]
pub struct ImageFolder {
    set: ImageSet,
    batch_size: usize,
    seed: u64,
    rank: usize,
    world: usize,
    cursor: DataCursor,
    order: Vec<u32>,
    order_epoch: Option<u64>,
    /// Files that failed to decode during training (never tried again).
    bad: BTreeSet<u32>,
    skipped: u64,
}

impl ImageFolder {
    /// Batches of `batch_size` images of `set` for rank `rank` of `world`, shuffled by `seed`.
    pub fn new(
        set: ImageSet,
        batch_size: usize,
        seed: u64,
        rank: usize,
        world: usize,
    ) -> Result<Self, DataError> {
        super::check_batches(&set.name, set.files.len() as u64, batch_size, rank, world)?;
        let skipped = set.skipped;
        Ok(Self {
            set,
            batch_size,
            seed,
            rank,
            world,
            cursor: DataCursor::default(),
            order: Vec::new(),
            order_epoch: None,
            bad: BTreeSet::new(),
            skipped,
        })
    }

    /// Decodes file `i` into `x`, or records it as bad (with a warning) and returns false.
    fn try_decode(&mut self, i: u32, x: &mut Vec<f32>) -> bool {
        if self.bad.contains(&i) {
            return false;
        }
        let before = x.len();
        let file = &self.set.files[i as usize];
        match decode_file(&file.path, self.set.shape, x) {
            Ok(()) => true,
            Err(e) => {
                x.truncate(before);
                self.bad.insert(i);
                self.skipped += 1;
                tracing::warn!(
                    "skipping unreadable image {}: {e} ({} skipped on this rank)",
                    file.path.display(),
                    self.skipped
                );
                false
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
        ((self.set.files.len() / self.world) / self.batch_size) as u64
    }

    fn cursor(&self) -> DataCursor {
        self.cursor
    }

    fn seek(&mut self, cursor: DataCursor) -> Result<(), DataError> {
        super::check_seek(cursor, self.batches_per_epoch())?;
        self.cursor = cursor;
        Ok(())
    }

    fn skipped(&self) -> u64 {
        self.skipped
    }

    fn next_batch(&mut self, x: &mut Vec<f32>, y: &mut Vec<u32>) -> Result<DataCursor, DataError> {
        let at = self.cursor;
        if self.order_epoch != Some(at.epoch) {
            self.order = rank_indices(
                self.set.files.len(),
                self.batch_size,
                self.seed,
                at.epoch,
                self.rank,
                self.world,
            );
            self.order_epoch = Some(at.epoch);
        }
        x.clear();
        y.clear();
        let start = at.batch as usize * self.batch_size;
        let n = self.order.len();
        for k in start..start + self.batch_size {
            // An unreadable file's place goes to the next readable one of this rank's order.
            let mut served = false;
            for j in 0..n {
                let i = self.order[(k + j) % n];
                if self.try_decode(i, x) {
                    y.push(self.set.files[i as usize].label);
                    served = true;
                    break;
                }
            }
            if !served {
                return Err(DataError::Config(format!(
                    "{}: none of this rank's {n} images can be decoded; see the warnings above",
                    self.set.name
                )));
            }
        }
        self.cursor = super::after(at, self.batches_per_epoch());
        Ok(at)
    }
}
