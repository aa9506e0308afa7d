//! Layers without parameters that change shape or apply an elementwise function.

use super::{Ctx, Layer, Layout, State};
use crate::math;
use crate::pool::{Pool, SharedMut, split};

/// Runs `f(range)` over `0..n` split into one contiguous part per thread (a multiple of 16 values
/// each, so vector loops stay aligned to their chunks).
pub(crate) fn par_ranges(pool: &Pool, n: usize, f: impl Fn(std::ops::Range<usize>) + Sync) {
    let threads = pool.threads();
    if threads == 1 || n < 4096 {
        f(0..n);
        return;
    }
    let blocks = n.div_ceil(16);
    pool.run(|tid| {
        let b = split(blocks, tid, threads);
        f((b.start * 16).min(n)..(b.end * 16).min(n));
    });
}

/// `y[i] = f(x[i])` over the pool.
pub(crate) fn par_map(pool: &Pool, x: &[f32], y: &mut [f32], f: fn(&[f32], &mut [f32])) {
    let n = x.len().min(y.len());
    let out = SharedMut::new(y);
    par_ranges(pool, n, |r| {
        // SAFETY: the threads' ranges are disjoint.
        let o = unsafe { out.range(r.clone()) };
        f(&x[r], o);
    });
}

/// `max(0, x)` on any layout (use the fused form of dense and convolution layers where possible).
#[derive(Debug)]
pub struct Relu {
    layout: Layout,
}

impl Relu {
    /// ReLU over activations of `layout`.
    pub fn new(layout: Layout) -> Self {
        Self { layout }
    }
}

impl Layer for Relu {
    fn describe(&self) -> String {
        "relu".into()
    }

    fn input(&self) -> Layout {
        self.layout
    }

    fn output(&self) -> Layout {
        self.layout
    }

    fn reserve(&mut self, _batch: usize, _threads: usize) {}

    fn forward(&mut self, cx: &Ctx<'_>, _p: &[f32], _s: State<'_>, x: &[f32], y: &mut [f32]) {
        let n = cx.batch * self.layout.features();
        for (o, &v) in y[..n].iter_mut().zip(&x[..n]) {
            *o = v.max(0.0);
        }
    }

    fn backward(
        &mut self,
        cx: &Ctx<'_>,
        _p: &[f32],
        _x: &[f32],
        y: &[f32],
        dy: &mut [f32],
        dx: Option<&mut [f32]>,
        _g: &mut [f32],
    ) {
        let Some(dx) = dx else { return };
        let n = cx.batch * self.layout.features();
        for ((d, &g), &v) in dx[..n].iter_mut().zip(&dy[..n]).zip(&y[..n]) {
            *d = if v > 0.0 { g } else { 0.0 };
        }
    }
}

/// GELU (tanh approximation, GPT-2's) on any layout.
#[derive(Debug)]
pub struct Gelu {
    layout: Layout,
}

impl Gelu {
    /// GELU over activations of `layout`.
    pub fn new(layout: Layout) -> Self {
        Self { layout }
    }
}

crate::simd::multiversion! {
fn gelu_slice(x: &[f32], y: &mut [f32]) {
    for (o, &v) in y.iter_mut().zip(x) {
        *o = math::gelu(v);
    }
}
}

crate::simd::multiversion! {
/// `dx = dy · gelu'(x)`.
fn gelu_grad_slice(x: &[f32], dy: &[f32], dx: &mut [f32]) {
    for ((d, &g), &v) in dx.iter_mut().zip(dy).zip(x) {
        *d = g * math::gelu_grad(v);
    }
}
}

impl Layer for Gelu {
    fn describe(&self) -> String {
        "gelu".into()
    }

    fn input(&self) -> Layout {
        self.layout
    }

    fn output(&self) -> Layout {
        self.layout
    }

    fn reserve(&mut self, _batch: usize, _threads: usize) {}

    fn forward(&mut self, cx: &Ctx<'_>, _p: &[f32], _s: State<'_>, x: &[f32], y: &mut [f32]) {
        let n = cx.batch * self.layout.features();
        par_map(cx.pool, &x[..n], &mut y[..n], gelu_slice);
    }

    fn backward(
        &mut self,
        cx: &Ctx<'_>,
        _p: &[f32],
        x: &[f32],
        _y: &[f32],
        dy: &mut [f32],
        dx: Option<&mut [f32]>,
        _g: &mut [f32],
    ) {
        let Some(dx) = dx else { return };
        let n = cx.batch * self.layout.features();
        let out = SharedMut::new(&mut dx[..n]);
        let dy = &*dy;
        par_ranges(cx.pool, n, |r| {
            // SAFETY: the threads' ranges are disjoint.
            let o = unsafe { out.range(r.clone()) };
            gelu_grad_slice(&x[r.clone()], &dy[r], o);
        });
    }
}

/// NHWC `[batch × h × w × c]` to feature-major `[(c, h, w) × batch]`: PyTorch's `flatten(1)` order
/// of an NCHW tensor, so that a dense layer after it has PyTorch's weight layout.
#[derive(Debug)]
pub struct Flatten {
    c: usize,
    h: usize,
    w: usize,
}

impl Flatten {
    /// Flattens `c × h × w` images.
    pub fn new(c: usize, h: usize, w: usize) -> Self {
        Self { c, h, w }
    }
}

impl Layer for Flatten {
    fn describe(&self) -> String {
        "flatten".into()
    }

    fn input(&self) -> Layout {
        Layout::Image { c: self.c, h: self.h, w: self.w }
    }

    fn output(&self) -> Layout {
        Layout::Features(self.c * self.h * self.w)
    }

    fn reserve(&mut self, _batch: usize, _threads: usize) {}

    fn forward(&mut self, cx: &Ctx<'_>, _p: &[f32], _s: State<'_>, x: &[f32], y: &mut [f32]) {
        let (c, hw, n) = (self.c, self.h * self.w, cx.batch);
        for b in 0..n {
            for (px, vals) in x[b * hw * c..(b + 1) * hw * c].chunks_exact(c).enumerate() {
                for (ch, &v) in vals.iter().enumerate() {
                    y[(ch * hw + px) * n + b] = v;
                }
            }
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
        for b in 0..n {
            for (px, vals) in dx[b * hw * c..(b + 1) * hw * c].chunks_exact_mut(c).enumerate() {
                for (ch, v) in vals.iter_mut().enumerate() {
                    *v = dy[(ch * hw + px) * n + b];
                }
            }
        }
    }
}
