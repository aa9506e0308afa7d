//! How a worker group trains against the parameter servers: a [`GradientStep`] that combines the
//! group's gradient with collectives and exchanges each rank's block with the PS shards.
//!
//! Expected flow per rank: [`PsStep::start`] (offer the initial weights of this rank's block,
//! join, pull the current weights, allgather them, so a group that joins late starts from the
//! PS's weights), [`PsStep::start_step`] to continue a restarted group's step count, then
//! [`tandem_compute::train::Trainer::run`] (or [`tandem_compute::train::Trainer::step`]) with this step.
//!
//! A restarted group (launch attempt above 0), and a group that the servers know from the
//! checkpoints they resumed from (the whole job started again, as `tandem train --resume` does),
//! resumes its step count from the PS: in sync mode
//! from its clock on joining (the shards' update count, which every member group has reached,
//! kept in PS checkpoints); in async, bounded-staleness and elastic modes, whose clocks do not
//! count one group's steps, after the last step whose contributions every shard applied whole
//! (each push carries its step, and each shard keeps the group's last whole one, also in its
//! checkpoints, [`Kept::contributed`]), so that no step is trained twice: a step that some shards
//! had applied is taken by them again without being applied again; where a shard has no such
//! record (a checkpoint written before it was kept), from the furthest step the group reported
//! (kept in PS checkpoints, up to the checkpoint's version). Rank 0's value is
//! broadcast, so every rank of the group agrees. A group the servers do not know starts at 0.
//! Every report carries each rank's data cursor after the reported step, which the servers keep
//! with the group's progress (and in their checkpoints); a restarted rank continues its stream at
//! its cursor and reads its way to the step it resumes at ([`PsStep::resume_cursor`]), so that
//! samples skipped as unreadable before the restart do not shift what it serves: it continues
//! with the next unseen sample.
//!
//! Per step, with `p` ranks and rank `i` owning block `i` of the flat vector
//! ([`tandem_comm::block_range`]):
//! - gradient modes (`ps-sync`, `ps-async`, `hybrid`): reduce-scatter (average) of the gradient;
//!   rank `i` pushes block `i` and pulls it back (the PS runs the optimizer and the schedule);
//!   allgather of the weights. No rank carries the whole model to the PS.
//! - `easgd` (MPI-ESGD): allreduce (average) of the gradient and a local optimizer step on every
//!   rank (identical, so the group stays in sync); every τ steps rank `i` pulls the centre's block
//!   `i`, moves its block by `e = α·(x − centre)`, pushes `e` (the PS adds it to the centre), and
//!   the group allgathers the weights.
//!
//! A model's non-trainable state (batch-norm running statistics) is averaged over the group's
//! ranks after every step and put by rank 0 on shard 0, which holds the mean of every group's
//! latest (MXNet's rule for running statistics) and keeps it in its checkpoints; a group that
//! starts takes it from there ([`PsStep::take_state`]), so it survives group and PS restarts.
//!
//! Guarantees: every rank of a group makes the same collective calls in the same order, so the
//! group's weights are equal on all ranks after every step.

use std::ops::Range;

use tandem_api::OptimizerSpec;

use tandem_api::contract::GroupReport;
use tandem_api::{ExitClass, PsMode};
use tandem_comm::{Communicator, ReduceOp, block_range};
use tandem_compute::optim::{Optimizer, OptimizerState};
use tandem_compute::train::{EpochShare, GradientStep, TrainError};
use tandem_input::DataCursor;
use tandem_ps::client::{ClientError, Kept, PsClient};
use tandem_ps::wire::{ErrorCode, MAX_EPOCHS, Peer, Progress};

use super::words::{CURSOR_WORDS, broadcast_words, cursor_of, gather_cursors};

/// A group rank's link to the PS, as a [`GradientStep`].
pub struct PsStep<C: Communicator> {
    comm: C,
    client: PsClient,
    block: Range<usize>,
    start_step: u64,
    /// The group's last reported step before this start, with this rank's data cursor after it.
    resume: Option<(u64, DataCursor)>,
    mode: PsMode,
    local: Option<Optimizer>,
    scratch: Vec<f32>,
    /// The job's epoch plan as far as the group asked for it: groups that split each epoch.
    epochs: Vec<u32>,
}

