//! 2-D convolution on NHWC activations, any kernel size, stride and zero padding, as three GEMMs
//! with no im2col buffer (the *indirect* convolution: the GEMM reads patches straight from the
//! padded input through two offset tables).
//!
//! Tap order inside the layer is `k = (ky, kx, ci)` (channels innermost, contiguous in NHWC);
//! parameters keep PyTorch's `[cout, cin, kh, kw]` order in the flat vector.
//! - forward: `Y[p][co] = Σ_k Xp[pix[p] + tap[k]] · Wt[k][co]` — A by tables, B = the weights
//!   re-laid `[k × cout]` (`cout·cin·kh·kw` values, rebuilt each forward: the GEMM's packing);
//!   bias and ReLU fused in the epilogue.
//! - weight gradient: `dWt[k][co] = Σ_p Xp[tap[k] + pix[p]] · dY[p][co]` — the same tables swapped,
//!   B = dY in place; per-thread partial sums over the thread's samples, added in thread order.
//! - input gradient: `dcols[p][k] = Σ_co dY[p][co] · Wk[co][k]`, in chunks of pixels that stay in
//!   L2, scattered into the padded gradient as runs of `cin` contiguous values per tap.
//!
//! Threads split the batch (each thread its samples), as PCL-DNN splits the minibatch over cores.

use super::{Ctx, Init, Layer, Layout, ParamSpec, State};
use crate::gemm::{Bias, Epilogue, Index, MatA, MatB, gemm};
use crate::pool::{SharedMut, split};

/// Shape of a convolution.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ConvSpec {
    /// Input channels.
    pub cin: usize,
    /// Output channels.
    pub cout: usize,
    /// Kernel height.
    pub kh: usize,
    /// Kernel width.
    pub kw: usize,
    /// Stride (both directions).
    pub stride: usize,
    /// Zero padding (both sides, both directions).
    pub pad: usize,
    /// Whether the layer has a bias.
    pub bias: bool,
    /// Whether ReLU is fused after the bias.
    pub relu: bool,
}

/// Pixels per chunk of the input-gradient GEMM (its C, `chunk × cin·kh·kw`, stays in L2).
const DX_CHUNK: usize = 64;

/// A convolution layer over `h × w` inputs.
#[derive(Debug)]
pub struct Conv2d {
    spec: ConvSpec,
    h: usize,
    w: usize,
    hp: usize,
    wp: usize,
    ho: usize,
    wo: usize,
    /// Offset of tap `(ky, kx, ci)` from a patch's origin in the padded input.
    tap: Vec<usize>,
    /// Offset of each output pixel's patch origin in the padded input (whole batch).
    pix: Vec<usize>,
    /// The padded input, `[batch × hp × wp × cin]`; borders stay zero.
    xp: Vec<f32>,
    /// The padded input gradient.
    dxp: Vec<f32>,
    /// Weights as `[k × cout]` (forward B) and `[cout × k]` in tap order (input-gradient B).
    wt: Vec<f32>,
    wk: Vec<f32>,
    /// Per thread: weight-gradient partial `[k × cout]` then bias partial `[cout]`.
    gpart: Vec<Vec<f32>>,
    /// Per thread: input-gradient chunk `[DX_CHUNK × k]`.
    dcols: Vec<Vec<f32>>,
    capacity: usize,
}

impl Conv2d {
    /// A convolution of `spec` over `h × w` images. Errors when the kernel does not fit.
    pub fn new(spec: ConvSpec, h: usize, w: usize) -> Result<Self, String> {
        let ConvSpec { cin, cout, kh, kw, stride, pad, .. } = spec;
        if cin == 0 || cout == 0 || kh == 0 || kw == 0 || stride == 0 {
            return Err(format!("convolution {spec:?}: channels, kernel and stride must be at least 1"));
        }
        let (hp, wp) = (h + 2 * pad, w + 2 * pad);
        if kh > hp || kw > wp {
            return Err(format!(
                "a {kh}×{kw} kernel does not fit a {h}×{w} input with padding {pad}; use a smaller kernel or more padding"
            ));
        }
        let (ho, wo) = ((hp - kh) / stride + 1, (wp - kw) / stride + 1);
        let mut tap = Vec::with_capacity(kh * kw * cin);
        for ky in 0..kh {
            for kx in 0..kw {
                for ci in 0..cin {
                    tap.push((ky * wp + kx) * cin + ci);
                }
            }
        }
        Ok(Self {
            spec,
            h,
            w,
            hp,
            wp,
            ho,
            wo,
            tap,
            pix: Vec::new(),
            xp: Vec::new(),
            dxp: Vec::new(),
            wt: Vec::new(),
            wk: Vec::new(),
            gpart: Vec::new(),
            dcols: Vec::new(),
            capacity: 0,
        })
    }

