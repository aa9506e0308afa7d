//! The deterministic train/test split.
//!
//! Guarantees: the split depends only on the data set (a fixed seed), never on the training seed,
//! so every run and every rank evaluates on the same test set.

use super::{DataError, Dataset};
use tandem_util::rng::Rng;

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
    let (train, test) = held_out(data.len(), test);
    Ok(Splits { train: data.select(&train), test: data.select(&test) })
}

/// The fixed split of `0..len` into `len − test` training and `test` held-out indices.
pub(crate) fn held_out(len: usize, test: usize) -> (Vec<u32>, Vec<u32>) {
    let mut order: Vec<u32> = (0..len as u32).collect();
    Rng::new(SPLIT_SEED).shuffle(&mut order);
    let test = order.split_off(len - test.min(len));
    (order, test)
}
