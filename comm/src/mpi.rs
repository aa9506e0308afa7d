//! The `mpi` backend: [`Communicator`] over rsmpi and the system's OpenMPI, for ranks started by
//! `mpirun` (cargo feature `mpi`).
//!
//! Expected flow: [`MpiRuntime::init`] once per process (it calls `MPI_Init`; dropping it calls
//! `MPI_Finalize`), then [`MpiRuntime::world`] and, for groups, [`MpiComm::split`]. Communicators
//! borrow the runtime, so none can outlive `MPI_Finalize`.
//!
//! Guarantees: the same semantics as every [`Communicator`] — uneven reduce-scatter goes through
//! `MPI_Reduce_scatter` with per-rank counts, uneven allgather through `MPI_Allgatherv`. Caveat: MPI's
//! default error handler aborts the whole job on a communication failure (mpirun then reports which
//! rank died), so errors are not returned; MPI has no notion of a surviving rank.

use std::marker::PhantomData;
use std::ops::Range;

use mpi::collective::SystemOperation;
use mpi::datatype::{Equivalence, PartitionMut};
use mpi::environment::Universe;
use mpi::raw::AsRaw;
use mpi::topology::{Color, SimpleCommunicator};
use mpi::traits::{Communicator as _, CommunicatorCollectives, Root};

use super::{CommError, Communicator, ReduceOp, block_range, check_root};

/// MPI, initialised for this process.
pub struct MpiRuntime {
    universe: Universe,
}

impl std::fmt::Debug for MpiRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MpiRuntime")
    }
}

impl MpiRuntime {
    /// Initialises MPI (`MPI_Init`).
    pub fn init() -> Result<Self, CommError> {
        mpi::initialize().map(|universe| Self { universe }).ok_or_else(|| {
            CommError::Mpi("MPI is already initialised in this process; create one MpiRuntime".to_owned())
        })
    }

    /// `MPI_COMM_WORLD`: every rank mpirun started.
    pub fn world(&self) -> MpiComm<'_> {
        MpiComm { comm: self.universe.world(), scratch: Vec::new(), runtime: PhantomData }
    }
}

/// An MPI communicator.
pub struct MpiComm<'u> {
    comm: SimpleCommunicator,
    scratch: Vec<f32>,
    runtime: PhantomData<&'u MpiRuntime>,
}

impl std::fmt::Debug for MpiComm<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiComm").field("rank", &self.comm.rank()).field("size", &self.comm.size()).finish()
    }
}

fn count(len: usize) -> Result<i32, CommError> {
    i32::try_from(len)
        .map_err(|_| CommError::Invalid(format!("{len} elements exceed MPI's count limit; split the buffer")))
}

fn system_op(op: ReduceOp) -> SystemOperation {
    match op {
        ReduceOp::Sum | ReduceOp::Average => SystemOperation::sum(),
        ReduceOp::Max => SystemOperation::max(),
    }
}

impl<'u> MpiComm<'u> {
    /// Splits this communicator (`MPI_Comm_split`): ranks passing the same `color` form a group,
    /// ordered by `key` then by rank here. Collective over all ranks of this communicator.
    pub fn split(&self, color: u32, key: i32) -> Result<MpiComm<'u>, CommError> {
        let color = i32::try_from(color)
            .map_err(|_| CommError::Invalid(format!("split colour {color} exceeds MPI's limit")))?;
        let comm = self.comm.split_by_color_with_key(Color::with_value(color), key).ok_or_else(|| {
            CommError::Mpi("MPI_Comm_split returned no communicator for a defined colour".to_owned())
        })?;
        Ok(MpiComm { comm, scratch: Vec::new(), runtime: PhantomData })
    }

    /// Allreduce-sum from `send` into `recv` without the copy the in-place interface needs; this is
    /// what benchmarks compare against (as `osu_allreduce` does).
    pub fn allreduce_out_of_place(&self, send: &[f32], recv: &mut [f32]) -> Result<(), CommError> {
        if send.len() != recv.len() {
            return Err(CommError::Invalid("send and receive buffers differ in length".to_owned()));
        }
        count(send.len())?;
        self.comm.all_reduce_into(send, recv, SystemOperation::sum());
        Ok(())
    }
}

impl Communicator for MpiComm<'_> {
    fn rank(&self) -> usize {
        self.comm.rank() as usize
    }

    fn size(&self) -> usize {
        self.comm.size() as usize
    }

    fn backend(&self) -> &'static str {
        "mpi"
    }

    fn allreduce(&mut self, buf: &mut [f32], op: ReduceOp) -> Result<(), CommError> {
        count(buf.len())?;
        self.scratch.clear();
        self.scratch.extend_from_slice(buf);
        self.comm.all_reduce_into(&self.scratch[..], buf, system_op(op));
        op.finish(buf, self.size());
        Ok(())
    }

    fn reduce_scatter(&mut self, buf: &mut [f32], op: ReduceOp) -> Result<Range<usize>, CommError> {
        let (rank, size) = (self.rank(), self.size());
        let counts = (0..size)
            .map(|r| count(block_range(buf.len(), size, r).len()))
            .collect::<Result<Vec<i32>, _>>()?;
        let mine = block_range(buf.len(), size, rank);
        self.scratch.clear();
        self.scratch.resize(mine.len().max(1), 0.0);
        // SAFETY: `buf` holds sum(counts) f32s, `scratch` at least counts[rank]; the datatype is the
        // f32 equivalent, and the communicator and op handles are live for the call.
        let code = unsafe {
            mpi::ffi::MPI_Reduce_scatter(
                buf.as_ptr().cast(),
                self.scratch.as_mut_ptr().cast(),
                counts.as_ptr(),
                f32::equivalent_datatype().as_raw(),
                system_op(op).as_raw(),
                self.comm.as_raw(),
            )
        };
        if code != 0 {
            return Err(CommError::Mpi(format!("MPI_Reduce_scatter failed with code {code}")));
        }
        buf[mine.clone()].copy_from_slice(&self.scratch[..mine.len()]);
        op.finish(&mut buf[mine.clone()], size);
        Ok(mine)
    }

    fn allgather(&mut self, buf: &mut [f32]) -> Result<(), CommError> {
        let (rank, size) = (self.rank(), self.size());
        let blocks: Vec<Range<usize>> = (0..size).map(|r| block_range(buf.len(), size, r)).collect();
        let counts = blocks.iter().map(|b| count(b.len())).collect::<Result<Vec<i32>, _>>()?;
        let displs = blocks.iter().map(|b| count(b.start)).collect::<Result<Vec<i32>, _>>()?;
        self.scratch.clear();
        self.scratch.extend_from_slice(&buf[blocks[rank].clone()]);
        let mut partition = PartitionMut::new(buf, counts, displs);
        self.comm.all_gather_varcount_into(&self.scratch[..], &mut partition);
        Ok(())
    }

    fn broadcast(&mut self, buf: &mut [f32], root: usize) -> Result<(), CommError> {
        check_root(root, self.size())?;
        count(buf.len())?;
        self.comm.process_at_rank(root as i32).broadcast_into(buf);
        Ok(())
    }

    fn barrier(&mut self) -> Result<(), CommError> {
        self.comm.barrier();
        Ok(())
    }
}
