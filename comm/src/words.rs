//! Whole numbers through the collectives, which move `f32`s: step counts, a rank's data cursor and
//! other counters go as 16-bit pieces, which an `f32` holds exactly.
//!
//! Guarantees: [`broadcast_words`] and [`gather_cursors`] deliver every `u64` bit for bit (a step
//! beyond `f32`'s 2^24 does not round); both are collectives, called by every rank in the same
//! order.

use tandem_api::DataCursor;

use crate::{CommError, Communicator, block_range};

/// Broadcasts whole numbers from rank 0 exactly: each goes as four 16-bit pieces, which an `f32`
/// holds without rounding.
pub fn broadcast_words<C: Communicator>(comm: &mut C, words: &mut [u64]) -> Result<(), CommError> {
    let mut pieces = to_pieces(words);
    comm.broadcast(&mut pieces, 0)?;
    words.copy_from_slice(&from_pieces(&pieces));
    Ok(())
}

/// Whole numbers as four 16-bit pieces each, which an `f32` holds exactly.
pub fn to_pieces(words: &[u64]) -> Vec<f32> {
    words.iter().flat_map(|w| (0..4).map(move |i| ((w >> (16 * i)) & 0xffff) as f32)).collect()
}

/// The whole numbers of [`to_pieces`].
pub fn from_pieces(pieces: &[f32]) -> Vec<u64> {
    pieces
        .chunks_exact(4)
        .map(|p| p.iter().enumerate().fold(0, |acc, (i, &v)| acc | ((v as u64) << (16 * i))))
        .collect()
}

/// Words of a data cursor ([`DataCursor::words`]).
pub const CURSOR_WORDS: usize = DataCursor::WORDS;

/// The cursor in `w`'s first [`CURSOR_WORDS`] words.
pub fn cursor_of(w: &[u64]) -> DataCursor {
    let mut words = [0; CURSOR_WORDS];
    words.copy_from_slice(&w[..CURSOR_WORDS]);
    DataCursor::of_words(words)
}

/// Every rank's data cursor, gathered on every rank of `comm` (collective).
pub fn gather_cursors<C: Communicator>(comm: &mut C, mine: DataCursor) -> Result<Vec<DataCursor>, CommError> {
    let (size, rank) = (comm.size(), comm.rank());
    let pieces_per_rank = 4 * CURSOR_WORDS;
    let mut pieces = vec![0.0f32; pieces_per_rank * size];
    let block = block_range(pieces.len(), size, rank);
    pieces[block].copy_from_slice(&to_pieces(&mine.words()));
    comm.allgather(&mut pieces)?;
    let words = from_pieces(&pieces);
    Ok(words.chunks_exact(CURSOR_WORDS).map(cursor_of).collect())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::thread;
    use std::time::Duration;

    use super::*;
    use crate::algo::{AlgoConfig, Collectives};
    use crate::transport::LocalTransport;

    #[test]
    fn whole_numbers_reach_every_rank_exactly() {
        // Steps and update counts beyond f32's 2^24 would round if sent as plain floats.
        let sent = [0, 1, (1 << 24) + 1, (1 << 40) + 12_345, u64::MAX];
        let ranks: Vec<_> = LocalTransport::group(3, Duration::from_secs(30))
            .into_iter()
            .map(|t| {
                thread::spawn(move || {
                    let mut comm = Collectives::new(t, AlgoConfig::default(), "local");
                    let mut words = if comm.rank() == 0 { sent } else { [7; 5] };
                    broadcast_words(&mut comm, &mut words).unwrap();
                    words
                })
            })
            .collect();
        for (rank, r) in ranks.into_iter().enumerate() {
            assert_eq!(r.join().unwrap(), sent, "rank {rank}");
        }
    }
}