fn ps_err(e: ClientError) -> TrainError {
    TrainError::step(e.exit_class(), e)
}

/// A failed push of step `step`: a refusal of non-finite values is the model's divergence
/// ([`TrainError::NonFinite`], permanent: `tandem worker` exits 1), anything else as [`ps_err`].
fn push_err(step: u64, e: ClientError) -> TrainError {
    match e {
        ClientError::Refused { code: ErrorCode::NonFinite, .. } => {
            TrainError::NonFinite { step, refusal: e.to_string() }
        }
        e => ps_err(e),
    }
}

impl<C: Communicator> PsStep<C> {
    /// Joins the PS with this rank's block of `params` as initial weights, then replaces `params`
    /// with the PS's current weights (the same on every rank of the group afterwards). The mode is
    /// the servers', which the client checked against the worker's own at hello; `optimizer` is
    /// the local optimizer of the elastic mode.
    pub fn start(
        mut comm: C,
        mut client: PsClient,
        optimizer: &OptimizerSpec,
        params: &mut [f32],
    ) -> Result<Self, TrainError> {
        let mode = client.mode();
        let block = block_range(params.len(), comm.size(), comm.rank());
        if !block.is_empty() {
            client.init(block.start as u64, &params[block.clone()]).map_err(ps_err)?;
        }
        let clocks = client.join().map_err(ps_err)?;
        let (start_step, reported) = match client.peer() {
            Peer::Worker { group, attempt, .. } => {
                // The servers know the group when it was launched before (attempt above 0) or
                // when they resumed from checkpoints that hold its progress (the whole job started
                // again: `tandem train --resume`, a job re-applied on its checkpoint claim).
                let Kept { reported, contributed } = client.kept(group).map_err(ps_err)?;
                let start = match client.mode() {
                    _ if attempt == 0 && reported.is_none() => 0,
                    PsMode::Sync => clocks.iter().copied().max().unwrap_or(0),
                    // After the last step whose contributions every shard applied whole: no step
                    // is trained twice, and one whose contribution some shard missed (or, in the
                    // elastic mode, one trained only locally since the last exchange) again.
                    PsMode::Async { .. } | PsMode::Elastic { .. } => {
                        contributed.unwrap_or_else(|| reported.as_ref().map_or(0, |r| r.step))
                    }
                };
                (start, reported)
            }
            _ => (0, None),
        };
        // Rank 0's view is the group's: [start step, reported step + 1 (0: none), every rank's
        // cursor after the reported step].
        let size = comm.size();
        let mut words = vec![0u64; 2 + CURSOR_WORDS * size];
        words[0] = start_step;
        if let Some(r) = reported.filter(|r| r.cursors.len() == size) {
            words[1] = r.step + 1;
            for (slot, c) in words[2..].chunks_exact_mut(CURSOR_WORDS).zip(&r.cursors) {
                slot.copy_from_slice(&c.words());
            }
        }
        broadcast_words(&mut comm, &mut words).map_err(super::collective)?;
        let start_step = words[0];
        let rank = comm.rank();
        let resume = words[1]
            .checked_sub(1)
            .map(|step| (step, cursor_of(&words[2 + CURSOR_WORDS * rank..2 + CURSOR_WORDS * (rank + 1)])));
        if !block.is_empty() {
            client.pull(block.start as u64, &mut params[block.clone()]).map_err(ps_err)?;
        }
        comm.allgather(params).map_err(super::collective)?;
        let local = (!mode.pushes_gradients()).then(|| Optimizer::new(optimizer, params.len()));
        Ok(Self {
            comm,
            client,
            block,
            start_step,
            resume,
            mode,
            local,
            scratch: Vec::new(),
            epochs: Vec::new(),
        })
    }

