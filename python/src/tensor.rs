//! A torch tensor's memory handed to the collectives by its data pointer, without a copy.
//!
//! Guarantees: a tensor is checked before its memory is touched — a `torch.Tensor`, on the CPU,
//! strided and contiguous, and `float32` for a reduction — and refused with a `TypeError` or
//! `ValueError` that says what to pass instead. A broadcast copies bytes and never does
//! arithmetic, so it takes any dtype: the tensor's bytes travel as 4-byte words, through a padded
//! copy only when its size or address is not a whole number of words.
//!
//! Assumptions: the caller keeps the tensor alive and unresized while the call runs (it holds a
//! reference; another Python thread resizing or freeing the tensor during a collective would be a
//! use after free, as with any in-place operation on a tensor shared between threads).

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use tandem_comm::{Communicator, ReduceOp};

use crate::session;

/// Where a tensor's elements live: the address and length of its memory, as plain numbers so that
/// the region can cross into the closure that runs without the GIL.
#[derive(Clone, Copy, Debug)]
struct Region {
    /// Address of the first byte (`tensor.data_ptr()`).
    addr: usize,
    /// Length in bytes (`numel × element_size`).
    bytes: usize,
}

/// The region of `tensor` after the checks of the module docs; `float32` requires that dtype.
fn region(tensor: &Bound<'_, PyAny>, call: &str, float32: bool) -> PyResult<Region> {
    let not_tensor = || {
        let kind = tensor.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "?".to_owned());
        PyTypeError::new_err(format!("tandem.torch.{call}() takes a torch.Tensor, not a {kind}"))
    };
    let attr = |name: &str| tensor.getattr(name).map_err(|_| not_tensor());
    let call0 = |name: &str| tensor.call_method0(name).map_err(|_| not_tensor());
    let device: String = attr("device")?.getattr("type")?.extract()?;
    if device != "cpu" {
        return Err(PyValueError::new_err(format!(
            "tandem.torch.{call}() takes a CPU tensor, not one on {device}: there is no GPU path yet; pass \
             tensor.cpu() and copy the result back"
        )));
    }
    let layout = attr("layout")?.str()?.to_string();
    if layout != "torch.strided" {
        return Err(PyValueError::new_err(format!(
            "tandem.torch.{call}() takes a dense (strided) tensor, not a {layout} one; pass tensor.to_dense()"
        )));
    }
    let dtype = attr("dtype")?.str()?.to_string();
    if float32 && dtype != "torch.float32" {
        return Err(PyTypeError::new_err(format!(
            "tandem.torch.{call}() reduces float32 tensors, not {dtype}; pass tensor.float() and copy the \
             result back"
        )));
    }
    if !call0("is_contiguous")?.extract::<bool>()? {
        return Err(PyValueError::new_err(format!(
            "tandem.torch.{call}() works in place on a contiguous tensor, and this one is a strided view; \
             pass tensor.contiguous() and copy the result back"
        )));
    }
    let numel: usize = call0("numel")?.extract()?;
    let element: usize = call0("element_size")?.extract()?;
    let addr: usize = call0("data_ptr")?.extract()?;
    let bytes = numel.checked_mul(element).ok_or_else(|| {
        PyValueError::new_err(format!("tandem.torch.{call}(): the tensor's size overflows"))
    })?;
    Ok(Region { addr, bytes })
}

/// The memory of a checked `float32` tensor: aligned whole `f32` words, which [`floats`] checked.
#[derive(Clone, Copy, Debug)]
struct Floats(Region);

/// The memory of `tensor` after the checks of the module docs, as `float32` words.
fn floats(tensor: &Bound<'_, PyAny>, call: &str) -> PyResult<Floats> {
    let region = region(tensor, call, true)?;
    if !region.addr.is_multiple_of(std::mem::align_of::<f32>()) {
        return Err(PyValueError::new_err(format!(
            "tandem.torch.{call}(): the float32 tensor's memory is not aligned to its elements; pass tensor.clone()"
        )));
    }
    Ok(Floats(region))
}

