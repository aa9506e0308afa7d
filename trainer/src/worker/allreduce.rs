//! The PCL-DNN step of `algorithm: allreduce` (one group, no parameter server) as a
//! [`GradientStep`]: reduce-scatter (average) of the gradient, each rank runs the optimizer on its
//! own block of the flat vector, allgather of the weights.
//!
//! Expected flow per rank: [`AllreduceStep::start`] (rank 0's initial weights go to every rank),
//! then [`crate::train::Trainer::step`] with this step every iteration; [`AllreduceStep::gather_state`]
//! before a checkpoint.
//!
//! Guarantees: every rank makes the same collective calls in the same order, so the weights are
//! bit-identical on all ranks after every step. Rank `i` keeps optimizer state (momentum, Adam
//! moments) for block `i` ([`crate::comm::block_range`]) only, so optimizer memory is split over
//! the group. The optimizer is elementwise, so one step equals a single process's step on the
//! averaged gradient: with the batch sharding of [`crate::data`], the group trains like one
//! process with the group-size× batch, up to the order of floating-point sums.

use std::ops::Range;

use tandem_api::OptimizerSpec;

use crate::comm::{CommError, Communicator, ReduceOp, block_range};
use crate::optim::{Optimizer, OptimizerState};
use crate::train::{GradientStep, TrainError};

/// A group rank's sharded synchronous SGD step.
pub struct AllreduceStep<C: Communicator> {
    comm: C,
    block: Range<usize>,
    optimizer: Optimizer,
    gathered: Option<OptimizerState>,
}

fn comm_err(e: CommError) -> TrainError {
    TrainError::Step(format!("group collective: {e}"))
}

impl<C: Communicator> AllreduceStep<C> {
    /// Replaces `params` with rank 0's (equal on every rank afterwards) and owns this rank's block.
    pub fn start(mut comm: C, optimizer: &OptimizerSpec, params: &mut [f32]) -> Result<Self, TrainError> {
        comm.broadcast(params, 0).map_err(comm_err)?;
        let block = block_range(params.len(), comm.size(), comm.rank());
        let optimizer = Optimizer::new(optimizer, block.len());
        Ok(Self { comm, block, optimizer, gathered: None })
    }

    /// The group's communicator (for collectives outside the step, e.g. averaging the loss).
    pub fn comm(&mut self) -> &mut C {
        &mut self.comm
    }

    /// Collects every rank's block of the optimizer state so that
    /// [`GradientStep::optimizer_state`] returns the whole vector's state (collective: every rank
    /// calls it at the same step).
    pub fn gather_state(&mut self, total: usize) -> Result<(), TrainError> {
        let mine = self.optimizer.state();
        let mut buffers = Vec::with_capacity(mine.buffers.len());
        for (name, values) in mine.buffers {
            let mut full = vec![0.0; total];
            full[self.block.clone()].copy_from_slice(&values);
            self.comm.allgather(&mut full).map_err(comm_err)?;
            buffers.push((name, full));
        }
        self.gathered = Some(OptimizerState { kind: mine.kind, updates: mine.updates, buffers });
        Ok(())
    }
}

impl<C: Communicator> GradientStep for AllreduceStep<C> {
    fn apply(
        &mut self,
        _step: u64,
        lr: f64,
        params: &mut [f32],
        grads: &mut [f32],
    ) -> Result<(), TrainError> {
        let b = self.block.clone();
        let got = self.comm.reduce_scatter(grads, ReduceOp::Average).map_err(comm_err)?;
        if got != b {
            return Err(TrainError::Step(format!("reduce-scatter returned block {got:?}, expected {b:?}")));
        }
        self.optimizer.step(&mut params[b.clone()], &grads[b], lr)?;
        self.comm.allgather(params).map_err(comm_err)?;
        self.gathered = None;
        Ok(())
    }

    fn optimizer_state(&self) -> Option<OptimizerState> {
        self.gathered.clone()
    }

    fn restore_optimizer(&mut self, state: &OptimizerState) -> Result<(), TrainError> {
        let b = self.block.clone();
        let buffers = state
            .buffers
            .iter()
            .map(|(name, full)| {
                full.get(b.clone()).map(|v| (name.clone(), v.to_vec())).ok_or_else(|| {
                    TrainError::Config(format!(
                        "checkpointed optimizer buffer {name} holds {} values, fewer than this rank's block \
                         {b:?}; the checkpoint is of another model",
                        full.len()
                    ))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let shard = OptimizerState { kind: state.kind, updates: state.updates, buffers };
        Ok(self.optimizer.restore(&shard)?)
    }
}
