//! Fully connected layer on feature-major activations: `y[o][b] = relu?(Σ_i W[o][i]·x[i][b] + bias[o])`.
//!
//! All three products are one GEMM each, reading the weights in place from the flat vector:
//! forward `Y = W·X` (A = W row-major), input gradient `dX = Wᵀ·dY` (A = W read transposed by
//! strides), weight gradient `dW = dY·Xᵀ` (B = the sample-major copy of X this layer keeps, the
//! only copy it makes: `batch × in` values). Rows of C are split over the pool.

use super::{Ctx, Init, Layer, Layout, ParamSpec, State, transpose};
use crate::gemm::{Bias, Epilogue, MatA, MatB, gemm_parallel};

/// A dense layer `in → out`, optionally followed by ReLU.
#[derive(Debug)]
pub struct Dense {
    inputs: usize,
    outputs: usize,
    relu: bool,
    /// `x` sample-major (`batch × in`), the B operand of the weight gradient.
    xs: Vec<f32>,
}

impl Dense {
    /// `inputs → outputs`, with ReLU fused when `relu`.
    pub fn new(inputs: usize, outputs: usize, relu: bool) -> Self {
        Self { inputs, outputs, relu, xs: Vec::new() }
    }

    /// Inputs per sample.
    pub fn inputs(&self) -> usize {
        self.inputs
    }

    /// Outputs per sample.
    pub fn outputs(&self) -> usize {
        self.outputs
    }

    /// Whether ReLU follows.
    pub fn relu(&self) -> bool {
        self.relu
    }

    /// [`Layer::forward`] with the weight `w` (`[out × in]`) and bias `b` as separate slices (a
    /// model-parallel rank's rows of a larger layer, [`crate::split`]).
    pub fn forward_with(&mut self, cx: &Ctx<'_>, w: &[f32], b: &[f32], x: &[f32], y: &mut [f32]) {
        let (n, i, o) = (cx.batch, self.inputs, self.outputs);
        let epi = Epilogue { accumulate: false, bias: Bias::PerRow(b), relu: self.relu };
        let r = gemm_parallel(cx.pool, o, n, i, MatA::row_major(w, i), MatB::row_major(x, n), y, n, epi);
        debug_assert!(r.is_ok(), "{r:?}");
    }

    /// [`Layer::backward`] with the weight `w` and the gradients `gw`, `gb` as separate slices.
    #[allow(clippy::too_many_arguments)]
    pub fn backward_with(
        &mut self,
        cx: &Ctx<'_>,
        w: &[f32],
        x: &[f32],
        y: &[f32],
        dy: &mut [f32],
        dx: Option<&mut [f32]>,
        gw: &mut [f32],
        gb: &mut [f32],
    ) {
        let (n, i, o) = (cx.batch, self.inputs, self.outputs);
        let dy = &mut dy[..o * n];
        if self.relu {
            for (g, &v) in dy.iter_mut().zip(&y[..o * n]) {
                if v <= 0.0 {
                    *g = 0.0;
                }
            }
        }
        for (g, row) in gb.iter_mut().zip(dy.chunks_exact(n)) {
            *g = row.iter().sum();
        }
        let xs = &mut self.xs[..n * i];
        transpose(&x[..i * n], i, n, xs);
        let r = gemm_parallel(
            cx.pool,
            o,
            i,
            n,
            MatA::row_major(dy, n),
            MatB::row_major(xs, i),
            gw,
            i,
            Epilogue::default(),
        );
        debug_assert!(r.is_ok(), "{r:?}");
        if let Some(dx) = dx {
            let r = gemm_parallel(
                cx.pool,
                i,
                n,
                o,
                MatA::transposed(w, i),
                MatB::row_major(dy, n),
                dx,
                n,
                Epilogue::default(),
            );
            debug_assert!(r.is_ok(), "{r:?}");
        }
    }
}

impl Layer for Dense {
    fn describe(&self) -> String {
        format!("dense {}→{}{}", self.inputs, self.outputs, if self.relu { " relu" } else { "" })
    }

    fn input(&self) -> Layout {
        Layout::Features(self.inputs)
    }

    fn output(&self) -> Layout {
        Layout::Features(self.outputs)
    }

    fn params(&self) -> Vec<ParamSpec> {
        vec![
            ParamSpec::new("weight", &[self.outputs, self.inputs], Init::HeUniform { fan_in: self.inputs }),
            ParamSpec::new("bias", &[self.outputs], Init::Zeros),
        ]
    }

    fn forward_macs(&self) -> usize {
        self.inputs * self.outputs
    }

    fn dense_shape(&self) -> Option<(usize, usize, bool)> {
        Some((self.inputs, self.outputs, self.relu))
    }

    fn backward_macs(&self, input_grad: bool) -> usize {
        self.inputs * self.outputs * if input_grad { 2 } else { 1 }
    }

    fn reserve(&mut self, batch: usize, _threads: usize) {
        self.xs.resize(batch * self.inputs, 0.0);
    }

    fn forward(&mut self, cx: &Ctx<'_>, params: &[f32], _state: State<'_>, x: &[f32], y: &mut [f32]) {
        let (w, b) = params.split_at(self.outputs * self.inputs);
        self.forward_with(cx, w, b, x, y);
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
        let (gw, gb) = grads.split_at_mut(self.outputs * self.inputs);
        self.backward_with(cx, &params[..self.outputs * self.inputs], x, y, dy, dx, gw, gb);
    }
}
