//! The PCL-DNN step of `algorithm: allreduce` (one group, no parameter server) as a
//! [`GradientStep`]: reduce-scatter (average) of the gradient, each rank runs the optimizer on its
//! own block of the flat vector, allgather of the weights.
//!
//! Expected flow per rank: [`AllreduceStep::start`] (rank 0's initial weights go to every rank),
//! [`AllreduceStep::resume`] (rank 0's checkpoint, if it has one, goes to every rank), then
//! [`crate::compute::train::Trainer::run`] (or [`crate::compute::train::Trainer::step`]) with this step; [`AllreduceStep::gather_state`]
//! before a checkpoint, which rank 0 writes (the loop's [`GradientStep::prepare_checkpoint`]).
//!
//! Guarantees: every rank makes the same collective calls in the same order, so the weights are
//! bit-identical on all ranks after every step; so is a model's non-trainable state, averaged
//! over the ranks after every step and resumed with the weights from rank 0's checkpoint. Rank `i` keeps optimizer state (momentum, Adam
//! moments) for block `i` ([`crate::comm::block_range`]) only, so optimizer memory is split over
//! the group. The optimizer is elementwise, so one step equals a single process's step on the
//! averaged gradient: with the batch sharding of [`crate::compute::data`], the group trains like one
//! process with the group-size× batch, up to the order of floating-point sums.

use std::ops::Range;
use std::path::Path;

use tandem_api::OptimizerSpec;

use crate::comm::{CommError, Communicator, ReduceOp, block_range};
use crate::compute::checkpoint::Checkpoint;
use crate::compute::data::DataCursor;
use crate::compute::optim::{Optimizer, OptimizerState};
use crate::compute::train::{GradientStep, TrainError, Trainer};

/// A group rank's sharded synchronous SGD step.
pub struct AllreduceStep<C: Communicator> {
    comm: C,
    block: Range<usize>,
    optimizer: Optimizer,
    gathered: Option<OptimizerState>,
}

impl<C: Communicator> AllreduceStep<C> {
    /// Replaces `params` with rank 0's (equal on every rank afterwards) and owns this rank's block.
    pub fn start(mut comm: C, optimizer: &OptimizerSpec, params: &mut [f32]) -> Result<Self, TrainError> {
        comm.broadcast(params, 0).map_err(super::collective)?;
        let block = block_range(params.len(), comm.size(), comm.rank());
        let optimizer = Optimizer::new(optimizer, block.len());
        Ok(Self { comm, block, optimizer, gathered: None })
    }

    /// Resumes the whole group from `from`, a worker checkpoint and the path it was read from
    /// ([`crate::compute::checkpoint::newest_intact`]), which only rank 0 reads (the other ranks
    /// pass `None`; their output folder may be another machine's): rank 0 restores it and sends
    /// every rank the weights, the step and the optimizer state, and each rank moves its schedule
    /// and data stream to that step. Returns the step the group continues from; 0, with nothing
    /// changed, when rank 0 has no checkpoint. Collective: every rank calls it right after
    /// [`AllreduceStep::start`].
    pub fn resume(
        &mut self,
        trainer: &mut Trainer,
        from: Option<(&Path, &Checkpoint)>,
    ) -> Result<u64, TrainError> {
        let root = self.comm.rank() == 0;
        let saved = match from.filter(|_| root) {
            Some((path, ckpt)) => {
                trainer.restore(self, path, ckpt)?;
                ckpt.optimizer_state()
            }
            None => None,
        };
        // Every rank's data cursor, when the checkpoint has one for each rank of this group.
        let size = self.comm.size();
        let cursors = from
            .filter(|_| root)
            .map(|(_, c)| c.meta.cursors.clone())
            .filter(|c| c.len() == size)
            .unwrap_or_default();
        // [resumed, step, optimizer updates, optimizer state sent, cursors sent]
        let mut header = [
            u64::from(root && from.is_some()),
            trainer.step_count(),
            saved.as_ref().map_or(0, |s| s.updates),
            u64::from(saved.is_some()),
            u64::from(!cursors.is_empty()),
        ];
        broadcast_words(&mut self.comm, &mut header).map_err(super::collective)?;
        let [resumed, step, updates, with_state, with_cursors] = header;
        if resumed == 0 {
            return Ok(0);
        }
        let mut words: Vec<u64> = match cursors.is_empty() {
            true => vec![0; CURSOR_WORDS * size],
            false => cursors.iter().flat_map(|c| cursor_words(*c)).collect(),
        };
        if with_cursors == 1 {
            broadcast_words(&mut self.comm, &mut words).map_err(super::collective)?;
        }
        let mut params = trainer.params().to_vec();
        self.comm.broadcast(&mut params, 0).map_err(super::collective)?;
        // The non-trainable state (empty for a model without): every rank gets rank 0's.
        let mut model_state = trainer.state().to_vec();
        if !model_state.is_empty() {
            self.comm.broadcast(&mut model_state, 0).map_err(super::collective)?;
        }
        if with_state == 1 {
            // Whole buffers, in the order this optimizer keeps them; each rank keeps its block.
            let fresh = self.optimizer.state();
            let mut buffers = Vec::with_capacity(fresh.buffers.len());
            for (name, _) in fresh.buffers {
                let mut full = saved
                    .as_ref()
                    .and_then(|s| s.buffers.iter().find(|(n, _)| *n == name))
                    .map_or_else(|| vec![0.0; params.len()], |(_, b)| b.clone());
                self.comm.broadcast(&mut full, 0).map_err(super::collective)?;
                buffers.push((name, full));
            }
            if !root {
                self.restore_optimizer(&OptimizerState { kind: fresh.kind, updates, buffers })?;
            }
        }
        if !root {
            trainer.set_params(&params)?;
            trainer.set_state(&model_state)?;
            trainer.skip_to(step)?;
            if with_cursors == 1 {
                let rank = self.comm.rank();
                trainer.seek_data(cursor_of(&words[rank * CURSOR_WORDS..(rank + 1) * CURSOR_WORDS]))?;
            }
        }
        Ok(step)
    }

