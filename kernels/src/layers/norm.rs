//! Normalisation layers.
//!
//! - [`BatchNorm`]: over the batch (and, for images, the pixels) of each channel, in training mode
//!   (batch statistics; running statistics updated in the flat state vector) and evaluation mode
//!   (running statistics), with an optional fused ReLU. PyTorch's semantics: biased variance to
//!   normalise, unbiased variance in the running average, `momentum` weighting the new batch. On
//!   NHWC images (and token-major sequences) the vectors run over channels and threads split the
//!   pixels; the statistics are two-pass (mean, then squared deviations) with f32 sums per block
//!   of pixels gathered in f64, so a large mean does not swamp the variance.
//! - [`LayerNorm`]: over the features of each token of a token-major sequence (PyTorch's
//!   `nn.LayerNorm(d)`), threads split the tokens.

use super::{Ctx, Init, Layer, Layout, ParamSpec, State, StateSpec};
use crate::pool::{SharedMut, split};

/// Pixels per f32 block of a statistics sum before it joins the f64 total.
const BLOCK: usize = 64;

/// Adds a block of rows into two per-channel f32 accumulators.
type AddRows<'a> = dyn Fn(std::ops::Range<usize>, &mut [f32], &mut [f32]) + Sync + 'a;

/// Batch norm over the channels of `layout` (an image's `c`, a sequence's `d`, or every feature).
#[derive(Debug)]
pub struct BatchNorm {
    layout: Layout,
    channels: usize,
    eps: f32,
    momentum: f32,
    relu: bool,
    /// Batch mean and 1/σ of the last training forward, per channel.
    mean: Vec<f32>,
    inv_std: Vec<f32>,
    /// Per thread: f64 partial sums `[2 × channels]` and an f32 block accumulator `[channels]`.
    parts: Vec<(Vec<f64>, Vec<f32>)>,
    /// Per-channel scale and shift of the output pass.
    scale: Vec<f32>,
    shift: Vec<f32>,
}

impl BatchNorm {
    /// Batch norm with PyTorch's defaults (ε = 1e-5, momentum 0.1).
    pub fn new(layout: Layout) -> Self {
        let channels = match layout {
            Layout::Features(f) => f,
            Layout::Image { c, .. } => c,
            Layout::Sequence { d, .. } => d,
            Layout::Tokens { .. } => 0,
        };
        Self {
            layout,
            channels,
            eps: 1e-5,
            momentum: 0.1,
            relu: false,
            mean: vec![0.0; channels],
            inv_std: vec![0.0; channels],
            parts: Vec::new(),
            scale: vec![0.0; channels],
            shift: vec![0.0; channels],
        }
    }

    /// The same followed by ReLU (fused: one pass less forward and backward).
    pub fn with_relu(mut self) -> Self {
        self.relu = true;
        self
    }

    /// Values of one channel in a batch of `n`: rows of channels (NHWC), or one row per feature.
    fn rows(&self, n: usize) -> usize {
        match self.layout {
            Layout::Features(_) => n,
            other => n * other.features() / self.channels.max(1),
        }
    }

    /// Per-channel sums over the rows, two quantities at once: `add(rows, acc1, acc2)` adds a
    /// block of at most [`BLOCK`] rows into f32 accumulators, which join per-thread f64 totals;
    /// the threads' totals are combined in thread order.
    fn channel_sums(&mut self, cx: &Ctx<'_>, rows: usize, add: &AddRows<'_>) -> (Vec<f64>, Vec<f64>) {
        let c = self.channels;
        let threads = cx.pool.threads();
        let parts = SharedMut::new(&mut self.parts);
        cx.pool.run(|tid| {
            // SAFETY: thread `tid` alone uses its partial sums.
            let (sums, acc) = unsafe { &mut parts.range(tid..tid + 1)[0] };
            sums.fill(0.0);
            let (acc1, acc2) = acc.split_at_mut(c);
            let mine = split(rows, tid, threads);
            let mut r0 = mine.start;
            while r0 < mine.end {
                let r1 = (r0 + BLOCK).min(mine.end);
                acc1.fill(0.0);
                acc2.fill(0.0);
                add(r0..r1, acc1, acc2);
                for (s, &a) in sums.iter_mut().zip(acc1.iter().chain(acc2.iter())) {
                    *s += a as f64;
                }
                r0 = r1;
            }
        });
        let (mut s1, mut s2) = (vec![0.0f64; c], vec![0.0f64; c]);
        for (sums, _) in &self.parts[..threads] {
            for ch in 0..c {
                s1[ch] += sums[ch];
                s2[ch] += sums[c + ch];
            }
        }
        (s1, s2)
    }
}

