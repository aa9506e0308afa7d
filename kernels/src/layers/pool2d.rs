//! Pooling on NHWC activations: max pooling with saved argmax indices, average pooling (padding
//! counted, PyTorch's default), and global average pooling into feature-major features.
//! Vectors run over channels (contiguous in NHWC); threads split the batch.

use super::{Ctx, Layer, Layout, State};
use crate::pool::{SharedMut, split};

/// Window of a pooling layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct PoolSpec {
    /// Window size (square).
    pub k: usize,
    /// Stride.
    pub stride: usize,
    /// Padding (max pooling ignores padded positions; average pooling counts them as zeros).
    pub pad: usize,
}

fn out_dims(spec: PoolSpec, h: usize, w: usize) -> Result<(usize, usize), String> {
    let PoolSpec { k, stride, pad } = spec;
    if k == 0 || stride == 0 {
        return Err(format!("pooling {spec:?}: window and stride must be at least 1"));
    }
    if pad >= k {
        return Err(format!("pooling {spec:?}: padding must be smaller than the window"));
    }
    if h + 2 * pad < k || w + 2 * pad < k {
        return Err(format!("a {k}×{k} pooling window does not fit a {h}×{w} input with padding {pad}"));
    }
    Ok(((h + 2 * pad - k) / stride + 1, (w + 2 * pad - k) / stride + 1))
}

/// Max pooling; `backward` routes each output's gradient to the input that won.
#[derive(Debug)]
pub struct MaxPool2d {
    spec: PoolSpec,
    c: usize,
    h: usize,
    w: usize,
    ho: usize,
    wo: usize,
    /// Per output value, the index (within the batch's input) of its maximum.
    argmax: Vec<u32>,
}

impl MaxPool2d {
    /// Max pooling of `spec` over `c × h × w` inputs.
    pub fn new(spec: PoolSpec, c: usize, h: usize, w: usize) -> Result<Self, String> {
        let (ho, wo) = out_dims(spec, h, w)?;
        Ok(Self { spec, c, h, w, ho, wo, argmax: Vec::new() })
    }
}

impl Layer for MaxPool2d {
    fn describe(&self) -> String {
        format!("maxpool {}×{} s{} p{}", self.spec.k, self.spec.k, self.spec.stride, self.spec.pad)
    }

    fn input(&self) -> Layout {
        Layout::Image { c: self.c, h: self.h, w: self.w }
    }

    fn output(&self) -> Layout {
        Layout::Image { c: self.c, h: self.ho, w: self.wo }
    }

    fn reserve(&mut self, batch: usize, _threads: usize) {
        self.argmax.resize(batch * self.ho * self.wo * self.c, 0);
    }

    fn forward(&mut self, cx: &Ctx<'_>, _p: &[f32], _s: State<'_>, x: &[f32], y: &mut [f32]) {
        let (c, h, w, ho, wo) = (self.c, self.h, self.w, self.ho, self.wo);
        let PoolSpec { k, stride, pad } = self.spec;
        let threads = cx.pool.threads();
        let (ys, idx) = (SharedMut::new(y), SharedMut::new(&mut self.argmax));
        cx.pool.run(|tid| {
            let samples = split(cx.batch, tid, threads);
            let out_img = ho * wo * c;
            // SAFETY: each thread writes only its own samples' outputs and indices.
            let y_mine = unsafe { ys.range(samples.start * out_img..samples.end * out_img) };
            let i_mine = unsafe { idx.range(samples.start * out_img..samples.end * out_img) };
            let dims = MaxDims { c, h, w, ho, wo, k, stride, pad };
            for (bi, b) in samples.enumerate() {
                let o = bi * ho * wo * c;
                let (yo, io) = (&mut y_mine[o..o + ho * wo * c], &mut i_mine[o..o + ho * wo * c]);
                max_sample(&dims, x, b * h * w * c, yo, io);
            }
        });
    }

