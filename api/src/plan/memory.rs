//! How much memory a job needs, estimated from its spec before anything is allocated, so that a
//! job too large for the machine is refused with a message instead of aborting in the allocator.
//!
//! Expected flow: the local runner calls [`MemoryEstimate::of`] with the shape of the training
//! data (known from the spec for the built-in sources, [`builtin_data`]) and compares
//! [`MemoryEstimate::local_total`] with the memory the machine has available.
//!
//! Guarantees: the estimate is an upper-bound-minded approximation of the trainer's largest
//! allocations (the flat parameter vector, its gradient and optimizer state, the activations of
//! one batch and the data set); it saturates instead of overflowing on absurd specs.

use std::fmt;

use crate::job::{DataSource, ModelKind, ModelSpec, OptimizerKind, TrainingJobSpec, VggVariant};

/// Convolution kernel side of the CNN (5×5).
const KERNEL: u64 = 5;
/// Bytes of one value (f32).
const F32: u64 = 4;

/// The training data's shape, as far as the spec tells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataShape {
    /// Channels, height and width of one sample.
    pub channels: u64,
    /// Image height (1 for tabular data).
    pub height: u64,
    /// Image width (the feature count for tabular data).
    pub width: u64,
    /// Samples in the whole data set (training and test).
    pub samples: u64,
    /// Classes (the vocabulary of a text).
    pub classes: u64,
}

impl DataShape {
    fn features(&self) -> u64 {
        self.channels.saturating_mul(self.height).saturating_mul(self.width)
    }
}

/// Distinct bytes of a text: the vocabulary of byte-level tokens.
pub const BYTE_VOCAB: u64 = 256;
/// Characters of the `shakespeare` source (about 5.4 M).
pub const SHAKESPEARE_CHARS: u64 = 5_500_000;

/// The shape of a built-in data source; `None` for `path`, whose shape is known once read. A text
/// is `context` tokens per sample (its samples the windows of that many tokens).
pub fn builtin_data(spec: &TrainingJobSpec) -> Option<DataShape> {
    let image = |side, samples| DataShape { channels: 1, height: side, width: side, samples, classes: 10 };
    let context = u64::from(spec.model.context.unwrap_or(1)).max(1);
    let text = |tokens: u64, classes| DataShape {
        channels: 1,
        height: 1,
        width: context,
        samples: tokens / context,
        classes,
    };
    let synthetic_samples = u64::from(spec.data.synthetic_samples.unwrap_or(10_000));
    match spec.data.source {
        DataSource::Mnist5k => Some(image(28, 5000)),
        DataSource::Digits => Some(image(8, 1797)),
        DataSource::FashionMnist => Some(image(28, 70_000)),
        DataSource::Shakespeare => Some(text(SHAKESPEARE_CHARS, BYTE_VOCAB)),
        DataSource::Synthetic if spec.model.kind.is_language_model() => Some(text(
            synthetic_samples.saturating_mul(context),
            u64::from(spec.data.synthetic_classes.unwrap_or(256)),
        )),
        DataSource::Synthetic => {
            let (channels, height, width) = match spec.data.synthetic_shape.as_deref() {
                Some(&[c, h, w]) => (u64::from(c), u64::from(h), u64::from(w)),
                _ => (1, 28, 28),
            };
            let classes = u64::from(spec.data.synthetic_classes.unwrap_or(10));
            Some(DataShape { channels, height, width, samples: synthetic_samples, classes })
        }
        DataSource::Path | DataSource::Images | DataSource::Shards | DataSource::Text => None,
    }
}

/// The memory one job needs, by process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryEstimate {
    /// Trainable parameters of the model.
    pub parameters: u64,
    /// Bytes of the data set one worker holds.
    pub data_bytes: u64,
    /// Bytes of one worker process: data, parameters with gradient and optimizer state, one
    /// batch's activations.
    pub worker_bytes: u64,
    /// Bytes of all parameter-server shards together.
    pub ps_bytes: u64,
    /// Worker processes of the job.
    pub workers: u64,
    /// What drives the estimate, for the message: the fields and their values.
    pub drivers: String,
}

