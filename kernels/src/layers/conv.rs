//! 2-D convolution on NHWC activations, any kernel size, stride and zero padding, as three GEMMs
//! with no im2col buffer (the *indirect* convolution: the GEMM reads patches straight from a
//! padded image through two offset tables).
//!
//! Tap order inside the layer is `k = (ky, kx, ci)` (channels innermost, contiguous in NHWC);
//! parameters keep PyTorch's `[cout, cin, kh, kw]` order in the flat vector.
//! - forward: `Y[p][co] = Σ_k Xp[pix[p] + tap[k]] · Wt[k][co]` — A by tables, B = the weights
//!   re-laid `[k × cout]` (rebuilt each forward: the GEMM's packing); bias and ReLU fused in the
//!   epilogue. Threads split the batch.
//! - weight gradient: `dWt[k][co] = Σ_p Xp[tap[k] + pix[p]] · dY[p][co]` over the whole batch —
//!   the same tables swapped, B = dY in place. Threads split the taps (the rows of `dWt`), so
//!   there are no per-thread partial sums to add, the result does not depend on the thread count,
//!   and each thread re-lays its own rows into PyTorch's order.
//! - input gradient, stride 1 (and padding below the kernel size): a forward convolution of the
//!   output gradient, zero-padded by `kernel − 1 − pad`, with the weights flipped and transposed
//!   (`[(ky', kx', co) × cin]`), written straight into dx. Otherwise (strided): `dcols[p][k] =
//!   Σ_co dY[p][co] · Wk[co][k]`, in chunks of pixels that stay in L2, scattered into the padded
//!   gradient as runs of `cin` contiguous values per tap. Threads split the batch.
//!
//! The weight re-layouts run on every thread, each its own output channels or taps.

use super::norm::add_rows;
use super::residual::{add_into, relu_mask};
use super::{Ctx, Init, Layer, Layout, ParamSpec, State};
use crate::gemm::{Bias, Epilogue, Index, MatA, MatB, gemm, row_tile};
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

/// Pixels per chunk of the strided input-gradient GEMM (its C, `chunk × cin·kh·kw`, stays in L2).
const DX_CHUNK: usize = 64;

/// Output channels per block of the weight re-layouts: a block's rows of PyTorch's weights
/// (`BLOCK × cin·kh·kw`) stay in L2 while its `[k × cout]` side is written `BLOCK` values at a time.
const BLOCK: usize = 16;

/// How the input gradient is computed (see the module's documentation).
#[derive(Debug)]
enum InputGrad {
    /// Stride 1: a forward convolution of the padded output gradient with the flipped weights.
    Direct {
        /// Padded output-gradient image size.
        hq: usize,
        wq: usize,
        /// Offset of tap `(ky', kx', co)` from a patch's origin in the padded output gradient.
        tap: Vec<usize>,
        /// Offset of each input pixel's patch origin in the padded output gradient (whole batch).
        pix: Vec<usize>,
        /// The padded output gradient `[batch × hq × wq × cout]`; borders stay zero.
        dyp: Vec<f32>,
        /// Weights flipped and transposed, `[(ky', kx', co) × cin]` (the GEMM's B).
        wf: Vec<f32>,
    },
    /// Strided: columns of the input gradient, scattered into the padded input gradient.
    Scatter {
        /// The padded input gradient.
        dxp: Vec<f32>,
        /// Weights as `[cout × k]` in tap order (the GEMM's B).
        wk: Vec<f32>,
        /// Per thread: a chunk of columns `[DX_CHUNK × k]`.
        dcols: Vec<Vec<f32>>,
    },
}

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
    /// Weights as `[k × cout]` (the forward GEMM's B).
    wt: Vec<f32>,
    /// The weight gradient as `[k × cout]` in tap order.
    gtap: Vec<f32>,
    /// Per thread but the first: its partial weight gradient over its samples, `[k × cout]` (when
    /// the threads split the batch for it, see [`Conv2d::taps_split`]).
    gpart: Vec<Vec<f32>>,
    /// Per thread: the bias gradient's partial sum over the thread's samples.
    gbias: Vec<Vec<f32>>,
    dgrad: InputGrad,
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
        let dgrad = if stride == 1 && pad < kh && pad < kw {
            let (hq, wq) = (ho + 2 * (kh - 1 - pad), wo + 2 * (kw - 1 - pad));
            InputGrad::Direct {
                hq,
                wq,
                tap: taps(kh, kw, wq, cout),
                pix: Vec::new(),
                dyp: Vec::new(),
                wf: Vec::new(),
            }
        } else {
            InputGrad::Scatter { dxp: Vec::new(), wk: Vec::new(), dcols: Vec::new() }
        };
        Ok(Self {
            spec,
            h,
            w,
            hp,
            wp,
            ho,
            wo,
            tap: taps(kh, kw, wp, cin),
            pix: Vec::new(),
            xp: Vec::new(),
            wt: Vec::new(),
            gtap: Vec::new(),
            gpart: Vec::new(),
            gbias: Vec::new(),
            dgrad,
            capacity: 0,
        })
    }

    fn k(&self) -> usize {
        self.spec.kh * self.spec.kw * self.spec.cin
    }

    /// Whether the threads split the weight gradient's taps (each over the whole batch) rather than
    /// the batch (each all taps over its samples, then the partial sums added): the taps when the
    /// weights outweigh the activations each thread would read again, so adding `threads` copies of
    /// the weights would cost more than reading the batch's input and output gradient once more
    /// per thread.
    fn taps_split(&self, batch: usize, threads: usize) -> bool {
        let ConvSpec { cin, cout, .. } = self.spec;
        threads == 1 || self.k() * cout >= batch * self.ho * self.wo * (cin + cout)
    }
}