    /// Replaces `state`, the model's non-trainable state, on every rank of the group with the
    /// one the servers hold (the groups' mean, kept in PS checkpoints), when they hold one; a
    /// first group keeps its own. Collective: every rank calls it right after [`PsStep::start`].
    pub fn take_state(&mut self, state: &mut [f32]) -> Result<(), TrainError> {
        if state.is_empty() {
            return Ok(());
        }
        let held = if self.comm.rank() == 0 { self.client.get_state().map_err(ps_err)? } else { Vec::new() };
        // 0: none held, 1: take it, 2: it is of another model.
        let verdict = match held.len() {
            0 => 0.0,
            n if n == state.len() => 1.0,
            _ => 2.0,
        };
        let mut flag = [verdict];
        self.comm.broadcast(&mut flag, 0).map_err(super::collective)?;
        if flag[0] == 2.0 {
            return Err(TrainError::Config(format!(
                "the parameter servers hold a model state of {} values, this model keeps {}; the PS \
                 checkpoints are of another model",
                held.len(),
                state.len()
            )));
        }
        if flag[0] == 1.0 {
            if self.comm.rank() == 0 {
                state.copy_from_slice(&held);
            }
            self.comm.broadcast(state, 0).map_err(super::collective)?;
        }
        Ok(())
    }

    /// The step this group continues from: 0 on its first attempt, the PS's record of its
    /// progress after a restart (see the module documentation).
    pub fn start_step(&self) -> u64 {
        self.start_step
    }

    /// The group's last reported step before this start and this rank's data cursor after it,
    /// when the servers hold them: a restarted group continues its stream from there, reading
    /// ahead to [`PsStep::start_step`], so the samples it skipped as unreadable are not served
    /// again in their place.
    pub fn resume_cursor(&self) -> Option<(u64, DataCursor)> {
        self.resume
    }
}

impl<C: Communicator> GradientStep for PsStep<C> {
    fn apply(&mut self, step: u64, lr: f64, params: &mut [f32], grads: &mut [f32]) -> Result<(), TrainError> {
        let b = self.block.clone();
        match self.mode {
            PsMode::Sync | PsMode::Async { .. } => {
                let got = self.comm.reduce_scatter(grads, ReduceOp::Average).map_err(super::collective)?;
                if got != b {
                    return Err(TrainError::step(
                        ExitClass::Permanent,
                        format!("reduce-scatter returned block {got:?}, expected {b:?}"),
                    ));
                }
                if !b.is_empty() {
                    self.client
                        .push(step, b.start as u64, &grads[b.clone()])
                        .map_err(|e| push_err(step, e))?;
                    self.client.pull(b.start as u64, &mut params[b.clone()]).map_err(ps_err)?;
                }
                self.comm.allgather(params).map_err(super::collective)?;
            }
            PsMode::Elastic { alpha, tau } => {
                let (alpha, tau) = (alpha as f32, tau.max(1));
                self.comm.allreduce(grads, ReduceOp::Average).map_err(super::collective)?;
                if let Some(opt) = self.local.as_mut() {
                    opt.step(params, grads, lr)?;
                }
                if (step + 1).is_multiple_of(tau) {
                    if !b.is_empty() {
                        self.scratch.resize(b.len(), 0.0);
                        self.client.pull(b.start as u64, &mut self.scratch).map_err(ps_err)?;
                        for (c, x) in self.scratch.iter_mut().zip(&mut params[b.clone()]) {
                            let e = alpha * (*x - *c);
                            *x -= e;
                            *c = e;
                        }
                        self.client
                            .push(step, b.start as u64, &self.scratch)
                            .map_err(|e| push_err(step, e))?;
                    }
                    self.comm.allgather(params).map_err(super::collective)?;
                }
            }
        }
        Ok(())
    }

    fn optimizer_state(&self) -> Option<OptimizerState> {
        self.local.as_ref().map(Optimizer::state)
    }

    fn sync_state(&mut self, state: &mut [f32]) -> Result<(), TrainError> {
        // The group's ranks share it; rank 0 puts the group's on shard 0, which holds the mean
        // over the groups for a group that starts or restarts ([`PsStep::take_state`]).
        self.comm.allreduce(state, ReduceOp::Average).map_err(super::collective)?;
        if self.comm.rank() == 0 {
            self.client.put_state(state).map_err(ps_err)?;
        }
        Ok(())
    }

    fn leader(&self) -> bool {
        self.comm.rank() == 0
    }

    fn sum_over_group(&mut self, sums: &mut [f32]) -> Result<(), TrainError> {
        self.comm.allreduce(sums, ReduceOp::Sum).map_err(super::collective)
    }

    fn gather_cursors(&mut self, mine: DataCursor) -> Result<Vec<DataCursor>, TrainError> {
        gather_cursors(&mut self.comm, mine)
    }

