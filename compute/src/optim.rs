//! Optimizers on flat `f32` buffers: SGD with momentum (optionally Nesterov), AdamW, decoupled weight
//! decay, and the learning-rate schedule (linear warm-up, then constant, step or cosine decay).
//!
//! An [`Optimizer`] owns the state (momentum, Adam moments) of exactly the slice it is given, so a
//! worker can run one over the whole model and a parameter-server shard over its key range with the
//! same code. The schedule is separate ([`LrSchedule`]) because the learning rate is a function of the
//! global step, which the caller owns.
//!
//! Update rules (θ parameters, g gradient, η the scheduled rate, λ weight decay, t the 1-based count
//! of this optimizer's updates):
//! - SGD: θ ← θ − ηλθ; v ← μv + g; θ ← θ − η·(g + μv if Nesterov else v). (PyTorch's rule, with the
//!   decay decoupled from the gradient as the spec's `weightDecay` says.)
//! - AdamW: θ ← θ − ηλθ; m ← β₁m + (1−β₁)g; v ← β₂v + (1−β₂)g²;
//!   θ ← θ − η·(m/(1−β₁ᵗ)) / (√(v/(1−β₂ᵗ)) + ε). (PyTorch's `AdamW`.)
//!
//! Guarantees: updates are elementwise and run in index order in `f32` (momentum/moments in `f32`,
//! bias corrections in `f64`), so equal inputs give bit-identical outputs; state can be exported and
//! restored exactly ([`Optimizer::state`], [`Optimizer::restore`]).

use tandem_api::{OptimizerKind, OptimizerSpec, ScheduleKind, ScheduleSpec};

/// Errors of optimizer state handling.
#[derive(Debug, thiserror::Error)]
pub enum OptimError {
    /// Parameters, gradients and state disagree in length.
    #[error("optimizer over {state} values was given {params} parameters and {grads} gradients")]
    Length {
        /// Length of the optimizer's state.
        state: usize,
        /// Parameters given.
        params: usize,
        /// Gradients given.
        grads: usize,
    },
    /// Saved state does not fit this optimizer.
    #[error("saved optimizer state does not fit: {0}")]
    State(String),
}

/// Optimizer state in a form checkpoints can store: scalars plus named buffers.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct OptimizerState {
    /// `sgd` or `adamw`.
    pub kind: OptimizerKind,
    /// Updates applied so far (AdamW's t).
    pub updates: u64,
    /// Named state buffers (`momentum`; `exp_avg`, `exp_avg_sq`), each as long as the slice.
    #[serde(skip)]
    pub buffers: Vec<(String, Vec<f32>)>,
}

#[derive(Clone, Debug)]
enum Rule {
    Sgd { momentum: f32, nesterov: bool, velocity: Vec<f32> },
    AdamW { beta1: f64, beta2: f64, eps: f32, m: Vec<f32>, v: Vec<f32> },
}

/// An optimizer over one contiguous slice of the flat parameter vector.
#[derive(Clone, Debug)]
pub struct Optimizer {
    rule: Rule,
    weight_decay: f32,
    len: usize,
    updates: u64,
}

impl Optimizer {
    /// An optimizer with fresh state for a slice of `len` parameters.
    pub fn new(spec: &OptimizerSpec, len: usize) -> Self {
        let rule = match spec.kind {
            OptimizerKind::Sgd => Rule::Sgd {
                momentum: spec.momentum as f32,
                nesterov: spec.nesterov,
                // Without momentum there is no velocity to keep.
                velocity: if spec.momentum > 0.0 { vec![0.0; len] } else { Vec::new() },
            },
            OptimizerKind::Adamw => Rule::AdamW {
                beta1: spec.beta1,
                beta2: spec.beta2,
                eps: spec.epsilon as f32,
                m: vec![0.0; len],
                v: vec![0.0; len],
            },
        };
        Self { rule, weight_decay: spec.weight_decay as f32, len, updates: 0 }
    }

    /// Length of the slice this optimizer updates.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the slice is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Updates applied so far.
    pub fn updates(&self) -> u64 {
        self.updates
    }