impl MemoryEstimate {
    /// The estimate of `spec` on data of `data`'s shape.
    pub fn of(spec: &TrainingJobSpec, data: DataShape) -> Self {
        let hidden: Vec<u64> = spec.model.hidden.iter().map(|&w| u64::from(w)).collect();
        let batch = u64::from(spec.data.batch_size);
        let classes = data.classes.max(2);
        let (parameters, activations) = match spec.model.kind {
            ModelKind::Mlp => mlp(data.features(), &hidden, classes, batch),
            ModelKind::Resnet => resnet(&spec.model, data, batch),
            ModelKind::Vgg => vgg(&spec.model, data, batch),
            ModelKind::Gpt => gpt(&spec.model, classes, batch),
            ModelKind::Cnn => {
                let (c1, c2) = match spec.model.channels.as_slice() {
                    [a, b] => (u64::from(*a), u64::from(*b)),
                    _ => (1, 1),
                };
                let (h, w) = (data.height, data.width);
                let convs = c1
                    .saturating_mul(data.channels)
                    .saturating_mul(KERNEL * KERNEL)
                    .saturating_add(c1)
                    .saturating_add(c2.saturating_mul(c1).saturating_mul(KERNEL * KERNEL))
                    .saturating_add(c2);
                let flat = c2.saturating_mul(h / 4).saturating_mul(w / 4);
                let (head, head_act) = mlp(flat, &hidden, classes, batch);
                // im2col buffers of both blocks, and their outputs.
                let per_sample = (data.channels.saturating_mul(h).saturating_mul(w))
                    .saturating_mul(KERNEL * KERNEL)
                    .saturating_add(c1.saturating_mul(h).saturating_mul(w))
                    .saturating_add(
                        c1.saturating_mul(h / 2).saturating_mul(w / 2).saturating_mul(KERNEL * KERNEL),
                    )
                    .saturating_add(c2.saturating_mul(h / 2).saturating_mul(w / 2));
                (convs.saturating_add(head), head_act.saturating_add(batch.saturating_mul(per_sample)))
            }
        };
        // Weights, gradient, a flat copy for the exchange, and the optimizer's moments.
        let moments = match spec.training.optimizer.kind {
            OptimizerKind::Sgd => 1,
            OptimizerKind::Adamw => 2,
        };
        let param_bytes = parameters.saturating_mul(F32);
        // The data set as read, and its training/test split (a second copy while splitting).
        let mut data_bytes =
            data.samples.saturating_mul(data.features()).saturating_mul(F32).saturating_mul(2);
        if spec.data.source == DataSource::Synthetic && !spec.model.kind.is_language_model() {
            // The synthetic source's class prototypes.
            data_bytes =
                data_bytes.saturating_add(data.classes.saturating_mul(data.features()).saturating_mul(F32));
        }
        let worker_bytes = param_bytes
            .saturating_mul(3 + moments)
            .saturating_add(activations.saturating_mul(F32).saturating_mul(3))
            .saturating_add(data_bytes);
        let ps_bytes =
            if spec.parameter_servers.replicas == 0 { 0 } else { param_bytes.saturating_mul(2 + moments) };
        let workers = u64::from(spec.workers.ranks());
        let mut drivers = match spec.model.kind {
            ModelKind::Mlp => format!("model.kind mlp, model.hidden {:?}", spec.model.hidden),
            ModelKind::Cnn => format!(
                "model.kind cnn, model.hidden {:?}, model.channels {:?}",
                spec.model.hidden, spec.model.channels
            ),
            _ => format!("model {}", spec.model.label()),
        };
        drivers.push_str(&format!(
            ": {} parameters; {} samples of {} values",
            count(parameters),
            count(data.samples),
            data.features()
        ));
        if let Some(n) = spec.data.synthetic_samples.filter(|_| spec.data.source == DataSource::Synthetic) {
            drivers.push_str(&format!(" (data.syntheticSamples {n})"));
        }
        drivers.push_str(&format!(
            "; data.batchSize {batch}; {workers} worker process(es) (workers.groups × workers.groupSize)"
        ));
        Self { parameters, data_bytes, worker_bytes, ps_bytes, workers, drivers }
    }

    /// Bytes of every process of the job on one machine: each worker holds the whole model and
    /// data set, the shards together one copy of the parameters and their state.
    pub fn local_total(&self) -> u64 {
        self.worker_bytes.saturating_mul(self.workers).saturating_add(self.ps_bytes)
    }
}

