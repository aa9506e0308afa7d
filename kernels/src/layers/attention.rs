//! The core of multi-head causal self-attention: token-major `[q | k | v]` rows (`[batch·t × 3d]`,
//! the output of the `c_attn` projection, heads side by side inside each of q, k, v as in
//! PyTorch's `split(d).view(b, t, heads, d/heads)`) to the heads' outputs `[batch·t × d]` (the
//! input of `c_proj`). `softmax(q·kᵀ/√(d/heads))·v` with position `t` seeing positions `≤ t`.
//!
//! Each (sample, head) is a few GEMMs on strided views of the rows, in blocks of [`RB`] query rows
//! so the causal half above the diagonal is mostly skipped:
//! - forward: `S = Q·Kᵀ` (B = Kᵀ, the one copy: `d/heads × t` per head), a numerically stable
//!   softmax per row (max subtracted, masked positions exactly 0), `O = P·V` (B = V in place);
//!   `P` is kept for the backward pass (`batch·heads·t²` values);
//! - backward: `dP = dO·Vᵀ` (B = a copy of Vᵀ), `dS = P ⊙ (dP − rowsum(P ⊙ dP)) / √(d/heads)`,
//!   `dQ = dS·K`, `dK = dSᵀ·Q` and `dV = Pᵀ·dO` (A read transposed by strides, B in place).
//!
//! Threads split the samples (all heads of a sample on one thread), so each writes whole rows.

use super::{Ctx, Layer, Layout, State};
use crate::gemm::{Epilogue, Index, MatA, MatB, gemm};
use crate::math;
use crate::pool::{SharedMut, split};

/// Query rows per block of the causal GEMMs.
const RB: usize = 24;

/// Causal multi-head attention over sequences of `t` tokens of width `d` (`heads` heads of
/// `d / heads` features).
#[derive(Debug)]
pub struct CausalSelfAttention {
    t: usize,
    d: usize,
    heads: usize,
    /// Softmax probabilities `[batch × heads × t × t]` of the last forward.
    probs: Vec<f32>,
    /// Per thread: a transposed head `[d/heads × t]` and a `[t × t]` score-gradient block.
    scratch: Vec<(Vec<f32>, Vec<f32>)>,
}

impl CausalSelfAttention {
    /// Attention with `heads` heads over `t × d` sequences. Errors unless `heads` divides `d`.
    pub fn new(t: usize, d: usize, heads: usize) -> Result<Self, String> {
        if heads == 0 || d == 0 || t == 0 || !d.is_multiple_of(heads) {
            return Err(format!(
                "attention needs a width divisible by the number of heads, got width {d} and {heads} heads"
            ));
        }
        Ok(Self { t, d, heads, probs: Vec::new(), scratch: Vec::new() })
    }

    fn hd(&self) -> usize {
        self.d / self.heads
    }

    /// Multiply-adds of the causal products of one sample: two (forward) or four (backward) of
    /// `t(t+1)/2 · d`.
    fn causal_macs(&self) -> usize {
        self.t * (self.t + 1) / 2 * self.d
    }
}

/// `dst[j·t + s] = src[s·ld + j]` for `s < t`, `j < hd`: one head's rows transposed.
fn transpose_head(src: &[f32], ld: usize, t: usize, hd: usize, dst: &mut [f32]) {
    for s in 0..t {
        let row = &src[s * ld..s * ld + hd];
        for (j, &v) in row.iter().enumerate() {
            dst[j * t + s] = v;
        }
    }
}

/// Max of a slice in 16 lanes.
#[inline(always)]
fn max_lanes(x: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; 16];
    let mut chunks = x.chunks_exact(16);
    for c in &mut chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a = if v > *a { v } else { *a };
        }
    }
    let mut m = chunks.remainder().iter().fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m });
    for &a in &acc {
        m = if a > m { a } else { m };
    }
    m
}

crate::simd::multiversion! {
/// Row `t` of the probabilities from its raw scores `row[..=t]`: `softmax(scale·row)`, zeros past
/// the diagonal.
fn softmax_causal(row: &mut [f32], t: usize, scale: f32) {
    let (live, masked) = row.split_at_mut(t + 1);
    let m = max_lanes(live) * scale;
    let mut acc = [0.0f32; 16];
    let mut chunks = live.chunks_exact_mut(16);
    for c in &mut chunks {
        for (a, v) in acc.iter_mut().zip(c.iter_mut()) {
            *v = math::exp(*v * scale - m);
            *a += *v;
        }
    }
    let mut sum = 0.0f32;
    for v in chunks.into_remainder() {
        *v = math::exp(*v * scale - m);
        sum += *v;
    }
    sum += acc.iter().sum::<f32>();
    let inv = 1.0 / sum;
    for v in live.iter_mut() {
        *v *= inv;
    }
    masked.fill(0.0);
}
}