crate::simd::multiversion! {
/// `acc += Σ rows of x`.
pub(crate) fn add_rows(acc: &mut [f32], x: &[f32]) {
    for row in x.chunks_exact(acc.len()) {
        for (a, &v) in acc.iter_mut().zip(row) {
            *a += v;
        }
    }
}
}

crate::simd::multiversion! {
/// `acc += Σ (rows of x − mean)²`.
fn add_sq_dev(acc: &mut [f32], x: &[f32], mean: &[f32]) {
    for row in x.chunks_exact(acc.len()) {
        for ((a, &v), &m) in acc.iter_mut().zip(row).zip(mean) {
            let d = v - m;
            *a += d * d;
        }
    }
}
}

crate::simd::multiversion! {
/// `y = relu?(x·scale + shift)` per channel.
fn scale_shift(y: &mut [f32], x: &[f32], scale: &[f32], shift: &[f32], relu: bool) {
    let c = scale.len();
    for (yr, xr) in y.chunks_exact_mut(c).zip(x.chunks_exact(c)) {
        if relu {
            for (((o, &v), &a), &b) in yr.iter_mut().zip(xr).zip(scale).zip(shift) {
                *o = (v * a + b).max(0.0);
            }
        } else {
            for (((o, &v), &a), &b) in yr.iter_mut().zip(xr).zip(scale).zip(shift) {
                *o = v * a + b;
            }
        }
    }
}
}

crate::simd::multiversion! {
/// With `dy` masked by the ReLU (when fused): Σ dy and Σ dy·(x − mean) per channel over rows.
fn grad_sums(dy: &mut [f32], y: &[f32], x: &[f32], mean: &[f32], relu: bool, s1: &mut [f32], s2: &mut [f32]) {
    if relu {
        for (g, &v) in dy.iter_mut().zip(y) {
            *g = if v > 0.0 { *g } else { 0.0 };
        }
    }
    let c = mean.len();
    for (gr, xr) in dy.chunks_exact(c).zip(x.chunks_exact(c)) {
        for ((((a, b), &g), &v), &m) in s1.iter_mut().zip(s2.iter_mut()).zip(gr).zip(xr).zip(mean) {
            *a += g;
            *b += g * (v - m);
        }
    }
}
}

crate::simd::multiversion! {
/// `dx = k·(dy − a − (x − mean)·b)` per channel.
fn input_grad(dx: &mut [f32], dy: &[f32], x: &[f32], mean: &[f32], k: &[f32], a: &[f32], b: &[f32]) {
    let c = k.len();
    for ((dr, gr), xr) in dx.chunks_exact_mut(c).zip(dy.chunks_exact(c)).zip(x.chunks_exact(c)) {
        for ch in 0..c {
            dr[ch] = k[ch] * (gr[ch] - a[ch] - (xr[ch] - mean[ch]) * b[ch]);
        }
    }
}
}

impl Layer for BatchNorm {
    fn describe(&self) -> String {
        format!("batchnorm {}{}", self.channels, if self.relu { " relu" } else { "" })
    }

    fn input(&self) -> Layout {
        self.layout
    }

    fn output(&self) -> Layout {
        self.layout
    }

