//! `tandem._native`: the Rust half of the `tandem` Python package, over Tandem's own crates.
//!
//! Expected flow: Python's `tandem.torch.init()` calls `init`, which reads the launch contract
//! ([`tandem_api::contract`]) as `tandem worker` does and forms this rank's group communicator with
//! the `tcp` collectives ([`tandem_comm::tcp::connect_from_contract`]); the tensor calls then hand
//! a tensor's memory to that communicator by its data pointer, without a copy and with the GIL
//! released (`tensor`); `shutdown` says goodbye to the peers.
//!
//! Guarantees: no collective or contract logic lives here or in Python, only the crates'; every
//! failure is a Python exception of `errors` saying what to do; a tensor that is not what a call
//! needs (not a CPU tensor, not contiguous, not `float32` where the call sums) is refused before
//! its memory is touched.
//!
//! Caveats: one communicator per process, used by one collective at a time (calls from several
//! Python threads take turns); a tensor must not be resized or freed by another thread while a
//! collective on it runs, as with any in-place torch operation.

mod errors;
mod progress;
mod session;
mod tensor;

use pyo3::prelude::*;
use tandem_comm::Communicator;

/// Joins this rank's group as the launch contract says; a no-op when already joined.
#[pyfunction]
fn init(py: Python<'_>) -> PyResult<()> {
    session::init(py)
}

/// Leaves the group, telling the peers this rank is done; a no-op when not joined.
#[pyfunction]
fn shutdown(py: Python<'_>) -> PyResult<()> {
    session::shutdown(py)
}

/// Whether [`init`] has joined the group.
#[pyfunction]
fn is_initialized() -> PyResult<bool> {
    session::is_initialized()
}

/// This process's rank in its group.
#[pyfunction]
fn rank() -> PyResult<u32> {
    session::with_info("rank", |i| i.rank)
}

/// The number of ranks in this process's group.
#[pyfunction]
fn size() -> PyResult<u32> {
    session::with_info("size", |i| i.size)
}

/// This process's rank among the group's processes on its host.
#[pyfunction]
fn local_rank() -> PyResult<u32> {
    session::with_info("local_rank", |i| i.local_rank)
}

/// The index of this process's group.
#[pyfunction]
fn group() -> PyResult<u32> {
    session::with_info("group", |i| i.group)
}

/// The number of worker groups of the job.
#[pyfunction]
fn groups() -> PyResult<u32> {
    session::with_info("groups", |i| i.groups)
}

/// The job's `training.algorithm`, as written in the job (`allreduce`, `hybrid`, …).
#[pyfunction]
fn algorithm() -> PyResult<String> {
    session::with_info("algorithm", |i| i.algorithm.clone())
}

/// The job's name.
#[pyfunction]
fn job_name() -> PyResult<String> {
    session::with_info("job_name", |i| i.job_name.clone())
}

/// Averages (or sums) a contiguous float32 CPU tensor over the group, in place.
#[pyfunction]
#[pyo3(signature = (tensor, average = true))]
fn allreduce_(py: Python<'_>, tensor: &Bound<'_, PyAny>, average: bool) -> PyResult<()> {
    tensor::allreduce(py, tensor, average)
}

/// Averages (or sums) a contiguous float32 CPU tensor over the group, leaving only this rank's
/// block reduced in place (the rest unspecified); returns the block as `(start, end)`.
#[pyfunction]
#[pyo3(signature = (tensor, average = true))]
fn reduce_scatter_(py: Python<'_>, tensor: &Bound<'_, PyAny>, average: bool) -> PyResult<(usize, usize)> {
    tensor::reduce_scatter(py, tensor, average)
}

/// This rank's block of a flat vector of `total` elements in `reduce_scatter_` and `allgather_`,
/// as `(start, end)` ([`tandem_comm::block_range`]).
#[pyfunction]
fn block(total: usize) -> PyResult<(usize, usize)> {
    session::with_info("block", |i| {
        let range = tandem_comm::block_range(total, i.size as usize, i.rank as usize);
        (range.start, range.end)
    })
}

/// Gathers every rank's block of a contiguous float32 CPU tensor into every rank's, in place.
#[pyfunction]
fn allgather_(py: Python<'_>, tensor: &Bound<'_, PyAny>) -> PyResult<()> {
    tensor::allgather(py, tensor)
}

