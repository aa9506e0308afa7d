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

use crate::job::{DataSource, ModelKind, OptimizerKind, TrainingJobSpec};

/// Classes of every built-in data set.
const CLASSES: u64 = 10;
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
}

impl DataShape {
    fn features(&self) -> u64 {
        self.channels.saturating_mul(self.height).saturating_mul(self.width)
    }
}

/// The shape of a built-in data source; `None` for `path`, whose shape is known once read.
pub fn builtin_data(spec: &TrainingJobSpec) -> Option<DataShape> {
    let image = |side, samples| DataShape { channels: 1, height: side, width: side, samples };
    match spec.data.source {
        DataSource::Mnist5k => Some(image(28, 5000)),
        DataSource::Digits => Some(image(8, 1797)),
        DataSource::Synthetic => Some(image(28, u64::from(spec.data.synthetic_samples.unwrap_or(10_000)))),
        DataSource::Path => None,
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
        let (parameters, activations) = match spec.model.kind {
            ModelKind::Mlp => mlp(data.features(), &hidden, batch),
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
                let (head, head_act) = mlp(flat, &hidden, batch);
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
        let data_bytes = data.samples.saturating_mul(data.features()).saturating_mul(F32).saturating_mul(2);
        let worker_bytes = param_bytes
            .saturating_mul(3 + moments)
            .saturating_add(activations.saturating_mul(F32).saturating_mul(3))
            .saturating_add(data_bytes);
        let ps_bytes =
            if spec.parameter_servers.replicas == 0 { 0 } else { param_bytes.saturating_mul(2 + moments) };
        let workers = (u64::from(spec.workers.groups) * u64::from(spec.workers.group_size)).max(1);
        let mut drivers = format!(
            "model.kind {}, model.hidden {:?}",
            match spec.model.kind {
                ModelKind::Mlp => "mlp",
                ModelKind::Cnn => "cnn",
            },
            spec.model.hidden
        );
        if spec.model.kind == ModelKind::Cnn {
            drivers.push_str(&format!(", model.channels {:?}", spec.model.channels));
        }
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

/// Parameters and per-batch activation values of an MLP `inputs → hidden… → CLASSES`.
fn mlp(inputs: u64, hidden: &[u64], batch: u64) -> (u64, u64) {
    let mut params = 0u64;
    let mut widths = inputs;
    let mut prev = inputs;
    for &w in hidden.iter().chain(std::iter::once(&CLASSES)) {
        params = params.saturating_add(prev.saturating_mul(w)).saturating_add(w);
        widths = widths.saturating_add(w);
        prev = w;
    }
    (params, batch.saturating_mul(widths))
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
    "the job needs about {} of memory ({drivers}), more than the {} available; use smaller \
     model.hidden widths or model.channels, fewer data.syntheticSamples, a smaller data.batchSize or \
     fewer workers",
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