crate::simd::multiversion! {
/// Row `t` of the score gradient: `ds = scale·p ⊙ (dp − Σ p ⊙ dp)` on `..=t`, zeros past it.
fn softmax_backward_row(ds: &mut [f32], p: &[f32], t: usize, scale: f32) {
    let (live, masked) = ds.split_at_mut(t + 1);
    let p = &p[..t + 1];
    let mut acc = [0.0f32; 16];
    let (dc, pc) = (live.chunks_exact(16), p.chunks_exact(16));
    let mut dot: f32 = dc.remainder().iter().zip(pc.remainder()).map(|(&a, &b)| a * b).sum();
    for (a, b) in dc.zip(pc) {
        for l in 0..16 {
            acc[l] += a[l] * b[l];
        }
    }
    dot += acc.iter().sum::<f32>();
    for (v, &q) in live.iter_mut().zip(p) {
        *v = scale * q * (*v - dot);
    }
    masked.fill(0.0);
}
}

impl Layer for CausalSelfAttention {
    fn describe(&self) -> String {
        format!("causal self-attention {} heads × {}", self.heads, self.hd())
    }

    fn input(&self) -> Layout {
        Layout::Sequence { t: self.t, d: 3 * self.d }
    }

    fn output(&self) -> Layout {
        Layout::Sequence { t: self.t, d: self.d }
    }

    fn forward_macs(&self) -> usize {
        2 * self.causal_macs()
    }

    fn backward_macs(&self, input_grad: bool) -> usize {
        if input_grad { 4 * self.causal_macs() } else { 0 }
    }

    fn reserve(&mut self, batch: usize, threads: usize) {
        let (t, hd) = (self.t, self.hd());
        self.probs.resize(batch * self.heads * t * t, 0.0);
        self.scratch.resize_with(threads, || (Vec::new(), Vec::new()));
        for (ht, ds) in &mut self.scratch {
            ht.resize(hd * t, 0.0);
            ds.resize(t * t, 0.0);
        }
    }

    fn forward(&mut self, cx: &Ctx<'_>, _params: &[f32], _state: State<'_>, x: &[f32], y: &mut [f32]) {
        let (t, d, heads, hd) = (self.t, self.d, self.heads, self.hd());
        let (ld, scale) = (3 * d, 1.0 / (hd as f32).sqrt());
        let threads = cx.pool.threads();
        let (out, probs, scratch) =
            (SharedMut::new(y), SharedMut::new(&mut self.probs), SharedMut::new(&mut self.scratch));
        cx.pool.run(|tid| {
            let samples = split(cx.batch, tid, threads);
            // SAFETY: thread `tid` alone uses its scratch, its samples' output rows and their
            // probability blocks.
            let (kt, _) = unsafe { &mut scratch.range(tid..tid + 1)[0] };
            let y_mine = unsafe { out.range(samples.start * t * d..samples.end * t * d) };
            let p_mine = unsafe { probs.range(samples.start * heads * t * t..samples.end * heads * t * t) };
            for (bi, b) in samples.enumerate() {
                let rows = &x[b * t * ld..(b + 1) * t * ld];
                for h in 0..heads {
                    let p = &mut p_mine[(bi * heads + h) * t * t..(bi * heads + h + 1) * t * t];
                    transpose_head(&rows[d + h * hd..], ld, t, hd, kt);
                    let mut t0 = 0;
                    while t0 < t {
                        let t1 = (t0 + RB).min(t);
                        let a = MatA {
                            data: &rows[t0 * ld + h * hd..],
                            rows: Index::Stride(ld),
                            cols: Index::Stride(1),
                        };
                        let r = gemm(
                            t1 - t0,
                            t1,
                            hd,
                            a,
                            MatB::row_major(kt, t),
                            &mut p[t0 * t..],
                            t,
                            Epilogue::default(),
                        );
                        debug_assert!(r.is_ok(), "{r:?}");
                        for q in t0..t1 {
                            softmax_causal(&mut p[q * t..(q + 1) * t], q, scale);
                        }
                        let v = MatB { data: &rows[2 * d + h * hd..], rows: Index::Stride(ld) };
                        let yo = &mut y_mine[(bi * t + t0) * d + h * hd..];
                        let r = gemm(
                            t1 - t0,
                            hd,
                            t1,
                            MatA::row_major(&p[t0 * t..], t),
                            v,
                            yo,
                            d,
                            Epilogue::default(),
                        );
                        debug_assert!(r.is_ok(), "{r:?}");
                        t0 = t1;
                    }
                }
            }
        });
    }

