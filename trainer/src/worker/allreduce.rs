//! The PCL-DNN step of `algorithm: allreduce` (one group, no parameter server) as a
//! [`GradientStep`]: reduce-scatter (average) of the gradient, each rank runs the optimizer on its
//! own block of the flat vector, allgather of the weights.
//!
//! Expected flow per rank: [`AllreduceStep::start`] (rank 0's initial weights go to every rank),
//! [`AllreduceStep::resume`] (rank 0's checkpoint, if it has one, goes to every rank), then
//! [`tandem_compute::train::Trainer::run`] (or [`tandem_compute::train::Trainer::step`]) with this step; [`AllreduceStep::gather_state`]
//! before a checkpoint, which rank 0 writes (the loop's [`GradientStep::prepare_checkpoint`]).
//!
//! Guarantees: every rank makes the same collective calls in the same order, so the weights are
//! bit-identical on all ranks after every step; so is a model's non-trainable state, averaged
//! over the ranks after every step and resumed with the weights from rank 0's checkpoint. Rank `i` keeps optimizer state (momentum, Adam
//! moments) for block `i` ([`tandem_comm::block_range`]) only, so optimizer memory is split over
//! the group. The optimizer is elementwise, so one step equals a single process's step on the
//! averaged gradient: with the batch sharding of [`tandem_input`], the group trains like one
//! process with the group-size× batch, up to the order of floating-point sums.
//!
//! Model parallelism (a model with a [`Partition`], `model.parallelism` hybrid or model): the
//! split tensors leave the reduced vector. The group reduce-scatters and allgathers only the
//! data-parallel ranges (packed), and each rank runs its own optimizer on its own rows of the
//! split tensors, whose gradient only it computed (PCL-DNN: a model-parallel layer's weights
//! never travel). Other ranks' rows are stale on a rank until [`GradientStep::whole_params`]
//! gathers them (a sum in which every entry has one owner, so exact) before every evaluation and
//! checkpoint; checkpoints therefore hold the whole model and the whole optimizer state, in the
//! same layout as a data-parallel group's, and resume restores each rank's part of them.

use std::ops::Range;
use std::path::Path;

use tandem_api::{ExitClass, OptimizerSpec};

use tandem_comm::words::{CURSOR_WORDS, broadcast_words, cursor_of, gather_cursors};
use tandem_comm::{Communicator, ReduceOp, block_range};
use tandem_compute::checkpoint::Checkpoint;
use tandem_compute::model::Partition;
use tandem_compute::optim::{Optimizer, OptimizerState};
use tandem_compute::train::{GradientStep, TrainError, Trainer};
use tandem_input::DataCursor;

/// A group rank's sharded synchronous SGD step.
pub struct AllreduceStep<C: Communicator> {
    comm: C,
    /// This rank's block of the reduced vector: the whole flat vector, or the packed
    /// data-parallel ranges of a model-parallel group.
    block: Range<usize>,
    optimizer: Optimizer,
    gathered: Option<OptimizerState>,
    /// A model-parallel rank's own rows, which it updates alone.
    owned: Option<Box<Owned>>,
    /// The optimizer's state buffers (the spec's, equal on every rank whatever its block).
    names: Vec<String>,
}

/// What a rank of a model-parallel group (a [`Partition`]) updates alone, and the packed
/// buffers of its step.
struct Owned {
    /// The data-parallel ranges (everything but the split tensors), which the group reduces,
    /// packed in order.
    shared: Vec<Range<usize>>,
    /// This rank's rows of the split tensors.
    mine: Vec<Range<usize>>,
    /// The split tensors.
    split: Vec<Range<usize>>,
    /// `mine` in the packed coordinates of `split`.
    mine_in_split: Vec<Range<usize>>,
    /// Ranks: an owned gradient entry is this many times the group's.
    ranks: usize,
    optimizer: Optimizer,
    grads: Vec<f32>,
    params: Vec<f32>,
    mine_grads: Vec<f32>,
    mine_params: Vec<f32>,
    split_buf: Vec<f32>,
}

fn total(ranges: &[Range<usize>]) -> usize {
    ranges.iter().map(|r| r.len()).sum()
}

/// Copies `ranges` of `src`, in order, into `dst`.
fn pack(src: &[f32], ranges: &[Range<usize>], dst: &mut [f32]) {
    let mut at = 0;
    for r in ranges {
        dst[at..at + r.len()].copy_from_slice(&src[r.clone()]);
        at += r.len();
    }
}

/// Copies the packed `src` back into `ranges` of `dst`.
fn unpack(src: &[f32], ranges: &[Range<usize>], dst: &mut [f32]) {
    let mut at = 0;
    for r in ranges {
        dst[r.clone()].copy_from_slice(&src[at..at + r.len()]);
        at += r.len();
    }
}

