//! Models on candle: an MLP and a LeNet-style CNN, built from `spec.model`, with parameters created
//! from a seed so that two runs with the same seed start from the same weights bit for bit.
//!
//! Each model keeps one candle [`Var`] per tensor (candle's backward of a view into one big variable
//! would allocate full-size zero gradients per view) and exposes them through a [`FlatLayout`]: see
//! [`crate::compute::params`] for the order. Parameter names follow PyTorch's (`fc1.weight`, `conv1.bias`, …).
//!
//! Devices: the CPU always; CUDA only when built with the `cuda` feature *and* a CUDA driver is
//! present at run time ([`select_device`] checks before touching the driver, which panics when absent).

use candle_core::{DType, Device, Tensor, Var};
use tandem_api::{ModelKind, ModelSpec};

use crate::compute::data::InputShape;
use crate::compute::params::{self as flat, FlatError, FlatLayout};
use crate::compute::rng::Rng;

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
    /// The requested device is not usable.
    #[error("device {0}")]
    Device(String),
    /// Moving parameters or gradients through the flat buffer failed.
    #[error(transparent)]
    Flat(#[from] FlatError),
}

fn ctx(op: &'static str) -> impl FnOnce(candle_core::Error) -> ModelError {
    move |source| ModelError::Candle { op, source }
}

/// Which device to compute on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum DeviceChoice {
    /// CUDA when compiled in and a GPU driver is present, else the CPU.
    #[default]
    Auto,
    /// Always the CPU.
    Cpu,
    /// CUDA, or an error saying why not.
    Cuda,
}

/// Picks the compute device.
pub fn select_device(choice: DeviceChoice) -> Result<Device, ModelError> {
    match choice {
        DeviceChoice::Cpu => Ok(Device::Cpu),
        DeviceChoice::Auto => Ok(cuda_device().unwrap_or(Device::Cpu)),
        DeviceChoice::Cuda => cuda_device().ok_or_else(|| {
            ModelError::Device(if cfg!(feature = "cuda") {
                "cuda: no CUDA driver (libcuda) or no GPU found on this machine; use --device cpu".into()
            } else {
                "cuda: this tandem was built without the `cuda` feature; rebuild with \
                 `cargo build --release --features cuda` (needs the CUDA toolkit) or use --device cpu"
                    .into()
            })
        }),
    }
}

#[cfg(feature = "cuda")]
fn cuda_device() -> Option<Device> {
    // cudarc panics instead of returning an error when libcuda cannot be loaded: ask the loader first.
    let present = candle_core::cuda::cudarc::driver::sys::is_culib_present();
    if !present {
        return None;
    }
    Device::new_cuda(0).ok()
}

#[cfg(not(feature = "cuda"))]
fn cuda_device() -> Option<Device> {
    None
}

#[derive(Clone, Debug)]
enum Arch {
    /// `layers` dense layers, ReLU between them.
    Mlp { layers: usize },
    /// conv5×5(pad 2)→ReLU→maxpool2, twice, then `dense` dense layers. `im2col` holds, per conv
    /// layer, the gather indices that unfold its padded input into patch columns.
    Cnn { input: InputShape, dense: usize, im2col: [Tensor; 2] },
}

/// A network with its parameters.
#[derive(Debug)]
pub struct Model {
    arch: Arch,
    vars: Vec<Var>,
    layout: FlatLayout,
    device: Device,
    classes: usize,
}

/// Registers a parameter: (rng, name, shape, fan-in).
type AddParam<'a> = dyn FnMut(&mut Rng, String, Vec<usize>, usize) -> Result<(), ModelError> + 'a;

/// He-uniform weights (suits ReLU), zero biases; deterministic in `rng`.
fn param(
    rng: &mut Rng,
    shape: &[usize],
    fan_in: usize,
    bias: bool,
    device: &Device,
) -> Result<Var, ModelError> {
    let n: usize = shape.iter().product();
    let values: Vec<f32> = if bias {
        vec![0.0; n]
    } else {
        let bound = (6.0 / fan_in as f32).sqrt();
        (0..n).map(|_| rng.uniform(-bound, bound)).collect()
    };
    let t = Tensor::from_vec(values, shape, device).map_err(ctx("creating a parameter"))?;
    Var::from_tensor(&t).map_err(ctx("creating a parameter"))
}