impl Floats {
    /// The words, for the length of a call.
    ///
    /// # Safety
    ///
    /// The memory is of a live tensor that nothing else reads or writes while the slice is used,
    /// and no other slice of it is alive.
    unsafe fn slice<'a>(self) -> &'a mut [f32] {
        let Region { addr, bytes } = self.0;
        if bytes == 0 {
            return &mut [];
        }
        // SAFETY: the caller guarantees the memory is live and not aliased; the address is non-null
        // (a non-empty tensor's) and aligned for f32 ([`floats`]); a float32 tensor's bytes are
        // whole words; every bit pattern is a valid f32.
        unsafe { std::slice::from_raw_parts_mut(addr as *mut f32, bytes / std::mem::size_of::<f32>()) }
    }
}

/// The region as `f32` words, for a broadcast's `with` to work on in place; `None` when it is not
/// whole, aligned words (a tensor of another dtype).
///
/// # Safety
///
/// `region` is the memory of a live tensor that nothing else reads or writes until `with` returns.
unsafe fn in_place<T>(region: Region, with: impl FnOnce(&mut [f32]) -> T) -> Option<T> {
    const WORD: usize = std::mem::size_of::<f32>();
    if region.bytes == 0 {
        return Some(with(&mut []));
    }
    if !region.bytes.is_multiple_of(WORD) || !region.addr.is_multiple_of(std::mem::align_of::<f32>()) {
        return None;
    }
    // SAFETY: the caller guarantees the memory is live and not aliased for the call; the address is
    // non-null (a non-empty tensor's) and aligned for f32, checked above; every bit pattern is a
    // valid f32.
    let words = unsafe { std::slice::from_raw_parts_mut(region.addr as *mut f32, region.bytes / WORD) };
    Some(with(words))
}

/// `allreduce_`: average (or sum) over the group, in place.
pub fn allreduce(py: Python<'_>, tensor: &Bound<'_, PyAny>, average: bool) -> PyResult<()> {
    let words = floats(tensor, "allreduce_")?;
    let op = if average { ReduceOp::Average } else { ReduceOp::Sum };
    // SAFETY: `words` is the checked memory of `tensor`, which the caller holds for this call.
    session::with_comm(py, "allreduce_", move |comm| comm.allreduce(unsafe { words.slice() }, op))
}

/// `reduce_scatter_`: average (or sum) over the group, leaving this rank's block
/// ([`tandem_comm::block_range`]) reduced in place; returns that block as `(start, end)`. The rest
/// of the tensor is unspecified afterwards.
pub fn reduce_scatter(py: Python<'_>, tensor: &Bound<'_, PyAny>, average: bool) -> PyResult<(usize, usize)> {
    let words = floats(tensor, "reduce_scatter_")?;
    let op = if average { ReduceOp::Average } else { ReduceOp::Sum };
    // SAFETY: `words` is the checked memory of `tensor`, which the caller holds for this call.
    let block = session::with_comm(py, "reduce_scatter_", move |comm| {
        comm.reduce_scatter(unsafe { words.slice() }, op)
    })?;
    Ok((block.start, block.end))
}

/// `allgather_`: every rank's block ([`tandem_comm::block_range`]) of the tensor into every
/// rank's, in place.
pub fn allgather(py: Python<'_>, tensor: &Bound<'_, PyAny>) -> PyResult<()> {
    let words = floats(tensor, "allgather_")?;
    // SAFETY: `words` is the checked memory of `tensor`, which the caller holds for this call.
    session::with_comm(py, "allgather_", move |comm| comm.allgather(unsafe { words.slice() }))
}

/// `broadcast_`: rank `root`'s tensor into every rank's, in place, for any dtype.
pub fn broadcast(py: Python<'_>, tensor: &Bound<'_, PyAny>, root: usize) -> PyResult<()> {
    let size = session::with_info("broadcast_", |i| i.size as usize)?;
    if root >= size {
        return Err(PyValueError::new_err(format!(
            "tandem.torch.broadcast_(): root_rank {root} is not a rank of this group of {size}"
        )));
    }
    let region = region(tensor, "broadcast_", false)?;
    session::with_comm(py, "broadcast_", move |comm| {
        // SAFETY: `region` is the checked memory of `tensor`, which the caller holds for this call.
        match unsafe { in_place(region, |words| comm.broadcast(words, root)) } {
            Some(done) => done,
            None => broadcast_padded(comm, region, root),
        }
    })
}