    fn params(&self) -> Vec<ParamSpec> {
        vec![
            ParamSpec::new("weight", &[self.channels], Init::Ones),
            ParamSpec::new("bias", &[self.channels], Init::Zeros),
        ]
    }

    fn state(&self) -> Vec<StateSpec> {
        vec![
            StateSpec::new("running_mean", &[self.channels], Init::Zeros),
            StateSpec::new("running_var", &[self.channels], Init::Ones),
        ]
    }

    fn reserve(&mut self, _batch: usize, threads: usize) {
        let c = self.channels;
        self.parts.resize_with(threads, || (Vec::new(), Vec::new()));
        for (s, a) in &mut self.parts {
            s.resize(2 * c, 0.0);
            a.resize(2 * c, 0.0);
        }
    }

    fn forward(&mut self, cx: &Ctx<'_>, params: &[f32], state: State<'_>, x: &[f32], y: &mut [f32]) {
        if let Layout::Features(_) = self.layout {
            return self.forward_features(cx, params, state, x, y);
        }
        let c = self.channels;
        let rows = self.rows(cx.batch);
        let (gamma, beta) = params.split_at(c);
        let (mean, inv_std): (Vec<f32>, Vec<f32>) = match &state {
            State::Train(_) => {
                let (s1, _) =
                    self.channel_sums(cx, rows, &|r, a1, _| add_rows(a1, &x[r.start * c..r.end * c]));
                let mean32: Vec<f32> = s1.iter().map(|s| (s / rows as f64) as f32).collect();
                let m = &mean32;
                let (sq, _) =
                    self.channel_sums(cx, rows, &|r, a1, _| add_sq_dev(a1, &x[r.start * c..r.end * c], m));
                let inv: Vec<f32> =
                    sq.iter().map(|v| (1.0 / (v / rows as f64 + self.eps as f64).sqrt()) as f32).collect();
                (mean32, inv)
            }
            State::Eval(s) => {
                (s[..c].to_vec(), s[c..2 * c].iter().map(|v| 1.0 / (v + self.eps).sqrt()).collect())
            }
        };
        for ch in 0..c {
            self.scale[ch] = gamma[ch] * inv_std[ch];
            self.shift[ch] = beta[ch] - mean[ch] * self.scale[ch];
        }
        let threads = cx.pool.threads();
        let out = SharedMut::new(y);
        let (scale, shift, relu) = (&self.scale, &self.shift, self.relu);
        cx.pool.run(|tid| {
            let r = split(rows, tid, threads);
            // SAFETY: the threads' row ranges are disjoint.
            let yo = unsafe { out.range(r.start * c..r.end * c) };
            scale_shift(yo, &x[r.start * c..r.end * c], scale, shift, relu);
        });
        if let State::Train(s) = state {
            self.mean.copy_from_slice(&mean);
            self.inv_std.copy_from_slice(&inv_std);
            self.update_running(s, rows);
        }
    }

