//! The candle backend of today's model families: one candle [`Var`] per parameter tensor (candle's
//! backward of a view into one big variable would allocate full-size zero gradients per view),
//! exposed through the flat [`FlatLayout`] of [`crate::params`], and the cross-entropy
//! loss and its gradient by candle's autograd.
//!
//! Guarantees: `write_params(read_params())` leaves the weights bit-for-bit unchanged; the flat
//! gradient holds exactly the per-tensor gradients at their layout offsets (zeros for a tensor with
//! no gradient); reads copy straight out of CPU storage without intermediate tensors. Two nets
//! built from the same spec and seed start from the same weights bit for bit.

use candle_core::backprop::GradStore;
use candle_core::{CpuStorage, DType, Device, Storage, Tensor, Var};
use tandem_api::{ModelKind, ModelSpec};

use super::cnn::LeNet;
use super::mlp::Mlp;
use super::{BACKEND_ENV, Batch, BatchStats, Model, ModelError, ctx};
use crate::device;
use crate::params::{FlatError, FlatLayout};
use tandem_input::InputShape;
use tandem_util::rng::Rng;

/// Collects a model's parameters as it declares them: names, shapes and He-uniform initial values
/// (suits ReLU; biases zero), drawn in declaration order from one seeded generator.
pub struct Declare<'a> {
    rng: Rng,
    device: &'a Device,
    names: Vec<(String, Vec<usize>)>,
    vars: Vec<Var>,
}

impl Declare<'_> {
    /// Declares parameter `name` of `shape` with fan-in `fan_in` (a `.bias` starts at zero).
    pub fn add(&mut self, name: String, shape: Vec<usize>, fan_in: usize) -> Result<(), ModelError> {
        let n: usize = shape.iter().product();
        let values: Vec<f32> = if name.ends_with(".bias") {
            vec![0.0; n]
        } else {
            let bound = (6.0 / fan_in as f32).sqrt();
            (0..n).map(|_| self.rng.uniform(-bound, bound)).collect()
        };
        let t =
            Tensor::from_vec(values, shape.as_slice(), self.device).map_err(ctx("creating a parameter"))?;
        self.vars.push(Var::from_tensor(&t).map_err(ctx("creating a parameter"))?);
        self.names.push((name, shape));
        Ok(())
    }
}

#[derive(Clone, Debug)]
enum Arch {
    Mlp(Mlp),
    Cnn(LeNet),
}

/// A candle-backed network with its parameters (an MLP or a LeNet-style CNN).
#[derive(Debug)]
pub struct Net {
    arch: Arch,
    vars: Vec<Var>,
    layout: FlatLayout,
    state_layout: FlatLayout,
    device: device::Device,
    candle: Device,
    classes: usize,
}

impl Net {
    /// Builds the model of `spec` for inputs of shape `input` and `classes` output classes, with
    /// weights drawn from `seed`.
    pub fn new(
        spec: &ModelSpec,
        input: InputShape,
        classes: usize,
        seed: u64,
        device: &device::Device,
    ) -> Result<Self, ModelError> {
        if classes < 2 {
            return Err(ModelError::Spec(format!(
                "a classifier needs at least 2 classes, the data has {classes}"
            )));
        }
        if let Some(w) = spec.hidden.iter().find(|&&w| w == 0) {
            return Err(ModelError::Spec(format!("model.hidden widths must be at least 1, got {w}")));
        }
        let candle = device.candle();
        let mut params =
            Declare { rng: Rng::derive(seed, 0x1417), device: &candle, names: Vec::new(), vars: Vec::new() };
        let hidden: Vec<usize> = spec.hidden.iter().map(|&w| w as usize).collect();
        let arch = match spec.kind {
            ModelKind::Mlp => Arch::Mlp(Mlp::declare(&mut params, input.features(), &hidden, classes)?),
            ModelKind::Cnn => {
                Arch::Cnn(LeNet::declare(&mut params, input, &spec.channels, &hidden, classes, &candle)?)
            }
            kind @ (ModelKind::Resnet | ModelKind::Vgg | ModelKind::Gpt) => {
                return Err(ModelError::Spec(format!(
                    "model kind {} runs on Tandem's CPU engine only; the candle backend (CUDA devices, and \
                     {BACKEND_ENV}=candle on the CPU) has mlp and cnn: train it with --device cpu and \
                     {BACKEND_ENV} unset (or engine)",
                    kind.name()
                )));
            }
        };
        let Declare { names, vars, .. } = params;
        let layout = FlatLayout::new(names.iter().map(|(n, s)| (n.as_str(), s.as_slice())));
        Ok(Self {
            arch,
            vars,
            layout,
            state_layout: FlatLayout::default(),
            device: device.clone(),
            candle,
            classes,
        })
    }