    fn k(&self) -> usize {
        self.spec.kh * self.spec.kw * self.spec.cin
    }
}

/// Output channels per block of the weight re-layouts: a block's rows of PyTorch's weights
/// (`BLOCK × cin·kh·kw`) stay in L2 while its `[k × cout]` side is written `BLOCK` values at a time.
const BLOCK: usize = 16;

/// Walks the weights in blocks of [`BLOCK`] output channels, calling `f(t, i, co0..co1)` for each
/// tap `t = (ky, kx, ci)` of the block, where `i` is the tap's offset within a PyTorch row
/// (`ci·kh·kw + ky·kw + kx`): weight `(co, t)` is at `t·cout + co` in tap order and at `co·k + i`
/// in PyTorch's order.
fn for_each_tap_block(spec: &ConvSpec, mut f: impl FnMut(usize, usize, std::ops::Range<usize>)) {
    let ConvSpec { cin, cout, kh, kw, .. } = *spec;
    let khkw = kh * kw;
    for co0 in (0..cout).step_by(BLOCK) {
        let co1 = (co0 + BLOCK).min(cout);
        for kyx in 0..khkw {
            for ci in 0..cin {
                f(kyx * cin + ci, ci * khkw + kyx, co0..co1);
            }
        }
    }
}

/// PyTorch's `[cout, cin, kh, kw]` weights `w` as `wt = [k × cout]` in tap order (the forward GEMM's B).
fn weights_to_taps_by_cout(spec: &ConvSpec, w: &[f32], wt: &mut [f32]) {
    let (cout, k) = (spec.cout, spec.kh * spec.kw * spec.cin);
    for_each_tap_block(spec, |t, i, cos| {
        for co in cos {
            wt[t * cout + co] = w[co * k + i];
        }
    });
}

/// PyTorch's weights `w` as `wk = [cout × k]` in tap order (the input-gradient GEMM's B): each output
/// channel's row permuted in place of a transpose.
fn weights_to_taps_by_row(spec: &ConvSpec, w: &[f32], wk: &mut [f32]) {
    let ConvSpec { cin, kh, kw, .. } = *spec;
    let khkw = kh * kw;
    let k = khkw * cin;
    for (dst, src) in wk.chunks_exact_mut(k).zip(w.chunks_exact(k)) {
        for kyx in 0..khkw {
            for (ci, d) in dst[kyx * cin..(kyx + 1) * cin].iter_mut().enumerate() {
                *d = src[ci * khkw + kyx];
            }
        }
    }
}

/// The threads' weight-gradient partials (`[k × cout]` in tap order each) summed in thread order
/// into PyTorch's layout `gw`.
fn taps_to_weights(spec: &ConvSpec, parts: &[Vec<f32>], gw: &mut [f32]) {
    let (cout, k) = (spec.cout, spec.kh * spec.kw * spec.cin);
    for_each_tap_block(spec, |t, i, cos| {
        for co in cos {
            gw[co * k + i] = parts.iter().map(|part| part[t * cout + co]).sum();
        }
    });
}

crate::simd::multiversion! {
/// Adds each pixel's column `cols[q]` (`k` values in tap order) into the padded input gradient at
/// its patch: one contiguous run of `cin` values per tap.
fn scatter(dxp: &mut [f32], cols: &[f32], pix: &[usize], tap: &[usize], base: usize, cin: usize) {
    let k = tap.len();
    for (&p, col) in pix.iter().zip(cols.chunks_exact(k)) {
        let origin = p - base;
        for (t, run) in col.chunks_exact(cin).enumerate() {
            let at = origin + tap[t * cin];
            for (d, &s) in dxp[at..at + cin].iter_mut().zip(run) {
                *d += s;
            }
        }
    }
}
}

impl Layer for Conv2d {
    fn describe(&self) -> String {
        let s = &self.spec;
        format!(
            "conv {}→{} {}×{} s{} p{}{}",
            s.cin,
            s.cout,
            s.kh,
            s.kw,
            s.stride,
            s.pad,
            if s.relu { " relu" } else { "" }
        )
    }

