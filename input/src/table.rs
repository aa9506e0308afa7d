//! Shuffled, sharded mini-batches over a training set held in memory: the [`Source`] of every
//! data set that fits in memory.

use super::{DataCursor, DataError, Dataset, InputShape, Source};
use tandem_util::rng::Rng;

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
        super::check_batches(&data.name, data.len() as u64, batch_size, rank, world)?;
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
        tandem_api::plan::steps_per_epoch(self.data.len() as u64, self.world as u64, self.batch_size as u64)
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
        super::check_seek(cursor, self.batches_per_epoch())?;
        self.cursor = cursor;
        Ok(())
    }

    /// This rank's `len / world` sample indices for `epoch`, disjoint from every other rank's: first
    /// its part of each global batch, in batch order (what [`Loader::next_batch`] serves), then its
    /// share of the samples that do not fill a global batch (unused that epoch).
    pub fn epoch_indices(&self, epoch: u64) -> Vec<u32> {
        rank_indices(self.data.len(), self.batch_size, self.seed, epoch, self.rank, self.world)
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
            y.extend_from_slice(self.data.targets(i as usize));
        }
        self.cursor = super::after(at, self.batches_per_epoch());
        at
    }
}

impl Source for Loader {
    fn name(&self) -> &str {
        &self.data.name
    }

    fn shape(&self) -> InputShape {
        self.data.shape
    }

    fn classes(&self) -> usize {
        self.data.classes
    }

    fn samples(&self) -> u64 {
        self.data.len() as u64
    }

    fn batches_per_epoch(&self) -> u64 {
        Loader::batches_per_epoch(self)
    }

    fn cursor(&self) -> DataCursor {
        self.cursor
    }

    fn seek(&mut self, cursor: DataCursor) -> Result<(), DataError> {
        Loader::seek(self, cursor)
    }

    fn next_batch(&mut self, x: &mut Vec<f32>, y: &mut Vec<u32>) -> Result<DataCursor, DataError> {
        Ok(Loader::next_batch(self, x, y))
    }

    fn set_share(&mut self, rank: usize, world: usize, at: DataCursor) -> Result<(), DataError> {
        super::check_batches(&self.data.name, self.data.len() as u64, self.batch_size, rank, world)?;
        (self.rank, self.world, self.order_epoch) = (rank, world, None);
        self.seek(at)
    }
}

/// Rank `rank` of `world`'s `len / world` indices of `0..len` for `epoch`, disjoint from every
/// other rank's: the epoch's permutation (drawn from `seed` and `epoch`) is cut into global
/// batches of `world × batch`, of which this rank takes the `rank`-th slice, in batch order; then
/// its share of the indices that do not fill a global batch (unused that epoch).
pub(crate) fn rank_indices(
    len: usize,
    batch: usize,
    seed: u64,
    epoch: u64,
    rank: usize,
    world: usize,
) -> Vec<u32> {
    let mut order: Vec<u32> = (0..len as u32).collect();
    Rng::derive(seed, 0xe90c ^ epoch.wrapping_mul(0x9E37_79B9)).shuffle(&mut order);
    let (b, w, r) = (batch.max(1), world.max(1), rank);
    let per_rank = len / w;
    let batches = per_rank / b;
    let mut mine = Vec::with_capacity(per_rank);
    for j in 0..batches {
        let start = (j * w + r) * b;
        mine.extend_from_slice(&order[start..start + b]);
    }
    let (rest, tail) = (batches * w * b, per_rank - batches * b);
    mine.extend_from_slice(&order[rest + r * tail..rest + (r + 1) * tail]);
    mine
}
