//! The CPU backend: the model families as networks of Tandem's compute engine
//! ([`tandem_kernels`]), whose layers read the weights in place from the trainer's flat parameter
//! buffer and write their gradients in place into its flat gradient buffer.
//!
//! Nothing is copied between formats inside a step: [`Model::forward_backward`] hands the
//! [`crate::params::ParamStore`]'s slices straight to
//! [`tandem_kernels::net::Network::forward_backward`], which keeps its activations in buffers it
//! owns (allocated once, for the largest batch seen). The flat order, the names and the
//! initialisation are those of the candle backend ([`super::net`]): He-uniform weights drawn in
//! flat order from the same seeded generator, biases zero, so both backends start from the same
//! weights bit for bit and their checkpoints are interchangeable.
//!
//! Threads: one fork-join pool per model, of [`threads`] threads.

use tandem_api::{ModelKind, ModelSpec, VggVariant};
use tandem_kernels::models::{self, GptConfig, ResNetConfig, ResNetFamily, VggConfig};
use tandem_kernels::net::{self as knet, NetError, Network};

use super::{Batch, BatchStats, Model, ModelError};
use crate::device::Device;
use crate::params::FlatLayout;
use tandem_input::InputShape;
use tandem_util::rng::Rng;

/// Environment variable that sets the compute threads of a process (a whole number ≥ 1).
pub const THREADS_ENV: &str = "TANDEM_THREADS";

/// Threads of a process's compute pool: [`THREADS_ENV`] when set; otherwise the CPUs this process
/// may use (its affinity mask and its container's CPU quota, which is how a pod's
/// `resources.limits.cpu` sizes it), shared among the ranks `mpirun` started on this node
/// (`OMPI_COMM_WORLD_LOCAL_SIZE`); at least 1. The local runner sets [`THREADS_ENV`] for each rank
/// to its share of the machine (the CPUs over the job's ranks).
pub fn threads() -> Result<usize, ModelError> {
    if let Ok(v) = std::env::var(THREADS_ENV) {
        return match v.trim().parse::<usize>() {
            Ok(n) if n >= 1 => Ok(n),
            _ => Err(ModelError::Spec(format!(
                "{THREADS_ENV}={v:?} is not a whole number >= 1; set it to the compute threads per process or unset it"
            ))),
        };
    }
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let local_ranks = std::env::var("OMPI_COMM_WORLD_LOCAL_SIZE")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&n| n >= 1)
        .unwrap_or(1);
    Ok((cpus / local_ranks).max(1))
}

/// A model family on the engine.
pub struct Engine {
    net: Network,
    /// Whether the network reads token ids (a GPT): the batch's values are then whole token ids,
    /// converted into `ids` before each step.
    tokens: bool,
    ids: Vec<u32>,
    layout: FlatLayout,
    state_layout: FlatLayout,
    seed: u64,
    device: Device,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").field("net", &self.net).field("params", &self.layout.len()).finish()
    }
}

impl Engine {
    /// The model of `spec` for inputs of `input` and `classes` classes, on `threads` threads,
    /// initialised from `seed` by [`Model::init`].
    pub fn new(
        spec: &ModelSpec,
        input: InputShape,
        classes: usize,
        seed: u64,
        threads: usize,
    ) -> Result<Self, ModelError> {
        if classes < 2 {
            return Err(ModelError::Spec(format!(
                "a classifier needs at least 2 classes, the data has {classes}"
            )));
        }
        if let Some(w) = spec.hidden.iter().find(|&&w| w == 0) {
            return Err(ModelError::Spec(format!("model.hidden widths must be at least 1, got {w}")));
        }
        let net = network(spec, input, classes, threads)?;
        let layout = FlatLayout::new(net.params().iter().map(|e| (e.name.as_str(), e.shape.as_slice())));
        let state_layout = FlatLayout::new(net.state().iter().map(|e| (e.name.as_str(), e.shape.as_slice())));
        let tokens = spec.kind.is_language_model();
        Ok(Self { net, tokens, ids: Vec::new(), layout, state_layout, seed, device: Device::Cpu })
    }

    /// The engine network (for profiling and benchmarks).
    pub fn network(&self) -> &Network {
        &self.net
    }

    /// The engine network, to profile its layers (`tandem plan`).
    pub fn network_mut(&mut self) -> &mut Network {
        &mut self.net
    }

    /// Threads of the model's pool.
    pub fn threads(&self) -> usize {
        self.net.threads()
    }
}