/// Offsets of the taps `(ky, kx, c)` of a `kh × kw` kernel from a patch's origin in a padded NHWC
/// image `wp` pixels wide with `c` channels.
fn taps(kh: usize, kw: usize, wp: usize, c: usize) -> Vec<usize> {
    let mut tap = Vec::with_capacity(kh * kw * c);
    for ky in 0..kh {
        for kx in 0..kw {
            tap.extend((0..c).map(|ci| (ky * wp + kx) * c + ci));
        }
    }
    tap
}

/// Offsets of the patch origins of `batch` images of `rows × cols` output pixels in padded images
/// of `img` values, `wp` pixels wide, `c` channels, with stride `stride`.
fn origins(
    batch: usize,
    rows: usize,
    cols: usize,
    img: usize,
    wp: usize,
    c: usize,
    stride: usize,
) -> Vec<usize> {
    let mut pix = Vec::with_capacity(batch * rows * cols);
    for b in 0..batch {
        for oy in 0..rows {
            pix.extend((0..cols).map(|ox| b * img + (oy * stride * wp + ox * stride) * c));
        }
    }
    pix
}

/// Where `h × w × c` NHWC images sit inside their zero-bordered copies (`hp × wp × c` each,
/// `top` rows and `left` columns in).
#[derive(Clone, Copy, Debug)]
struct Frame {
    h: usize,
    w: usize,
    c: usize,
    hp: usize,
    wp: usize,
    top: usize,
    left: usize,
}

impl Frame {
    /// Values of one bordered image.
    fn img(&self) -> usize {
        self.hp * self.wp * self.c
    }

    /// Copies the images of `src` into the interiors of `dst`'s bordered images.
    fn fill(&self, src: &[f32], dst: &mut [f32]) {
        let row = self.w * self.c;
        for (s, d) in src.chunks_exact(self.h * row).zip(dst.chunks_exact_mut(self.img())) {
            for (y, s) in s.chunks_exact(row).enumerate() {
                let at = ((y + self.top) * self.wp + self.left) * self.c;
                d[at..at + row].copy_from_slice(s);
            }
        }
    }

    /// Copies the interiors of `src`'s bordered images into the images of `dst`.
    fn crop(&self, src: &[f32], dst: &mut [f32]) {
        let row = self.w * self.c;
        for (s, d) in src.chunks_exact(self.img()).zip(dst.chunks_exact_mut(self.h * row)) {
            for (y, d) in d.chunks_exact_mut(row).enumerate() {
                let at = ((y + self.top) * self.wp + self.left) * self.c;
                d.copy_from_slice(&s[at..at + row]);
            }
        }
    }
}