impl Owned {
    /// The packed step buffers of `partition` over a vector of `len`, with `optimizer` for this
    /// rank's rows.
    fn new(partition: &Partition, len: usize, optimizer: &OptimizerSpec) -> Result<Self, TrainError> {
        let split = partition.split.clone();
        let owned = &partition.owned;
        let fits = split.windows(2).all(|w| w[0].end <= w[1].start)
            && split.last().is_none_or(|r| r.end <= len)
            && owned.len() == split.len()
            && split.iter().zip(owned).all(|(t, o)| o.is_empty() || (t.start <= o.start && o.end <= t.end));
        if !fits {
            return Err(TrainError::Config(format!(
                "the model's split tensors {split:?} (this rank's parts {owned:?}) are not ordered parts of its \
                 {len} parameters; this is a bug, please report it"
            )));
        }
        let mut shared = Vec::new();
        let mut at = 0;
        for r in &split {
            if r.start > at {
                shared.push(at..r.start);
            }
            at = r.end;
        }
        if at < len {
            shared.push(at..len);
        }
        let mut mine_in_split = Vec::new();
        let mut base = 0;
        for (tensor, own) in split.iter().zip(owned) {
            let from = base + own.start.saturating_sub(tensor.start);
            mine_in_split.push(from..from + own.len());
            base += tensor.len();
        }
        let mine = owned.clone();
        let offset = total(&mine);
        Ok(Self {
            grads: vec![0.0; total(&shared)],
            params: vec![0.0; total(&shared)],
            mine_grads: vec![0.0; offset],
            mine_params: vec![0.0; offset],
            split_buf: vec![0.0; total(&split)],
            optimizer: Optimizer::new(optimizer, offset),
            ranks: partition.ranks.max(1),
            shared,
            mine,
            split,
            mine_in_split,
        })
    }
}

impl<C: Communicator> AllreduceStep<C> {
    /// Replaces `params` with rank 0's (equal on every rank afterwards) and owns this rank's block.
    /// With a model `partition` (a model-parallel group), the block is of the data-parallel part
    /// and the rank updates its own rows of the split tensors alone.
    pub fn start(
        mut comm: C,
        optimizer: &OptimizerSpec,
        params: &mut [f32],
        partition: Option<&Partition>,
    ) -> Result<Self, TrainError> {
        comm.broadcast(params, 0).map_err(super::collective)?;
        let owned = partition.map(|p| Owned::new(p, params.len(), optimizer).map(Box::new)).transpose()?;
        let reduced = owned.as_ref().map_or(params.len(), |o| o.grads.len());
        let block = block_range(reduced, comm.size(), comm.rank());
        let names = Optimizer::new(optimizer, 1).state().buffers.into_iter().map(|(n, _)| n).collect();
        let optimizer = Optimizer::new(optimizer, block.len());
        Ok(Self { comm, block, optimizer, gathered: None, owned, names })
    }

