//! Where a rank is in its stream of training batches: what a checkpoint keeps, what a group's
//! ranks gather and what the parameter server's wire carries in a progress report, so that a
//! restarted rank continues its data exactly where it stopped.

use serde::{Deserialize, Serialize};

/// Position in the stream of batches: enough to resume it exactly.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataCursor {
    /// Epoch (0-based).
    pub epoch: u64,
    /// Next batch within the epoch (0-based).
    pub batch: u64,
    /// Position of the next unseen sample in the rank's sequence of the epoch (for a tar shard
    /// stream: samples past the rank's first, in the epoch's shard order, so it names a shard and
    /// an offset in it), when it is not `batch × batch size` because samples were skipped; the
    /// image sources set it after every batch. `None`: `batch × batch size`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sample: Option<u64>,
}

impl DataCursor {
    /// Whole numbers in [`DataCursor::words`].
    pub const WORDS: usize = 3;

    /// Batch `batch` of epoch `epoch`, its samples where no sample was skipped.
    pub fn at(epoch: u64, batch: u64) -> Self {
        Self { epoch, batch, sample: None }
    }

    /// The cursor as whole numbers, as collectives and the PS wire carry it: epoch, batch, and
    /// the sample position plus one (0: none).
    pub fn words(self) -> [u64; Self::WORDS] {
        [self.epoch, self.batch, self.sample.map_or(0, |s| s.saturating_add(1))]
    }

    /// The cursor of [`DataCursor::words`].
    pub fn of_words([epoch, batch, sample]: [u64; Self::WORDS]) -> Self {
        Self { epoch, batch, sample: sample.checked_sub(1) }
    }
}
