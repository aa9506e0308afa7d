//! WebDataset tar shards (`source: shards`): each sample is the consecutive members `<key>.jpg`
//! (or `.jpeg`, `.png`) and `<key>.cls` (its class, a decimal integer) of a tar file, the shards
//! given as a folder of `.tar` files or a brace pattern (`/data/train-{000..009}.tar`). Shards are
//! read in sequence with the `tar` crate, one member at a time, never whole in memory. The folder,
//! pattern or file may be in object storage (`s3://<bucket>/train-{000..009}.tar`): an object is
//! streamed by ranged reads ([`super::store`]), and a failed request is an error, not damage.
//!
//! Expected flow: [`ShardSet::open`] walks every shard's headers once (skipping image data by
//! seeking; reading only the small `.cls` members) to count its samples and classes and to read
//! the first image's shape; [`ShardReader`] then streams a rank's samples: a reader thread reads
//! the tar members in sequence and the [`super::pipeline`]'s threads decode and augment them
//! ahead of the step, through bounded queues.
//!
//! Order and sharding: each epoch visits the shards in a permutation drawn from (seed, epoch),
//! samples in file order; of the epoch's N samples, rank r of w takes the contiguous run
//! `[r·N/w, (r+1)·N/w)`, so each sample is read once per epoch by exactly one rank, and a rank reads
//! about 1/w of the shards (skipping, by headers only, into the first of them). Its batches are
//! consecutive runs of that range; the samples beyond the last full batch are left out that epoch.
//! Samples are shuffled only as the shards are (`tandem data pack` shuffles when it writes them).
//!
//! Guarantees: a truncated member ends its shard at the count pass with a warning naming the shard
//! and the member, and is counted; an image that cannot be decoded, or a `.cls` that is not a
//! class, is skipped with a warning naming the shard and key, and counted ([`Source::skipped`]):
//! its place goes to the next sample of the epoch's sequence. The cursor after every batch
//! records the position of the next unseen sample ([`DataCursor::sample`]: with the epoch's shard
//! order it names the shard and the offset in it), so a stream resumed there continues exactly.
//!
//! Caveats: the sample shape is the first image's (channels too) unless `data.imageSize` is set;
//! other sizes are resized to it. A sample that replaces a corrupt one comes from past the rank's
//! run (the next rank's first), so with corrupt data a sample may be seen by two ranks in an epoch.

use std::fs::File;
use std::io::{Cursor, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use image::ImageReader;

use super::augment::Transform;
use super::images::{self, IMAGE_EXTENSIONS};
use super::pipeline::{Feed, Flow, Item, Load, Pipeline, Plan, Producer};
use super::store;
use super::{DataCursor, DataError, Dataset, InputShape, Prep, Source};
use tandem_util::rng::Rng;

/// The shard files that `location` names: a folder's `.tar` files sorted by name, a brace
/// pattern's expansion (`train-{000..009}.tar`, numbers zero-padded to the first one's width), or
/// one file.
pub fn shard_paths(location: &str) -> Result<Vec<PathBuf>, DataError> {
    let path = Path::new(location);
    if store::is_dir(path)? {
        let found = super::stream::shard_files(path, ".tar")?;
        if found.is_empty() {
            return Err(DataError::Config(format!("{location}: the folder has no .tar shard")));
        }
        return Ok(found);
    }
    let (Some(open), Some(close)) = (location.find('{'), location.find('}')) else {
        return Ok(vec![path.to_owned()]);
    };
    let bad = || {
        DataError::Config(format!(
            "{location}: a shard pattern has one range of numbers in braces, such as train-{{000..009}}.tar"
        ))
    };
    let (lo, hi) = location.get(open + 1..close).and_then(|r| r.split_once("..")).ok_or_else(bad)?;
    let (a, b): (u64, u64) = (lo.parse().map_err(|_| bad())?, hi.parse().map_err(|_| bad())?);
    if a > b || close < open {
        return Err(bad());
    }
    let width = lo.len();
    Ok((a..=b)
        .map(|i| PathBuf::from(format!("{}{i:0width$}{}", &location[..open], &location[close + 1..])))
        .collect())
}

/// One complete sample of a shard, as [`walk`] hands it over.
struct Member<'a> {
    key: &'a str,
    /// The image's bytes, when they were asked for.
    image: Option<Vec<u8>>,
    label: u32,
}