impl Model {
    /// Builds the model of `spec` for inputs of shape `input` and `classes` output classes, with
    /// weights drawn from `seed`.
    pub fn new(
        spec: &ModelSpec,
        input: InputShape,
        classes: usize,
        seed: u64,
        device: &Device,
    ) -> Result<Self, ModelError> {
        if classes < 2 {
            return Err(ModelError::Spec(format!(
                "a classifier needs at least 2 classes, the data has {classes}"
            )));
        }
        if let Some(w) = spec.hidden.iter().find(|&&w| w == 0) {
            return Err(ModelError::Spec(format!("model.hidden widths must be at least 1, got {w}")));
        }
        let mut rng = Rng::derive(seed, 0x1417);
        let mut names: Vec<(String, Vec<usize>)> = Vec::new();
        let mut vars = Vec::new();
        let mut add =
            |rng: &mut Rng, name: String, shape: Vec<usize>, fan_in: usize| -> Result<(), ModelError> {
                let bias = name.ends_with(".bias");
                vars.push(param(rng, &shape, fan_in, bias, device)?);
                names.push((name, shape));
                Ok(())
            };
        let hidden: Vec<usize> = spec.hidden.iter().map(|&w| w as usize).collect();
        let dense = |rng: &mut Rng, mut width: usize, add: &mut AddParam<'_>| -> Result<usize, ModelError> {
            let widths = hidden.iter().copied().chain(std::iter::once(classes));
            let mut count = 0;
            for (i, out) in widths.enumerate() {
                add(rng, format!("fc{}.weight", i + 1), vec![out, width], width)?;
                add(rng, format!("fc{}.bias", i + 1), vec![out], width)?;
                width = out;
                count += 1;
            }
            Ok(count)
        };
        let arch = match spec.kind {
            ModelKind::Mlp => Arch::Mlp { layers: dense(&mut rng, input.features(), &mut add)? },
            ModelKind::Cnn => {
                let [c1, c2] = match spec.channels.as_slice() {
                    &[a, b] if a >= 1 && b >= 1 => [a as usize, b as usize],
                    other => {
                        return Err(ModelError::Spec(format!(
                            "model.channels needs exactly two values >= 1 (one per convolution block), got {other:?}"
                        )));
                    }
                };
                if input.height < 4 || input.width < 4 {
                    return Err(ModelError::Spec(format!(
                        "a cnn needs images of at least 4×4 pixels (two 2×2 poolings), the data has {}×{}",
                        input.height, input.width
                    )));
                }
                let k = 5;
                add(&mut rng, "conv1.weight".into(), vec![c1, input.channels, k, k], input.channels * k * k)?;
                add(&mut rng, "conv1.bias".into(), vec![c1], input.channels * k * k)?;
                add(&mut rng, "conv2.weight".into(), vec![c2, c1, k, k], c1 * k * k)?;
                add(&mut rng, "conv2.bias".into(), vec![c2], c1 * k * k)?;
                let flat_in = c2 * (input.height / 4) * (input.width / 4);
                let (h2, w2) = (input.height / 2, input.width / 2);
                let im2col = [
                    im2col_index(input.channels, input.height, input.width, k, device)?,
                    im2col_index(c1, h2, w2, k, device)?,
                ];
                Arch::Cnn { input, dense: dense(&mut rng, flat_in, &mut add)?, im2col }
            }
        };
        let layout = FlatLayout::new(names.iter().map(|(n, s)| (n.as_str(), s.as_slice())));
        Ok(Self { arch, vars, layout, device: device.clone(), classes })
    }

    /// The flat layout of the parameters.
    pub fn layout(&self) -> &FlatLayout {
        &self.layout
    }

    /// Number of parameters.
    pub fn num_params(&self) -> usize {
        self.layout.len()
    }

    /// Output classes.
    pub fn classes(&self) -> usize {
        self.classes
    }

    /// The device the model computes on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The parameter variables, in flat order.
    pub fn vars(&self) -> &[Var] {
        &self.vars
    }

    /// Copies the parameters into `out` (length [`Model::num_params`]).
    pub fn read_params(&self, out: &mut [f32]) -> Result<(), ModelError> {
        Ok(flat::read_params(&self.layout, &self.vars, out)?)
    }

    /// Sets the parameters from `src` (length [`Model::num_params`]).
    pub fn write_params(&self, src: &[f32]) -> Result<(), ModelError> {
        Ok(flat::write_params(&self.layout, &self.vars, src, &self.device)?)
    }

    /// Logits for a batch `x` of shape `[batch, features]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor, ModelError> {
        let c = ctx("forward");
        let v = |i: usize| self.vars[i].as_tensor();
        let dense_from = |mut x: Tensor, first: usize, layers: usize| -> candle_core::Result<Tensor> {
            for l in 0..layers {
                let (w, b) = (v(first + 2 * l), v(first + 2 * l + 1));
                x = x.matmul(&w.t()?)?.broadcast_add(b)?;
                if l + 1 < layers {
                    x = x.relu()?;
                }
            }
            Ok(x)
        };
        match &self.arch {
            Arch::Mlp { layers } => dense_from(x.clone(), 0, *layers).map_err(c),
            Arch::Cnn { input, dense, im2col } => (|| {
                let b = x.dim(0)?;
                let x = x.reshape((b, input.channels, input.height, input.width))?;
                let x = conv_block(&x, v(0), v(1), &im2col[0])?;
                let x = conv_block(&x, v(2), v(3), &im2col[1])?;
                let x = x.flatten_from(1)?;
                dense_from(x, 4, *dense)
            })()
            .map_err(c),
        }
    }

    /// Turns host data into input tensors on the model's device.
    pub fn batch_tensors(&self, x: &[f32], y: &[u32]) -> Result<(Tensor, Tensor), ModelError> {
        let n = y.len();
        let features = x.len().checked_div(n).unwrap_or(0);
        let xt = Tensor::from_slice(x, (n, features), &self.device).map_err(ctx("uploading a batch"))?;
        let yt = Tensor::from_slice(y, n, &self.device).map_err(ctx("uploading a batch"))?;
        Ok((xt, yt))
    }

    /// Mean cross-entropy loss and number of correct predictions of a batch, and the flat gradient of
    /// the mean loss in `grads` (length [`Model::num_params`]).
    pub fn loss_and_grad(&self, x: &[f32], y: &[u32], grads: &mut [f32]) -> Result<BatchStats, ModelError> {
        let (xt, yt) = self.batch_tensors(x, y)?;
        let logits = self.forward(&xt)?;
        let loss = candle_nn::loss::cross_entropy(&logits, &yt).map_err(ctx("cross-entropy loss"))?;
        let store = loss.backward().map_err(ctx("backward"))?;
        flat::read_grads(&self.layout, &self.vars, &store, grads)?;
        let correct = count_correct(&logits, &yt)?;
        let loss =
            loss.to_dtype(DType::F32).and_then(|l| l.to_scalar::<f32>()).map_err(ctx("reading the loss"))?;
        Ok(BatchStats { loss, correct, samples: y.len() })
    }

    /// Summed loss and correct predictions over `y.len()` samples, without gradients.
    pub fn evaluate(&self, x: &[f32], y: &[u32]) -> Result<BatchStats, ModelError> {
        let (xt, yt) = self.batch_tensors(x, y)?;
        let logits = self.forward(&xt)?.detach();
        let loss = candle_nn::loss::cross_entropy(&logits, &yt).map_err(ctx("cross-entropy loss"))?;
        let loss = loss.to_scalar::<f32>().map_err(ctx("reading the loss"))?;
        Ok(BatchStats { loss, correct: count_correct(&logits, &yt)?, samples: y.len() })
    }
}