    /// Number of parameters.
    pub fn num_params(&self) -> usize {
        self.layout.len()
    }

    /// The parameter variables, in flat order.
    pub fn vars(&self) -> &[Var] {
        &self.vars
    }

    /// Copies the parameters into `out` (length [`Net::num_params`]).
    pub fn read_params(&self, out: &mut [f32]) -> Result<(), ModelError> {
        read_params(&self.layout, &self.vars, out)
    }

    /// Sets the parameters from `src` (length [`Net::num_params`]).
    pub fn write_params(&self, src: &[f32]) -> Result<(), ModelError> {
        write_params(&self.layout, &self.vars, src, &self.candle)
    }

    /// Logits for a batch `x` of shape `[batch, features]`, with the parameters the net holds.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor, ModelError> {
        let v: Vec<&Tensor> = self.vars.iter().map(|v| v.as_tensor()).collect();
        match &self.arch {
            Arch::Mlp(mlp) => mlp.forward(x.clone(), &v, 0),
            Arch::Cnn(cnn) => cnn.forward(x, &v),
        }
        .map_err(ctx("forward"))
    }

    /// Turns host data into input tensors on the net's device.
    pub fn batch_tensors(&self, x: &[f32], y: &[u32]) -> Result<(Tensor, Tensor), ModelError> {
        let n = y.len();
        let features = x.len().checked_div(n).unwrap_or(0);
        let xt = Tensor::from_slice(x, (n, features), &self.candle).map_err(ctx("uploading a batch"))?;
        let yt = Tensor::from_slice(y, n, &self.candle).map_err(ctx("uploading a batch"))?;
        Ok((xt, yt))
    }

    /// Mean cross-entropy loss and number of correct predictions of a batch, with the parameters
    /// the net holds, and the flat gradient of the mean loss in `grads` (length [`Net::num_params`]).
    pub fn loss_and_grad(&self, x: &[f32], y: &[u32], grads: &mut [f32]) -> Result<BatchStats, ModelError> {
        let (xt, yt) = self.batch_tensors(x, y)?;
        let logits = self.forward(&xt)?;
        let loss = candle_nn::loss::cross_entropy(&logits, &yt).map_err(ctx("cross-entropy loss"))?;
        let store = loss.backward().map_err(ctx("backward"))?;
        read_grads(&self.layout, &self.vars, &store, grads)?;
        let correct = count_correct(&logits, &yt)?;
        let loss =
            loss.to_dtype(DType::F32).and_then(|l| l.to_scalar::<f32>()).map_err(ctx("reading the loss"))?;
        Ok(BatchStats { loss, correct, samples: y.len() })
    }

    /// Mean loss and correct predictions over `y.len()` samples, without gradients.
    pub fn loss(&self, x: &[f32], y: &[u32]) -> Result<BatchStats, ModelError> {
        let (xt, yt) = self.batch_tensors(x, y)?;
        let logits = self.forward(&xt)?.detach();
        let loss = candle_nn::loss::cross_entropy(&logits, &yt).map_err(ctx("cross-entropy loss"))?;
        let loss = loss.to_scalar::<f32>().map_err(ctx("reading the loss"))?;
        Ok(BatchStats { loss, correct: count_correct(&logits, &yt)?, samples: y.len() })
    }
}

