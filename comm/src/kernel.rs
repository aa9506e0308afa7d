//! The element-wise reduction kernels every collective runs: `dst ⊕= src` for sum and max, and the
//! division that finishes an average, vectorised for the CPU this process runs on.
//!
//! The widest kernel the CPU offers is chosen once, at first use: AVX-512F (16 lanes), AVX2 (8
//! lanes), or the portable loop that the compiler vectorises for the baseline target (SSE2 on
//! x86-64, NEON on aarch64). All three compute exactly the same bits: an element-wise sum or
//! maximum has no association to change, and the lanes apply the same IEEE operation in the same
//! operand order as the scalar loop.
//!
//! Guarantees:
//! - [`combine`] with `incoming_first` computes `src[i] ⊕ dst[i]`, otherwise `dst[i] ⊕ src[i]`.
//!   Two ranks that combine the same two operands in the same order get the same bits, signed
//!   zeros included (`max(-0, +0)` depends on the order), which is what keeps recursive doubling
//!   bit-identical on every rank. One exception: when a sum is NaN it is NaN on every rank, but
//!   which NaN payload it carries is left to the compiler (Rust does not specify the payload of a
//!   NaN produced by arithmetic, and LLVM may swap the operands of an addition).
//! - `max(a, b)` is `a` when `a > b` or `b` is NaN, else `b`: a NaN operand yields the other one
//!   (as [`f32::max`]), and between equal operands (`-0` and `+0`) the second wins — defined
//!   here rather than left to [`f32::max`], which may return either.
//! - [`finish_average`] divides (never multiplies by a reciprocal), so it matches a serial
//!   reference that divides.

use std::sync::OnceLock;

use super::ReduceOp;

/// The instruction set the kernels use on this CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// AVX-512F, 16 lanes.
    Avx512,
    /// AVX2, 8 lanes.
    Avx2,
    /// The baseline target, vectorised by the compiler.
    Portable,
}

impl Isa {
    /// The widest set this CPU supports, detected once.
    pub fn detected() -> Isa {
        static ISA: OnceLock<Isa> = OnceLock::new();
        *ISA.get_or_init(|| {
            #[cfg(target_arch = "x86_64")]
            {
                if std::arch::is_x86_feature_detected!("avx512f") {
                    return Isa::Avx512;
                }
                if std::arch::is_x86_feature_detected!("avx2") {
                    return Isa::Avx2;
                }
            }
            Isa::Portable
        })
    }

    /// Every set this CPU can run, widest first (for tests that compare them).
    pub fn available() -> Vec<Isa> {
        let mut all = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                all.push(Isa::Avx512);
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                all.push(Isa::Avx2);
            }
        }
        all.push(Isa::Portable);
        all
    }
}

impl std::fmt::Display for Isa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Isa::Avx512 => "avx512",
            Isa::Avx2 => "avx2",
            Isa::Portable => "portable",
        })
    }
}

/// `dst[i] = dst[i] ⊕ src[i]` (or `src[i] ⊕ dst[i]` with `incoming_first`) over the common length,
/// with `Average` summing (the caller divides once at the end).
pub fn combine(op: ReduceOp, dst: &mut [f32], src: &[f32], incoming_first: bool) {
    combine_with(Isa::detected(), op, dst, src, incoming_first);
}

/// [`combine`] with a chosen instruction set; `isa` must be one of [`Isa::available`] (another
/// falls back to the portable loop).
pub fn combine_with(isa: Isa, op: ReduceOp, dst: &mut [f32], src: &[f32], incoming_first: bool) {
    let n = dst.len().min(src.len());
    let (dst, src) = (&mut dst[..n], &src[..n]);
    let max = op == ReduceOp::Max;
    #[cfg(target_arch = "x86_64")]
    {
        match isa {
            Isa::Avx512 if std::arch::is_x86_feature_detected!("avx512f") => {
                // SAFETY: the CPU supports AVX-512F (checked above); both slices hold `n` elements.
                unsafe { x86::combine_avx512(dst, src, max, incoming_first) };
                return;
            }
            Isa::Avx2 if std::arch::is_x86_feature_detected!("avx2") => {
                // SAFETY: the CPU supports AVX2 (checked above); both slices hold `n` elements.
                unsafe { x86::combine_avx2(dst, src, max, incoming_first) };
                return;
            }
            _ => {}
        }
    }
    let _ = isa;
    portable(dst, src, max, incoming_first);
}