    fn backward(
        &mut self,
        cx: &Ctx<'_>,
        _params: &[f32],
        x: &[f32],
        _y: &[f32],
        dy: &mut [f32],
        dx: Option<&mut [f32]>,
        _grads: &mut [f32],
    ) {
        let Some(dx) = dx else { return };
        let (t, d, heads, hd) = (self.t, self.d, self.heads, self.hd());
        let (ld, scale) = (3 * d, 1.0 / (hd as f32).sqrt());
        let threads = cx.pool.threads();
        let (dxs, scratch) = (SharedMut::new(dx), SharedMut::new(&mut self.scratch));
        let (probs, dy) = (&self.probs, &*dy);
        cx.pool.run(|tid| {
            let samples = split(cx.batch, tid, threads);
            // SAFETY: thread `tid` alone uses its scratch and its samples' rows of dx.
            let (vt, ds) = unsafe { &mut scratch.range(tid..tid + 1)[0] };
            let dx_mine = unsafe { dxs.range(samples.start * t * ld..samples.end * t * ld) };
            for (bi, b) in samples.enumerate() {
                let rows = &x[b * t * ld..(b + 1) * t * ld];
                let drows = &mut dx_mine[bi * t * ld..(bi + 1) * t * ld];
                let dout = &dy[b * t * d..(b + 1) * t * d];
                for h in 0..heads {
                    let p = &probs[(b * heads + h) * t * t..(b * heads + h + 1) * t * t];
                    transpose_head(&rows[2 * d + h * hd..], ld, t, hd, vt);
                    // dP and dS, block by block of query rows; then dQ for the block.
                    let mut t0 = 0;
                    while t0 < t {
                        let t1 = (t0 + RB).min(t);
                        let a = MatA {
                            data: &dout[t0 * d + h * hd..],
                            rows: Index::Stride(d),
                            cols: Index::Stride(1),
                        };
                        let r = gemm(
                            t1 - t0,
                            t1,
                            hd,
                            a,
                            MatB::row_major(vt, t),
                            &mut ds[t0 * t..],
                            t,
                            Epilogue::default(),
                        );
                        debug_assert!(r.is_ok(), "{r:?}");
                        for q in t0..t1 {
                            softmax_backward_row(
                                &mut ds[q * t..(q + 1) * t],
                                &p[q * t..(q + 1) * t],
                                q,
                                scale,
                            );
                        }
                        let k = MatB { data: &rows[d + h * hd..], rows: Index::Stride(ld) };
                        let r = gemm(
                            t1 - t0,
                            hd,
                            t1,
                            MatA::row_major(&ds[t0 * t..], t),
                            k,
                            &mut drows[t0 * ld + h * hd..],
                            ld,
                            Epilogue::default(),
                        );
                        debug_assert!(r.is_ok(), "{r:?}");
                        t0 = t1;
                    }
                    // dK = dSᵀ·Q and dV = Pᵀ·dO, block by block of key rows s, over queries ≥ s.
                    let mut s0 = 0;
                    while s0 < t {
                        let s1 = (s0 + RB).min(t);
                        let a =
                            MatA { data: &ds[s0 * t + s0..], rows: Index::Stride(1), cols: Index::Stride(t) };
                        let q = MatB { data: &rows[s0 * ld + h * hd..], rows: Index::Stride(ld) };
                        let r = gemm(
                            s1 - s0,
                            hd,
                            t - s0,
                            a,
                            q,
                            &mut drows[s0 * ld + d + h * hd..],
                            ld,
                            Epilogue::default(),
                        );
                        debug_assert!(r.is_ok(), "{r:?}");
                        let a =
                            MatA { data: &p[s0 * t + s0..], rows: Index::Stride(1), cols: Index::Stride(t) };
                        let g = MatB { data: &dout[s0 * d + h * hd..], rows: Index::Stride(d) };
                        let r = gemm(
                            s1 - s0,
                            hd,
                            t - s0,
                            a,
                            g,
                            &mut drows[s0 * ld + 2 * d + h * hd..],
                            ld,
                            Epilogue::default(),
                        );
                        debug_assert!(r.is_ok(), "{r:?}");
                        s0 = s1;
                    }
                }
            }
        });
    }
}
