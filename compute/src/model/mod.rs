//! Models: what turns a batch and the flat parameters into a loss and a flat gradient.
//!
//! A [`Model`] is a set of explicit functions over flat buffers — parameters and gradients of its
//! [`Model::layout`], non-trainable state of its [`Model::state_layout`] — which the training loop
//! owns ([`crate::params::ParamStore`]). Nothing in the trait is tied to a framework: a
//! model may keep preallocated activations and device copies inside itself and compute its
//! forward and backward passes by hand, or hand them to a framework. The families — an MLP, a
//! LeNet-style CNN, ResNet, VGG and a GPT — run on Tandem's compute engine ([`engine`], the CPU's:
//! the layers compute in place on the flat buffers); the MLP and the CNN also on candle ([`net`],
//! built from [`mlp`], [`cnn`] and [`layers`]: the CUDA path, and a reference in tests), which
//! refuses the others by name. [`build`] picks the family from `spec.model` and the backend from
//! the device. [`split::Split`] is the engine's model with dense layers split over a worker
//! group's ranks (`model.parallelism`: hybrid, model), which a worker builds with its group.
//!
//! Parameter names follow PyTorch's (`fc1.weight`, `conv1.bias`, …); see
//! [`crate::params`] for the flat order.

pub mod cnn;
pub mod engine;
pub mod layers;
pub mod mlp;
pub mod net;
pub mod split;

use tandem_api::ModelSpec;

use crate::device::{Device, DeviceError};
use crate::params::{FlatError, FlatLayout};
use tandem_input::InputShape;

pub use engine::Engine;
pub use net::Net;
pub use split::Split;

/// Errors while building or running a model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The spec cannot describe a model for this data.
    #[error("invalid model spec: {0}")]
    Spec(String),
    /// A candle operation failed.
    #[error("{op} failed: {source}")]
    Candle {
        /// What the model was doing.
        op: &'static str,
        /// candle's error, with shapes.
        source: candle_core::Error,
    },
    /// Copying one tensor to or from the flat buffers failed.
    #[error("copying tensor {name} through the flat buffer: {source}")]
    Tensor {
        /// Tensor name.
        name: String,
        /// candle's error.
        source: candle_core::Error,
    },
    /// The compute engine refused a step's buffers or batch.
    #[error(transparent)]
    Engine(#[from] tandem_kernels::net::NetError),
    /// The requested device is not usable.
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// A flat buffer does not fit the model.
    #[error(transparent)]
    Flat(#[from] FlatError),
}

fn ctx(op: &'static str) -> impl FnOnce(candle_core::Error) -> ModelError {
    move |source| ModelError::Candle { op, source }
}

/// One batch: for a classifier, `labels.len()` samples of `features.len() / labels.len()` values
/// each; for a language model, windows of `context` token ids (whole numbers as values) with the
/// next token of every position as its labels (`labels.len() == features.len()`).
#[derive(Clone, Copy, Debug)]
pub struct Batch<'a> {
    /// Sample-major features (token ids for a language model).
    pub features: &'a [f32],
    /// One class per sample, or one next token per position.
    pub labels: &'a [u32],
}

/// Loss and accuracy of one batch.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BatchStats {
    /// Mean cross-entropy over the batch's targets (nats per token for a language model: its
    /// perplexity is `exp(loss)`).
    pub loss: f32,
    /// Correct predictions.
    pub correct: usize,
    /// Targets in the batch: samples of a classifier, tokens of a language model (so rates are
    /// tokens per second there).
    pub samples: usize,
}

/// A classifier as functions over flat buffers (see the module documentation).
///
/// Guarantees every implementation gives: `forward_backward` and `evaluate` read the parameters
/// only from `params` (never from an earlier call), so moving the buffers between processes or
/// restoring them from a checkpoint is all it takes to move the model; equal inputs give equal
/// outputs.
pub trait Model: std::fmt::Debug + Send {
    /// Names, shapes and offsets of the trainable parameters (and of their gradients).
    fn layout(&self) -> &FlatLayout;

    /// Names, shapes and offsets of the non-trainable state (e.g. running statistics); empty for
    /// a model without state.
    fn state_layout(&self) -> &FlatLayout;

    /// Output classes.
    fn classes(&self) -> usize;

    /// Where the model computes.
    fn device(&self) -> &Device;

    /// Writes the initial parameters and state, drawn from the seed the model was built with.
    fn init(&self, params: &mut [f32], state: &mut [f32]) -> Result<(), ModelError>;

    /// Mean loss and accuracy of `batch` in training mode, with the gradient of the mean loss
    /// written to `grads` and the state updated (e.g. running statistics moved towards the batch's).
    fn forward_backward(
        &mut self,
        params: &[f32],
        state: &mut [f32],
        grads: &mut [f32],
        batch: Batch<'_>,
    ) -> Result<BatchStats, ModelError>;

    /// Mean loss and accuracy of `batch` in evaluation mode; changes nothing.
    fn evaluate(&mut self, params: &[f32], state: &[f32], batch: Batch<'_>)
    -> Result<BatchStats, ModelError>;

    /// For a model split over a group, which parts of the flat vector this rank computes alone;
    /// `None` (the default) for a model every rank computes whole.
    fn partition(&self) -> Option<Partition> {
        None
    }
}

/// The parts of the flat vector a model-parallel rank computes alone ([`split::Split`]): the
/// group's step may update each rank's own rows locally instead of reducing them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Partition {
    /// Every split tensor's range, in flat order.
    pub split: Vec<std::ops::Range<usize>>,
    /// This rank's part of each (one range per split tensor, possibly empty).
    pub owned: Vec<std::ops::Range<usize>>,
    /// Ranks in the group: the gradient of an owned entry is this many times the group's (the
    /// convention of [`tandem_kernels::split`], under which averaging over the ranks is exact).
    pub ranks: usize,
}

/// Environment variable that picks the CPU backend: `engine` (the default) or `candle` (the
/// former backend, kept as a reference; same weights, names and checkpoints).
pub const BACKEND_ENV: &str = "TANDEM_CPU_BACKEND";

/// The model `spec` describes, for inputs of `input` and `classes` classes, initialised from `seed`:
/// on the CPU the engine's ([`Engine`], on [`engine::threads`] threads) unless [`BACKEND_ENV`] asks
/// for candle's, on a GPU candle's ([`Net`]).
pub fn build(
    spec: &ModelSpec,
    input: InputShape,
    classes: usize,
    seed: u64,
    device: &Device,
) -> Result<Box<dyn Model>, ModelError> {
    if device.is_host() {
        match std::env::var(BACKEND_ENV).as_deref() {
            Err(_) | Ok("" | "engine") => {}
            Ok("candle") => return Ok(Box::new(Net::new(spec, input, classes, seed, device)?)),
            Ok(other) => {
                return Err(ModelError::Spec(format!(
                    "{BACKEND_ENV}={other:?} names no CPU backend; use engine (the default) or candle"
                )));
            }
        }
        let threads = engine::threads()?;
        tracing::info!(threads, "model on the CPU engine");
        return Ok(Box::new(Engine::new(spec, input, classes, seed, threads)?));
    }
    Ok(Box::new(Net::new(spec, input, classes, seed, device)?))
}