/// Parameters and per-batch activation values of an MLP `inputs → hidden… → classes`.
fn mlp(inputs: u64, hidden: &[u64], classes: u64, batch: u64) -> (u64, u64) {
    let mut params = 0u64;
    let mut widths = inputs;
    let mut prev = inputs;
    for &w in hidden.iter().chain(std::iter::once(&classes)) {
        params = params.saturating_add(prev.saturating_mul(w)).saturating_add(w);
        widths = widths.saturating_add(w);
        prev = w;
    }
    (params, batch.saturating_mul(widths))
}

/// Parameters and per-sample activation values of a convolutional network, walked layer by
/// layer over an image of `c × h × w`.
#[derive(Clone, Copy, Debug)]
struct Walk {
    c: u64,
    h: u64,
    w: u64,
    params: u64,
    acts: u64,
}

impl Walk {
    fn new(data: DataShape) -> Self {
        Self { c: data.channels, h: data.height.max(1), w: data.width.max(1), params: 0, acts: 0 }
    }

    fn pixels(&self) -> u64 {
        self.h.saturating_mul(self.w)
    }

    /// A `k × k` convolution to `cout` channels with `stride` (padding `k / 2`), with bias or
    /// followed by batch norm (its output, normalised output and saved statistics).
    fn conv(&mut self, cout: u64, k: u64, stride: u64, norm: bool) {
        self.params = self.params.saturating_add(self.c.saturating_mul(cout).saturating_mul(k * k));
        self.params = self.params.saturating_add(if norm { 2 * cout } else { cout });
        self.h = (self.h - 1) / stride + 1;
        self.w = (self.w - 1) / stride + 1;
        self.c = cout;
        let out = self.c.saturating_mul(self.pixels());
        self.acts = self.acts.saturating_add(out.saturating_mul(if norm { 3 } else { 1 }));
    }

    /// A pooling with `stride`.
    fn pool(&mut self, stride: u64) {
        self.h = (self.h - 1) / stride + 1;
        self.w = (self.w - 1) / stride + 1;
        self.acts = self.acts.saturating_add(self.c.saturating_mul(self.pixels()).saturating_mul(2));
    }

    /// A dense layer from the current features to `out`.
    fn dense(&mut self, out: u64) {
        let inputs = self.c.saturating_mul(self.pixels());
        self.params = self.params.saturating_add(inputs.saturating_mul(out)).saturating_add(out);
        (self.c, self.h, self.w) = (out, 1, 1);
        self.acts = self.acts.saturating_add(out);
    }
}

/// A ResNet's parameters and one batch's activation values (see `tandem_kernels::models::resnet`).
fn resnet(model: &ModelSpec, data: DataShape, batch: u64) -> (u64, u64) {
    let depth = u64::from(model.depth.unwrap_or(20));
    let imagenet = matches!(depth, 18 | 34 | 50 | 101 | 152);
    let (stages, bottleneck): (Vec<u64>, bool) = match depth {
        18 => (vec![2, 2, 2, 2], false),
        34 => (vec![3, 4, 6, 3], false),
        50 => (vec![3, 4, 6, 3], true),
        101 => (vec![3, 4, 23, 3], true),
        152 => (vec![3, 8, 36, 3], true),
        d => (vec![d.saturating_sub(2) / 6; 3], false),
    };
    let width = u64::from(model.width.unwrap_or(if imagenet { 64 } else { 16 }));
    let mut n = Walk::new(data);
    if imagenet {
        n.conv(width, 7, 2, true);
        n.pool(2);
    } else {
        n.conv(width, 3, 1, true);
    }
    for (i, &blocks) in stages.iter().enumerate() {
        let w = width << i;
        for j in 0..blocks {
            let stride = if i > 0 && j == 0 { 2 } else { 1 };
            let (cin, h, wd) = (n.c, n.h, n.w);
            let out = if bottleneck { 4 * w } else { w };
            if bottleneck {
                n.conv(w, 1, 1, true);
                n.conv(w, 3, stride, true);
                n.conv(out, 1, 1, true);
            } else {
                n.conv(w, 3, stride, true);
                n.conv(w, 3, 1, true);
            }
            if stride != 1 || cin != out {
                let mut shortcut = Walk { c: cin, h, w: wd, params: 0, acts: 0 };
                shortcut.conv(out, 1, stride, true);
                n.params = n.params.saturating_add(shortcut.params);
                n.acts = n.acts.saturating_add(shortcut.acts);
            }
            // The sum and its ReLU.
            n.acts = n.acts.saturating_add(n.c.saturating_mul(n.pixels()).saturating_mul(2));
        }
    }
    (n.c, n.h, n.w) = (n.c, 1, 1);
    n.dense(data.classes.max(2));
    (n.params, n.acts.saturating_mul(batch))
}