impl Model for Net {
    fn layout(&self) -> &FlatLayout {
        &self.layout
    }

    fn state_layout(&self) -> &FlatLayout {
        &self.state_layout
    }

    fn classes(&self) -> usize {
        self.classes
    }

    fn device(&self) -> &device::Device {
        &self.device
    }

    fn init(&self, params: &mut [f32], _state: &mut [f32]) -> Result<(), ModelError> {
        self.read_params(params)
    }

    fn forward_backward(
        &mut self,
        params: &[f32],
        _state: &mut [f32],
        grads: &mut [f32],
        batch: Batch<'_>,
    ) -> Result<BatchStats, ModelError> {
        self.write_params(params)?;
        self.loss_and_grad(batch.features, batch.labels, grads)
    }

    fn evaluate(
        &mut self,
        params: &[f32],
        _state: &[f32],
        batch: Batch<'_>,
    ) -> Result<BatchStats, ModelError> {
        self.write_params(params)?;
        self.loss(batch.features, batch.labels)
    }
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

/// Copies a tensor's values into `out` (same element count), straight from CPU storage when it can.
fn copy_out(name: &str, t: &Tensor, out: &mut [f32]) -> Result<(), ModelError> {
    let err = |source| ModelError::Tensor { name: name.to_owned(), source };
    {
        let (storage, layout) = t.storage_and_layout();
        if let (Storage::Cpu(CpuStorage::F32(v)), Some((a, b))) = (&*storage, layout.contiguous_offsets())
            && b - a == out.len()
        {
            out.copy_from_slice(&v[a..b]);
            return Ok(());
        }
    }
    // Other devices or strided tensors: one copy through the host.
    let v =
        t.flatten_all().and_then(|t| t.to_dtype(candle_core::DType::F32)).and_then(|t| t.to_vec1::<f32>());
    let v = v.map_err(err)?;
    if v.len() != out.len() {
        return Err(FlatError::Length { what: "tensor", expected: out.len(), got: v.len() }.into());
    }
    out.copy_from_slice(&v);
    Ok(())
}

/// Copies every parameter into `out`, in layout order.
fn read_params(layout: &FlatLayout, vars: &[Var], out: &mut [f32]) -> Result<(), ModelError> {
    layout.check("parameters", out.len())?;
    for (e, var) in layout.entries().iter().zip(vars) {
        copy_out(&e.name, var.as_tensor(), &mut out[e.offset..e.offset + e.len])?;
    }
    Ok(())
}

/// Sets every parameter from `src`, in layout order.
fn write_params(layout: &FlatLayout, vars: &[Var], src: &[f32], device: &Device) -> Result<(), ModelError> {
    layout.check("parameters", src.len())?;
    for (e, var) in layout.entries().iter().zip(vars) {
        let t = Tensor::from_slice(&src[e.offset..e.offset + e.len], e.shape.as_slice(), device);
        t.and_then(|t| var.set(&t)).map_err(|source| ModelError::Tensor { name: e.name.clone(), source })?;
    }
    Ok(())
}

/// Copies the gradient of every parameter into `out`, in layout order; a parameter without a
/// gradient (unused in the loss) gets zeros.
fn read_grads(
    layout: &FlatLayout,
    vars: &[Var],
    grads: &GradStore,
    out: &mut [f32],
) -> Result<(), ModelError> {
    layout.check("gradients", out.len())?;
    for (e, var) in layout.entries().iter().zip(vars) {
        let dst = &mut out[e.offset..e.offset + e.len];
        match grads.get(var.as_tensor()) {
            Some(g) => copy_out(&e.name, g, dst)?,
            None => dst.fill(0.0),
        }
    }
    Ok(())
}