    fn backward(
        &mut self,
        cx: &Ctx<'_>,
        params: &[f32],
        x: &[f32],
        y: &[f32],
        dy: &mut [f32],
        dx: Option<&mut [f32]>,
        grads: &mut [f32],
    ) {
        if let Layout::Features(_) = self.layout {
            return self.backward_features(cx, params, x, y, dy, dx, grads);
        }
        let c = self.channels;
        let rows = self.rows(cx.batch);
        let relu = self.relu;
        let mean = self.mean.clone();
        let dys = SharedMut::new(&mut dy[..rows * c]);
        let m = &mean;
        let (sd, sdx) = self.channel_sums(cx, rows, &|r, a1, a2| {
            let span = r.start * c..r.end * c;
            // SAFETY: each block of rows is visited by exactly one thread (the threads' row ranges
            // are disjoint), so the parts of dy written here are disjoint.
            let g = unsafe { dys.range(span.clone()) };
            grad_sums(g, &y[span.clone()], &x[span], m, relu, a1, a2);
        });
        let (gg, gb) = grads.split_at_mut(c);
        for ch in 0..c {
            gb[ch] = sd[ch] as f32;
            gg[ch] = (sdx[ch] * self.inv_std[ch] as f64) as f32;
        }
        let Some(dx) = dx else { return };
        let gamma = &params[..c];
        let n = rows as f32;
        let k: Vec<f32> = (0..c).map(|ch| gamma[ch] * self.inv_std[ch]).collect();
        let a: Vec<f32> = sd.iter().map(|&s| s as f32 / n).collect();
        let b: Vec<f32> =
            (0..c).map(|ch| (sdx[ch] / rows as f64) as f32 * self.inv_std[ch] * self.inv_std[ch]).collect();
        let threads = cx.pool.threads();
        let out = SharedMut::new(dx);
        let dy = &*dy;
        cx.pool.run(|tid| {
            let r = split(rows, tid, threads);
            let span = r.start * c..r.end * c;
            // SAFETY: the threads' row ranges are disjoint.
            let d = unsafe { out.range(span.clone()) };
            input_grad(d, &dy[span.clone()], &x[span], m, &k, &a, &b);
        });
    }
}

impl BatchNorm {
    fn update_running(&self, s: &mut [f32], count: usize) {
        let (c, m) = (self.channels, self.momentum);
        for ch in 0..c {
            let var = 1.0 / (self.inv_std[ch] as f64).powi(2) - self.eps as f64;
            let unbiased = if count > 1 { var * count as f64 / (count - 1) as f64 } else { var };
            s[ch] = (1.0 - m) * s[ch] + m * self.mean[ch];
            s[c + ch] = (1.0 - m) * s[c + ch] + m * unbiased as f32;
        }
    }

    /// Feature-major `[features × batch]`: each channel is one contiguous row.
    fn forward_features(&mut self, cx: &Ctx<'_>, params: &[f32], state: State<'_>, x: &[f32], y: &mut [f32]) {
        let (c, n) = (self.channels, cx.batch);
        let (gamma, beta) = params.split_at(c);
        for ch in 0..c {
            let xs = &x[ch * n..(ch + 1) * n];
            let (mean, inv_std) = match &state {
                State::Train(_) => {
                    let mean = xs.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
                    let var = xs.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n as f64;
                    self.mean[ch] = mean as f32;
                    self.inv_std[ch] = (1.0 / (var + self.eps as f64).sqrt()) as f32;
                    (self.mean[ch], self.inv_std[ch])
                }
                State::Eval(s) => (s[ch], 1.0 / (s[c + ch] + self.eps).sqrt()),
            };
            let (g, b) = (gamma[ch] * inv_std, beta[ch]);
            for (o, &v) in y[ch * n..(ch + 1) * n].iter_mut().zip(xs) {
                let z = (v - mean) * g + b;
                *o = if self.relu { z.max(0.0) } else { z };
            }
        }
        if let State::Train(s) = state {
            self.update_running(s, n);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn backward_features(
        &mut self,
        cx: &Ctx<'_>,
        params: &[f32],
        x: &[f32],
        y: &[f32],
        dy: &mut [f32],
        dx: Option<&mut [f32]>,
        grads: &mut [f32],
    ) {
        let (c, n) = (self.channels, cx.batch);
        let gamma = &params[..c];
        let (gg, gb) = grads.split_at_mut(c);
        let mut dx = dx;
        for ch in 0..c {
            let r = ch * n..(ch + 1) * n;
            if self.relu {
                for (g, &v) in dy[r.clone()].iter_mut().zip(&y[r.clone()]) {
                    if v <= 0.0 {
                        *g = 0.0;
                    }
                }
            }
            let (mean, inv_std) = (self.mean[ch], self.inv_std[ch]);
            let (mut sum_dy, mut sum_dy_xhat) = (0.0f64, 0.0f64);
            for (&g, &v) in dy[r.clone()].iter().zip(&x[r.clone()]) {
                sum_dy += g as f64;
                sum_dy_xhat += g as f64 * ((v - mean) * inv_std) as f64;
            }
            gb[ch] = sum_dy as f32;
            gg[ch] = sum_dy_xhat as f32;
            if let Some(dx) = dx.as_deref_mut() {
                let k = gamma[ch] * inv_std / n as f32;
                let (sd, sdx) = (sum_dy as f32, sum_dy_xhat as f32);
                for ((d, &g), &v) in dx[r.clone()].iter_mut().zip(&dy[r.clone()]).zip(&x[r.clone()]) {
                    let xhat = (v - mean) * inv_std;
                    *d = k * (n as f32 * g - sd - xhat * sdx);
                }
            }
        }
    }
}

/// Layer norm over the `d` features of each token (PyTorch's `nn.LayerNorm(d)`, ε = 1e-5).
#[derive(Debug)]
pub struct LayerNorm {
    t: usize,
    d: usize,
    eps: f32,
    /// Per token of the last forward: mean and 1/σ.
    stats: Vec<(f32, f32)>,
    /// Per thread: partial gradients of weight and bias, `[2 × d]`.
    parts: Vec<Vec<f32>>,
}

impl LayerNorm {
    /// Layer norm of sequences of `t` tokens of `d` features.
    pub fn new(t: usize, d: usize) -> Self {
        Self { t, d, eps: 1e-5, stats: Vec::new(), parts: Vec::new() }
    }
}

/// Σ x in 16 lanes (vectorisable without reassociating a single sum).
#[inline(always)]
fn sum_lanes(x: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    let mut acc = [0.0f32; 16];
    let mut chunks = x.chunks_exact(16);
    for c in &mut chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += f(v);
        }
    }
    let tail: f32 = chunks.remainder().iter().map(|&v| f(v)).sum();
    acc.iter().sum::<f32>() + tail
}