/// What a walk over a shard ended with.
#[derive(Debug, Default)]
struct WalkEnd {
    /// Samples skipped (truncated, no class, unreadable class).
    skipped: u64,
}

/// Calls `each(index, sample)` for the complete samples of the shard `path`, in order (`index`
/// counts them from 0), until it returns false; an image's bytes are read only when
/// `wants(index)`, else skipped by seeking.
fn walk(
    path: &Path,
    wants: impl Fn(u64) -> bool,
    mut each: impl FnMut(u64, Member<'_>) -> bool,
) -> Result<WalkEnd, DataError> {
    let (file, len) = store::open(path)?;
    let mut archive = tar::Archive::new(file);
    let entries =
        archive.entries_with_seek().map_err(|source| DataError::Io { path: path.to_owned(), source })?;
    let mut end = WalkEnd::default();
    let mut g = Gather::default();
    for entry in entries {
        let mut entry = match entry {
            Ok(e) => e,
            Err(e) if store::is_store_error(&e) => return Err(DataError::Config(e.to_string())),
            Err(e) => {
                end.skipped += 1;
                tracing::warn!(
                    "skipping the rest of shard {} after {} samples: it is truncated or damaged (a tar header \
                     cannot be read: {e})",
                    path.display(),
                    g.index
                );
                g.drop_partial();
                break;
            }
        };
        let name = entry.path().map(|p| p.to_string_lossy().into_owned()).unwrap_or_default();
        if !entry.header().entry_type().is_file() {
            continue;
        }
        // WebDataset's key: the path up to the first dot of its last component.
        let (stem, ext) = split_key(&name);
        if stem != g.key {
            if !g.flush(path, &mut end, &mut each) {
                return Ok(end);
            }
            g.key = stem.to_owned();
        }
        if entry.raw_file_position() + entry.size() > len {
            end.skipped += 1;
            tracing::warn!(
                "skipping truncated tar member {name} of shard {} ({} of its {} bytes are there) and the rest of the shard",
                path.display(),
                len.saturating_sub(entry.raw_file_position()),
                entry.size()
            );
            // The sample of this member is lost with it: it is the one counted.
            (g.image, g.label) = (None, None);
            break;
        }
        let ext = ext.to_ascii_lowercase();
        if IMAGE_EXTENSIONS.contains(&ext.as_str()) {
            let bytes = if wants(g.index) {
                let mut b = Vec::with_capacity(entry.size() as usize);
                if let Err(e) = entry.read_to_end(&mut b) {
                    if store::is_store_error(&e) {
                        return Err(DataError::Config(e.to_string()));
                    }
                    end.skipped += 1;
                    tracing::warn!("shard {} ends in an unreadable member {name}: {e}", path.display());
                    (g.image, g.label) = (None, None);
                    break;
                }
                Some(b)
            } else {
                None
            };
            g.image = Some(bytes);
        } else if ext == "cls" {
            let mut text = String::new();
            g.label = Some(match entry.read_to_string(&mut text) {
                Ok(_) => text
                    .trim()
                    .parse::<u32>()
                    .map_err(|_| format!("its .cls holds {:?}, not a class number", text.trim())),
                Err(e) => Err(format!("its .cls cannot be read: {e}")),
            });
        }
    }
    g.flush(path, &mut end, &mut each);
    Ok(end)
}

/// The sample a walk is gathering: its key, image (the bytes, if read) and class, and how many
/// complete samples came before it.
#[derive(Default)]
struct Gather {
    key: String,
    image: Option<Option<Vec<u8>>>,
    label: Option<Result<u32, String>>,
    index: u64,
}

impl Gather {
    /// Forgets the gathered sample unless it is complete (the damage that ended the walk is the
    /// one count of its loss).
    fn drop_partial(&mut self) {
        if self.image.is_none() || self.label.is_none() {
            (self.image, self.label) = (None, None);
        }
    }

    /// Hands the gathered sample to `each` if it is complete (else warns and counts it); returns
    /// whether the walk goes on.
    fn flush(
        &mut self,
        path: &Path,
        end: &mut WalkEnd,
        each: &mut impl FnMut(u64, Member<'_>) -> bool,
    ) -> bool {
        match (self.image.take(), self.label.take()) {
            (Some(bytes), Some(Ok(label))) => {
                let go = each(self.index, Member { key: &self.key, image: bytes, label });
                self.index += 1;
                go
            }
            (None, None) => true,
            (image, label) => {
                end.skipped += 1;
                let why = match (image, label) {
                    (_, Some(Err(e))) => e,
                    (None, _) => "it has a .cls but no .jpg, .jpeg or .png member".to_owned(),
                    _ => "it has an image but no .cls member".to_owned(),
                };
                tracing::warn!("skipping sample {} of shard {}: {why}", self.key, path.display());
                true
            }
        }
    }
}

/// A member name's WebDataset key and extension (`a/b.c.jpg` → `a/b`, `c.jpg`).
fn split_key(name: &str) -> (&str, &str) {
    let base = name.rfind('/').map_or(0, |i| i + 1);
    match name[base..].find('.') {
        Some(dot) => (&name[..base + dot], &name[base + dot + 1..]),
        None => (name, ""),
    }
}

/// A set of tar shards, counted: what each rank streams from.
#[derive(Clone, Debug)]
pub struct ShardSet {
    /// Where it came from, for messages.
    pub name: String,
    /// The shard files.
    pub shards: Vec<PathBuf>,
    /// Complete samples of each shard.
    pub samples: Vec<u64>,
    /// Classes: one more than the largest class seen.
    pub classes: usize,
    /// What every image is decoded to.
    pub shape: InputShape,
    /// Samples skipped by the count pass.
    pub skipped: u64,
}

impl ShardSet {
    /// Counts the shards at `location` (see [`shard_paths`]); images are decoded to `size`
    /// (height, width) when given, else to the first image's size.
    pub fn open(location: &str, size: Option<(u32, u32)>) -> Result<Self, DataError> {
        let shards = shard_paths(location)?;
        let (mut samples, mut classes, mut skipped, mut first) = (Vec::new(), 0usize, 0u64, None::<Vec<u8>>);
        for (s, path) in shards.iter().enumerate() {
            let mut n = 0;
            let need_first = |i: u64| i == 0 && s == 0;
            let end = walk(path, need_first, |i, m| {
                if i == 0 && s == 0 {
                    first = m.image;
                }
                classes = classes.max(m.label as usize + 1);
                n += 1;
                true
            })?;
            skipped += end.skipped;
            samples.push(n);
        }
        let total: u64 = samples.iter().sum();
        let Some(first) = first.filter(|_| total > 0) else {
            return Err(DataError::Config(format!(
                "{location}: no complete sample (<key>.jpg|png with <key>.cls) in {} shard(s)",
                shards.len()
            )));
        };
        let header = images::header_of(ImageReader::new(Cursor::new(&first))).map_err(|e| {
            DataError::Config(format!(
                "{location}: the first image of {} cannot be read: {e}",
                shards[0].display()
            ))
        })?;
        let (height, width) = size.unwrap_or((header.height, header.width));
        let shape = InputShape {
            channels: if header.color { 3 } else { 1 },
            height: height as usize,
            width: width as usize,
        };
        Ok(Self {
            name: format!("{} shard(s) at {location}", shards.len()),
            shards,
            samples,
            classes,
            shape,
            skipped,
        })
    }

    /// The keys of the first `n` samples with their decoded images' sizes (or why they failed).
    pub fn peek(&self, n: usize) -> Result<Vec<(String, String)>, DataError> {
        let mut shown = Vec::new();
        for path in &self.shards {
            if shown.len() >= n {
                break;
            }
            walk(
                path,
                |_| true,
                |_, m| {
                    let what = match m
                        .image
                        .as_deref()
                        .map(|b| ImageReader::new(Cursor::new(b)).with_guessed_format())
                    {
                        Some(Ok(r)) => match r.decode() {
                            Ok(i) => {
                                format!("{}×{} {:?}, class {}", i.width(), i.height(), i.color(), m.label)
                            }
                            Err(e) => format!("cannot be decoded: {e}"),
                        },
                        _ => "cannot be read".to_owned(),
                    };
                    shown.push((format!("{}:{}", path.display(), m.key), what));
                    shown.len() < n
                },
            )?;
        }
        Ok(shown)
    }

    /// Samples over all shards.
    pub fn total(&self) -> u64 {
        self.samples.iter().sum()
    }

    /// Decodes every sample into a data set in memory (the test set), with `classes` classes,
    /// as `transform` prepares a test image.
    pub fn decode_all(&self, classes: usize, transform: &Transform) -> Result<Dataset, DataError> {
        let (mut features, mut labels) = (Vec::new(), Vec::new());
        let mut skipped = self.skipped;
        for path in &self.shards {
            let end = walk(
                path,
                |_| true,
                |_, m| {
                    if let Some(bytes) = m.image {
                        match images::decode_image(ImageReader::new(Cursor::new(&bytes))) {
                            Ok(image) => {
                                transform.eval(image, &mut features);
                                labels.push(m.label);
                            }
                            Err(e) => {
                                skipped += 1;
                                tracing::warn!(
                                    "skipping unreadable image {} of shard {}: {e}",
                                    m.key,
                                    path.display()
                                );
                            }
                        }
                    }
                    true
                },
            )?;
            skipped += end.skipped;
        }
        if skipped > 0 {
            tracing::warn!("{}: {skipped} sample(s) skipped", self.name);
        }
        Ok(Dataset::classified(self.name.clone(), self.shape, classes.max(self.classes), features, labels))
    }
}

/// Batches of tar shards for one rank, read by a thread and decoded and augmented by the
/// pipeline's ahead of the step (see the module documentation).
#[derive(Debug)]
pub struct ShardReader {
    set: Arc<ShardSet>,
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

impl ShardReader {
    /// Batches of `batch_size` samples of `set` for rank `rank` of `world`, shards shuffled by
    /// `seed`, decoded as [`Prep::plain`] says until [`ShardReader::with_prep`].
    pub fn new(
        set: ShardSet,
        batch_size: usize,
        seed: u64,
        rank: usize,
        world: usize,
    ) -> Result<Self, DataError> {
        super::check_batches(&set.name, set.total(), batch_size, rank, world)?;
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

    /// The order in which epoch `epoch` visits the shards.
    pub fn shard_order(&self, epoch: u64) -> Vec<usize> {
        shard_order(self.set.shards.len(), self.seed, epoch)
    }

    /// The shard (an index of [`ShardSet::shards`]) and the sample in it at position `sample`
    /// of this rank's sequence of `epoch` (what [`DataCursor::sample`] counts).
    pub fn locate(&self, epoch: u64, sample: u64) -> Option<(usize, u64)> {
        let set = &self.set;
        let total = set.total();
        let mut at = (self.rank as u64 * (total / self.world as u64) + sample) % total.max(1);
        for s in self.shard_order(epoch) {
            if at < set.samples[s] {
                return Some((s, at));
            }
            at -= set.samples[s];
        }
        None
    }

    /// Starts the reader thread and the decoders at the cursor.
    fn start(&mut self) {
        let producer = ShardSequence {
            set: Arc::clone(&self.set),
            seed: self.seed,
            rank: self.rank as u64,
            world: self.world as u64,
        };
        let plan = Plan {
            batch: self.batch_size,
            batches: self.batches_per_epoch(),
            features: self.set.shape.features(),
            threads: self.prep.threads,
            prefetch: self.prep.prefetch,
            sequence: self.set.total(),
        };
        let decode = images::train_decoder(Arc::clone(&self.prep.transform));
        self.pipeline = Some(Pipeline::start(producer, decode, plan, self.cursor, Arc::clone(&self.skipped)));
    }
}

fn shard_order(shards: usize, seed: u64, epoch: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..shards).collect();
    Rng::derive(seed, 0x7a25 ^ epoch.wrapping_mul(0x9E37_79B9)).shuffle(&mut order);
    order
}

/// What the reader thread reads: a rank's run of every epoch's sequence.
struct ShardSequence {
    set: Arc<ShardSet>,
    seed: u64,
    rank: u64,
    world: u64,
}

impl Producer for ShardSequence {
    /// Reads the epoch's sequence from sample `from` of this rank's run on (wrapping at the
    /// epoch's end), one shard after another, for as long as `feed` asks.
    fn epoch(&mut self, epoch: u64, from: u64, feed: &mut Feed) -> Result<bool, DataError> {
        let set = &self.set;
        let order = shard_order(set.shards.len(), self.seed, epoch);
        let total = set.total().max(1);
        let mut start = (self.rank * (total / self.world) + from) % total;
        let mut first = None;
        for (slot, &s) in order.iter().enumerate() {
            if start < set.samples[s] {
                first = Some((slot, start));
                break;
            }
            start -= set.samples[s];
        }
        let Some((mut slot, mut skip)) = first else {
            return Err(DataError::Config(format!(
                "{}: position {from} is past the end of epoch {epoch}",
                set.name
            )));
        };
        let mut pos = from;
        let mut idle_slots = 0;
        loop {
            let shard = order[slot];
            let path = &set.shards[shard];
            let mut flow = Flow::Continue;
            let mut sent = false;
            walk(
                path,
                |i| i >= skip,
                |i, m| {
                    let Some(bytes) = m.image.filter(|_| i >= skip) else { return true };
                    sent = true;
                    let item = Item {
                        pos,
                        id: ((shard as u64) << 32) | i,
                        label: m.label,
                        name: format!("{}:{}", path.display(), m.key),
                        load: Load::Bytes(bytes),
                    };
                    pos += 1;
                    flow = feed.send(item);
                    flow == Flow::Continue
                },
            )?;
            match flow {
                Flow::EpochDone => return Ok(true),
                Flow::Gone => return Ok(false),
                Flow::Continue => {}
            }
            idle_slots = if sent { 0 } else { idle_slots + 1 };
            if idle_slots > order.len() {
                return Err(DataError::Config(format!(
                    "{}: the shards hold no sample now; did they change while training?",
                    set.name
                )));
            }
            skip = 0;
            slot = (slot + 1) % order.len();
        }
    }
}

impl Source for ShardReader {
    fn name(&self) -> &str {
        &self.set.name
    }

    fn shape(&self) -> InputShape {
        self.set.shape
    }

    fn classes(&self) -> usize {
        self.set.classes
    }

    fn samples(&self) -> u64 {
        self.set.total()
    }

    fn batches_per_epoch(&self) -> u64 {
        tandem_api::plan::steps_per_epoch(self.set.total(), self.world as u64, self.batch_size as u64)
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
        super::check_batches(&self.set.name, self.set.total(), self.batch_size, rank, world)?;
        (self.rank, self.world) = (rank, world);
        // The seek stops the pipeline, whose batches ahead were the old share's.
        self.seek(at)
    }
}

/// What [`pack`] wrote.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PackSummary {
    /// Training shards written.
    pub train_shards: Vec<PathBuf>,
    /// Test shards written.
    pub test_shards: Vec<PathBuf>,
    /// Training samples.
    pub train_samples: u64,
    /// Test samples.
    pub test_samples: u64,
    /// Class names, by label.
    pub classes: Vec<String>,
    /// Files left out because their header could not be read.
    pub skipped: u64,
}

/// Writes the image folder `root` (laid out as [`super::images`] reads it, its test set included)
/// as WebDataset shards into `out`: `train-000000.tar`, … and `test-000000.tar`, …, each closed
/// once it holds `shard_bytes` bytes of images, the samples shuffled by `seed` (so that a shard
/// mixes the classes). The files' bytes are copied, not re-encoded.
pub fn pack(root: &Path, out: &Path, shard_bytes: u64, seed: u64) -> Result<PackSummary, DataError> {
    let folder = images::open(root, None, images::Sizing::First)?;
    std::fs::create_dir_all(out).map_err(|source| DataError::Io { path: out.to_owned(), source })?;
    let mut summary = PackSummary {
        classes: folder.train.classes.clone(),
        skipped: folder.train.skipped + folder.test.skipped,
        ..PackSummary::default()
    };
    for (prefix, set) in [("train", &folder.train), ("test", &folder.test)] {
        let mut order: Vec<usize> = (0..set.files.len()).collect();
        Rng::derive(seed, 0x9ac4).shuffle(&mut order);
        let mut writer =
            ShardWriter { out, prefix, shard_bytes, builder: None, bytes: 0, written: Vec::new() };
        for (n, &i) in order.iter().enumerate() {
            let f = &set.files[i];
            let bytes = store::read(&f.path)?;
            let ext = f.path.extension().and_then(|e| e.to_str()).unwrap_or("png").to_ascii_lowercase();
            writer.add(&format!("{n:09}"), &ext, &bytes, f.label)?;
        }
        let shards = writer.finish()?;
        if prefix == "train" {
            (summary.train_shards, summary.train_samples) = (shards, set.files.len() as u64);
        } else {
            (summary.test_shards, summary.test_samples) = (shards, set.files.len() as u64);
        }
    }
    Ok(summary)
}

/// Writes `<prefix>-NNNNNN.tar` shards of about `shard_bytes` each.
struct ShardWriter<'a> {
    out: &'a Path,
    prefix: &'a str,
    shard_bytes: u64,
    builder: Option<(PathBuf, tar::Builder<std::io::BufWriter<File>>)>,
    bytes: u64,
    written: Vec<PathBuf>,
}

impl ShardWriter<'_> {
    fn add(&mut self, key: &str, ext: &str, image: &[u8], label: u32) -> Result<(), DataError> {
        if self.builder.is_none() {
            let path = self.out.join(format!("{}-{:06}.tar", self.prefix, self.written.len()));
            let file = File::create(&path).map_err(|source| DataError::Io { path: path.clone(), source })?;
            self.builder = Some((path, tar::Builder::new(std::io::BufWriter::new(file))));
            self.bytes = 0;
        }
        let Some((path, builder)) = self.builder.as_mut() else { return Ok(()) };
        let class = label.to_string();
        for (name, data) in [(format!("{key}.{ext}"), image), (format!("{key}.cls"), class.as_bytes())] {
            let mut header = tar::Header::new_ustar();
            header.set_size(data.len() as u64);
            header.set_mode(0o644);
            header.set_entry_type(tar::EntryType::Regular);
            builder
                .append_data(&mut header, &name, data)
                .map_err(|source| DataError::Io { path: path.clone(), source })?;
        }
        self.bytes += image.len() as u64;
        if self.bytes >= self.shard_bytes {
            self.close()?;
        }
        Ok(())
    }

    fn close(&mut self) -> Result<(), DataError> {
        if let Some((path, builder)) = self.builder.take() {
            let io = |source| DataError::Io { path: path.clone(), source };
            let mut w = builder.into_inner().map_err(io)?;
            std::io::Write::flush(&mut w).map_err(io)?;
            self.written.push(path);
        }
        Ok(())
    }

    fn finish(mut self) -> Result<Vec<PathBuf>, DataError> {
        self.close()?;
        Ok(self.written)
    }
}
