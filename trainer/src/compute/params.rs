//! The flat view of a model: every parameter (and every gradient) as one contiguous `f32` buffer —
//! the unit that collectives, the parameter server and checkpoints move.
//!
//! Order (fixed, part of the wire and checkpoint format): tensors in the order the model declares them,
//! which is forward order, weight before bias (e.g. `fc1.weight`, `fc1.bias`, `fc2.weight`, …); inside a
//! tensor, row-major (C) order. [`FlatLayout`] records name, shape and offset of each tensor, so the PS
//! can split the buffer by key range and a checkpoint can be checked against the model that loads it.
//!
//! Guarantees: `write_params(read_params())` leaves the weights bit-for-bit unchanged; the flat gradient
//! holds exactly the per-tensor gradients at their layout offsets (zeros for a tensor with no gradient).
//! Reads copy straight out of CPU storage without intermediate tensors.

use candle_core::backprop::GradStore;
use candle_core::{CpuStorage, Device, Storage, Tensor, Var};

/// Errors of the flat view.
#[derive(Debug, thiserror::Error)]
pub enum FlatError {
    /// A buffer does not have the layout's length.
    #[error("flat buffer has {got} values but the model has {expected} parameters ({what})")]
    Length {
        /// Which buffer.
        what: &'static str,
        /// Expected length.
        expected: usize,
        /// Actual length.
        got: usize,
    },
    /// candle failed while copying a tensor.
    #[error("copying tensor {name} through the flat buffer: {source}")]
    Tensor {
        /// Tensor name.
        name: String,
        /// candle's error.
        source: candle_core::Error,
    },
}

/// One tensor's place in the flat buffer.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LayoutEntry {
    /// Parameter name, e.g. `fc1.weight`.
    pub name: String,
    /// Tensor shape.
    pub shape: Vec<usize>,
    /// First element in the flat buffer.
    pub offset: usize,
    /// Number of elements.
    pub len: usize,
}

/// Names, shapes and offsets of every parameter tensor in the flat buffer.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FlatLayout {
    entries: Vec<LayoutEntry>,
    len: usize,
}

impl FlatLayout {
    /// A layout of the given tensors, in the given order.
    pub fn new<'a>(tensors: impl IntoIterator<Item = (&'a str, &'a [usize])>) -> Self {
        let mut entries = Vec::new();
        let mut offset = 0;
        for (name, shape) in tensors {
            let len = shape.iter().product();
            entries.push(LayoutEntry { name: name.to_owned(), shape: shape.to_vec(), offset, len });
            offset += len;
        }
        Self { entries, len: offset }
    }

    /// Total number of parameters.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the layout holds no parameter.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The tensors, in flat order.
    pub fn entries(&self) -> &[LayoutEntry] {
        &self.entries
    }

    /// The part of `buf` that holds tensor `i`.
    pub fn slice<'a>(&self, buf: &'a [f32], i: usize) -> &'a [f32] {
        let e = &self.entries[i];
        &buf[e.offset..e.offset + e.len]
    }

    fn check(&self, what: &'static str, got: usize) -> Result<(), FlatError> {
        if got == self.len { Ok(()) } else { Err(FlatError::Length { what, expected: self.len, got }) }
    }
}

/// Copies a tensor's values into `out` (same element count), straight from CPU storage when it can.
fn copy_out(name: &str, t: &Tensor, out: &mut [f32]) -> Result<(), FlatError> {
    let err = |source| FlatError::Tensor { name: name.to_owned(), source };
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
        return Err(FlatError::Length { what: "tensor", expected: out.len(), got: v.len() });
    }
    out.copy_from_slice(&v);
    Ok(())
}

/// Copies every parameter into `out`, in layout order.
pub fn read_params(layout: &FlatLayout, vars: &[Var], out: &mut [f32]) -> Result<(), FlatError> {
    layout.check("parameters", out.len())?;
    for (e, var) in layout.entries.iter().zip(vars) {
        copy_out(&e.name, var.as_tensor(), &mut out[e.offset..e.offset + e.len])?;
    }
    Ok(())
}

/// Sets every parameter from `src`, in layout order.
pub fn write_params(
    layout: &FlatLayout,
    vars: &[Var],
    src: &[f32],
    device: &Device,
) -> Result<(), FlatError> {
    layout.check("parameters", src.len())?;
    for (e, var) in layout.entries.iter().zip(vars) {
        let t = Tensor::from_slice(&src[e.offset..e.offset + e.len], e.shape.as_slice(), device);
        t.and_then(|t| var.set(&t)).map_err(|source| FlatError::Tensor { name: e.name.clone(), source })?;
    }
    Ok(())
}

/// Copies the gradient of every parameter into `out`, in layout order; a parameter without a
/// gradient (unused in the loss) gets zeros.
pub fn read_grads(
    layout: &FlatLayout,
    vars: &[Var],
    grads: &GradStore,
    out: &mut [f32],
) -> Result<(), FlatError> {
    layout.check("gradients", out.len())?;
    for (e, var) in layout.entries.iter().zip(vars) {
        let dst = &mut out[e.offset..e.offset + e.len];
        match grads.get(var.as_tensor()) {
            Some(g) => copy_out(&e.name, g, dst)?,
            None => dst.fill(0.0),
        }
    }
    Ok(())
}