/// Copies rank `root_rank`'s contiguous CPU tensor, of any dtype, into every rank's, in place.
#[pyfunction]
fn broadcast_(py: Python<'_>, tensor: &Bound<'_, PyAny>, root_rank: usize) -> PyResult<()> {
    tensor::broadcast(py, tensor, root_rank)
}

/// Returns once every rank of the group has called it.
#[pyfunction]
fn barrier(py: Python<'_>) -> PyResult<()> {
    session::with_comm(py, "barrier", |comm| comm.barrier())
}

/// Joins the parameter servers with the flat float32 weights `params` (taken by the servers when
/// they hold none), which then hold the servers' weights; returns the step the group continues
/// from. Collective: every rank of the group calls it once.
#[pyfunction]
fn ps_start(py: Python<'_>, params: &Bound<'_, PyAny>) -> PyResult<u64> {
    tensor::ps_start(py, params)
}

/// One step of `ps-sync`, `ps-async` or `hybrid`: the group's averaged gradient pushed for `step`,
/// the servers' new weights pulled into `params` (flat float32 tensors of one length).
#[pyfunction]
fn ps_push_pull(
    py: Python<'_>,
    step: u64,
    params: &Bound<'_, PyAny>,
    grads: &Bound<'_, PyAny>,
) -> PyResult<()> {
    tensor::ps_push_pull(py, step, params, grads)
}

/// `easgd`'s elastic exchange after step `step` when it is due (every τ steps); returns whether
/// it exchanged.
#[pyfunction]
fn ps_elastic(py: Python<'_>, step: u64, params: &Bound<'_, PyAny>) -> PyResult<bool> {
    tensor::ps_elastic(py, step, params)
}

/// Whether the job's algorithm uses parameter servers, and whether they take gradients
/// (`ps-sync`, `ps-async`, `hybrid`) or elastic differences (`easgd`): `None`, `"gradients"` or
/// `"elastic"`.
#[pyfunction]
fn ps_kind() -> PyResult<Option<&'static str>> {
    session::with_info("algorithm", |i| {
        i.ps_mode.map(|m| if m.pushes_gradients() { "gradients" } else { "elastic" })
    })
}

/// The step this rank's group continues from: after joining the parameter servers, their record
/// of the group's progress (above 0 after a restart); otherwise 0.
#[pyfunction]
fn start_step() -> PyResult<u64> {
    session::with_info("start_step", |i| i.start_step)
}

/// Appends one progress line for the job's status (rank 0 writes; other ranks' calls are no-ops).
#[pyfunction]
#[pyo3(signature = (step, loss = None, accuracy = None, samples = None, epoch = None))]
fn report(
    step: u64,
    loss: Option<f64>,
    accuracy: Option<f64>,
    samples: Option<u64>,
    epoch: Option<u64>,
) -> PyResult<bool> {
    progress::report(step, loss, accuracy, samples, epoch)
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    errors::register(m)?;
    m.add_function(wrap_pyfunction!(init, m)?)?;
    m.add_function(wrap_pyfunction!(shutdown, m)?)?;
    m.add_function(wrap_pyfunction!(is_initialized, m)?)?;
    m.add_function(wrap_pyfunction!(rank, m)?)?;
    m.add_function(wrap_pyfunction!(size, m)?)?;
    m.add_function(wrap_pyfunction!(local_rank, m)?)?;
    m.add_function(wrap_pyfunction!(group, m)?)?;
    m.add_function(wrap_pyfunction!(groups, m)?)?;
    m.add_function(wrap_pyfunction!(algorithm, m)?)?;
    m.add_function(wrap_pyfunction!(job_name, m)?)?;
    m.add_function(wrap_pyfunction!(allreduce_, m)?)?;
    m.add_function(wrap_pyfunction!(reduce_scatter_, m)?)?;
    m.add_function(wrap_pyfunction!(allgather_, m)?)?;
    m.add_function(wrap_pyfunction!(block, m)?)?;
    m.add_function(wrap_pyfunction!(broadcast_, m)?)?;
    m.add_function(wrap_pyfunction!(barrier, m)?)?;
    m.add_function(wrap_pyfunction!(report, m)?)?;
    m.add_function(wrap_pyfunction!(ps_start, m)?)?;
    m.add_function(wrap_pyfunction!(ps_push_pull, m)?)?;
    m.add_function(wrap_pyfunction!(ps_elastic, m)?)?;
    m.add_function(wrap_pyfunction!(ps_kind, m)?)?;
    m.add_function(wrap_pyfunction!(start_step, m)?)?;
    Ok(())
}
