//! One group communicator used by two parties of a model-parallel rank: the group's gradient step
//! (a [`Communicator`]) and the split layers of its model (a [`tandem_kernels::split::Group`]).
//!
//! Guarantees: both parties call collectives from the rank's one training thread, one after the
//! other (the model's inside the step's compute, the step's after it), so every rank still makes
//! the same calls in the same order and the lock is never contended; it only lets the two own the
//! communicator together.

use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tandem_kernels::split::{Group, GroupError};

use tandem_comm::{CommError, Communicator, ReduceOp, block_range};

/// A communicator shared by a rank's step and its model.
pub struct Shared<C> {
    comm: Arc<Mutex<C>>,
    rank: usize,
    size: usize,
    backend: &'static str,
}

impl<C> Clone for Shared<C> {
    fn clone(&self) -> Self {
        Self { comm: self.comm.clone(), rank: self.rank, size: self.size, backend: self.backend }
    }
}

impl<C: Communicator> Shared<C> {
    /// Shares `comm`.
    pub fn new(comm: C) -> Self {
        let (rank, size, backend) = (comm.rank(), comm.size(), comm.backend());
        Self { comm: Arc::new(Mutex::new(comm)), rank, size, backend }
    }

    fn lock(&self) -> MutexGuard<'_, C> {
        // A panic while holding the lock leaves the communicator as it was; nothing to repair.
        self.comm.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<C: Communicator + Send + 'static> Shared<C> {
    /// The handle the model's split layers call.
    pub fn model_group(&self) -> Box<dyn Group> {
        Box::new(self.clone())
    }
}

impl<C: Communicator> Communicator for Shared<C> {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
    fn backend(&self) -> &'static str {
        self.backend
    }
    fn allreduce(&mut self, buf: &mut [f32], op: ReduceOp) -> Result<(), CommError> {
        self.lock().allreduce(buf, op)
    }
    fn reduce_scatter(&mut self, buf: &mut [f32], op: ReduceOp) -> Result<Range<usize>, CommError> {
        self.lock().reduce_scatter(buf, op)
    }
    fn allgather(&mut self, buf: &mut [f32]) -> Result<(), CommError> {
        self.lock().allgather(buf)
    }
    fn broadcast(&mut self, buf: &mut [f32], root: usize) -> Result<(), CommError> {
        self.lock().broadcast(buf, root)
    }
    fn barrier(&mut self) -> Result<(), CommError> {
        self.lock().barrier()
    }
}

fn group_error(e: CommError) -> GroupError {
    GroupError { message: e.to_string(), peer_lost: e.is_peer_lost() }
}

impl<C: Communicator + Send> Group for Shared<C> {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn allgather(&mut self, buf: &mut [f32]) -> Result<(), GroupError> {
        self.lock().allgather(buf).map_err(group_error)
    }

    fn reduce_scatter_sum(&mut self, buf: &mut [f32]) -> Result<(), GroupError> {
        let expected = block_range(buf.len(), self.size, self.rank);
        let got = self.lock().reduce_scatter(buf, ReduceOp::Sum).map_err(group_error)?;
        if got != expected {
            return Err(GroupError {
                message: format!("reduce-scatter returned block {got:?}, expected {expected:?}"),
                peer_lost: false,
            });
        }
        Ok(())
    }
}
