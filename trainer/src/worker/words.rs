//! Whole numbers through the collectives, which move `f32`s: a rank's data cursor and other
//! counters go as 16-bit pieces, which an `f32` holds exactly.

use tandem_comm::{CommError, Communicator, block_range};
use tandem_compute::train::TrainError;
use tandem_input::DataCursor;

/// Broadcasts whole numbers from rank 0 exactly: each goes as four 16-bit pieces, which an `f32`
/// holds without rounding.
pub(super) fn broadcast_words<C: Communicator>(comm: &mut C, words: &mut [u64]) -> Result<(), CommError> {
    let mut pieces = to_pieces(words);
    comm.broadcast(&mut pieces, 0)?;
    words.copy_from_slice(&from_pieces(&pieces));
    Ok(())
}

/// Whole numbers as four 16-bit pieces each, which an `f32` holds exactly.
pub(super) fn to_pieces(words: &[u64]) -> Vec<f32> {
    words.iter().flat_map(|w| (0..4).map(move |i| ((w >> (16 * i)) & 0xffff) as f32)).collect()
}

/// The whole numbers of [`to_pieces`].
pub(super) fn from_pieces(pieces: &[f32]) -> Vec<u64> {
    pieces
        .chunks_exact(4)
        .map(|p| p.iter().enumerate().fold(0, |acc, (i, &v)| acc | ((v as u64) << (16 * i))))
        .collect()
}

/// Words of a data cursor ([`DataCursor::words`]).
pub(super) const CURSOR_WORDS: usize = DataCursor::WORDS;

/// The cursor in `w`'s first [`CURSOR_WORDS`] words.
pub(super) fn cursor_of(w: &[u64]) -> DataCursor {
    let mut words = [0; CURSOR_WORDS];
    words.copy_from_slice(&w[..CURSOR_WORDS]);
    DataCursor::of_words(words)
}

/// Every rank's data cursor, gathered on every rank of `comm` (collective).
pub(super) fn gather_cursors<C: Communicator>(
    comm: &mut C,
    mine: DataCursor,
) -> Result<Vec<DataCursor>, TrainError> {
    let (size, rank) = (comm.size(), comm.rank());
    let pieces_per_rank = 4 * CURSOR_WORDS;
    let mut pieces = vec![0.0f32; pieces_per_rank * size];
    let block = block_range(pieces.len(), size, rank);
    pieces[block].copy_from_slice(&to_pieces(&mine.words()));
    comm.allgather(&mut pieces).map_err(super::collective)?;
    let words = from_pieces(&pieces);
    Ok(words.chunks_exact(CURSOR_WORDS).map(cursor_of).collect())
}
