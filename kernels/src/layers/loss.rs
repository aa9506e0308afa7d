//! Softmax and cross-entropy fused: one pass over the logits gives the loss, the correct count and
//! the gradient `(softmax − onehot) / targets`. Logits are feature-major (`[classes × n]`, a
//! classifier's head) or token-major (`[n × classes]`, a language model's, one row per position).

use crate::math;

/// How the logits of `n` targets are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogitsOrder {
    /// `[classes × n]`: logit `k` of target `b` at `k·n + b`.
    FeatureMajor,
    /// `[n × classes]`: logit `k` of target `b` at `b·classes + k`.
    TargetMajor,
}

/// Mean cross-entropy over the targets of a batch.
#[derive(Debug)]
pub struct SoftmaxCrossEntropy {
    classes: usize,
}

impl SoftmaxCrossEntropy {
    /// A loss over `classes` classes.
    pub fn new(classes: usize) -> Self {
        Self { classes }
    }

    /// Classes.
    pub fn classes(&self) -> usize {
        self.classes
    }

    /// Summed loss and correct predictions of feature-major logits (see [`Self::run_with`]).
    pub fn run(&self, logits: &[f32], labels: &[u32], grad: Option<&mut [f32]>) -> (f64, usize) {
        self.run_with(LogitsOrder::FeatureMajor, logits, labels, grad)
    }

    /// Summed loss and correct predictions of the batch; `grad` (when given) receives the
    /// gradient of the **mean** loss with respect to the logits. Labels must be `< classes`
    /// (the network checks).
    pub fn run_with(
        &self,
        order: LogitsOrder,
        logits: &[f32],
        labels: &[u32],
        grad: Option<&mut [f32]>,
    ) -> (f64, usize) {
        let (c, n) = (self.classes, labels.len());
        if order == LogitsOrder::TargetMajor {
            return rows(c, logits, labels, grad);
        }
        let mut loss = 0.0f64;
        let mut correct = 0;
        let mut grad = grad;
        let inv_n = 1.0 / n as f32;
        for (b, &label) in labels.iter().enumerate() {
            let z = |k: usize| logits[k * n + b];
            let (mut best, mut arg) = (f32::NEG_INFINITY, 0);
            for k in 0..c {
                if z(k) > best {
                    best = z(k);
                    arg = k;
                }
            }
            correct += usize::from(arg == label as usize);
            let mut sum = 0.0f32;
            for k in 0..c {
                sum += (z(k) - best).exp();
            }
            let lse = best + sum.ln();
            loss += (lse - z(label as usize)) as f64;
            if let Some(g) = grad.as_deref_mut() {
                for k in 0..c {
                    let p = (z(k) - lse).exp();
                    g[k * n + b] = (p - if k == label as usize { 1.0 } else { 0.0 }) * inv_n;
                }
            }
        }
        (loss, correct)
    }
}

/// Target-major logits: each target's row is contiguous, so the row's passes vectorise.
fn rows(c: usize, logits: &[f32], labels: &[u32], grad: Option<&mut [f32]>) -> (f64, usize) {
    let mut loss = 0.0f64;
    let mut correct = 0;
    let mut grad = grad;
    let inv_n = 1.0 / labels.len() as f32;
    for (b, &label) in labels.iter().enumerate() {
        let z = &logits[b * c..(b + 1) * c];
        let (mut best, mut arg) = (f32::NEG_INFINITY, 0);
        for (k, &v) in z.iter().enumerate() {
            if v > best {
                best = v;
                arg = k;
            }
        }
        correct += usize::from(arg == label as usize);
        match grad.as_deref_mut() {
            Some(g) => {
                let g = &mut g[b * c..(b + 1) * c];
                let sum = exp_shifted(z, best, g);
                let lse = best + sum.ln();
                loss += (lse - z[label as usize]) as f64;
                scale(g, inv_n / sum);
                g[label as usize] -= inv_n;
            }
            None => {
                let sum: f32 = z.iter().map(|&v| (v - best).exp()).sum();
                loss += (best + sum.ln() - z[label as usize]) as f64;
            }
        }
    }
    (loss, correct)
}

crate::simd::multiversion! {
/// `out = e^(z − m)`; returns `Σ out`.
fn exp_shifted_into(z: &[f32], m: f32, out: &mut [f32], sum: &mut f32) {
    let mut acc = [0.0f32; 16];
    let mut zc = z.chunks_exact(16);
    let mut oc = out.chunks_exact_mut(16);
    for (zv, ov) in (&mut zc).zip(&mut oc) {
        for l in 0..16 {
            ov[l] = math::exp(zv[l] - m);
            acc[l] += ov[l];
        }
    }
    let mut s = 0.0f32;
    for (&v, o) in zc.remainder().iter().zip(oc.into_remainder()) {
        *o = math::exp(v - m);
        s += *o;
    }
    *sum = s + acc.iter().sum::<f32>();
}
}

fn exp_shifted(z: &[f32], m: f32, out: &mut [f32]) -> f32 {
    let mut s = 0.0;
    exp_shifted_into(z, m, out, &mut s);
    s
}

fn scale(v: &mut [f32], k: f32) {
    for x in v {
        *x *= k;
    }
}
