//! How a worker group trains against the parameter servers: a [`GradientStep`] over
//! [`tandem_ps::group::GroupExchange`], the group's half of each PS algorithm (which documents the
//! exchange per mode, the resumed step count and the model state), with the training loop's
//! local optimizer for the elastic mode.
//!
//! Expected flow per rank: [`PsStep::start`] (join and take the PS's weights), [`PsStep::take_state`],
//! [`PsStep::start_step`] to continue a restarted group's step count, then
//! [`tandem_compute::train::Trainer::run`] (or [`tandem_compute::train::Trainer::step`]) with this step.
//! Every report carries each rank's data cursor after the reported step, which the servers keep
//! with the group's progress (and in their checkpoints); a restarted rank continues its stream at
//! its cursor and reads its way to the step it resumes at ([`PsStep::resume_cursor`]), so that
//! samples skipped as unreadable before the restart do not shift what it serves.
//!
//! Guarantees: every rank of a group makes the same collective calls in the same order, so the
//! group's weights are equal on all ranks after every step.

use tandem_api::OptimizerSpec;
use tandem_api::contract::GroupReport;
use tandem_comm::Communicator;
use tandem_compute::optim::{Optimizer, OptimizerState};
use tandem_compute::train::{EpochShare, GradientStep, TrainError};
use tandem_input::DataCursor;
use tandem_ps::client::PsClient;
use tandem_ps::group::{ExchangeError, GroupExchange};
use tandem_ps::wire::Progress;

/// A group rank's link to the PS, as a [`GradientStep`].
pub struct PsStep<C: Communicator> {
    exchange: GroupExchange<C>,
    /// The elastic mode's local optimizer (in gradient modes the servers run it).
    local: Option<Optimizer>,
}

/// A failed exchange as a training error of the class its origin gave it; a refused push of
/// non-finite values is the model's divergence ([`TrainError::NonFinite`], permanent).
fn train_err(e: ExchangeError) -> TrainError {
    match e {
        ExchangeError::Diverged { step, refusal } => TrainError::NonFinite { step, refusal },
        ExchangeError::Config(message) => TrainError::Config(message),
        ExchangeError::Collective(e) => super::collective(e),
        e => TrainError::step(e.exit_class(), e),
    }
}

impl<C: Communicator> PsStep<C> {
    /// Joins the PS with this rank's block of `params` as initial weights, then replaces `params`
    /// with the PS's current weights (the same on every rank of the group afterwards); see
    /// [`GroupExchange::start`]. `optimizer` is the local optimizer of the elastic mode.
    pub fn start(
        comm: C,
        client: PsClient,
        optimizer: &OptimizerSpec,
        params: &mut [f32],
    ) -> Result<Self, TrainError> {
        let exchange = GroupExchange::start(comm, client, params).map_err(train_err)?;
        let local = (!exchange.mode().pushes_gradients()).then(|| Optimizer::new(optimizer, params.len()));
        Ok(Self { exchange, local })
    }

    /// Replaces `state`, the model's non-trainable state, with the servers' when they hold one
    /// ([`GroupExchange::take_state`]). Collective: every rank calls it right after [`PsStep::start`].
    pub fn take_state(&mut self, state: &mut [f32]) -> Result<(), TrainError> {
        self.exchange.take_state(state).map_err(train_err)
    }

    /// The step this group continues from ([`GroupExchange::start_step`]).
    pub fn start_step(&self) -> u64 {
        self.exchange.start_step()
    }

    /// The group's last reported step before this start and this rank's data cursor after it
    /// ([`GroupExchange::resume_cursor`]): a restarted group continues its stream from there,
    /// reading ahead to [`PsStep::start_step`].
    pub fn resume_cursor(&self) -> Option<(u64, DataCursor)> {
        self.exchange.resume_cursor()
    }
}

impl<C: Communicator> GradientStep for PsStep<C> {
    fn apply(&mut self, step: u64, lr: f64, params: &mut [f32], grads: &mut [f32]) -> Result<(), TrainError> {
        match self.local.as_mut() {
            None => self.exchange.push_pull(step, params, grads).map_err(train_err),
            Some(opt) => {
                self.exchange.average(grads).map_err(train_err)?;
                opt.step(params, grads, lr)?;
                self.exchange.elastic(step, params).map(drop).map_err(train_err)
            }
        }
    }

    fn optimizer_state(&self) -> Option<OptimizerState> {
        self.local.as_ref().map(Optimizer::state)
    }

    fn sync_state(&mut self, state: &mut [f32]) -> Result<(), TrainError> {
        self.exchange.sync_state(state).map_err(train_err)
    }

    fn leader(&self) -> bool {
        self.exchange.rank().0 == 0
    }

    fn sum_over_group(&mut self, sums: &mut [f32]) -> Result<(), TrainError> {
        self.exchange.sum_over_group(sums).map_err(train_err)
    }

    fn gather_cursors(&mut self, mine: DataCursor) -> Result<Vec<DataCursor>, TrainError> {
        self.exchange.gather_cursors(mine).map_err(train_err)
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
        self.exchange.report(progress).map_err(train_err)
    }

    fn epoch_share(&mut self, epoch: u64) -> Result<EpochShare, TrainError> {
        Ok(match self.exchange.epoch_share(epoch).map_err(train_err)? {
            Some((rank, world)) => EpochShare::Slice { rank, world },
            None => EpochShare::Out,
        })
    }

    fn finish(&mut self) -> Result<(), TrainError> {
        self.exchange.leave().map_err(train_err)
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
    use tandem_api::ExitClass;
    use tandem_ps::client::ClientError;

    #[test]
    fn a_refused_non_finite_push_is_a_permanent_divergence_not_a_lost_server() {
        // The exchange's own text is checked in tandem_ps::group; here, the training error it becomes.
        let e = train_err(ExchangeError::Diverged { step: 7, refusal: "NaN at offset 3".into() });
        assert!(matches!(e, TrainError::NonFinite { step: 7, .. }), "{e}");
        // Not a lost peer: `tandem worker` exits 1, which restart policies treat as permanent.
        assert_eq!(crate::worker::WorkerError::Train(e).exit_class(), ExitClass::Permanent);
        // A server lost during a push stays retryable.
        let lost = ClientError::Lost { index: 0, addr: "a".into(), op: "push", detail: "reset".into() };
        assert_eq!(train_err(ExchangeError::Ps(lost)).exit_class(), ExitClass::PeerLost);
    }
}
