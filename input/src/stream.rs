//! A [`Source`] that streams: training samples are read from a list of CSV shard files as they
//! are needed, never held in memory as a whole, and a [`DataCursor`] resumes the stream exactly.
//!
//! Expected flow: [`ShardStream::open`] reads each shard once to count and check its rows (a pass
//! that keeps nothing), then [`Source::next_batch`] reads rows in order.
//!
//! Order: each epoch visits the shards in a permutation drawn from (seed, epoch) and the rows of
//! a shard in file order; the concatenation is cut into global batches of world × batch rows, of
//! which rank r takes the r-th slice (as [`super::Loader`] does with its permutation), and the
//! rows that do not fill a global batch are left out that epoch. So batches are a pure function
//! of (seed, epoch, rank, world, batch index), p ranks step like one process with the p× batch,
//! and a cursor (epoch, batch) names one position in the stream: [`Source::seek`] reopens the
//! shard that holds it and skips to it.
//!
//! Caveats: rows are shuffled only at the granularity of shards; every rank reads (and skips)
//! the rows of the other ranks' slices.

use std::path::{Path, PathBuf};

use super::csv::{CsvOptions, CsvReader};
use super::{DataCursor, DataError, InputShape, Source};
use tandem_util::rng::Rng;

/// A stream of labelled samples from CSV shard files (see the module documentation).
#[derive(Debug)]
pub struct ShardStream {
    name: String,
    shards: Vec<PathBuf>,
    rows: Vec<u64>,
    opts: CsvOptions,
    shape: InputShape,
    classes: usize,
    batch_size: usize,
    seed: u64,
    rank: usize,
    world: usize,
    cursor: DataCursor,
    /// Shard order of `reader_epoch`.
    order: Vec<usize>,
    reader: Option<Reader>,
}

/// The open shard and the epoch position of its next row.
#[derive(Debug)]
struct Reader {
    epoch: u64,
    /// Position in the epoch's order of `shard`.
    slot: usize,
    rows: CsvReader,
    /// Rows of the epoch's sequence before the next row of `rows`.
    position: u64,
}

impl ShardStream {
    /// A stream over `shards` read with `opts` (whose `shape` and `classes` must be given), in
    /// batches of `batch_size` for rank `rank` of `world`, shuffled by `seed`.
    pub fn open(
        shards: Vec<PathBuf>,
        opts: CsvOptions,
        batch_size: usize,
        seed: u64,
        rank: usize,
        world: usize,
    ) -> Result<Self, DataError> {
        let (Some(shape), Some(classes)) = (opts.shape, opts.classes) else {
            return Err(DataError::Config(
                "a streamed data set needs its sample shape and class count up front".into(),
            ));
        };
        if world == 0 || rank >= world {
            return Err(DataError::Config(format!("rank {rank} is not in a world of {world}")));
        }
        if shards.is_empty() {
            return Err(DataError::Config("a streamed data set needs at least one shard file".into()));
        }
        let mut rows = Vec::with_capacity(shards.len());
        let mut scratch = Vec::new();
        for path in &shards {
            let mut reader = CsvReader::open(path, &opts)?;
            let mut n = 0u64;
            while reader.next_row(&mut scratch)?.is_some() {
                scratch.clear();
                n += 1;
            }
            rows.push(n);
        }
        let name = format!("{} shard(s) from {}", shards.len(), shards[0].display());
        let stream = Self {
            name,
            shards,
            rows,
            opts,
            shape,
            classes,
            batch_size,
            seed,
            rank,
            world,
            cursor: DataCursor::default(),
            order: Vec::new(),
            reader: None,
        };
        super::check_batches(&stream.name, stream.samples(), batch_size, rank, world)?;
        Ok(stream)
    }

    /// The order in which epoch `epoch` visits the shards.
    pub fn shard_order(&self, epoch: u64) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.shards.len()).collect();
        Rng::derive(self.seed, 0x5a4d ^ epoch.wrapping_mul(0x9E37_79B9)).shuffle(&mut order);
        order
    }

    /// Opens the reader at row `position` of epoch `epoch`'s sequence.
    fn open_at(&mut self, epoch: u64, position: u64) -> Result<(), DataError> {
        self.order = self.shard_order(epoch);
        let mut before = 0u64;
        for (slot, &shard) in self.order.iter().enumerate() {
            if position < before + self.rows[shard] {
                let mut rows = CsvReader::open(&self.shards[shard], &self.opts)?;
                let mut scratch = Vec::new();
                for _ in before..position {
                    rows.next_row(&mut scratch)?;
                    scratch.clear();
                }
                self.reader = Some(Reader { epoch, slot, rows, position });
                return Ok(());
            }
            before += self.rows[shard];
        }
        Err(DataError::Config(format!("{}: position {position} is past the end of epoch {epoch}", self.name)))
    }

    /// Reads the row at `position` of epoch `epoch` into `x` and `y`, moving the reader there.
    fn read_row(
        &mut self,
        epoch: u64,
        position: u64,
        x: &mut Vec<f32>,
        y: &mut Vec<u32>,
    ) -> Result<(), DataError> {
        let in_place = self.reader.as_ref().is_some_and(|r| r.epoch == epoch && r.position <= position);
        if !in_place {
            self.open_at(epoch, position)?;
        }
        let mut scratch = Vec::new();
        loop {
            let Some(r) = self.reader.as_mut() else {
                return Err(DataError::Config(format!("{}: the stream is not open", self.name)));
            };
            let wanted = r.position == position;
            let target: &mut Vec<f32> = if wanted { &mut *x } else { &mut scratch };
            match r.rows.next_row(target)? {
                Some(label) => {
                    r.position += 1;
                    if wanted {
                        y.push(label);
                        return Ok(());
                    }
                    scratch.clear();
                }
                None => {
                    // The shard ended: continue with the next one of the epoch's order.
                    let (slot, at) = (r.slot + 1, r.position);
                    let Some(&shard) = self.order.get(slot) else {
                        return Err(DataError::Config(format!(
                            "{}: epoch {epoch} ended before row {position}; a shard file changed while training",
                            self.name
                        )));
                    };
                    let rows = CsvReader::open(&self.shards[shard], &self.opts)?;
                    self.reader = Some(Reader { epoch, slot, rows, position: at });
                }
            }
        }
    }
}

impl Source for ShardStream {
    fn name(&self) -> &str {
        &self.name
    }

    fn shape(&self) -> InputShape {
        self.shape
    }

    fn classes(&self) -> usize {
        self.classes
    }

    fn samples(&self) -> u64 {
        self.rows.iter().sum()
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
        Ok(())
    }

    fn next_batch(&mut self, x: &mut Vec<f32>, y: &mut Vec<u32>) -> Result<DataCursor, DataError> {
        let at = self.cursor;
        x.clear();
        y.clear();
        let (b, w, r) = (self.batch_size as u64, self.world as u64, self.rank as u64);
        let start = (at.batch * w + r) * b;
        for position in start..start + b {
            self.read_row(at.epoch, position, x, y)?;
        }
        self.cursor = super::after(at, self.batches_per_epoch());
        Ok(at)
    }

    fn set_share(&mut self, rank: usize, world: usize, at: DataCursor) -> Result<(), DataError> {
        super::check_batches(&self.name, self.samples(), self.batch_size, rank, world)?;
        (self.rank, self.world, self.reader) = (rank, world, None);
        self.seek(at)
    }
}

/// The paths of `dir`'s files whose names end in `suffix`, sorted by name.
pub fn shard_files(dir: &Path, suffix: &str) -> Result<Vec<PathBuf>, DataError> {
    super::store::files(dir, suffix)
}