/// A broadcast of memory that is not whole aligned words, through a padded copy.
fn broadcast_padded(
    comm: &mut impl Communicator,
    region: Region,
    root: usize,
) -> Result<(), tandem_comm::CommError> {
    let mut words = vec![0f32; region.bytes.div_ceil(4)];
    let padded: &mut [u8] = bytemuck_bytes(&mut words);
    // SAFETY: `region` is the memory of a live tensor held by the caller, non-empty here (an empty
    // one is whole words), and u8 has no alignment; it is read and written only within this call.
    let memory = unsafe { std::slice::from_raw_parts_mut(region.addr as *mut u8, region.bytes) };
    padded[..region.bytes].copy_from_slice(memory);
    comm.broadcast(&mut words, root)?;
    memory.copy_from_slice(&bytemuck_bytes(&mut words)[..region.bytes]);
    Ok(())
}

/// The bytes of `words`.
fn bytemuck_bytes(words: &mut [f32]) -> &mut [u8] {
    let len = std::mem::size_of_val(words);
    // SAFETY: the bytes of a live, exclusively borrowed f32 slice, for the same lifetime; u8 has no
    // alignment and every bit pattern is valid both ways.
    unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<u8>(), len) }
}

/// Refuses two regions that share memory: the weights and the gradients are written at once.
fn apart(call: &str, Floats(a): Floats, Floats(b): Floats) -> PyResult<()> {
    if a.addr < b.addr + b.bytes && b.addr < a.addr + a.bytes {
        return Err(PyValueError::new_err(format!(
            "tandem.torch.{call}: the parameter and gradient buffers overlap; pass two separate tensors"
        )));
    }
    Ok(())
}

/// Joins the parameter servers with `params` (the flat float32 weights) as the initial weights;
/// `params` then holds the servers'. Returns the step the group continues from.
pub fn ps_start(py: Python<'_>, params: &Bound<'_, PyAny>) -> PyResult<u64> {
    let words = floats(params, "DistributedOptimizer")?;
    // SAFETY: `words` is the checked memory of `params`, which the caller holds for this call.
    session::ps_start(py, unsafe { words.slice() })
}

/// One step of a gradient mode: the group's averaged `grads` pushed for step `step`, the new
/// weights pulled into `params`.
pub fn ps_push_pull(
    py: Python<'_>,
    step: u64,
    params: &Bound<'_, PyAny>,
    grads: &Bound<'_, PyAny>,
) -> PyResult<()> {
    const CALL: &str = "DistributedOptimizer.step()";
    let (p, g) = (floats(params, CALL)?, floats(grads, CALL)?);
    apart(CALL, p, g)?;
    if p.0.bytes != g.0.bytes {
        return Err(PyValueError::new_err(format!(
            "tandem.torch.{CALL}: {} weights but {} gradients",
            p.0.bytes / 4,
            g.0.bytes / 4
        )));
    }
    // SAFETY: `p` and `g` are the checked, disjoint memories of `params` and `grads`, which the
    // caller holds for this call.
    session::with_ps(py, CALL, move |x| x.push_pull(step, unsafe { p.slice() }, unsafe { g.slice() }))
}

/// The elastic exchange after step `step` when it is due: `params` moved towards the centre.
/// Returns whether it exchanged.
pub fn ps_elastic(py: Python<'_>, step: u64, params: &Bound<'_, PyAny>) -> PyResult<bool> {
    const CALL: &str = "DistributedOptimizer.step()";
    let p = floats(params, CALL)?;
    // SAFETY: `p` is the checked memory of `params`, which the caller holds for this call.
    session::with_ps(py, CALL, move |x| x.elastic(step, unsafe { p.slice() }))
}