    fn backward(
        &mut self,
        cx: &Ctx<'_>,
        _p: &[f32],
        _x: &[f32],
        _y: &[f32],
        dy: &mut [f32],
        dx: Option<&mut [f32]>,
        _g: &mut [f32],
    ) {
        let Some(dx) = dx else { return };
        let (in_img, out_img) = (self.h * self.w * self.c, self.ho * self.wo * self.c);
        let threads = cx.pool.threads();
        let dxs = SharedMut::new(dx);
        let argmax = &self.argmax;
        let dy = &*dy;
        cx.pool.run(|tid| {
            let samples = split(cx.batch, tid, threads);
            let base = samples.start * in_img;
            // SAFETY: a sample's argmax indices point into that sample's input only, and each
            // thread owns its samples.
            let dx_mine = unsafe { dxs.range(base..samples.end * in_img) };
            dx_mine.fill(0.0);
            let r = samples.start * out_img..samples.end * out_img;
            for (&i, &g) in argmax[r.clone()].iter().zip(&dy[r]) {
                dx_mine[i as usize - base] += g;
            }
        });
    }
}

struct MaxDims {
    c: usize,
    h: usize,
    w: usize,
    ho: usize,
    wo: usize,
    k: usize,
    stride: usize,
    pad: usize,
}

crate::simd::multiversion! {
/// One sample's max pooling: values and argmax indices (absolute in `x`). Branch-free over the
/// channels so it vectorises; `>` keeps the first maximum, as PyTorch does.
fn max_sample(d: &MaxDims, x: &[f32], xb: usize, y: &mut [f32], idx: &mut [u32]) {
    let c = d.c;
    for oy in 0..d.ho {
        for ox in 0..d.wo {
            let o = (oy * d.wo + ox) * c;
            let (yo, io) = (&mut y[o..o + c], &mut idx[o..o + c]);
            yo.fill(f32::NEG_INFINITY);
            for ky in 0..d.k {
                let Some(iy) = (oy * d.stride + ky).checked_sub(d.pad).filter(|&v| v < d.h) else {
                    continue;
                };
                for kx in 0..d.k {
                    let Some(ix) = (ox * d.stride + kx).checked_sub(d.pad).filter(|&v| v < d.w) else {
                        continue;
                    };
                    let at = xb + (iy * d.w + ix) * c;
                    let xs = &x[at..at + c];
                    for (ch, ((yv, iv), &v)) in yo.iter_mut().zip(io.iter_mut()).zip(xs).enumerate() {
                        let take = v > *yv;
                        *yv = if take { v } else { *yv };
                        *iv = if take { (at + ch) as u32 } else { *iv };
                    }
                }
            }
        }
    }
}
}

/// Average pooling (zero padding counted in the divisor, PyTorch's `count_include_pad=True`).
#[derive(Debug)]
pub struct AvgPool2d {
    spec: PoolSpec,
    c: usize,
    h: usize,
    w: usize,
    ho: usize,
    wo: usize,
}

impl AvgPool2d {
    /// Average pooling of `spec` over `c × h × w` inputs.
    pub fn new(spec: PoolSpec, c: usize, h: usize, w: usize) -> Result<Self, String> {
        let (ho, wo) = out_dims(spec, h, w)?;
        Ok(Self { spec, c, h, w, ho, wo })
    }

    /// Calls `f(output offset, input offset)` for every (output pixel, in-bounds window pixel) of
    /// one sample.
    fn windows(&self, mut f: impl FnMut(usize, usize)) {
        let PoolSpec { k, stride, pad } = self.spec;
        for oy in 0..self.ho {
            for ox in 0..self.wo {
                for ky in 0..k {
                    let Some(iy) = (oy * stride + ky).checked_sub(pad).filter(|&v| v < self.h) else {
                        continue;
                    };
                    for kx in 0..k {
                        let Some(ix) = (ox * stride + kx).checked_sub(pad).filter(|&v| v < self.w) else {
                            continue;
                        };
                        f((oy * self.wo + ox) * self.c, (iy * self.w + ix) * self.c);
                    }
                }
            }
        }
    }
}

impl Layer for AvgPool2d {
    fn describe(&self) -> String {
        format!("avgpool {}×{} s{} p{}", self.spec.k, self.spec.k, self.spec.stride, self.spec.pad)
    }

    fn input(&self) -> Layout {
        Layout::Image { c: self.c, h: self.h, w: self.w }
    }

    fn output(&self) -> Layout {
        Layout::Image { c: self.c, h: self.ho, w: self.wo }
    }

    fn reserve(&mut self, _batch: usize, _threads: usize) {}

