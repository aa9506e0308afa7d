//! A worker group's half of the PS exchange, over the group's collectives: what every program that
//! trains a group against the parameter servers runs — `tandem worker` for the built-in models
//! (the trainer's `worker::ps_step`) and `tandem.torch`'s `DistributedOptimizer` for a user's
//! script — so that both run the job's algorithm the same way.
//!
//! Expected flow per rank: [`GroupExchange::start`] (offer the initial weights of this rank's
//! block, join, pull the current weights, allgather them, so a group that joins late starts from
//! the PS's weights); [`GroupExchange::take_state`]; then per step either
//! [`GroupExchange::push_pull`] (gradient modes) or [`GroupExchange::average`], the caller's own
//! optimizer step, and [`GroupExchange::elastic`] (the elastic mode); [`GroupExchange::leave`] at
//! the end.
//!
//! A restarted group (launch attempt above 0), and a group that the servers know from the
//! checkpoints they resumed from, resumes its step count from the PS: in sync mode from its clock
//! on joining (the shards' update count, which every member group has reached, kept in PS
//! checkpoints); in async, bounded-staleness and elastic modes, whose clocks do not count one
//! group's steps, after the last step whose contributions every shard applied whole
//! ([`crate::client::Kept::contributed`]), so that no step is trained twice; where a shard has no
//! such record (a checkpoint written before it was kept), from the furthest step the group
//! reported. Rank 0's value is broadcast, so every rank of the group agrees. A group the servers
//! do not know starts at 0. A restarted rank also gets its data cursor after the group's last
//! reported step ([`GroupExchange::resume_cursor`]).
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
//! ranks ([`GroupExchange::sync_state`]) and put by rank 0 on shard 0, which holds the mean of
//! every group's latest (MXNet's rule for running statistics) and keeps it in its checkpoints; a
//! group that starts takes it from there ([`GroupExchange::take_state`]).
//!
//! Guarantees: every rank of a group makes the same collective calls in the same order, so the
//! group's weights are equal on all ranks after every step; every error says which exchange
//! failed and has its [`ExitClass`].

use std::ops::Range;

use tandem_api::{DataCursor, ExitClass, PsMode};
use tandem_comm::words::{CURSOR_WORDS, broadcast_words, cursor_of, gather_cursors};
use tandem_comm::{CommError, Communicator, ReduceOp, block_range};

use crate::client::{ClientError, Kept, PsClient};
use crate::wire::{ErrorCode, MAX_EPOCHS, Peer, Progress};

/// A failed exchange of a group with the parameter servers.
#[derive(Debug, thiserror::Error)]
pub enum ExchangeError {
    /// A collective of the group failed.
    #[error("group collective: {0}")]
    Collective(#[from] CommError),
    /// A parameter server failed or refused.
    #[error(transparent)]
    Ps(#[from] ClientError),
    /// The servers refused a push of non-finite values: the model diverged.
    #[error(
        "training diverged at step {step}: {refusal} (a permanent failure: a restart from the same weights \
         would diverge again)"
    )]
    Diverged {
        /// The step whose push was refused.
        step: u64,
        /// The servers' refusal.
        refusal: String,
    },
    /// The job's configuration does not fit the servers (another model's checkpoints, a call for
    /// another mode).
    #[error("{0}")]
    Config(String),
}

impl ExchangeError {
    /// How a process that stops on this error exits: a lost peer or server is retryable, the rest
    /// is permanent.
    pub fn exit_class(&self) -> ExitClass {
        match self {
            ExchangeError::Collective(e) => e.exit_class(),
            ExchangeError::Ps(e) => e.exit_class(),
            ExchangeError::Diverged { .. } | ExchangeError::Config(_) => ExitClass::Permanent,
        }
    }
}

/// A failed push of step `step`: a refusal of non-finite values is the model's divergence.
fn push_err(step: u64, e: ClientError) -> ExchangeError {
    match e {
        ClientError::Refused { code: ErrorCode::NonFinite, .. } => {
            ExchangeError::Diverged { step, refusal: e.to_string() }
        }
        e => ExchangeError::Ps(e),
    }
}

/// One group rank's link to the PS and to its group.
pub struct GroupExchange<C: Communicator> {
    comm: C,
    client: PsClient,
    block: Range<usize>,
    start_step: u64,
    /// The group's last reported step before this start, with this rank's data cursor after it.
    resume: Option<(u64, DataCursor)>,
    mode: PsMode,
    scratch: Vec<f32>,
    /// The job's epoch plan as far as the group asked for it: groups that split each epoch.
    epochs: Vec<u32>,
}

