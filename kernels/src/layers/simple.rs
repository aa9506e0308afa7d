//! Layers without parameters that change shape or apply an elementwise function.

use super::{Ctx, Layer, Layout, State};

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