/// Padding of the 5×5 convolutions ("same" output size).
const PAD: usize = 2;

/// Indices that gather a zero-padded `[c, h+2p, w+2p]` image (flattened) into `[c·k·k, h·w]` patch
/// columns, row (ci, ky, kx), column (y, x).
fn im2col_index(c: usize, h: usize, w: usize, k: usize, device: &Device) -> Result<Tensor, ModelError> {
    let (hp, wp) = (h + 2 * PAD, w + 2 * PAD);
    let mut idx = Vec::with_capacity(c * k * k * h * w);
    for ci in 0..c {
        for ky in 0..k {
            for kx in 0..k {
                for y in 0..h {
                    for x in 0..w {
                        idx.push((ci * hp * wp + (y + ky) * wp + (x + kx)) as u32);
                    }
                }
            }
        }
    }
    Tensor::from_vec(idx, c * k * k * h * w, device).map_err(ctx("building convolution indices"))
}

/// conv5×5 (pad 2, stride 1) → +bias → ReLU → 2×2 max-pool, on `[b, c, h, w]`.
///
/// The convolution is an explicit im2col gather plus one batched matmul rather than candle's
/// `conv2d`, whose CPU backward (`conv_transpose2d`) is a scalar loop about 10× slower; the gather's
/// backward is a scatter-add and the matmul's is two GEMMs.
fn conv_block(x: &Tensor, w: &Tensor, bias: &Tensor, im2col: &Tensor) -> candle_core::Result<Tensor> {
    let (b, c, h, wd) = x.dims4()?;
    let c_out = w.dim(0)?;
    let xp = x.pad_with_zeros(2, PAD, PAD)?.pad_with_zeros(3, PAD, PAD)?;
    let cols = xp.reshape((b, c * (h + 2 * PAD) * (wd + 2 * PAD)))?.index_select(im2col, 1)?;
    let kk = cols.dim(1)? / (h * wd);
    let cols = cols.reshape((b, kk, h * wd))?;
    let y = w.reshape((c_out, kk))?.broadcast_matmul(&cols)?;
    let y = y.reshape((b, c_out, h, wd))?.broadcast_add(&bias.reshape((1, c_out, 1, 1))?)?;
    y.relu()?.max_pool2d(2)
}

