//! Whether a frame's floats are all finite, checked in one pass the compiler vectorises: the
//! shard refuses a push, init or model state that holds a NaN or an infinity before any of it
//! reaches the weights (see [`super::state`]).
//!
//! Guarantees: [`copy_finite`] checks each block just before it copies it, so the check of a
//! push's gradient costs no pass of its own over memory and no bad value is copied; [`first_non_finite`] reads each value
//! once on the common path (all finite) and looks again at one block only to name the first bad
//! index. No dependencies, so a benchmark can include this file as it ships (`bench/ps_finite.rs`).

/// Values checked per block: small enough to stay in L1 for the second look, large enough that
/// the per-block branch costs nothing.
const BLOCK: usize = 1024;
/// Independent accumulators, so the loop has no serial dependency and maps onto vector lanes
/// (16 × f32 is one AVX-512 register, two AVX ones).
const LANES: usize = 16;

/// The index of the first value of `values` that is NaN or infinite, or `None` when all are
/// finite.
pub fn first_non_finite(values: &[f32]) -> Option<usize> {
    for (b, block) in values.chunks(BLOCK).enumerate() {
        if !all_finite(block) {
            // Some value of this block is not finite: find the first.
            return block.iter().position(|x| !x.is_finite()).map(|i| b * BLOCK + i);
        }
    }
    None
}

/// Copies `src` into `dst` (of the same length) if every value is finite, and says whether it
/// did: block by block, each block checked (as [`first_non_finite`] does) and then copied while it
/// is still in L1, so memory is read once. On `false`, `dst` holds the finite blocks before the
/// first bad one: the caller treats it as scratch.
pub fn copy_finite(dst: &mut [f32], src: &[f32]) -> bool {
    for (d, s) in dst.chunks_mut(BLOCK).zip(src.chunks(BLOCK)) {
        if !all_finite(s) {
            return false;
        }
        d.copy_from_slice(s);
    }
    true
}

/// `x - x`: 0 for a finite `x`, NaN for a NaN or an infinity.
#[inline(always)]
#[allow(clippy::eq_op)] // Subtracting a value from itself is the point.
fn zero_if_finite(x: f32) -> f32 {
    x - x
}

/// `x - x` is 0 for a finite `x` and NaN for a NaN or an infinity, and a sum of them is NaN as soon
/// as one is: a lane-wise sum is one subtract and one add per value, with no branch, which the
/// compiler turns into vector instructions.
fn all_finite(block: &[f32]) -> bool {
    let mut acc = [0.0f32; LANES];
    let mut chunks = block.chunks_exact(LANES);
    for chunk in chunks.by_ref() {
        for (a, &x) in acc.iter_mut().zip(chunk) {
            *a += zero_if_finite(x);
        }
    }
    for (a, &x) in acc.iter_mut().zip(chunks.remainder()) {
        *a += zero_if_finite(x);
    }
    // Every lane is ±0 when all were finite; any NaN lane makes the sum NaN.
    acc.iter().sum::<f32>() == 0.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_first_nan_or_infinity_anywhere() {
        for len in [0usize, 1, 15, 16, 17, 1023, 1024, 1025, 5000] {
            let clean: Vec<f32> = (0..len).map(|i| (i as f32 - 7.5) * 1e30).collect();
            assert_eq!(first_non_finite(&clean), None, "len {len}");
            for at in [0, len / 3, len.saturating_sub(1)] {
                if at >= len {
                    continue;
                }
                for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -f32::NAN] {
                    let mut v = clean.clone();
                    v[at] = bad;
                    if at + 1 < len {
                        v[len - 1] = f32::NAN;
                    }
                    assert_eq!(first_non_finite(&v), Some(at), "len {len}, {bad} at {at}");
                }
            }
        }
    }

    #[test]
    fn extreme_finite_values_pass() {
        let v = [f32::MAX, f32::MIN, f32::MIN_POSITIVE, -0.0, 0.0, 1e-45, -f32::MAX].repeat(100);
        assert_eq!(first_non_finite(&v), None);
        let mut copy = vec![1.0; v.len()];
        assert!(copy_finite(&mut copy, &v));
        assert_eq!(copy, v);
    }

    #[test]
    fn the_checked_copy_copies_and_sees_every_bad_value() {
        for len in [0usize, 1, 15, 16, 17, 100, 1025, 2100] {
            let clean: Vec<f32> = (0..len).map(|i| i as f32 - 3.0).collect();
            let mut dst = vec![0.0; len];
            assert!(copy_finite(&mut dst, &clean), "len {len}");
            assert_eq!(dst, clean);
            for at in 0..len {
                for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
                    let mut v = clean.clone();
                    v[at] = bad;
                    assert!(!copy_finite(&mut dst, &v), "len {len}, {bad} at {at}");
                }
            }
        }
    }
}