crate::simd::multiversion! {
fn ln_rows(x: &[f32], y: &mut [f32], stats: &mut [(f32, f32)], gamma: &[f32], beta: &[f32], eps: f32) {
    let d = gamma.len();
    for ((xr, yr), st) in x.chunks_exact(d).zip(y.chunks_exact_mut(d)).zip(stats.iter_mut()) {
        let mean = sum_lanes(xr, |v| v) / d as f32;
        let var = sum_lanes(xr, |v| (v - mean) * (v - mean)) / d as f32;
        let rstd = 1.0 / (var + eps).sqrt();
        *st = (mean, rstd);
        for (((o, &v), &g), &b) in yr.iter_mut().zip(xr).zip(gamma).zip(beta) {
            *o = (v - mean) * rstd * g + b;
        }
    }
}
}

crate::simd::multiversion! {
/// One thread's rows: `dx` (when given) and the partial weight/bias gradients in `part`.
fn ln_backward_rows(
    x: &[f32],
    dy: &[f32],
    dx: Option<&mut [f32]>,
    stats: &[(f32, f32)],
    gamma: &[f32],
    part: &mut [f32],
) {
    let d = gamma.len();
    let (pg, pb) = part.split_at_mut(d);
    pg.fill(0.0);
    pb.fill(0.0);
    let mut dx = dx;
    for (r, ((xr, gr), &(mean, rstd))) in x.chunks_exact(d).zip(dy.chunks_exact(d)).zip(stats).enumerate() {
        for (((a, b), &v), &g) in pg.iter_mut().zip(pb.iter_mut()).zip(xr).zip(gr) {
            *a += g * (v - mean) * rstd;
            *b += g;
        }
        let Some(dx) = dx.as_deref_mut() else { continue };
        // dx = rstd·(g·γ − mean(g·γ) − x̂·mean(g·γ·x̂)), the sums in 16 lanes.
        let mut s1 = [0.0f32; 16];
        let mut s2 = [0.0f32; 16];
        let (xc, gc, wc) = (xr.chunks_exact(16), gr.chunks_exact(16), gamma.chunks_exact(16));
        let tail = xc.remainder().iter().zip(gc.remainder()).zip(wc.remainder());
        let (mut t1, mut t2) = (0.0f32, 0.0f32);
        for ((&v, &g), &w) in tail {
            t1 += g * w;
            t2 += g * w * (v - mean) * rstd;
        }
        for ((xv, gv), wv) in xc.zip(gc).zip(wc) {
            for l in 0..16 {
                let gh = gv[l] * wv[l];
                s1[l] += gh;
                s2[l] += gh * (xv[l] - mean) * rstd;
            }
        }
        let m1 = (s1.iter().sum::<f32>() + t1) / d as f32;
        let m2 = (s2.iter().sum::<f32>() + t2) / d as f32;
        for (((o, &v), &g), &w) in dx[r * d..(r + 1) * d].iter_mut().zip(xr).zip(gr).zip(gamma) {
            let xhat = (v - mean) * rstd;
            *o = rstd * (g * w - m1 - xhat * m2);
        }
    }
}
}