fn count_correct(logits: &Tensor, y: &Tensor) -> Result<usize, ModelError> {
    let pred = logits.argmax(1).map_err(ctx("argmax"))?;
    let eq = pred
        .eq(y)
        .and_then(|e| e.to_dtype(DType::U32))
        .and_then(|e| e.sum_all())
        .and_then(|s| s.to_scalar::<u32>());
    Ok(eq.map_err(ctx("counting correct predictions"))? as usize)
}

/// Loss and accuracy of one batch.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BatchStats {
    /// Mean cross-entropy over the batch.
    pub loss: f32,
    /// Correct predictions.
    pub correct: usize,
    /// Samples in the batch.
    pub samples: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn im2col_convolution_equals_candles_conv2d() {
        let mut rng = Rng::new(1);
        let dev = Device::Cpu;
        let (b, c, h, w, c_out) = (3, 2, 6, 5, 4);
        let mut t = |shape: &[usize]| {
            let n = shape.iter().product();
            Tensor::from_vec((0..n).map(|_| rng.normal()).collect::<Vec<f32>>(), shape, &dev).unwrap()
        };
        let (x, k, bias) = (t(&[b, c, h, w]), t(&[c_out, c, 5, 5]), t(&[c_out]));
        let idx = im2col_index(c, h, w, 5, &dev).unwrap();
        let ours = conv_block(&x, &k, &bias, &idx).unwrap();
        let reference = x
            .conv2d(&k, 2, 1, 1, 1)
            .and_then(|y| y.broadcast_add(&bias.reshape((1, c_out, 1, 1))?))
            .and_then(|y| y.relu()?.max_pool2d(2))
            .unwrap();
        assert_eq!(ours.dims(), reference.dims());
        let diff = (ours - reference).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
        assert!(diff < 1e-4, "max difference {diff}");
    }
}
