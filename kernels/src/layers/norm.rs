//! Batch normalisation over the batch (and, for images, the pixels) of each channel, in training
//! mode (batch statistics, running statistics updated in the flat state vector) and evaluation
//! mode (running statistics), with its backward. PyTorch's semantics: biased variance to
//! normalise, unbiased variance in the running average, `momentum` weighting the new batch.

use super::{Ctx, Init, Layer, Layout, ParamSpec, State, StateSpec};

/// Batch norm over the channels of `layout` (an image's `c`, or every feature).
#[derive(Debug)]
pub struct BatchNorm {
    layout: Layout,
    channels: usize,
    eps: f32,
    momentum: f32,
    /// Batch mean and 1/σ of the last training forward, per channel.
    mean: Vec<f32>,
    inv_std: Vec<f32>,
}

impl BatchNorm {
    /// Batch norm with PyTorch's defaults (ε = 1e-5, momentum 0.1).
    pub fn new(layout: Layout) -> Self {
        let channels = match layout {
            Layout::Features(f) => f,
            Layout::Image { c, .. } => c,
        };
        Self {
            layout,
            channels,
            eps: 1e-5,
            momentum: 0.1,
            mean: vec![0.0; channels],
            inv_std: vec![0.0; channels],
        }
    }

    /// `(offset, stride, count)` of channel `ch`'s values in a batch of `n`.
    fn lane(&self, ch: usize, n: usize) -> (usize, usize, usize) {
        match self.layout {
            Layout::Features(_) => (ch * n, 1, n),
            Layout::Image { c, h, w } => (ch, c, n * h * w),
        }
    }
}

impl Layer for BatchNorm {
    fn describe(&self) -> String {
        format!("batchnorm {}", self.channels)
    }

    fn input(&self) -> Layout {
        self.layout
    }

    fn output(&self) -> Layout {
        self.layout
    }

    fn params(&self) -> Vec<ParamSpec> {
        vec![
            ParamSpec { name: "weight", shape: vec![self.channels], init: Init::Ones },
            ParamSpec { name: "bias", shape: vec![self.channels], init: Init::Zeros },
        ]
    }

    fn state(&self) -> Vec<StateSpec> {
        vec![
            StateSpec { name: "running_mean", shape: vec![self.channels], init: Init::Zeros },
            StateSpec { name: "running_var", shape: vec![self.channels], init: Init::Ones },
        ]
    }

    fn reserve(&mut self, _batch: usize, _threads: usize) {}

    fn forward(&mut self, cx: &Ctx<'_>, params: &[f32], state: State<'_>, x: &[f32], y: &mut [f32]) {
        let c = self.channels;
        let (gamma, beta) = params.split_at(c);
        for ch in 0..c {
            let (off, stride, count) = self.lane(ch, cx.batch);
            let at = |j: usize| off + j * stride;
            let (mean, inv_std) = match &state {
                State::Train(_) => {
                    let mut s = 0.0f64;
                    for j in 0..count {
                        s += x[at(j)] as f64;
                    }
                    let mean = s / count as f64;
                    let mut v = 0.0f64;
                    for j in 0..count {
                        let d = x[at(j)] as f64 - mean;
                        v += d * d;
                    }
                    let var = v / count as f64;
                    self.mean[ch] = mean as f32;
                    self.inv_std[ch] = (1.0 / (var + self.eps as f64).sqrt()) as f32;
                    (mean as f32, self.inv_std[ch])
                }
                State::Eval(s) => (s[ch], 1.0 / (s[c + ch] + self.eps).sqrt()),
            };
            let (g, b) = (gamma[ch] * inv_std, beta[ch]);
            for j in 0..count {
                y[at(j)] = (x[at(j)] - mean) * g + b;
            }
        }
        if let State::Train(s) = state {
            let m = self.momentum;
            for ch in 0..c {
                let count = self.lane(ch, cx.batch).2;
                let var = 1.0 / (self.inv_std[ch] * self.inv_std[ch]) - self.eps;
                let unbiased = if count > 1 { var * count as f32 / (count - 1) as f32 } else { var };
                s[ch] = (1.0 - m) * s[ch] + m * self.mean[ch];
                s[c + ch] = (1.0 - m) * s[c + ch] + m * unbiased;
            }
        }
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
        let c = self.channels;
        let gamma = &params[..c];
        let (gg, gb) = grads.split_at_mut(c);
        let mut dx = dx;
        for ch in 0..c {
            let (off, stride, count) = self.lane(ch, cx.batch);
            let at = |j: usize| off + j * stride;
            let (mean, inv_std) = (self.mean[ch], self.inv_std[ch]);
            let (mut sum_dy, mut sum_dy_xhat) = (0.0f64, 0.0f64);
            for j in 0..count {
                let g = dy[at(j)] as f64;
                sum_dy += g;
                sum_dy_xhat += g * ((x[at(j)] - mean) * inv_std) as f64;
            }
            gb[ch] = sum_dy as f32;
            gg[ch] = sum_dy_xhat as f32;
            if let Some(dx) = dx.as_deref_mut() {
                let k = gamma[ch] * inv_std / count as f32;
                let (sd, sdx) = (sum_dy as f32, sum_dy_xhat as f32);
                for j in 0..count {
                    let xhat = (x[at(j)] - mean) * inv_std;
                    dx[at(j)] = k * (count as f32 * dy[at(j)] - sd - xhat * sdx);
                }
            }
        }
    }
}