    fn reports_cursors(&self) -> bool {
        true
    }

    fn report(&mut self, r: &GroupReport, cursors: &[DataCursor]) -> Result<(), TrainError> {
        let progress = Progress {
            step: r.step,
            loss: r.loss.map(|l| l as f32),
            accuracy: r.accuracy.map(|a| a as f32),
            samples: r.samples,
            epoch: u32::try_from(r.epoch).unwrap_or(u32::MAX),
            data_wait: r.data_wait as f32,
            skipped: r.skipped,
            cursors: cursors.to_vec(),
        };
        self.client.report(progress).map_err(ps_err)
    }

    fn epoch_share(&mut self, epoch: u64) -> Result<EpochShare, TrainError> {
        if self.epochs.len() as u64 <= epoch {
            // Rank 0 asks shard 0, and the group takes its answer: [asked, groups of each epoch].
            let n = usize::try_from(epoch).unwrap_or(usize::MAX).saturating_add(1).min(MAX_EPOCHS as usize);
            let mut words = vec![0u64; 1 + n];
            let mut failed = None;
            if self.comm.rank() == 0 {
                // The client checked that the plan holds every epoch through `epoch`.
                match self.client.epochs(epoch) {
                    Ok(groups) => {
                        words[0] = 1;
                        for (w, g) in words[1..].iter_mut().zip(groups) {
                            *w = u64::from(g);
                        }
                    }
                    Err(e) => failed = Some(ps_err(e)),
                }
            }
            broadcast_words(&mut self.comm, &mut words).map_err(super::collective)?;
            if let Some(e) = failed {
                return Err(e);
            }
            if words[0] != 1 {
                return Err(TrainError::step(
                    ExitClass::Permanent,
                    format!(
                        "rank 0 of the group could not get the job's epoch plan for epoch {epoch} (see its log)"
                    ),
                ));
            }
            self.epochs = words[1..].iter().map(|&g| g as u32).collect();
        }
        let groups = self.epochs.get(epoch as usize).copied().unwrap_or(1) as usize;
        let group = match self.client.peer() {
            Peer::Worker { group, .. } => group as usize,
            Peer::Observer => 0,
        };
        let (size, rank) = (self.comm.size(), self.comm.rank());
        Ok(if group < groups {
            EpochShare::Slice { rank: group * size + rank, world: groups * size }
        } else {
            EpochShare::Out
        })
    }

    fn finish(&mut self) -> Result<(), TrainError> {
        self.client.leave().map_err(ps_err)
    }

    fn restore_optimizer(&mut self, state: &OptimizerState) -> Result<(), TrainError> {
        match self.local.as_mut() {
            Some(opt) => Ok(opt.restore(state)?),
            // The PS owns the optimizer in gradient modes; a worker checkpoint carries none.
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_non_finite_push_is_a_permanent_divergence_not_a_lost_server() {
        let refused = ClientError::Refused {
            index: 0,
            addr: "127.0.0.1:7070".into(),
            op: "push",
            code: ErrorCode::NonFinite,
            message: "push of group 1 for step 7 holds NaN at offset 3: refused".into(),
        };
        let e = push_err(7, refused);
        let text = e.to_string();
        assert!(
            text.contains("training diverged at step 7")
                && text.contains("push of group 1 for step 7 holds NaN at offset 3")
                && text.contains("a permanent failure"),
            "{text}"
        );
        assert!(matches!(e, TrainError::NonFinite { step: 7, .. }));
        // Not a lost peer: `tandem worker` exits 1, which restart policies treat as permanent.
        assert_eq!(crate::worker::WorkerError::Train(e).exit_class(), ExitClass::Permanent);
        // A server lost during a push stays retryable, another refusal a step error.
        let lost = ClientError::Lost { index: 0, addr: "a".into(), op: "push", detail: "reset".into() };
        assert_eq!(push_err(7, lost).exit_class(), ExitClass::PeerLost);
        let other = ClientError::Refused {
            index: 0,
            addr: "a".into(),
            op: "push",
            code: ErrorCode::OutOfBounds,
            message: "step".into(),
        };
        assert!(matches!(push_err(7, other), TrainError::Step { class: ExitClass::Permanent, .. }));
    }
}
