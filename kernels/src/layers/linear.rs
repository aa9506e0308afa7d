//! Fully connected layer on token-major sequences (`[tokens × d]`, one row per token), PyTorch's
//! `nn.Linear` applied to every token: `Y[n][o] = Σ_i X[n][i]·W[o][i] + b[o]`.
//!
//! Three GEMMs with the tokens as rows: forward `Y = X·Wᵀ` (B = the weights re-laid `[in × out]`
//! each forward, `in·out` values: the GEMM's packing), input gradient `dX = dY·W` (B = W in place)
//! and weight gradient `dW = dYᵀ·X` (A = dY read transposed by strides, B = X in place). No
//! activation copy. Rows of C are split over the pool.

use super::norm::add_rows;
use super::residual::add_into;
use super::{Ctx, Init, Layer, Layout, ParamSpec, State};
use crate::gemm::{Bias, Epilogue, MatA, MatB, gemm_parallel};
use crate::pool::{SharedMut, split};

/// `d_in → d_out` on each of `t` tokens, with or without bias.
#[derive(Debug)]
pub struct Linear {
    t: usize,
    inputs: usize,
    outputs: usize,
    bias: bool,
    init: Init,
    /// Wᵀ, `[in × out]`: the forward GEMM's B.
    wt: Vec<f32>,
    /// Per thread: bias-gradient partial sums.
    bpart: Vec<Vec<f32>>,
}

impl Linear {
    /// `inputs → outputs` on sequences of `t` tokens; weights start as `init`.
    pub fn new(t: usize, inputs: usize, outputs: usize, bias: bool, init: Init) -> Self {
        Self { t, inputs, outputs, bias, init, wt: Vec::new(), bpart: Vec::new() }
    }
}

impl Layer for Linear {
    fn describe(&self) -> String {
        format!("linear {}→{}{}", self.inputs, self.outputs, if self.bias { "" } else { " no bias" })
    }

    fn input(&self) -> Layout {
        Layout::Sequence { t: self.t, d: self.inputs }
    }

    fn output(&self) -> Layout {
        Layout::Sequence { t: self.t, d: self.outputs }
    }

    fn params(&self) -> Vec<ParamSpec> {
        let mut p = vec![ParamSpec::new("weight", &[self.outputs, self.inputs], self.init)];
        if self.bias {
            p.push(ParamSpec::new("bias", &[self.outputs], Init::Zeros));
        }
        p
    }

    fn forward_macs(&self) -> usize {
        self.t * self.inputs * self.outputs
    }

    fn backward_macs(&self, input_grad: bool) -> usize {
        self.forward_macs() * if input_grad { 2 } else { 1 }
    }

    fn reserve(&mut self, _batch: usize, threads: usize) {
        self.wt.resize(self.inputs * self.outputs, 0.0);
        self.bpart.resize_with(threads, Vec::new);
        for b in &mut self.bpart {
            b.resize(self.outputs, 0.0);
        }
    }

    fn forward(&mut self, cx: &Ctx<'_>, params: &[f32], _state: State<'_>, x: &[f32], y: &mut [f32]) {
        let (n, i, o) = (cx.batch * self.t, self.inputs, self.outputs);
        let (w, b) = params.split_at(o * i);
        super::transpose(w, o, i, &mut self.wt);
        let bias = if self.bias { Bias::PerCol(b) } else { Bias::None };
        let epi = Epilogue { accumulate: false, bias, relu: false };
        let r =
            gemm_parallel(cx.pool, n, o, i, MatA::row_major(x, i), MatB::row_major(&self.wt, o), y, o, epi);
        debug_assert!(r.is_ok(), "{r:?}");
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
        let (n, i, o) = (cx.batch * self.t, self.inputs, self.outputs);
        let dy = &dy[..n * o];
        let (gw, gb) = grads.split_at_mut(o * i);
        if self.bias {
            let threads = cx.pool.threads();
            let parts = SharedMut::new(&mut self.bpart);
            cx.pool.run(|tid| {
                // SAFETY: thread `tid` alone uses its partial.
                let part = unsafe { &mut parts.range(tid..tid + 1)[0] };
                part.fill(0.0);
                let r = split(n, tid, threads);
                add_rows(part, &dy[r.start * o..r.end * o]);
            });
            gb.fill(0.0);
            for part in &self.bpart[..threads] {
                add_into(gb, part);
            }
        }
        let r = gemm_parallel(
            cx.pool,
            o,
            i,
            n,
            MatA::transposed(dy, o),
            MatB::row_major(x, i),
            gw,
            i,
            Epilogue::default(),
        );
        debug_assert!(r.is_ok(), "{r:?}");
        if let Some(dx) = dx {
            let w = &params[..o * i];
            let r = gemm_parallel(
                cx.pool,
                n,
                i,
                o,
                MatA::row_major(dy, o),
                MatB::row_major(w, i),
                dx,
                i,
                Epilogue::default(),
            );
            debug_assert!(r.is_ok(), "{r:?}");
        }
    }
}
