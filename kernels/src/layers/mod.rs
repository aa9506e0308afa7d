//! The engine's layers: each reads its weights from, and writes its gradients into, its own slice
//! of the network's flat parameter and gradient vectors, and keeps non-trainable state (batch-norm
//! running statistics) in a slice of the flat state vector.
//!
//! Activation layouts ([`Layout`]): dense layers work **feature-major** (`[features × batch]`, so
//! a GEMM's vector dimension is the batch); convolutions, pooling and image batch norm work
//! **NHWC** (`[batch × h × w × c]`, vectors over channels). [`Flatten`] turns NHWC into the
//! feature-major `(c, h, w)` order that a dense layer after a convolution expects (PyTorch's
//! `flatten(1)` order, so parameters keep PyTorch's meaning). Sequence layers (the transformer's)
//! work **token-major** (`[batch·t × d]`, one row per token, like NHWC with the tokens as
//! pixels); their integer input ([`Layout::Tokens`]) is not an activation but the batch's token
//! ids, which [`Ctx::tokens`] carries.
//!
//! Composites: [`Chain`] (layers in sequence, itself a layer) and [`Residual`] (`main(x) +
//! shortcut(x)`, then an optional ReLU) nest, so a ResNet block or a transformer block is one
//! layer of the network with PyTorch's parameter names (`layer1.0.conv1.weight`,
//! `h.0.attn.c_attn.weight`).
//!
//! Contract of a [`Layer`] (the network relies on it):
//! - `forward` writes all of `y` (`batch × output.features()` values); `backward` writes all of
//!   `dx` (when asked for) and **overwrites** the layer's gradient slice.
//! - Nothing allocates once [`Layer::reserve`] has seen the largest batch.
//! - Work is split over `cx.pool` by batch or by output rows, statically, so results depend only
//!   on the thread count.

mod attention;
mod chain;
mod conv;
mod dense;
mod embed;
mod linear;
mod loss;
mod norm;
mod pool2d;
mod residual;
mod simple;

pub use attention::CausalSelfAttention;
pub use chain::{Chain, ChainBuilder, Entry, NamedLayers};
pub use conv::{Conv2d, ConvSpec};
pub use dense::Dense;
pub use embed::{Embedding, PositionEmbedding};
pub use linear::Linear;
pub use loss::{LogitsOrder, SoftmaxCrossEntropy};
pub use norm::{BatchNorm, LayerNorm};
pub use pool2d::{AvgPool2d, GlobalAvgPool, MaxPool2d, PoolSpec};
pub use residual::Residual;
pub use simple::{Flatten, Gelu, Relu};

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
    /// A sequence of `t` tokens of `d` features each, stored token-major: `[batch·t × d]`.
    Sequence {
        /// Tokens per sample.
        t: usize,
        /// Features per token.
        d: usize,
    },
    /// `t` integer token ids below `vocab` per sample (`[batch × t]` in [`Ctx::tokens`]); no
    /// float values.
    Tokens {
        /// Tokens per sample.
        t: usize,
        /// Number of distinct ids.
        vocab: usize,
    },
}

impl Layout {
    /// Float values per sample in an activation buffer (0 for token ids, which are not floats).
    pub fn features(&self) -> usize {
        match *self {
            Layout::Features(f) => f,
            Layout::Image { c, h, w } => c * h * w,
            Layout::Sequence { t, d } => t * d,
            Layout::Tokens { .. } => 0,
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
    /// Uniform in ±`bound` (a transformer's small initialisation: std 0.02 is bound 0.02·√3).
    Uniform {
        /// Half-width of the interval.
        bound: f32,
    },
    /// All zeros.
    Zeros,
    /// All ones.
    Ones,
}

/// One parameter tensor of a layer.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ParamSpec {
    /// Name inside the layer (`weight`, `bias`, or a composite's `conv1.weight`); the enclosing
    /// chain prefixes the layer's name.
    pub name: String,
    /// Row-major shape (PyTorch's: `[out, in]`, `[out, in, kh, kw]`, `[c]`).
    pub shape: Vec<usize>,
    /// Initialisation.
    pub init: Init,
}

impl ParamSpec {
    /// A tensor `name` of `shape`.
    pub fn new(name: &str, shape: &[usize], init: Init) -> Self {
        Self { name: name.to_owned(), shape: shape.to_vec(), init }
    }

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
    /// The batch's token ids (`[batch × t]`) when the network's input is [`Layout::Tokens`],
    /// empty otherwise.
    pub tokens: &'a [u32],
}

/// Time spent in one layer while profiling (see [`Layer::set_profiling`]).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct LayerTime {
    /// Full name (`layer1.0.conv1`).
    pub name: String,
    /// The layer's description.
    pub kind: String,
    /// Whether the layer has no inner layers (composites' times include their layers').
    pub leaf: bool,
    /// Forward seconds.
    pub forward: f64,
    /// Backward seconds.
    pub backward: f64,
    /// Forward passes timed.
    pub calls: usize,
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
    /// A dense layer's `(inputs, outputs, relu)`, so that a model-parallel network
    /// ([`crate::split`]) can split it by output rows; `None` for every other layer.
    fn dense_shape(&self) -> Option<(usize, usize, bool)> {
        None
    }
    /// Makes room for batches of up to `batch` samples (allocates; called before the first step
    /// and whenever a larger batch arrives, never in the steady state).
    fn reserve(&mut self, batch: usize, threads: usize);
    /// Composites: start (or stop) timing each inner layer's forward and backward passes.
    fn set_profiling(&mut self, on: bool) {
        let _ = on;
    }
    /// Composites: the inner layers' accumulated times since profiling started, names prefixed
    /// with `prefix`.
    fn times(&self, prefix: &str, out: &mut Vec<LayerTime>) {
        let _ = (prefix, out);
    }
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