    fn input(&self) -> Layout {
        Layout::Image { c: self.spec.cin, h: self.h, w: self.w }
    }

    fn output(&self) -> Layout {
        Layout::Image { c: self.spec.cout, h: self.ho, w: self.wo }
    }

    fn params(&self) -> Vec<ParamSpec> {
        let s = &self.spec;
        let mut p = vec![ParamSpec::new(
            "weight",
            &[s.cout, s.cin, s.kh, s.kw],
            Init::HeUniform { fan_in: self.k() },
        )];
        if s.bias {
            p.push(ParamSpec::new("bias", &[s.cout], Init::Zeros));
        }
        p
    }

    fn forward_macs(&self) -> usize {
        self.ho * self.wo * self.spec.cout * self.k()
    }

    fn backward_macs(&self, input_grad: bool) -> usize {
        self.forward_macs() * if input_grad { 2 } else { 1 }
    }

    fn reserve(&mut self, batch: usize, threads: usize) {
        let cin = self.spec.cin;
        let img = self.hp * self.wp * cin;
        if batch > self.capacity {
            self.xp = vec![0.0; batch * img];
            self.dxp = vec![0.0; batch * img];
            self.pix.clear();
            let s = self.spec.stride;
            for b in 0..batch {
                for oy in 0..self.ho {
                    for ox in 0..self.wo {
                        self.pix.push(b * img + (oy * s * self.wp + ox * s) * cin);
                    }
                }
            }
            self.capacity = batch;
        }
        let k = self.k();
        self.wt.resize(k * self.spec.cout, 0.0);
        self.wk.resize(k * self.spec.cout, 0.0);
        self.gpart.resize_with(threads, Vec::new);
        self.dcols.resize_with(threads, Vec::new);
        for g in &mut self.gpart {
            g.resize(k * self.spec.cout + self.spec.cout, 0.0);
        }
        for d in &mut self.dcols {
            d.resize(DX_CHUNK * k, 0.0);
        }
    }

    fn forward(&mut self, cx: &Ctx<'_>, params: &[f32], _state: State<'_>, x: &[f32], y: &mut [f32]) {
        let ConvSpec { cin, cout, pad, relu, bias, .. } = self.spec;
        let k = self.k();
        let (wparams, bparams) = params.split_at(cout * k);
        weights_to_taps_by_cout(&self.spec, wparams, &mut self.wt);
        let (h, w, hp, wp) = (self.h, self.w, self.hp, self.wp);
        let img_in = h * w * cin;
        let img_p = hp * wp * cin;
        let npix = self.ho * self.wo;
        let threads = cx.pool.threads();
        let xp = SharedMut::new(&mut self.xp);
        cx.pool.run(|tid| {
            let samples = split(cx.batch, tid, threads);
            // SAFETY: each thread writes only its own samples' padded images.
            let xp_mine = unsafe { xp.range(samples.start * img_p..samples.end * img_p) };
            for (bi, b) in samples.clone().enumerate() {
                let src = &x[b * img_in..(b + 1) * img_in];
                let dst = &mut xp_mine[bi * img_p..(bi + 1) * img_p];
                for row in 0..h {
                    let d = ((row + pad) * wp + pad) * cin;
                    dst[d..d + w * cin].copy_from_slice(&src[row * w * cin..(row + 1) * w * cin]);
                }
            }
        });
        let out = SharedMut::new(y);
        let (tap, pix, wt, xp) = (&self.tap, &self.pix, &self.wt, &self.xp);
        cx.pool.run(|tid| {
            let samples = split(cx.batch, tid, threads);
            if samples.is_empty() {
                return;
            }
            let (p0, p1) = (samples.start * npix, samples.end * npix);
            // SAFETY: the threads' output pixel ranges are disjoint.
            let y_mine = unsafe { out.range(p0 * cout..p1 * cout) };
            let a = MatA { data: xp, rows: Index::Table(&pix[p0..p1]), cols: Index::Table(tap) };
            let epi = Epilogue {
                accumulate: false,
                bias: if bias { Bias::PerCol(bparams) } else { Bias::None },
                relu,
            };
            let r = gemm(p1 - p0, cout, k, a, MatB::row_major(wt, cout), y_mine, cout, epi);
            debug_assert!(r.is_ok(), "{r:?}");
        });
    }

