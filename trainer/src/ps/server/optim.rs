//! The update a parameter-server shard runs on its slice in sync and async modes: the compute
//! layer's flat-slice [`Optimizer`] driven by the job's [`LrSchedule`].
//!
//! Guarantees: the rule is exactly the worker-side one (`tandem_compute::optim`), so moving the update
//! between workers and servers changes nothing numerically; its state is exported for shard
//! checkpoints and restored exactly.

use tandem_api::OptimizerSpec;

use tandem_compute::optim::{LrSchedule, Optimizer, OptimizerState};

/// Optimizer plus schedule over one shard.
#[derive(Clone, Debug)]
pub struct ShardOptimizer {
    optimizer: Optimizer,
    schedule: LrSchedule,
    spec: OptimizerSpec,
}

impl ShardOptimizer {
    /// Fresh state for a shard of `len` values, with the schedule over the run's `total_steps`
    /// (the workers' [`tandem_api::JobPlan::total_steps`], so both sides decay alike).
    pub fn new(spec: &OptimizerSpec, len: usize, total_steps: u64) -> Self {
        Self {
            optimizer: Optimizer::new(spec, len),
            schedule: LrSchedule::new(spec.learning_rate, &spec.schedule, total_steps),
            spec: spec.clone(),
        }
    }

    /// Spans the schedule over `total_steps` (learned after a restore from a checkpoint that did
    /// not record it).
    pub fn set_total_steps(&mut self, total_steps: u64) {
        self.schedule = LrSchedule::new(self.spec.learning_rate, &self.spec.schedule, total_steps);
    }

    /// Applies `grad` as update number `step` (0-based, the schedule's step).
    pub fn step(&mut self, params: &mut [f32], grad: &[f32], step: u64) {
        if let Err(e) = self.optimizer.step(params, grad, self.schedule.at(step)) {
            // The shard sizes both buffers from its own range, so this is a bug, not bad input.
            tracing::error!(error = %e, "shard update skipped");
        }
    }

    /// The state, for a checkpoint.
    pub fn state(&self) -> OptimizerState {
        self.optimizer.state()
    }

    /// Restores a checkpoint's state.
    pub fn restore(&mut self, state: &OptimizerState) -> Result<(), String> {
        self.optimizer.restore(state).map_err(|e| e.to_string())
    }
}