/// Walks the weights of output channels `cos` (a range of whole [`BLOCK`]s but for the last) in
/// blocks of [`BLOCK`], calling `f(t, i, co0..co1)` for each tap `t = (ky, kx, ci)` in `taps`,
/// where `i` is the tap's offset within a PyTorch row (`ci·kh·kw + ky·kw + kx`): weight `(co, t)` is
/// at `t·cout + co` in tap order and at `co·k + i` in PyTorch's order.
fn for_each_tap_block(
    spec: &ConvSpec,
    cos: std::ops::Range<usize>,
    taps: std::ops::Range<usize>,
    mut f: impl FnMut(usize, usize, std::ops::Range<usize>),
) {
    let ConvSpec { cin, kh, kw, .. } = *spec;
    let khkw = kh * kw;
    for co0 in cos.clone().step_by(BLOCK) {
        let co1 = (co0 + BLOCK).min(cos.end);
        for t in taps.clone() {
            let (kyx, ci) = (t / cin, t % cin);
            f(t, ci * khkw + kyx, co0..co1);
        }
    }
}

/// Rows `taps` of `wt = [k × cout]` (tap order, the forward GEMM's B) from PyTorch's
/// `[cout, cin, kh, kw]` weights `w`; `wt` holds just those rows.
fn weights_to_taps_by_cout(spec: &ConvSpec, w: &[f32], taps: std::ops::Range<usize>, wt: &mut [f32]) {
    let (cout, k) = (spec.cout, spec.kh * spec.kw * spec.cin);
    let t0 = taps.start;
    for_each_tap_block(spec, 0..cout, taps, |t, i, cos| {
        for co in cos {
            wt[(t - t0) * cout + co] = w[co * k + i];
        }
    });
}

/// Rows `cos` of `wk = [cout × k]` in tap order (the strided input-gradient GEMM's B) from
/// PyTorch's weights `w`: each output channel's row permuted; `wk` holds just those rows.
fn weights_to_taps_by_row(spec: &ConvSpec, w: &[f32], cos: std::ops::Range<usize>, wk: &mut [f32]) {
    let ConvSpec { cin, kh, kw, .. } = *spec;
    let khkw = kh * kw;
    let k = khkw * cin;
    for (dst, src) in wk.chunks_exact_mut(k).zip(w[cos.start * k..cos.end * k].chunks_exact(k)) {
        for kyx in 0..khkw {
            for (ci, d) in dst[kyx * cin..(kyx + 1) * cin].iter_mut().enumerate() {
                *d = src[ci * khkw + kyx];
            }
        }
    }
}

/// Rows of output channels `cos` of the flipped, transposed weights `wf = [(ky', kx', co) × cin]`
/// (the direct input gradient's B): `wf[(ky'·kw + kx')·cout + co][ci] = w[co][ci][kh−1−ky'][kw−1−kx']`.
///
/// # Safety
/// `wf` must be valid for writes of `kh·kw·cout·cin` values, and no other thread may write the
/// rows of these output channels meanwhile.
unsafe fn weights_flipped(spec: &ConvSpec, w: &[f32], cos: std::ops::Range<usize>, wf: *mut f32) {
    let ConvSpec { cin, cout, kh, kw, .. } = *spec;
    let khkw = kh * kw;
    for co in cos {
        let src = &w[co * cin * khkw..(co + 1) * cin * khkw];
        for kyx in 0..khkw {
            let flip = khkw - 1 - kyx;
            // SAFETY: row (kyx, co) lies inside `wf` and belongs to this caller (the contract).
            let dst = unsafe { std::slice::from_raw_parts_mut(wf.add((kyx * cout + co) * cin), cin) };
            for (ci, d) in dst.iter_mut().enumerate() {
                *d = src[ci * khkw + flip];
            }
        }
    }
}