    fn backward(
        &mut self,
        cx: &Ctx<'_>,
        params: &[f32],
        _x: &[f32],
        y: &[f32],
        dy: &mut [f32],
        dx: Option<&mut [f32]>,
        grads: &mut [f32],
    ) {
        let ConvSpec { cin, cout, pad, relu, bias, .. } = self.spec;
        let k = self.k();
        let npix = self.ho * self.wo;
        let (h, w, hp, wp) = (self.h, self.w, self.hp, self.wp);
        let img_p = hp * wp * cin;
        let img_in = h * w * cin;
        let want_dx = dx.is_some();
        if want_dx {
            let wparams = &params[..cout * k];
            weights_to_taps_by_row(&self.spec, wparams, &mut self.wk);
        }
        let threads = cx.pool.threads();
        let dys = SharedMut::new(dy);
        let gparts = SharedMut::new(&mut self.gpart);
        let dcols = SharedMut::new(&mut self.dcols);
        let dxp = SharedMut::new(&mut self.dxp);
        let dxs = dx.map(SharedMut::new);
        let (tap, pix, wk) = (&self.tap, &self.pix, &self.wk);
        let xp = &self.xp;
        cx.pool.run(|tid| {
            let samples = split(cx.batch, tid, threads);
            // SAFETY: thread `tid` alone uses its partial-sum and chunk buffers.
            let gpart = unsafe { &mut gparts.range(tid..tid + 1)[0] };
            let (gw, gb) = gpart.split_at_mut(k * cout);
            if samples.is_empty() {
                gw.fill(0.0);
                gb.fill(0.0);
                return;
            }
            let (p0, p1) = (samples.start * npix, samples.end * npix);
            // SAFETY: the threads' pixel ranges of dy are disjoint.
            let dy_mine = unsafe { dys.range(p0 * cout..p1 * cout) };
            if relu {
                for (g, &v) in dy_mine.iter_mut().zip(&y[p0 * cout..p1 * cout]) {
                    if v <= 0.0 {
                        *g = 0.0;
                    }
                }
            }
            gb.fill(0.0);
            if bias {
                for row in dy_mine.chunks_exact(cout) {
                    for (s, &g) in gb.iter_mut().zip(row) {
                        *s += g;
                    }
                }
            }
            let a = MatA { data: xp, rows: Index::Table(tap), cols: Index::Table(&pix[p0..p1]) };
            let r = gemm(k, cout, p1 - p0, a, MatB::row_major(dy_mine, cout), gw, cout, Epilogue::default());
            debug_assert!(r.is_ok(), "{r:?}");
            let Some(dxs) = dxs else { return };
            // SAFETY: each thread owns its samples' padded gradient images and its chunk buffer.
            let dxp_mine = unsafe { dxp.range(samples.start * img_p..samples.end * img_p) };
            dxp_mine.fill(0.0);
            let chunk = unsafe { &mut dcols.range(tid..tid + 1)[0] };
            let base = samples.start * img_p;
            let mut q0 = p0;
            while q0 < p1 {
                let q1 = (q0 + DX_CHUNK).min(p1);
                let rows = q1 - q0;
                let a = MatA::row_major(&dy_mine[(q0 - p0) * cout..], cout);
                let r = gemm(
                    rows,
                    k,
                    cout,
                    a,
                    MatB::row_major(wk, k),
                    &mut chunk[..rows * k],
                    k,
                    Epilogue::default(),
                );
                debug_assert!(r.is_ok(), "{r:?}");
                let part = &chunk[..rows * k];
                scatter(dxp_mine, part, &pix[q0..q1], tap, base, cin);
                q0 = q1;
            }
            // SAFETY: the threads' samples of dx are disjoint.
            let dx_mine = unsafe { dxs.range(samples.start * img_in..samples.end * img_in) };
            for bi in 0..samples.len() {
                let src = &dxp_mine[bi * img_p..(bi + 1) * img_p];
                let dst = &mut dx_mine[bi * img_in..(bi + 1) * img_in];
                for row in 0..h {
                    let s = ((row + pad) * wp + pad) * cin;
                    dst[row * w * cin..(row + 1) * w * cin].copy_from_slice(&src[s..s + w * cin]);
                }
            }
        });
        // Sum the threads' partials in thread order into PyTorch's layout.
        let (gw, gb) = grads.split_at_mut(cout * k);
        taps_to_weights(&self.spec, &self.gpart[..threads], gw);
        if bias {
            for (co, g) in gb.iter_mut().enumerate().take(cout) {
                *g = self.gpart[..threads].iter().map(|p| p[k * cout + co]).sum();
            }
        }
    }
}