    fn forward(&mut self, cx: &Ctx<'_>, _p: &[f32], _s: State<'_>, x: &[f32], y: &mut [f32]) {
        let c = self.c;
        let (in_img, out_img) = (self.h * self.w * c, self.ho * self.wo * c);
        let scale = 1.0 / (self.spec.k * self.spec.k) as f32;
        let threads = cx.pool.threads();
        let ys = SharedMut::new(y);
        cx.pool.run(|tid| {
            let samples = split(cx.batch, tid, threads);
            // SAFETY: each thread writes only its own samples' outputs.
            let y_mine = unsafe { ys.range(samples.start * out_img..samples.end * out_img) };
            y_mine.fill(0.0);
            for (bi, b) in samples.enumerate() {
                let (xb, yb) =
                    (&x[b * in_img..(b + 1) * in_img], &mut y_mine[bi * out_img..(bi + 1) * out_img]);
                self.windows(|o, i| {
                    for (d, &s) in yb[o..o + c].iter_mut().zip(&xb[i..i + c]) {
                        *d += s;
                    }
                });
                for v in yb.iter_mut() {
                    *v *= scale;
                }
            }
        });
    }

    fn backward(
        &mut self,
        cx: &Ctx<'_>,
        _p: &[f32],
        _x: &[f32],
        _y: &[f32],
        dy: &mut [f32],
        dx: Option<&mut [f32]>,
        _g: &mut [f32],
    ) {
        let Some(dx) = dx else { return };
        let c = self.c;
        let (in_img, out_img) = (self.h * self.w * c, self.ho * self.wo * c);
        let scale = 1.0 / (self.spec.k * self.spec.k) as f32;
        let threads = cx.pool.threads();
        let dxs = SharedMut::new(dx);
        let dy = &*dy;
        cx.pool.run(|tid| {
            let samples = split(cx.batch, tid, threads);
            // SAFETY: each thread writes only its own samples' input gradients.
            let dx_mine = unsafe { dxs.range(samples.start * in_img..samples.end * in_img) };
            dx_mine.fill(0.0);
            for (bi, b) in samples.enumerate() {
                let (gb, db) =
                    (&dy[b * out_img..(b + 1) * out_img], &mut dx_mine[bi * in_img..(bi + 1) * in_img]);
                self.windows(|o, i| {
                    for (d, &s) in db[i..i + c].iter_mut().zip(&gb[o..o + c]) {
                        *d += s * scale;
                    }
                });
            }
        });
    }
}

/// Mean over all pixels of each channel: NHWC `c × h × w` in, feature-major `c` out.
#[derive(Debug)]
pub struct GlobalAvgPool {
    c: usize,
    h: usize,
    w: usize,
}

impl GlobalAvgPool {
    /// Global average pooling of `c × h × w` inputs.
    pub fn new(c: usize, h: usize, w: usize) -> Self {
        Self { c, h, w }
    }
}

impl Layer for GlobalAvgPool {
    fn describe(&self) -> String {
        "global avgpool".into()
    }

    fn input(&self) -> Layout {
        Layout::Image { c: self.c, h: self.h, w: self.w }
    }

    fn output(&self) -> Layout {
        Layout::Features(self.c)
    }

    fn reserve(&mut self, _batch: usize, _threads: usize) {}

    fn forward(&mut self, cx: &Ctx<'_>, _p: &[f32], _s: State<'_>, x: &[f32], y: &mut [f32]) {
        let (c, hw, n) = (self.c, self.h * self.w, cx.batch);
        let scale = 1.0 / hw as f32;
        y[..c * n].fill(0.0);
        for b in 0..n {
            for px in x[b * hw * c..(b + 1) * hw * c].chunks_exact(c) {
                for (ch, &v) in px.iter().enumerate() {
                    y[ch * n + b] += v;
                }
            }
        }
        for v in &mut y[..c * n] {
            *v *= scale;
        }
    }

    fn backward(
        &mut self,
        cx: &Ctx<'_>,
        _p: &[f32],
        _x: &[f32],
        _y: &[f32],
        dy: &mut [f32],
        dx: Option<&mut [f32]>,
        _g: &mut [f32],
    ) {
        let Some(dx) = dx else { return };
        let (c, hw, n) = (self.c, self.h * self.w, cx.batch);
        let scale = 1.0 / hw as f32;
        for b in 0..n {
            for px in dx[b * hw * c..(b + 1) * hw * c].chunks_exact_mut(c) {
                for (ch, d) in px.iter_mut().enumerate() {
                    *d = dy[ch * n + b] * scale;
                }
            }
        }
    }
}