/// Divides every element by `size` (the end of an `Average`).
pub fn finish_average(buf: &mut [f32], size: usize) {
    let n = size as f32;
    buf.iter_mut().for_each(|x| *x /= n);
}

/// The scalar definition every vector kernel must match.
#[inline(always)]
fn scalar(d: f32, s: f32, max: bool, incoming_first: bool) -> f32 {
    match (max, incoming_first) {
        (false, false) => d + s,
        (false, true) => s + d,
        (true, false) => vmax(d, s),
        (true, true) => vmax(s, d),
    }
}

/// The maximum as `vmaxps` computes it, with [`f32::max`]'s NaN rule.
#[inline(always)]
fn vmax(a: f32, b: f32) -> f32 {
    if b.is_nan() || a > b { a } else { b }
}

// `*s + *d` spells the operand order of the definition (`scalar`), although for a sum only a NaN
// payload could tell the orders apart, and that is unspecified anyway (module docs).
#[allow(clippy::assign_op_pattern)]
fn portable(dst: &mut [f32], src: &[f32], max: bool, incoming_first: bool) {
    // Four monomorphic loops, so that each one vectorises without a branch in its body.
    match (max, incoming_first) {
        (false, false) => dst.iter_mut().zip(src).for_each(|(d, s)| *d += *s),
        (false, true) => dst.iter_mut().zip(src).for_each(|(d, s)| *d = *s + *d),
        (true, false) => dst.iter_mut().zip(src).for_each(|(d, s)| *d = vmax(*d, *s)),
        (true, true) => dst.iter_mut().zip(src).for_each(|(d, s)| *d = vmax(*s, *d)),
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::scalar;

    /// One kernel per instruction set; `max` is `vmaxps(a, b)` (`a > b ? a : b`, so the second
    /// operand when either is NaN or both are zero) with the lanes where `b` is NaN taking `a`.
    macro_rules! kernel {
        ($name:ident, $feature:literal, $lanes:literal, $vec:ty, $load:ident, $store:ident, $add:ident,
         $max:ident, $nan_b:expr) => {
            #[target_feature(enable = $feature)]
            pub(super) unsafe fn $name(dst: &mut [f32], src: &[f32], max: bool, incoming_first: bool) {
                let n = dst.len().min(src.len());
                let (d, s) = (dst.as_mut_ptr(), src.as_ptr());
                // Four vectors per iteration: the loop is bound by loads and stores, not latency.
                let step = 4 * $lanes;
                let mut i = 0;
                while i + step <= n {
                    for k in 0..4 {
                        let at = i + k * $lanes;
                        // SAFETY: `at + lanes <= n`, within both slices; unaligned loads.
                        unsafe {
                            let x: $vec = $load(d.add(at));
                            let y: $vec = $load(s.add(at));
                            let (a, b) = if incoming_first { (y, x) } else { (x, y) };
                            let r = if max { $nan_b(a, b, $max(a, b)) } else { $add(a, b) };
                            $store(d.add(at), r);
                        }
                    }
                    i += step;
                }
                while i + $lanes <= n {
                    // SAFETY: as above.
                    unsafe {
                        let x: $vec = $load(d.add(i));
                        let y: $vec = $load(s.add(i));
                        let (a, b) = if incoming_first { (y, x) } else { (x, y) };
                        let r = if max { $nan_b(a, b, $max(a, b)) } else { $add(a, b) };
                        $store(d.add(i), r);
                    }
                    i += $lanes;
                }
                for j in i..n {
                    dst[j] = scalar(dst[j], src[j], max, incoming_first);
                }
            }
        };
    }

    #[target_feature(enable = "avx512f")]
    #[inline]
    fn nan_b_512(a: __m512, b: __m512, m: __m512) -> __m512 {
        // Lanes where b is unordered with itself (NaN) take a.
        let b_nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(b, b);
        _mm512_mask_blend_ps(b_nan, m, a)
    }

    #[target_feature(enable = "avx2")]
    #[inline]
    fn nan_b_256(a: __m256, b: __m256, m: __m256) -> __m256 {
        let b_nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(b, b);
        _mm256_blendv_ps(m, a, b_nan)
    }

    kernel!(
        combine_avx512,
        "avx512f",
        16,
        __m512,
        _mm512_loadu_ps,
        _mm512_storeu_ps,
        _mm512_add_ps,
        _mm512_max_ps,
        nan_b_512
    );
    kernel!(
        combine_avx2,
        "avx2",
        8,
        __m256,
        _mm256_loadu_ps,
        _mm256_storeu_ps,
        _mm256_add_ps,
        _mm256_max_ps,
        nan_b_256
    );
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// Values that exercise the edge cases: signed zeros, NaNs with payloads, infinities,
    /// subnormals, and ordinary numbers.
    fn awkward(len: usize, seed: u32) -> Vec<f32> {
        let specials = [
            0.0,
            -0.0,
            f32::NAN,
            f32::from_bits(0x7fc0_1234),
            f32::from_bits(0xffc0_0001),
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MIN_POSITIVE / 4.0,
            1.5,
            -2.25,
        ];
        let mut x = seed.wrapping_mul(2_654_435_761).max(1);
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                if x.is_multiple_of(3) {
                    specials[(x / 3) as usize % specials.len()]
                } else {
                    (x as f32) * 1e-9 - 2.0
                }
            })
            .collect()
    }

    #[test]
    fn every_kernel_matches_the_scalar_definition_bit_for_bit() {
        for isa in Isa::available() {
            for len in [0, 1, 7, 8, 15, 16, 17, 63, 64, 65, 1000] {
                for op in ReduceOp::ALL {
                    for incoming_first in [false, true] {
                        let (d0, s) = (awkward(len, 1), awkward(len, 2));
                        let mut got = d0.clone();
                        combine_with(isa, op, &mut got, &s, incoming_first);
                        let want: Vec<f32> = d0
                            .iter()
                            .zip(&s)
                            .map(|(&d, &s)| scalar(d, s, op == ReduceOp::Max, incoming_first))
                            .collect();
                        // Bit for bit, except a NaN sum's payload, which is the compiler's (module docs).
                        let bits = |v: &[f32]| {
                            v.iter()
                                .map(|x| {
                                    if op != ReduceOp::Max && x.is_nan() {
                                        f32::NAN.to_bits()
                                    } else {
                                        x.to_bits()
                                    }
                                })
                                .collect::<Vec<_>>()
                        };
                        assert_eq!(bits(&got), bits(&want), "{isa} {op} len {len} first {incoming_first}");
                    }
                }
            }
        }
    }

    #[test]
    fn the_operand_order_makes_partners_agree() {
        // Rank a computes a ⊕ b with its own value first; rank b passes incoming_first and gets
        // the same bits, even where ⊕ is not commutative bit for bit.
        for op in ReduceOp::ALL {
            let (a, b) = (awkward(257, 3), awkward(257, 4));
            let (mut on_a, mut on_b) = (a.clone(), b.clone());
            combine(op, &mut on_a, &b, false);
            combine(op, &mut on_b, &a, true);
            // A NaN sum's payload is unspecified (module docs): only that it is NaN must agree.
            let same = |x: &f32, y: &f32| {
                x.to_bits() == y.to_bits() || (op != ReduceOp::Max && x.is_nan() && y.is_nan())
            };
            assert!(on_a.iter().zip(&on_b).all(|(x, y)| same(x, y)), "{op}");
        }
    }

    #[test]
    fn max_ignores_a_nan_operand_like_f32_max() {
        let mut d = vec![f32::NAN, 1.0, f32::NAN];
        combine(ReduceOp::Max, &mut d, &[2.0, f32::NAN, f32::NAN], false);
        assert_eq!(d[0], 2.0);
        assert_eq!(d[1], 1.0);
        assert!(d[2].is_nan());
    }
}