    /// Resumes the whole group from `from`, a worker checkpoint and the path it was read from
    /// ([`tandem_compute::checkpoint::newest_intact`]), which only rank 0 reads (the other ranks
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
            false => cursors.iter().flat_map(|c| c.words()).collect(),
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
            let mut buffers = Vec::with_capacity(self.names.len());
            for name in self.names.clone() {
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
            trainer.skip_to(self, step)?;
            if with_cursors == 1 {
                let rank = self.comm.rank();
                trainer.seek_data(cursor_of(&words[rank * CURSOR_WORDS..(rank + 1) * CURSOR_WORDS]))?;
            }
        }
        Ok(step)
    }

    /// Every rank's data cursor, gathered on every rank (collective).
    pub fn gather_cursors(&mut self, mine: DataCursor) -> Result<Vec<DataCursor>, TrainError> {
        gather_cursors(&mut self.comm, mine).map_err(super::collective)
    }

    /// Collects every rank's block of the optimizer state so that
    /// [`GradientStep::optimizer_state`] returns the whole vector's state (collective: every rank
    /// calls it at the same step).
    pub fn gather_state(&mut self, total: usize) -> Result<(), TrainError> {
        if let Some(o) = &self.owned {
            // Every entry is kept by exactly one rank: its block of the data-parallel part, its
            // own rows; the others add zeros.
            let (shared, own) = (self.optimizer.state(), o.optimizer.state());
            let get = |s: &OptimizerState, name: &str| {
                s.buffers.iter().find(|(n, _)| n == name).map(|(_, b)| b.clone()).unwrap_or_default()
            };
            let mut buffers = Vec::with_capacity(self.names.len());
            for name in &self.names {
                let (block, rows) = (get(&shared, name), get(&own, name));
                let mut packed = vec![0.0; o.grads.len()];
                if block.len() == self.block.len() {
                    packed[self.block.clone()].copy_from_slice(&block);
                }
                let mut full = vec![0.0; total];
                unpack(&packed, &o.shared, &mut full);
                if rows.len() == o.mine_grads.len() {
                    unpack(&rows, &o.mine, &mut full);
                }
                self.comm.allreduce(&mut full, ReduceOp::Sum).map_err(super::collective)?;
                buffers.push((name.clone(), full));
            }
            self.gathered = Some(OptimizerState { kind: shared.kind, updates: shared.updates, buffers });
            return Ok(());
        }
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

impl<C: Communicator> GradientStep for AllreduceStep<C> {
    fn apply(
        &mut self,
        _step: u64,
        lr: f64,
        params: &mut [f32],
        grads: &mut [f32],
    ) -> Result<(), TrainError> {
        let b = self.block.clone();
        if let Some(o) = self.owned.as_mut() {
            // The data-parallel part as always, packed; then this rank's rows alone, with the
            // group's gradient (the owner holds `ranks` times it, see `Partition`).
            pack(grads, &o.shared, &mut o.grads);
            pack(params, &o.shared, &mut o.params);
            let got = self.comm.reduce_scatter(&mut o.grads, ReduceOp::Average).map_err(super::collective)?;
            if got != b {
                return Err(TrainError::step(
                    ExitClass::Permanent,
                    format!("reduce-scatter returned block {got:?}, expected {b:?}"),
                ));
            }
            self.optimizer.step(&mut o.params[b.clone()], &o.grads[b], lr)?;
            self.comm.allgather(&mut o.params).map_err(super::collective)?;
            unpack(&o.params, &o.shared, params);
            pack(grads, &o.mine, &mut o.mine_grads);
            pack(params, &o.mine, &mut o.mine_params);
            let scale = 1.0 / o.ranks as f32;
            for g in &mut o.mine_grads {
                *g *= scale;
            }
            o.optimizer.step(&mut o.mine_params, &o.mine_grads, lr)?;
            unpack(&o.mine_params, &o.mine, params);
            self.gathered = None;
            return Ok(());
        }
        let got = self.comm.reduce_scatter(grads, ReduceOp::Average).map_err(super::collective)?;
        if got != b {
            return Err(TrainError::step(
                ExitClass::Permanent,
                format!("reduce-scatter returned block {got:?}, expected {b:?}"),
            ));
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

    fn whole_params(&mut self, params: &mut [f32]) -> Result<(), TrainError> {
        let Some(o) = self.owned.as_mut() else { return Ok(()) };
        // Each split entry is its owner's; the others add zeros, so the sum is exact.
        o.split_buf.fill(0.0);
        for (g, at) in o.mine.iter().zip(&o.mine_in_split) {
            o.split_buf[at.clone()].copy_from_slice(&params[g.clone()]);
        }
        self.comm.allreduce(&mut o.split_buf, ReduceOp::Sum).map_err(super::collective)?;
        unpack(&o.split_buf, &o.split, params);
        Ok(())
    }

    fn restore_optimizer(&mut self, state: &OptimizerState) -> Result<(), TrainError> {
        let b = self.block.clone();
        if let Some(o) = self.owned.as_mut() {
            let end = o.split.iter().chain(&o.shared).map(|r| r.end).max().unwrap_or(0);
            let (mut shared, mut own) = (Vec::new(), Vec::new());
            for (name, full) in &state.buffers {
                if full.len() < end {
                    return Err(TrainError::Config(format!(
                        "checkpointed optimizer buffer {name} holds {} values, fewer than the model's {end}; \
                         the checkpoint is of another model",
                        full.len()
                    )));
                }
                let mut packed = vec![0.0; o.grads.len()];
                pack(full, &o.shared, &mut packed);
                shared.push((name.clone(), packed[b.clone()].to_vec()));
                let mut rows = vec![0.0; o.mine_grads.len()];
                pack(full, &o.mine, &mut rows);
                own.push((name.clone(), rows));
            }
            // An optimizer of no values (every tensor split, or a rank without rows) keeps nothing.
            if !self.optimizer.is_empty() {
                let shared = OptimizerState { kind: state.kind, updates: state.updates, buffers: shared };
                self.optimizer.restore(&shared)?;
            }
            if !o.optimizer.is_empty() {
                o.optimizer.restore(&OptimizerState {
                    kind: state.kind,
                    updates: state.updates,
                    buffers: own,
                })?;
            }
            return Ok(());
        }
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
