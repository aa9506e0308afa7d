//! The engine's layers: each reads its weights from, and writes its gradients into, its own slice
//! of the network's flat parameter and gradient vectors, and keeps non-trainable state (batch-norm
//! running statistics) in a slice of the flat state vector.
//!
//! Activation layouts ([`Layout`]): dense layers work **feature-major** (`[features × batch]`, so
//! a GEMM's vector dimension is the batch); convolutions, pooling and image batch norm work
//! **NHWC** (`[batch × h × w × c]`, vectors over channels). [`Flatten`] turns NHWC into the
//! feature-major `(c, h, w)` order that a dense layer after a convolution expects (PyTorch's
//! `flatten(1)` order, so parameters keep PyTorch's meaning).
//!
//! Contract of a [`Layer`] (the network relies on it):
//! - `forward` writes all of `y` (`batch × output.features()` values); `backward` writes all of
//!   `dx` (when asked for) and **overwrites** the layer's gradient slice.
//! - Nothing allocates once [`Layer::reserve`] has seen the largest batch.
//! - Work is split over `cx.pool` by batch or by output rows, statically, so results depend only
//!   on the thread count.

mod conv;
mod dense;
mod loss;
mod norm;
mod pool2d;
mod simple;

pub use conv::{Conv2d, ConvSpec};
pub use dense::Dense;
pub use loss::SoftmaxCrossEntropy;
pub use norm::BatchNorm;
pub use pool2d::{AvgPool2d, GlobalAvgPool, MaxPool2d, PoolSpec};
pub use simple::{Flatten, Relu};

use crate::pool::Pool;

/// Shape and memory order of one sample's activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Layout {
    /// `features` values per sample, stored feature-major: `[features × batch]`.
    Features(usize),
    /// An image stored NHWC: `[batch × h × w × c]`.
    Image {
        /// Channels.
        c: usize,
        /// Height.
        h: usize,
        /// Width.
        w: usize,
    },
}

impl Layout {
    /// Values per sample.
    pub fn features(&self) -> usize {
        match *self {
            Layout::Features(f) => f,
            Layout::Image { c, h, w } => c * h * w,
        }
    }
}

/// How a parameter tensor is initialised.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub enum Init {
    /// Uniform in ±√(6 / fan_in) (He-uniform, suits ReLU), drawn in row-major order.
    HeUniform {
        /// Inputs per output.
        fan_in: usize,
    },
    /// All zeros.
    Zeros,
    /// All ones.
    Ones,
}

/// One parameter tensor of a layer.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ParamSpec {
    /// Name inside the layer (`weight`, `bias`); the network prefixes the layer's name.
    pub name: &'static str,
    /// Row-major shape (PyTorch's: `[out, in]`, `[out, in, kh, kw]`, `[c]`).
    pub shape: Vec<usize>,
    /// Initialisation.
    pub init: Init,
}

impl ParamSpec {
    /// Number of values.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether the tensor is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A layer's trainable-state request: parameters are [`ParamSpec`]s, non-trainable state is this.
pub type StateSpec = ParamSpec;

/// What a layer call may touch besides its data.
#[derive(Clone, Copy, Debug)]
pub struct Ctx<'a> {
    /// The job's threads.
    pub pool: &'a Pool,
    /// Samples in this batch.
    pub batch: usize,
}

/// A layer's view of the non-trainable state: writable when training (batch norm updates its
/// running statistics), read-only when evaluating.
#[derive(Debug)]
pub enum State<'a> {
    /// Training: batch statistics are used and running statistics updated.
    Train(&'a mut [f32]),
    /// Evaluation: running statistics are used.
    Eval(&'a [f32]),
}

/// One layer of a network.
pub trait Layer: Send {
    /// Short description for logs (`conv 16→32 5×5 s1 p2 relu`).
    fn describe(&self) -> String;
    /// Input layout.
    fn input(&self) -> Layout;
    /// Output layout.
    fn output(&self) -> Layout;
    /// Parameter tensors, in flat order.
    fn params(&self) -> Vec<ParamSpec> {
        Vec::new()
    }
    /// Non-trainable state tensors, in flat order.
    fn state(&self) -> Vec<StateSpec> {
        Vec::new()
    }
    /// Multiply-adds of one sample's forward pass (for GFLOP/s reports).
    fn forward_macs(&self) -> usize {
        0
    }
    /// Multiply-adds of one sample's backward pass; `input_grad` says whether dx is computed.
    fn backward_macs(&self, input_grad: bool) -> usize {
        let _ = input_grad;
        0
    }
    /// Makes room for batches of up to `batch` samples (allocates; called before the first step
    /// and whenever a larger batch arrives, never in the steady state).
    fn reserve(&mut self, batch: usize, threads: usize);
    /// `y = f(x)`.
    fn forward(&mut self, cx: &Ctx<'_>, params: &[f32], state: State<'_>, x: &[f32], y: &mut [f32]);
    /// Gradients: `dy` in (may be overwritten), `dx` out when given, the gradient slice overwritten.
    #[allow(clippy::too_many_arguments)]
    fn backward(
        &mut self,
        cx: &Ctx<'_>,
        params: &[f32],
        x: &[f32],
        y: &[f32],
        dy: &mut [f32],
        dx: Option<&mut [f32]>,
        grads: &mut [f32],
    );
}

/// Transposes `src` (`rows × cols`, row-major) into `dst` (`cols × rows`).
pub(crate) fn transpose(src: &[f32], rows: usize, cols: usize, dst: &mut [f32]) {
    // Blocks of 16×16 keep both sides in cache lines.
    const B: usize = 16;
    for r0 in (0..rows).step_by(B) {
        for c0 in (0..cols).step_by(B) {
            for r in r0..(r0 + B).min(rows) {
                let s = &src[r * cols..r * cols + cols];
                for c in c0..(c0 + B).min(cols) {
                    dst[c * rows + r] = s[c];
                }
            }
        }
    }
}