    /// Every rank's data cursor, gathered on every rank (collective).
    pub fn gather_cursors(&mut self, mine: DataCursor) -> Result<Vec<DataCursor>, TrainError> {
        let (size, rank) = (self.comm.size(), self.comm.rank());
        let pieces_per_rank = 4 * CURSOR_WORDS;
        let mut pieces = vec![0.0f32; pieces_per_rank * size];
        let block = block_range(pieces.len(), size, rank);
        pieces[block].copy_from_slice(&to_pieces(&cursor_words(mine)));
        self.comm.allgather(&mut pieces).map_err(super::collective)?;
        let words = from_pieces(&pieces);
        Ok(words.chunks_exact(CURSOR_WORDS).map(cursor_of).collect())
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
            self.comm.allgather(&mut full).map_err(super::collective)?;
            buffers.push((name, full));
        }
        self.gathered = Some(OptimizerState { kind: mine.kind, updates: mine.updates, buffers });
        Ok(())
    }
}

/// Broadcasts whole numbers from rank 0 exactly: each goes as four 16-bit pieces, which an `f32`
/// holds without rounding.
fn broadcast_words<C: Communicator>(comm: &mut C, words: &mut [u64]) -> Result<(), CommError> {
    let mut pieces = to_pieces(words);
    comm.broadcast(&mut pieces, 0)?;
    words.copy_from_slice(&from_pieces(&pieces));
    Ok(())
}

/// Whole numbers as four 16-bit pieces each, which an `f32` holds exactly.
fn to_pieces(words: &[u64]) -> Vec<f32> {
    words.iter().flat_map(|w| (0..4).map(move |i| ((w >> (16 * i)) & 0xffff) as f32)).collect()
}

/// The whole numbers of [`to_pieces`].
fn from_pieces(pieces: &[f32]) -> Vec<u64> {
    pieces
        .chunks_exact(4)
        .map(|p| p.iter().enumerate().fold(0, |acc, (i, &v)| acc | ((v as u64) << (16 * i))))
        .collect()
}

/// Words of a data cursor: epoch, batch, and the sample position plus one (0: none).
const CURSOR_WORDS: usize = 3;

fn cursor_words(c: DataCursor) -> [u64; CURSOR_WORDS] {
    [c.epoch, c.batch, c.sample.map_or(0, |s| s + 1)]
}

fn cursor_of(w: &[u64]) -> DataCursor {
    DataCursor { epoch: w[0], batch: w[1], sample: w[2].checked_sub(1) }
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
        let got = self.comm.reduce_scatter(grads, ReduceOp::Average).map_err(super::collective)?;
        if got != b {
            return Err(TrainError::Step(format!("reduce-scatter returned block {got:?}, expected {b:?}")));
        }
        self.optimizer.step(&mut params[b.clone()], &grads[b], lr)?;
        self.comm.allgather(params).map_err(super::collective)?;
        self.gathered = None;
        Ok(())
    }

    fn optimizer_state(&self) -> Option<OptimizerState> {
        self.gathered.clone()
    }

    fn sync_state(&mut self, state: &mut [f32]) -> Result<(), TrainError> {
        self.comm.allreduce(state, ReduceOp::Average).map_err(super::collective)
    }

    fn leader(&self) -> bool {
        self.comm.rank() == 0
    }

    fn sum_over_group(&mut self, sums: &mut [f32]) -> Result<(), TrainError> {
        self.comm.allreduce(sums, ReduceOp::Sum).map_err(super::collective)
    }

    fn prepare_checkpoint(&mut self, len: usize) -> Result<(), TrainError> {
        self.gather_state(len)
    }

    fn gather_cursors(&mut self, mine: DataCursor) -> Result<Vec<DataCursor>, TrainError> {
        AllreduceStep::gather_cursors(self, mine)
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::thread;
    use std::time::Duration;

    use super::*;
    use crate::comm::algo::{AlgoConfig, Collectives};
    use crate::comm::transport::LocalTransport;

    #[test]
    fn whole_numbers_reach_every_rank_exactly() {
        // Steps and update counts beyond f32's 2^24 would round if sent as plain floats.
        let sent = [0, 1, (1 << 24) + 1, (1 << 40) + 12_345, u64::MAX];
        let ranks: Vec<_> = LocalTransport::group(3, Duration::from_secs(30))
            .into_iter()
            .map(|t| {
                thread::spawn(move || {
                    let mut comm = Collectives::new(t, AlgoConfig::default(), "local");
                    let mut words = if comm.rank() == 0 { sent } else { [7; 5] };
                    broadcast_words(&mut comm, &mut words).unwrap();
                    words
                })
            })
            .collect();
        for (rank, r) in ranks.into_iter().enumerate() {
            assert_eq!(r.join().unwrap(), sent, "rank {rank}");
        }
    }
}