    /// Applies one update with learning rate `lr` to `params` from `grads`.
    pub fn step(&mut self, params: &mut [f32], grads: &[f32], lr: f64) -> Result<(), OptimError> {
        if params.len() != self.len || grads.len() != self.len {
            return Err(OptimError::Length { state: self.len, params: params.len(), grads: grads.len() });
        }
        self.updates += 1;
        let lr32 = lr as f32;
        let decay = lr32 * self.weight_decay;
        match &mut self.rule {
            Rule::Sgd { momentum, nesterov, velocity } => {
                let mu = *momentum;
                if velocity.is_empty() {
                    for (p, &g) in params.iter_mut().zip(grads) {
                        *p -= decay * *p;
                        *p -= lr32 * g;
                    }
                } else {
                    for ((p, &g), v) in params.iter_mut().zip(grads).zip(velocity.iter_mut()) {
                        *p -= decay * *p;
                        *v = mu * *v + g;
                        let d = if *nesterov { g + mu * *v } else { *v };
                        *p -= lr32 * d;
                    }
                }
            }
            Rule::AdamW { beta1, beta2, eps, m, v } => {
                let t = self.updates as i32;
                let bc1 = 1.0 - beta1.powi(t);
                let bc2 = 1.0 - beta2.powi(t);
                let step = (lr / bc1) as f32;
                let bc2_sqrt = bc2.sqrt() as f32;
                let (b1, b2) = (*beta1 as f32, *beta2 as f32);
                let e = *eps;
                for (((p, &g), m), v) in params.iter_mut().zip(grads).zip(m.iter_mut()).zip(v.iter_mut()) {
                    *p -= decay * *p;
                    *m = b1 * *m + (1.0 - b1) * g;
                    *v = b2 * *v + (1.0 - b2) * g * g;
                    *p -= step * *m / (v.sqrt() / bc2_sqrt + e);
                }
            }
        }
        Ok(())
    }

    /// The state, for a checkpoint.
    pub fn state(&self) -> OptimizerState {
        let (kind, buffers) = match &self.rule {
            Rule::Sgd { velocity, .. } => (
                OptimizerKind::Sgd,
                if velocity.is_empty() { vec![] } else { vec![("momentum".to_owned(), velocity.clone())] },
            ),
            Rule::AdamW { m, v, .. } => (
                OptimizerKind::Adamw,
                vec![("exp_avg".to_owned(), m.clone()), ("exp_avg_sq".to_owned(), v.clone())],
            ),
        };
        OptimizerState { kind, updates: self.updates, buffers }
    }

    /// Restores state saved by [`Optimizer::state`] of an optimizer with the same spec and length.
    pub fn restore(&mut self, state: &OptimizerState) -> Result<(), OptimError> {
        let fresh = self.state();
        if state.kind != fresh.kind {
            return Err(OptimError::State(format!(
                "saved by a {:?} optimizer, this job uses {:?}",
                state.kind, fresh.kind
            )));
        }
        let names = |s: &OptimizerState| s.buffers.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
        if names(state) != names(&fresh) {
            return Err(OptimError::State(format!(
                "saved buffers {:?}, this optimizer keeps {:?}",
                names(state),
                names(&fresh)
            )));
        }
        if let Some((n, b)) = state.buffers.iter().find(|(_, b)| b.len() != self.len) {
            return Err(OptimError::State(format!(
                "buffer {n} has {} values, expected {}",
                b.len(),
                self.len
            )));
        }
        let get = |name: &str| state.buffers.iter().find(|(n, _)| n == name).map(|(_, b)| b.clone());
        match &mut self.rule {
            Rule::Sgd { velocity, .. } => {
                if let Some(b) = get("momentum") {
                    *velocity = b;
                }
            }
            Rule::AdamW { m, v, .. } => {
                if let (Some(a), Some(b)) = (get("exp_avg"), get("exp_avg_sq")) {
                    *m = a;
                    *v = b;
                }
            }
        }
        self.updates = state.updates;
        Ok(())
    }
}

/// The learning rate as a function of the global step (0-based).
#[derive(Clone, Debug, PartialEq)]
pub struct LrSchedule {
    peak: f64,
    spec: ScheduleSpec,
    total_steps: u64,
}

impl LrSchedule {
    /// The schedule of `spec` peaking at `peak`, over a run of `total_steps` steps (cosine decays to
    /// zero at the last step).
    pub fn new(peak: f64, spec: &ScheduleSpec, total_steps: u64) -> Self {
        Self { peak, spec: spec.clone(), total_steps }
    }

    /// The same schedule over a run of `total_steps` steps.
    pub fn over(&self, total_steps: u64) -> Self {
        Self { total_steps, ..self.clone() }
    }

    /// The rate for step `step` (0-based): linear warm-up `peak·(step+1)/warmup` during the first
    /// `warmupSteps`, then constant, `peak·γ^⌊(step−warmup)/stepSize⌋` or
    /// `peak·½(1+cos(π·(step−warmup)/(total−warmup)))`.
    pub fn at(&self, step: u64) -> f64 {
        let warm = self.spec.warmup_steps;
        if step < warm {
            return self.peak * (step + 1) as f64 / warm as f64;
        }
        let after = step - warm;
        match self.spec.kind {
            ScheduleKind::Constant => self.peak,
            ScheduleKind::Step => {
                let gamma = self.spec.gamma.unwrap_or(0.1);
                let k = after / self.spec.step_size.max(1);
                self.peak * gamma.powi(k.min(i32::MAX as u64) as i32)
            }
            ScheduleKind::Cosine => {
                let span = self.total_steps.saturating_sub(warm).max(1) as f64;
                let x = (after as f64 / span).min(1.0);
                self.peak * 0.5 * (1.0 + (std::f64::consts::PI * x).cos())
            }
        }
    }
}