/// The weight gradient's rows `taps` (in tap order, `gtap = [taps × cout]`) written into
/// PyTorch's layout `gw`.
///
/// # Safety
/// `gw` must be valid for writes of `cout·k` values, and no other thread may write the positions
/// of these taps meanwhile.
unsafe fn taps_to_weights(spec: &ConvSpec, gtap: &[f32], taps: std::ops::Range<usize>, gw: *mut f32) {
    let (cout, k) = (spec.cout, spec.kh * spec.kw * spec.cin);
    let t0 = taps.start;
    for_each_tap_block(spec, 0..cout, taps, |t, i, cos| {
        for co in cos {
            // SAFETY: `co·k + i < cout·k`, and tap `t`'s positions are this caller's (the contract).
            unsafe { *gw.add(co * k + i) = gtap[(t - t0) * cout + co] };
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

impl Conv2d {
    /// Where the input sits in the padded input.
    fn input_frame(&self) -> Frame {
        let ConvSpec { cin, pad, .. } = self.spec;
        Frame { h: self.h, w: self.w, c: cin, hp: self.hp, wp: self.wp, top: pad, left: pad }
    }

    /// Where the output gradient sits in its padded copy (the direct input gradient's).
    fn output_frame(&self, hq: usize, wq: usize) -> Frame {
        let ConvSpec { cout, kh, kw, pad, .. } = self.spec;
        Frame { h: self.ho, w: self.wo, c: cout, hp: hq, wp: wq, top: kh - 1 - pad, left: kw - 1 - pad }
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
        let ConvSpec { cin, cout, stride, .. } = self.spec;
        let k = self.k();
        let img = self.hp * self.wp * cin;
        if batch > self.capacity {
            self.xp = vec![0.0; batch * img];
            self.pix = origins(batch, self.ho, self.wo, img, self.wp, cin, stride);
            let (h, w) = (self.h, self.w);
            match &mut self.dgrad {
                InputGrad::Direct { hq, wq, pix, dyp, .. } => {
                    let img_q = *hq * *wq * cout;
                    *dyp = vec![0.0; batch * img_q];
                    *pix = origins(batch, h, w, img_q, *wq, cout, 1);
                }
                InputGrad::Scatter { dxp, .. } => *dxp = vec![0.0; batch * img],
            }
            self.capacity = batch;
        }
        self.wt.resize(k * cout, 0.0);
        self.gtap.resize(k * cout, 0.0);
        let parts = if self.taps_split(batch, threads) { 0 } else { threads - 1 };
        self.gpart.resize_with(parts, Vec::new);
        for g in &mut self.gpart {
            g.resize(k * cout, 0.0);
        }
        self.gbias.resize_with(threads, Vec::new);
        for g in &mut self.gbias {
            g.resize(cout, 0.0);
        }
        match &mut self.dgrad {
            InputGrad::Direct { wf, .. } => wf.resize(k * cout, 0.0),
            InputGrad::Scatter { wk, dcols, .. } => {
                wk.resize(k * cout, 0.0);
                dcols.resize_with(threads, Vec::new);
                for d in dcols {
                    d.resize(DX_CHUNK * k, 0.0);
                }
            }
        }
    }

    fn forward(&mut self, cx: &Ctx<'_>, params: &[f32], _state: State<'_>, x: &[f32], y: &mut [f32]) {
        let spec = self.spec;
        let ConvSpec { cout, relu, bias, .. } = spec;
        let k = self.k();
        let (wparams, bparams) = params.split_at(cout * k);
        let frame = self.input_frame();
        let (img_in, img_p) = (self.h * self.w * spec.cin, frame.img());
        let npix = self.ho * self.wo;
        let threads = cx.pool.threads();
        let (xp, wt) = (SharedMut::new(&mut self.xp), SharedMut::new(&mut self.wt));
        cx.pool.run(|tid| {
            let taps = split(k, tid, threads);
            // SAFETY: each thread writes its own rows (taps) of wt and its own samples' padded
            // images.
            let wt_mine = unsafe { wt.range(taps.start * cout..taps.end * cout) };
            weights_to_taps_by_cout(&spec, wparams, taps, wt_mine);
            let samples = split(cx.batch, tid, threads);
            let xp_mine = unsafe { xp.range(samples.start * img_p..samples.end * img_p) };
            frame.fill(&x[samples.start * img_in..samples.end * img_in], xp_mine);
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
        let spec = self.spec;
        let ConvSpec { cin, cout, relu, bias, .. } = spec;
        let k = self.k();
        let npix = self.ho * self.wo;
        let all = cx.batch * npix;
        let threads = cx.pool.threads();
        let wparams = &params[..cout * k];
        let want_dx = dx.is_some();
        let out_frame = match self.dgrad {
            InputGrad::Direct { hq, wq, .. } => Some(self.output_frame(hq, wq)),
            InputGrad::Scatter { .. } => None,
        };
        // By samples: the ReLU's mask on dy, the bias's partial sums and the padded copy of dy;
        // by output channels: the input gradient's weights (a region only when there is any).
        let prepare = relu || bias || want_dx;
        let dys = SharedMut::new(&mut dy[..all * cout]);
        let gbias = SharedMut::new(&mut self.gbias);
        let (dyp, wdx) = match &mut self.dgrad {
            InputGrad::Direct { dyp, wf, .. } => (SharedMut::new(dyp), SharedMut::new(wf)),
            InputGrad::Scatter { wk, .. } => (SharedMut::new(&mut []), SharedMut::new(wk)),
        };
        let prep = |tid: usize| {
            let samples = split(cx.batch, tid, threads);
            let (p0, p1) = (samples.start * npix, samples.end * npix);
            // SAFETY: the threads' samples of dy and of its padded copy, their bias partials and
            // their output channels of the weights are disjoint.
            let dy_mine = unsafe { dys.range(p0 * cout..p1 * cout) };
            if relu {
                relu_mask(dy_mine, &y[p0 * cout..p1 * cout]);
            }
            let gb = unsafe { &mut gbias.range(tid..tid + 1)[0] };
            gb.fill(0.0);
            if bias {
                add_rows(gb, dy_mine);
            }
            if !want_dx {
                return;
            }
            let cos = split(cout, tid, threads);
            match out_frame {
                Some(f) => {
                    let dyp_mine = unsafe { dyp.range(samples.start * f.img()..samples.end * f.img()) };
                    f.fill(dy_mine, dyp_mine);
                    unsafe { weights_flipped(&spec, wparams, cos, wdx.as_ptr()) };
                }
                None => {
                    let wk_mine = unsafe { wdx.range(cos.start * k..cos.end * k) };
                    weights_to_taps_by_row(&spec, wparams, cos, wk_mine);
                }
            }
        };
        if prepare {
            cx.pool.run(prep);
        }
        // The weight gradient, then the input gradient by samples.
        let (gw, gb) = grads.split_at_mut(cout * k);
        let (gws, gtap, gpart) =
            (SharedMut::new(gw), SharedMut::new(&mut self.gtap), SharedMut::new(&mut self.gpart));
        let mr = row_tile(cout);
        let tiles = k.div_ceil(mr);
        let by_taps = self.taps_split(cx.batch, threads) || self.gpart.len() + 1 < threads;
        let dy = &dy[..all * cout];
        let dxs = dx.map(SharedMut::new);
        let frame = self.input_frame();
        let (tap, pix, xp) = (&self.tap, &self.pix[..all], &self.xp);
        let how = match &mut self.dgrad {
            InputGrad::Direct { tap, pix, dyp, wf, .. } => Dgrad::Direct { tap, pix, dyp, wf },
            InputGrad::Scatter { dxp, wk, dcols } => {
                Dgrad::Scatter { dxp: SharedMut::new(dxp), wk, dcols: SharedMut::new(dcols) }
            }
        };
        let input_grad = InputGradRun { spec, npix, frame, tap, pix, how };
        let img_in = self.h * self.w * cin;
        cx.pool.run(|tid| {
            if by_taps {
                // Each thread its taps (rows of the tap-order gradient) over the whole batch, then
                // their positions in PyTorch's layout.
                let t = split(tiles, tid, threads);
                let taps = (t.start * mr).min(k)..(t.end * mr).min(k);
                // SAFETY: the threads' rows of the tap-order gradient are disjoint, and so are the
                // positions of their taps in PyTorch's layout.
                let mine = unsafe { gtap.range(taps.start * cout..taps.end * cout) };
                let a = MatA { data: xp, rows: Index::Table(&tap[taps.clone()]), cols: Index::Table(pix) };
                let r = gemm(
                    taps.len(),
                    cout,
                    all,
                    a,
                    MatB::row_major(dy, cout),
                    mine,
                    cout,
                    Epilogue::default(),
                );
                debug_assert!(r.is_ok(), "{r:?}");
                unsafe { taps_to_weights(&spec, mine, taps, gws.as_ptr()) };
            } else {
                // Each thread all taps over its samples: thread 0 into the gradient, the others
                // into their partial sums (added in the next region).
                let samples = split(cx.batch, tid, threads);
                let (p0, p1) = (samples.start * npix, samples.end * npix);
                // SAFETY: thread 0 alone writes the tap-order gradient, thread `tid` > 0 alone its
                // partial.
                let c = if tid == 0 {
                    unsafe { gtap.range(0..k * cout) }
                } else {
                    unsafe { &mut gpart.range(tid - 1..tid)[0][..k * cout] }
                };
                if samples.is_empty() {
                    c.fill(0.0);
                } else {
                    let a = MatA { data: xp, rows: Index::Table(tap), cols: Index::Table(&pix[p0..p1]) };
                    let b = MatB::row_major(&dy[p0 * cout..p1 * cout], cout);
                    let r = gemm(k, cout, p1 - p0, a, b, c, cout, Epilogue::default());
                    debug_assert!(r.is_ok(), "{r:?}");
                }
            }
            let Some(dxs) = dxs else { return };
            let samples = split(cx.batch, tid, threads);
            // SAFETY: the threads' samples of dx are disjoint.
            let dx_mine = unsafe { dxs.range(samples.start * img_in..samples.end * img_in) };
            input_grad.run(tid, samples, dy, dx_mine);
        });
        if !by_taps {
            // The partial sums added in thread order, each thread its taps, then their positions
            // in PyTorch's layout.
            let parts = &self.gpart[..threads - 1];
            cx.pool.run(|tid| {
                let t = split(tiles, tid, threads);
                let taps = (t.start * mr).min(k)..(t.end * mr).min(k);
                if taps.is_empty() {
                    return;
                }
                let span = taps.start * cout..taps.end * cout;
                // SAFETY: the threads' rows of the tap-order gradient and the positions of their
                // taps in PyTorch's layout are disjoint.
                let mine = unsafe { gtap.range(span.clone()) };
                for part in parts {
                    add_into(mine, &part[span.clone()]);
                }
                unsafe { taps_to_weights(&spec, mine, taps, gws.as_ptr()) };
            });
        }
        // The bias: the threads' partial sums in thread order.
        if bias {
            for (co, g) in gb.iter_mut().enumerate().take(cout) {
                *g = self.gbias[..threads].iter().map(|p| p[co]).sum();
            }
        }
    }
}

/// The input gradient's part of the second backward region.
struct InputGradRun<'a> {
    spec: ConvSpec,
    /// Output pixels per sample.
    npix: usize,
    /// Where the input sits in the padded input (and the strided path's padded gradient).
    frame: Frame,
    /// The input's taps and the output pixels' patch origins (where the strided path scatters).
    tap: &'a [usize],
    pix: &'a [usize],
    how: Dgrad<'a>,
}

impl InputGradRun<'_> {
    /// The input gradient `dx` of `samples` (their part of dx) from the masked output gradient `dy`
    /// (the whole batch's), on thread `tid`.
    fn run(&self, tid: usize, samples: std::ops::Range<usize>, dy: &[f32], dx: &mut [f32]) {
        let ConvSpec { cin, cout, .. } = self.spec;
        match &self.how {
            Dgrad::Direct { tap, pix, dyp, wf } => {
                let hw = self.frame.h * self.frame.w;
                let (q0, q1) = (samples.start * hw, samples.end * hw);
                let a = MatA { data: dyp, rows: Index::Table(&pix[q0..q1]), cols: Index::Table(tap) };
                let b = MatB::row_major(wf, cin);
                let r = gemm(q1 - q0, cin, tap.len(), a, b, dx, cin, Epilogue::default());
                debug_assert!(r.is_ok(), "{r:?}");
            }
            Dgrad::Scatter { dxp, wk, dcols } => {
                let k = self.tap.len();
                let img_p = self.frame.img();
                // SAFETY: each thread owns its samples' padded gradient images and its chunk.
                let dxp_mine = unsafe { dxp.range(samples.start * img_p..samples.end * img_p) };
                dxp_mine.fill(0.0);
                let cols = unsafe { &mut dcols.range(tid..tid + 1)[0] };
                let base = samples.start * img_p;
                let (p0, p1) = (samples.start * self.npix, samples.end * self.npix);
                let mut q0 = p0;
                while q0 < p1 {
                    let q1 = (q0 + DX_CHUNK).min(p1);
                    let rows = q1 - q0;
                    let a = MatA::row_major(&dy[q0 * cout..], cout);
                    let part = &mut cols[..rows * k];
                    let r = gemm(rows, k, cout, a, MatB::row_major(wk, k), part, k, Epilogue::default());
                    debug_assert!(r.is_ok(), "{r:?}");
                    scatter(dxp_mine, part, &self.pix[q0..q1], self.tap, base, cin);
                    q0 = q1;
                }
                self.frame.crop(dxp_mine, dx);
            }
        }
    }
}

/// The input gradient's buffers as the second backward region reads and writes them.
enum Dgrad<'a> {
    Direct { tap: &'a [usize], pix: &'a [usize], dyp: &'a [f32], wf: &'a [f32] },
    Scatter { dxp: SharedMut<f32>, wk: &'a [f32], dcols: SharedMut<Vec<f32>> },
}
