//! Softmax and cross-entropy fused: one pass over the logits gives the loss, the correct count and
//! the gradient `(softmax − onehot) / batch`.

/// Mean cross-entropy of feature-major logits `[classes × batch]`.
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

    /// Summed loss and correct predictions of the batch; `grad` (when given) receives the
    /// gradient of the **mean** loss with respect to the logits. Labels must be `< classes`
    /// (the network checks).
    pub fn run(&self, logits: &[f32], labels: &[u32], grad: Option<&mut [f32]>) -> (f64, usize) {
        let (c, n) = (self.classes, labels.len());
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