impl Layer for LayerNorm {
    fn describe(&self) -> String {
        format!("layernorm {}", self.d)
    }

    fn input(&self) -> Layout {
        Layout::Sequence { t: self.t, d: self.d }
    }

    fn output(&self) -> Layout {
        self.input()
    }

    fn params(&self) -> Vec<ParamSpec> {
        vec![ParamSpec::new("weight", &[self.d], Init::Ones), ParamSpec::new("bias", &[self.d], Init::Zeros)]
    }

    fn reserve(&mut self, batch: usize, threads: usize) {
        self.stats.resize(batch * self.t, (0.0, 0.0));
        self.parts.resize_with(threads, Vec::new);
        for p in &mut self.parts {
            p.resize(2 * self.d, 0.0);
        }
    }

    fn forward(&mut self, cx: &Ctx<'_>, params: &[f32], _state: State<'_>, x: &[f32], y: &mut [f32]) {
        let (n, d) = (cx.batch * self.t, self.d);
        let (gamma, beta) = params.split_at(d);
        let threads = cx.pool.threads();
        let (out, st) = (SharedMut::new(y), SharedMut::new(&mut self.stats));
        let eps = self.eps;
        cx.pool.run(|tid| {
            let r = split(n, tid, threads);
            // SAFETY: the threads' token ranges are disjoint.
            let (yo, so) = unsafe { (out.range(r.start * d..r.end * d), st.range(r.clone())) };
            ln_rows(&x[r.start * d..r.end * d], yo, so, gamma, beta, eps);
        });
    }

    fn backward(
        &mut self,
        cx: &Ctx<'_>,
        params: &[f32],
        x: &[f32],
        _y: &[f32],
        dy: &mut [f32],
        dx: Option<&mut [f32]>,
        grads: &mut [f32],
    ) {
        let (n, d) = (cx.batch * self.t, self.d);
        let gamma = &params[..d];
        let threads = cx.pool.threads();
        let dxs = dx.map(SharedMut::new);
        let parts = SharedMut::new(&mut self.parts);
        let (stats, dy) = (&self.stats, &*dy);
        cx.pool.run(|tid| {
            let r = split(n, tid, threads);
            let span = r.start * d..r.end * d;
            // SAFETY: the threads' token ranges and partial buffers are disjoint.
            let part = unsafe { &mut parts.range(tid..tid + 1)[0] };
            let dx_mine = dxs.as_ref().map(|s| unsafe { s.range(span.clone()) });
            ln_backward_rows(&x[span.clone()], &dy[span], dx_mine, &stats[r], gamma, part);
        });
        grads.fill(0.0);
        for part in &self.parts[..threads] {
            for (g, &p) in grads.iter_mut().zip(part) {
                *g += p;
            }
        }
    }
}