/// The engine network of `spec` for inputs of `input` and `classes` classes (the vocabulary of
/// a language model, whose samples are `model.context` token ids).
pub(super) fn network(
    spec: &ModelSpec,
    input: InputShape,
    classes: usize,
    threads: usize,
) -> Result<Network, ModelError> {
    let image = (input.channels, input.height, input.width);
    let need = |field: &str, v: Option<u32>| {
        v.map(|v| v as usize)
            .ok_or_else(|| ModelError::Spec(format!("model kind {} needs model.{field}", spec.kind.name())))
    };
    let hidden: Vec<usize> = spec.hidden.iter().map(|&w| w as usize).collect();
    let net = match spec.kind {
        ModelKind::Mlp => models::mlp(input.features(), &hidden, classes, threads),
        ModelKind::Cnn => {
            let channels = match spec.channels.as_slice() {
                &[a, b] if a >= 1 && b >= 1 => [a as usize, b as usize],
                other => {
                    return Err(ModelError::Spec(format!(
                        "model.channels needs exactly two values >= 1 (one per convolution block), got {other:?}"
                    )));
                }
            };
            models::lenet(image, channels, &hidden, classes, threads)
        }
        ModelKind::Resnet => {
            let depth = need("depth", spec.depth)?;
            let family = ResNetFamily::for_depth(depth).map_err(spec_error)?;
            let standard = ResNetConfig::standard(depth).map_err(spec_error)?;
            let width = spec.width.map_or(standard.width, |w| w as usize);
            models::resnet(ResNetConfig { depth, family, width }, image, classes, threads)
        }
        ModelKind::Vgg => {
            let variant = match spec.variant.unwrap_or_default() {
                VggVariant::A => models::VggVariant::A,
                VggVariant::D => models::VggVariant::Vgg16,
            };
            let standard = VggConfig::standard(variant);
            let cfg = VggConfig {
                variant,
                width: spec.width.map_or(standard.width, |w| w as usize),
                hidden: spec.classifier_width.map_or(standard.hidden, |w| w as usize),
            };
            models::vgg(cfg, image, classes, threads)
        }
        ModelKind::Gpt => {
            let context = need("context", spec.context)?;
            if input.features() != context {
                return Err(ModelError::Spec(format!(
                    "model.context is {context} tokens but the data's samples have {} values; a GPT trains on a \
                     text source (data.source shakespeare or synthetic), whose samples are model.context tokens",
                    input.features()
                )));
            }
            let cfg = GptConfig {
                vocab: classes,
                context,
                layers: need("layers", spec.layers)?,
                heads: need("heads", spec.heads)?,
                width: need("dim", spec.dim)?,
            };
            if !cfg.width.is_multiple_of(cfg.heads) {
                return Err(ModelError::Spec(format!(
                    "model.heads ({}) must divide model.dim ({})",
                    cfg.heads, cfg.width
                )));
            }
            models::gpt(cfg, threads)
        }
    };
    net.map_err(spec_error)
}

/// Token ids from a batch's values: each must be a whole number (the vocabulary check is the
/// network's).
fn token_ids(values: &[f32], ids: &mut Vec<u32>) -> Result<(), ModelError> {
    ids.clear();
    for (i, &v) in values.iter().enumerate() {
        if !(v >= 0.0 && v.fract() == 0.0 && v < u32::MAX as f32) {
            return Err(ModelError::Spec(format!(
                "value {v} at position {i} of the batch is not a token id; a GPT trains on a text source"
            )));
        }
        ids.push(v as u32);
    }
    Ok(())
}

/// A build error of the engine as a spec error ("invalid network: " dropped, the message says what).
fn spec_error(e: NetError) -> ModelError {
    match e {
        NetError::Build(msg) => ModelError::Spec(msg),
        other => ModelError::Engine(other),
    }
}

fn stats(s: knet::BatchStats) -> BatchStats {
    BatchStats { loss: s.loss, correct: s.correct, samples: s.targets }
}

impl Model for Engine {
    fn layout(&self) -> &FlatLayout {
        &self.layout
    }

    fn state_layout(&self) -> &FlatLayout {
        &self.state_layout
    }

    fn classes(&self) -> usize {
        self.net.classes()
    }

    fn device(&self) -> &Device {
        &self.device
    }

    fn init(&self, params: &mut [f32], state: &mut [f32]) -> Result<(), ModelError> {
        // The candle backend's generator and stream (see `net::Declare`): same weights bit for bit.
        let mut rng = Rng::derive(self.seed, 0x1417);
        self.net.init(params, state, &mut |lo, hi| rng.uniform(lo, hi))?;
        Ok(())
    }

    fn forward_backward(
        &mut self,
        params: &[f32],
        state: &mut [f32],
        grads: &mut [f32],
        batch: Batch<'_>,
    ) -> Result<BatchStats, ModelError> {
        let input = if self.tokens {
            token_ids(batch.features, &mut self.ids)?;
            knet::Batch::Tokens(&self.ids)
        } else {
            knet::Batch::Values(batch.features)
        };
        Ok(stats(self.net.forward_backward(params, state, grads, input, batch.labels)?))
    }

    fn evaluate(
        &mut self,
        params: &[f32],
        state: &[f32],
        batch: Batch<'_>,
    ) -> Result<BatchStats, ModelError> {
        let input = if self.tokens {
            token_ids(batch.features, &mut self.ids)?;
            knet::Batch::Tokens(&self.ids)
        } else {
            knet::Batch::Values(batch.features)
        };
        Ok(stats(self.net.evaluate(params, state, input, batch.labels)?))
    }
}