/// A VGG's parameters and one batch's activation values (see `tandem_kernels::models::vgg`).
fn vgg(model: &ModelSpec, data: DataShape, batch: u64) -> (u64, u64) {
    let width = u64::from(model.width.unwrap_or(64));
    let convs: &[&[u64]] = match model.variant.unwrap_or_default() {
        VggVariant::A => &[&[1], &[2], &[4, 4], &[8, 8], &[8, 8]],
        VggVariant::D => &[&[1, 1], &[2, 2], &[4, 4, 4], &[8, 8, 8], &[8, 8, 8]],
    };
    let mut n = Walk::new(data);
    for stage in convs {
        for &mult in *stage {
            n.conv(mult * width, 3, 1, false);
        }
        if n.h >= 2 && n.w >= 2 {
            n.pool(2);
        }
    }
    let hidden = u64::from(model.classifier_width.unwrap_or(4096));
    n.dense(hidden);
    n.dense(hidden);
    n.dense(data.classes.max(2));
    (n.params, n.acts.saturating_mul(batch))
}

/// A GPT's parameters and one batch's activation values (see `tandem_kernels::models::gpt`).
fn gpt(model: &ModelSpec, vocab: u64, batch: u64) -> (u64, u64) {
    let (layers, heads) = (u64::from(model.layers.unwrap_or(1)), u64::from(model.heads.unwrap_or(1)));
    let (d, t) = (u64::from(model.dim.unwrap_or(1)), u64::from(model.context.unwrap_or(1)));
    let block = d.saturating_mul(d).saturating_mul(12).saturating_add(d.saturating_mul(13));
    let params = vocab
        .saturating_add(t)
        .saturating_mul(d)
        .saturating_add(layers.saturating_mul(block))
        .saturating_add(2 * d);
    // Per token and block: norms, q/k/v, attention output, projections and the 4× MLP (about
    // 20 d), and the attention weights of every head (t each).
    let per_token = layers
        .saturating_mul(d.saturating_mul(20).saturating_add(heads.saturating_mul(t)))
        .saturating_add(vocab.saturating_mul(2));
    (params, per_token.saturating_mul(t).saturating_mul(batch))
}

/// A count in words: `8.6 G`.
fn count(n: u64) -> String {
    let n = n as f64;
    match n {
        n if n >= 1e9 => format!("{:.1} G", n / 1e9),
        n if n >= 1e6 => format!("{:.1} M", n / 1e6),
        n if n >= 1e3 => format!("{:.1} k", n / 1e3),
        n => format!("{n}"),
    }
}

/// Bytes in binary units: `137.4 GiB`.
pub struct Bytes(pub u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0 as f64;
        let gib = (1u64 << 30) as f64;
        let mib = (1u64 << 20) as f64;
        if b >= 1024.0 * gib {
            write!(f, "{:.1} TiB", b / (1024.0 * gib))
        } else if b >= gib {
            write!(f, "{:.1} GiB", b / gib)
        } else {
            write!(f, "{:.1} MiB", b / mib)
        }
    }
}

/// A job too large for the memory at hand.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "the job needs about {} of memory ({drivers}), more than the {} available; use a smaller \
     model (model.hidden or model.channels; model.depth or model.width; model.layers, model.dim or \
     model.context), fewer data.syntheticSamples, a smaller data.batchSize or fewer workers",
    Bytes(*.need), Bytes(*.available)
)]
pub struct MemoryError {
    /// Bytes the job needs.
    pub need: u64,
    /// Bytes available.
    pub available: u64,
    /// The fields behind the estimate, with their values.
    pub drivers: String,
}

impl MemoryEstimate {
    /// Refuses the job when `need` (one of this estimate's totals) exceeds `available` bytes.
    pub fn check(&self, need: u64, available: u64) -> Result<(), MemoryError> {
        if need <= available {
            return Ok(());
        }
        Err(MemoryError { need, available, drivers: self.drivers.clone() })
    }
}