impl<C: Communicator> GroupExchange<C> {
    /// Joins the PS with this rank's block of `params` as initial weights, then replaces `params`
    /// with the PS's current weights (the same on every rank of the group afterwards). The mode is
    /// the servers', which the client checked against the worker's own at hello.
    pub fn start(mut comm: C, mut client: PsClient, params: &mut [f32]) -> Result<Self, ExchangeError> {
        let mode = client.mode();
        let block = block_range(params.len(), comm.size(), comm.rank());
        if !block.is_empty() {
            client.init(block.start as u64, &params[block.clone()])?;
        }
        let clocks = client.join()?;
        let (start_step, reported) = match client.peer() {
            Peer::Worker { group, attempt, .. } => {
                // The servers know the group when it was launched before (attempt above 0) or
                // when they resumed from checkpoints that hold its progress (the whole job started
                // again: `tandem train --resume`, a job re-applied on its checkpoint claim).
                let Kept { reported, contributed } = client.kept(group)?;
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
        broadcast_words(&mut comm, &mut words)?;
        let start_step = words[0];
        let rank = comm.rank();
        let resume = words[1]
            .checked_sub(1)
            .map(|step| (step, cursor_of(&words[2 + CURSOR_WORDS * rank..2 + CURSOR_WORDS * (rank + 1)])));
        if !block.is_empty() {
            client.pull(block.start as u64, &mut params[block.clone()])?;
        }
        comm.allgather(params)?;
        Ok(Self { comm, client, block, start_step, resume, mode, scratch: Vec::new(), epochs: Vec::new() })
    }

    /// The servers' mode.
    pub fn mode(&self) -> PsMode {
        self.mode
    }

    /// The group's communicator, for collectives beside the exchange (every rank of the group
    /// calls them in the same order, as it does the exchange's).
    pub fn comm(&mut self) -> &mut C {
        &mut self.comm
    }

    /// This rank's place in its group: (rank, ranks).
    pub fn rank(&self) -> (usize, usize) {
        (self.comm.rank(), self.comm.size())
    }

    /// The step this group continues from: 0 on its first attempt, the PS's record of its
    /// progress after a restart (see the module documentation).
    pub fn start_step(&self) -> u64 {
        self.start_step
    }

    /// The group's last reported step before this start and this rank's data cursor after it,
    /// when the servers hold them.
    pub fn resume_cursor(&self) -> Option<(u64, DataCursor)> {
        self.resume
    }

    /// Replaces `state`, the model's non-trainable state, on every rank of the group with the
    /// one the servers hold (the groups' mean, kept in PS checkpoints), when they hold one; a
    /// first group keeps its own. Collective: every rank calls it right after
    /// [`GroupExchange::start`].
    pub fn take_state(&mut self, state: &mut [f32]) -> Result<(), ExchangeError> {
        if state.is_empty() {
            return Ok(());
        }
        let held = if self.comm.rank() == 0 { self.client.get_state()? } else { Vec::new() };
        // 0: none held, 1: take it, 2: it is of another model.
        let verdict = match held.len() {
            0 => 0.0,
            n if n == state.len() => 1.0,
            _ => 2.0,
        };
        let mut flag = [verdict];
        self.comm.broadcast(&mut flag, 0)?;
        if flag[0] == 2.0 {
            return Err(ExchangeError::Config(format!(
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
            self.comm.broadcast(state, 0)?;
        }
        Ok(())
    }

    /// One step of a gradient mode (`ps-sync`, `ps-async`, `hybrid`): averages `grads` over the
    /// group, pushes this rank's block for step `step`, pulls the block's new weights into
    /// `params` and allgathers them. `grads` holds the reduced block afterwards.
    pub fn push_pull(
        &mut self,
        step: u64,
        params: &mut [f32],
        grads: &mut [f32],
    ) -> Result<(), ExchangeError> {
        if !self.mode.pushes_gradients() {
            return Err(ExchangeError::Config(format!(
                "the parameter servers run the {} mode, which takes elastic differences, not gradients",
                self.mode
            )));
        }
        let b = self.block.clone();
        let got = self.comm.reduce_scatter(grads, ReduceOp::Average)?;
        if got != b {
            return Err(ExchangeError::Config(format!(
                "reduce-scatter returned block {got:?}, expected {b:?}"
            )));
        }
        if !b.is_empty() {
            self.client.push(step, b.start as u64, &grads[b.clone()]).map_err(|e| push_err(step, e))?;
            self.client.pull(b.start as u64, &mut params[b.clone()])?;
        }
        self.comm.allgather(params)?;
        Ok(())
    }

    /// Averages `grads` over the group (the elastic mode's step, before the local optimizer's).
    pub fn average(&mut self, grads: &mut [f32]) -> Result<(), ExchangeError> {
        Ok(self.comm.allreduce(grads, ReduceOp::Average)?)
    }

    /// The elastic exchange after step `step`, every τ steps of the elastic mode: moves this
    /// rank's block of `params` towards the centre by `α·(x − centre)`, pushes that difference to
    /// the centre, and allgathers the weights. Returns whether it exchanged (false between
    /// exchanges and in the other modes).
    pub fn elastic(&mut self, step: u64, params: &mut [f32]) -> Result<bool, ExchangeError> {
        let PsMode::Elastic { alpha, tau } = self.mode else {
            return Ok(false);
        };
        if !(step + 1).is_multiple_of(tau.max(1)) {
            return Ok(false);
        }
        let (alpha, b) = (alpha as f32, self.block.clone());
        if !b.is_empty() {
            self.scratch.resize(b.len(), 0.0);
            self.client.pull(b.start as u64, &mut self.scratch)?;
            for (c, x) in self.scratch.iter_mut().zip(&mut params[b.clone()]) {
                let e = alpha * (*x - *c);
                *x -= e;
                *c = e;
            }
            self.client.push(step, b.start as u64, &self.scratch).map_err(|e| push_err(step, e))?;
        }
        self.comm.allgather(params)?;
        Ok(true)
    }

    /// Averages `state`, the model's non-trainable state, over the group; rank 0 puts the
    /// group's on shard 0, which holds the mean over the groups for a group that starts or
    /// restarts ([`GroupExchange::take_state`]).
    pub fn sync_state(&mut self, state: &mut [f32]) -> Result<(), ExchangeError> {
        self.comm.allreduce(state, ReduceOp::Average)?;
        if self.comm.rank() == 0 {
            self.client.put_state(state)?;
        }
        Ok(())
    }

    /// Sums `sums` over the group, in place.
    pub fn sum_over_group(&mut self, sums: &mut [f32]) -> Result<(), ExchangeError> {
        Ok(self.comm.allreduce(sums, ReduceOp::Sum)?)
    }

    /// Every rank's data cursor, on every rank (collective).
    pub fn gather_cursors(&mut self, mine: DataCursor) -> Result<Vec<DataCursor>, ExchangeError> {
        Ok(gather_cursors(&mut self.comm, mine)?)
    }

    /// Reports the group's progress to the servers, which keep it (and in their checkpoints).
    pub fn report(&mut self, progress: Progress) -> Result<(), ExchangeError> {
        Ok(self.client.report(progress)?)
    }

    /// This rank's slice of epoch `epoch` as the job's epoch plan splits it: `Some((rank, world))`
    /// among the ranks of the groups that share the epoch, `None` when this group sits it out.
    /// Rank 0 asks shard 0 and the group takes its answer (collective).
    pub fn epoch_share(&mut self, epoch: u64) -> Result<Option<(usize, usize)>, ExchangeError> {
        if self.epochs.len() as u64 <= epoch {
            // [asked, groups of each epoch].
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
                    Err(e) => failed = Some(ExchangeError::Ps(e)),
                }
            }
            broadcast_words(&mut self.comm, &mut words)?;
            if let Some(e) = failed {
                return Err(e);
            }
            if words[0] != 1 {
                return Err(ExchangeError::Config(format!(
                    "rank 0 of the group could not get the job's epoch plan for epoch {epoch} (see its log)"
                )));
            }
            self.epochs = words[1..].iter().map(|&g| g as u32).collect();
        }
        let groups = self.epochs.get(epoch as usize).copied().unwrap_or(1) as usize;
        let group = match self.client.peer() {
            Peer::Worker { group, .. } => group as usize,
            Peer::Observer => 0,
        };
        let (size, rank) = (self.comm.size(), self.comm.rank());
        Ok((group < groups).then_some((group * size + rank, groups * size)))
    }

    /// Leaves the servers: this group is done.
    pub fn leave(&mut self) -> Result<(), ExchangeError> {
        Ok(self.client.leave()?)
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
        assert!(matches!(e, ExchangeError::Diverged { step: 7, .. }));
        assert_eq!(e.exit_class(), ExitClass::Permanent);
        // A server lost during a push stays retryable, another refusal is permanent.
        let lost = ClientError::Lost { index: 0, addr: "a".into(), op: "push", detail: "reset".into() };
        assert_eq!(push_err(7, lost).exit_class(), ExitClass::PeerLost);
        let other = ClientError::Refused {
            index: 0,
            addr: "a".into(),
            op: "push",
            code: ErrorCode::OutOfBounds,
            message: "step".into(),
        };
        assert!(matches!(push_err(7, other), ExchangeError::Ps(ClientError::Refused { .. })));
    }
}
