//! Key ranges: which parameter-server replica holds which part of the flat parameter vector.
//!
//! Guarantees: [`ranges`] is a pure function of `(total, replicas)`, shared by servers and
//! clients, so both sides agree on the layout without talking; the ranges are contiguous, in
//! replica order, cover `0..total` exactly once, and differ in length by at most one element
//! (the first `total % replicas` replicas hold one more), as ps-lite's even split of the key space.

use std::ops::Range;

/// The range of the flat vector held by each of `replicas` shards, in shard order.
///
/// With `replicas == 0` there is nothing to hold and the result is empty.
pub fn ranges(total: u64, replicas: u32) -> Vec<Range<u64>> {
    if replicas == 0 {
        return Vec::new();
    }
    let n = u64::from(replicas);
    let base = total / n;
    let extra = total % n;
    let mut start = 0;
    (0..n)
        .map(|i| {
            let len = base + u64::from(i < extra);
            let range = start..start + len;
            start += len;
            range
        })
        .collect()
}

/// The range held by shard `index`, or `None` when `index >= replicas`.
pub fn range_of(total: u64, replicas: u32, index: u32) -> Option<Range<u64>> {
    ranges(total, replicas).into_iter().nth(index as usize)
}

/// The part of `piece` that lies inside `shard`, empty when they do not meet.
pub fn intersect(piece: &Range<u64>, shard: &Range<u64>) -> Range<u64> {
    let start = piece.start.max(shard.start);
    let end = piece.end.min(shard.end);
    if start < end { start..end } else { start..start }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_cover_everything_once_and_are_balanced() {
        for total in [0u64, 1, 2, 7, 10, 1000, 235_146] {
            for replicas in 1u32..=9 {
                let rs = ranges(total, replicas);
                assert_eq!(rs.len(), replicas as usize);
                assert_eq!(rs[0].start, 0);
                assert_eq!(rs.last().map(|r| r.end), Some(total));
                for pair in rs.windows(2) {
                    assert_eq!(pair[0].end, pair[1].start, "ranges must be contiguous");
                }
                let lens: Vec<u64> = rs.iter().map(|r| r.end - r.start).collect();
                let (min, max) = (lens.iter().min(), lens.iter().max());
                assert!(max.zip(min).is_some_and(|(a, b)| a - b <= 1), "unbalanced {lens:?}");
            }
        }
    }

    #[test]
    fn ranges_match_the_documented_split() {
        assert_eq!(ranges(10, 3), vec![0..4, 4..7, 7..10]);
        assert_eq!(range_of(10, 3, 2), Some(7..10));
        assert_eq!(range_of(10, 3, 3), None);
        assert!(ranges(5, 0).is_empty());
    }

    #[test]
    fn intersect_clips_to_the_shard() {
        assert_eq!(intersect(&(2..9), &(4..7)), 4..7);
        assert!(intersect(&(0..3), &(4..7)).is_empty());
        assert_eq!(intersect(&(5..20), &(4..7)), 5..7);
    }
}
