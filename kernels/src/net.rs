//! A network: a [`Chain`] of layers with a fused softmax cross-entropy head, over one flat
//! parameter vector, one flat gradient vector and one flat state vector that the caller owns.
//!
//! Flat order (the trainer's wire and checkpoint format): layers in forward order, each layer's
//! tensors in its declared order (weight before bias), row-major inside a tensor. Names are
//! PyTorch's: `<layer>.<tensor>`, nested (`fc1.weight`, `layer1.0.conv1.weight`,
//! `h.0.attn.c_attn.bias`, `bn1.running_mean`). A tied tensor appears once.
//!
//! A step ([`Network::forward_backward`]) builds no graph and allocates nothing once the largest
//! batch has been seen: activations and their gradients live in buffers the network owns, the
//! layers read their weights in place from `params` and overwrite their slices of `grads`.
//!
//! Inputs ([`Batch`]): float samples, sample-major `[batch × features]` with each sample in NCHW
//! order (as data sets store them), which the network lays out for its first layer; or integer
//! token ids `[batch × t]` for a language model. Targets: one class per sample for a classifier,
//! one per position (`[batch × t]`, the next token) for a sequence model; the loss is the mean over
//! all targets.
//!
//! State: every state tensor is a running statistic of batch norm (`running_mean`,
//! `running_var`), updated by training steps and read by evaluation. Replicas of a network that
//! train on different data combine their states by averaging them elementwise (see
//! [`Network::state`]).

use std::time::Instant;

use crate::layers::{
    Chain, ChainBuilder, Ctx, Entry, Init, Layer, LayerTime, Layout, LogitsOrder, NamedLayers,
    SoftmaxCrossEntropy, State, transpose,
};
use crate::pool::Pool;

/// Errors of building or running a network.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum NetError {
    /// The network cannot be built as asked.
    #[error("invalid network: {0}")]
    Build(String),
    /// A buffer passed to a step has the wrong length.
    #[error("{what} has {got} values but the network needs {expected}")]
    Length {
        /// Which buffer.
        what: &'static str,
        /// Needed.
        expected: usize,
        /// Given.
        got: usize,
    },
    /// A label is not a class of the network.
    #[error("label {label} of target {target} is not below the network's {classes} classes")]
    Label {
        /// The label.
        label: u32,
        /// Its position in the targets.
        target: usize,
        /// Classes.
        classes: usize,
    },
    /// A token id is outside the vocabulary.
    #[error("token {token} at position {position} of the input is not below the vocabulary size {vocab}")]
    Token {
        /// The id.
        token: u32,
        /// Its position in the input.
        position: usize,
        /// Vocabulary size.
        vocab: usize,
    },
    /// A collective of a model-parallel group failed ([`crate::split`]).
    #[error("model-parallel group: {0}")]
    Group(crate::split::GroupError),
    /// The input is of the wrong kind (floats for a token model, or the reverse).
    #[error("the network takes {expected} as input, got {got}")]
    InputKind {
        /// What the network takes.
        expected: &'static str,
        /// What it got.
        got: &'static str,
    },
}

/// One input batch.
#[derive(Clone, Copy, Debug)]
pub enum Batch<'a> {
    /// Float samples, sample-major, each sample in NCHW order.
    Values(&'a [f32]),
    /// Token ids, `[batch × t]`.
    Tokens(&'a [u32]),
}

impl Batch<'_> {
    fn len(&self) -> usize {
        match self {
            Batch::Values(v) => v.len(),
            Batch::Tokens(t) => t.len(),
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            Batch::Values(_) => "float values",
            Batch::Tokens(_) => "token ids",
        }
    }
}

/// Loss and accuracy of a batch.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BatchStats {
    /// Mean cross-entropy over the batch's targets (nats; per token for a language model, whose
    /// perplexity is `exp(loss)`).
    pub loss: f32,
    /// Correct predictions (arg-max equals the target).
    pub correct: usize,
    /// Targets (samples for a classifier, tokens for a sequence model).
    pub targets: usize,
}

/// Where the last training step's time went.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct StepTimes {
    /// Input layout and forward pass, seconds.
    pub forward: f64,
    /// Loss and its gradient, seconds.
    pub loss: f64,
    /// Backward pass, seconds.
    pub backward: f64,
}

/// Builds a [`Network`] layer by layer.
pub struct NetworkBuilder {
    chain: ChainBuilder,
}

impl NetworkBuilder {
    /// A network whose samples have the shape of `input` (an image's channels, height and width,
    /// a number of features, or a sequence of token ids).
    pub fn new(input: Layout) -> Self {
        Self { chain: ChainBuilder::new(input) }
    }

    /// The output layout of the network so far.
    pub fn output(&self) -> Layout {
        self.chain.output()
    }

    /// Appends `layer` under `name`. Errors (kept until [`NetworkBuilder::build`]) when its input
    /// does not match the previous output.
    pub fn push(self, name: &str, layer: impl Layer + 'static) -> Self {
        Self { chain: self.chain.push(name, layer) }
    }

    /// Appends a layer built by a fallible constructor (a shape error becomes the build error).
    pub fn try_push<L: Layer + 'static>(self, name: &str, layer: Result<L, String>) -> Self {
        Self { chain: self.chain.try_push(name, layer) }
    }

    /// Appends `layer` reading the existing tensor `tensor` as its weight (weight tying).
    pub fn push_tied(self, name: &str, layer: impl Layer + 'static, tensor: &str) -> Self {
        Self { chain: self.chain.push_tied(name, layer, tensor) }
    }

    /// The network, with its last layer's outputs (features, or per-position features of a
    /// sequence) as class scores into softmax cross-entropy, running on `threads` threads.
    pub fn build(self, threads: usize) -> Result<Network, NetError> {
        let root = self.chain.build().map_err(NetError::Build)?;
        let (classes, positions, order) = match root.output() {
            Layout::Features(c) if c >= 2 => (c, 1, LogitsOrder::FeatureMajor),
            Layout::Sequence { t, d } if d >= 2 => (d, t, LogitsOrder::TargetMajor),
            other => {
                return Err(NetError::Build(format!(
                    "the last layer must produce at least 2 class scores (features, or per position of a sequence), it produces {other:?}"
                )));
            }
        };
        Ok(Network {
            input: root.input(),
            root,
            loss: SoftmaxCrossEntropy::new(classes),
            positions,
            order,
            x0: Vec::new(),
            logits: Vec::new(),
            dlogits: Vec::new(),
            capacity: 0,
            pool: Pool::new(threads),
            last_step: StepTimes::default(),
        })
    }
}

impl From<ChainBuilder> for NetworkBuilder {
    /// A network whose body is `chain`.
    fn from(chain: ChainBuilder) -> Self {
        Self { chain }
    }
}

/// A network over flat parameter, gradient and state vectors.
pub struct Network {
    input: Layout,
    root: Chain,
    loss: SoftmaxCrossEntropy,
    /// Targets per sample.
    positions: usize,
    order: LogitsOrder,
    /// The input laid out for the first layer (unused when the layout needs no change).
    x0: Vec<f32>,
    logits: Vec<f32>,
    dlogits: Vec<f32>,
    capacity: usize,
    pool: Pool,
    last_step: StepTimes,
}

impl std::fmt::Debug for Network {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Network")
            .field("layers", &self.describe())
            .field("threads", &self.pool.threads())
            .finish()
    }
}

impl Network {
    /// The network's body as its input layout and named top-level layers, in order, without the
    /// loss (see [`Chain::into_layers`]).
    pub fn into_layers(self) -> Result<(Layout, NamedLayers), NetError> {
        self.root.into_layers().map_err(NetError::Build)
    }

    /// Parameter tensors in flat order.
    pub fn params(&self) -> &[Entry] {
        self.root.param_entries()
    }

    /// State tensors in flat order: batch norm's running statistics. A training step updates them
    /// from its batch; evaluation reads them. They are not trained by gradients: data-parallel
    /// replicas each update their own and combine them by an elementwise average of the whole
    /// state vector (exact for the running means, and for the variances the mean of the
    /// replicas' estimates), at evaluation and checkpoint time.
    pub fn state(&self) -> &[Entry] {
        self.root.state_entries()
    }

    /// Length of the flat parameter (and gradient) vector.
    pub fn num_params(&self) -> usize {
        self.root.num_params()
    }

    /// Length of the flat state vector.
    pub fn num_state(&self) -> usize {
        self.root.num_state()
    }

    /// Output classes (the vocabulary of a language model).
    pub fn classes(&self) -> usize {
        self.loss.classes()
    }

    /// The input of one sample.
    pub fn input(&self) -> Layout {
        self.input
    }

    /// Input values (floats or token ids) per sample.
    pub fn input_len(&self) -> usize {
        match self.input {
            Layout::Tokens { t, .. } => t,
            other => other.features(),
        }
    }

    /// Targets per sample: 1 for a classifier, the sequence length for a language model.
    pub fn targets_per_sample(&self) -> usize {
        self.positions
    }

    /// Threads of the network's pool.
    pub fn threads(&self) -> usize {
        self.pool.threads()
    }

    /// The network's thread pool (for elementwise work over the flat vectors, such as an
    /// optimizer's update, on the same threads).
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// Where the last [`Network::forward_backward`] spent its time.
    pub fn last_step(&self) -> StepTimes {
        self.last_step
    }

    /// Starts (or stops and clears) timing every layer's forward and backward passes.
    pub fn set_profiling(&mut self, on: bool) {
        self.root.set_profiling(on);
    }

    /// Every layer's accumulated time since profiling started, nested layers after their parent.
    pub fn layer_times(&self) -> Vec<LayerTime> {
        let mut out = Vec::new();
        self.root.times("", &mut out);
        out
    }

    /// One line per top-level layer.
    pub fn describe(&self) -> Vec<String> {
        self.root.describe_layers()
    }

    /// Floating-point operations of one training step on `batch` samples (2 per multiply-add, GEMM
    /// work only), for GFLOP/s reports.
    pub fn step_flops(&self, batch: usize) -> f64 {
        let macs = self.root.forward_macs() + self.root.backward_macs(false);
        2.0 * macs as f64 * batch as f64
    }

    /// Floating-point operations of one forward pass on `batch` samples.
    pub fn forward_flops(&self, batch: usize) -> f64 {
        2.0 * self.root.forward_macs() as f64 * batch as f64
    }

    /// Fills `params` and `state` with their initial values; `uniform(lo, hi)` draws the random
    /// ones in flat order, so a seeded generator reproduces the same weights.
    pub fn init(
        &self,
        params: &mut [f32],
        state: &mut [f32],
        uniform: &mut dyn FnMut(f32, f32) -> f32,
    ) -> Result<(), NetError> {
        check("params", params.len(), self.num_params())?;
        check("state", state.len(), self.num_state())?;
        for (list, buf) in [(self.params(), &mut *params), (self.state(), &mut *state)] {
            for e in list {
                let dst = &mut buf[e.range()];
                let bound = match e.init {
                    Init::Zeros => {
                        dst.fill(0.0);
                        continue;
                    }
                    Init::Ones => {
                        dst.fill(1.0);
                        continue;
                    }
                    Init::HeUniform { fan_in } => (6.0 / fan_in.max(1) as f32).sqrt(),
                    Init::Uniform { bound } => bound,
                };
                for v in dst {
                    *v = uniform(-bound, bound);
                }
            }
        }
        Ok(())
    }

    /// Samples in `x` after checking it against the targets `y`.
    fn check_batch(&self, x: Batch<'_>, y: &[u32]) -> Result<usize, NetError> {
        let samples = self.samples_of(x)?;
        check("the targets", y.len(), samples * self.positions)?;
        let classes = self.classes();
        if let Some((target, &label)) = y.iter().enumerate().find(|&(_, &l)| l as usize >= classes) {
            return Err(NetError::Label { label, target, classes });
        }
        Ok(samples)
    }

    /// Samples in `x`, after checking its kind, length and token ids.
    fn samples_of(&self, x: Batch<'_>) -> Result<usize, NetError> {
        let per = self.input_len();
        match (self.input, x) {
            (Layout::Tokens { vocab, .. }, Batch::Tokens(ids)) => {
                if let Some((position, &token)) = ids.iter().enumerate().find(|&(_, &t)| t as usize >= vocab)
                {
                    return Err(NetError::Token { token, position, vocab });
                }
            }
            (Layout::Tokens { .. }, other) => {
                return Err(NetError::InputKind { expected: "token ids", got: other.kind() });
            }
            (_, Batch::Tokens(_)) => {
                return Err(NetError::InputKind { expected: "float values", got: "token ids" });
            }
            _ => {}
        }
        if per == 0 || !x.len().is_multiple_of(per) {
            return Err(NetError::Length { what: "the input batch", expected: per, got: x.len() });
        }
        Ok(x.len() / per)
    }

    /// Makes room for batches of `batch` samples (allocates only when it grows).
    pub fn reserve(&mut self, batch: usize) {
        if batch <= self.capacity {
            return;
        }
        self.root.reserve(batch, self.pool.threads());
        self.x0 = vec![0.0; batch * self.input.features()];
        let out = batch * self.root.output().features();
        self.logits = vec![0.0; out];
        self.dlogits = vec![0.0; out];
        self.capacity = batch;
    }

    /// Runs the forward pass on `batch` samples of `x` (`state` decides the mode); the logits are
    /// in `self.logits`.
    fn forward(&mut self, params: &[f32], state: State<'_>, x: Batch<'_>, batch: usize) {
        let Self { root, x0, logits, pool, input, .. } = self;
        lay_out(*input, x, batch, x0);
        let (xin, tokens) = view(*input, x, batch, x0);
        let cx = Ctx { pool, batch, tokens };
        let out = batch * root.output().features();
        root.forward(&cx, params, state, xin, &mut logits[..out]);
    }

    /// One training step's compute: forward in training mode (batch statistics; running statistics
    /// updated in `state`), loss, backward. Overwrites `grads` with the gradient of the mean loss.
    pub fn forward_backward(
        &mut self,
        params: &[f32],
        state: &mut [f32],
        grads: &mut [f32],
        x: Batch<'_>,
        y: &[u32],
    ) -> Result<BatchStats, NetError> {
        check("params", params.len(), self.num_params())?;
        check("grads", grads.len(), self.num_params())?;
        check("state", state.len(), self.num_state())?;
        let batch = self.check_batch(x, y)?;
        if batch == 0 {
            grads.fill(0.0);
            return Ok(BatchStats { loss: 0.0, correct: 0, targets: 0 });
        }
        self.reserve(batch);
        let t0 = Instant::now();
        self.forward(params, State::Train(state), x, batch);
        let t1 = Instant::now();
        let out = batch * self.root.output().features();
        let (loss, correct) =
            self.loss.run_with(self.order, &self.logits[..out], y, Some(&mut self.dlogits[..out]));
        let t2 = Instant::now();
        let Self { root, x0, logits, dlogits, pool, input, .. } = self;
        let (xin, tokens) = view(*input, x, batch, x0);
        let cx = Ctx { pool, batch, tokens };
        root.backward(&cx, params, xin, &logits[..out], &mut dlogits[..out], None, grads);
        let t3 = Instant::now();
        self.last_step = StepTimes {
            forward: (t1 - t0).as_secs_f64(),
            loss: (t2 - t1).as_secs_f64(),
            backward: (t3 - t2).as_secs_f64(),
        };
        Ok(BatchStats { loss: (loss / y.len() as f64) as f32, correct, targets: y.len() })
    }

    /// Loss and correct predictions in evaluation mode (running statistics), in chunks of the
    /// largest batch seen so far (or the whole batch when none was).
    pub fn evaluate(
        &mut self,
        params: &[f32],
        state: &[f32],
        x: Batch<'_>,
        y: &[u32],
    ) -> Result<BatchStats, NetError> {
        check("params", params.len(), self.num_params())?;
        check("state", state.len(), self.num_state())?;
        let samples = self.check_batch(x, y)?;
        if samples == 0 {
            return Ok(BatchStats { loss: 0.0, correct: 0, targets: 0 });
        }
        if self.capacity == 0 {
            self.reserve(samples.min(1024));
        }
        let chunk = self.capacity;
        let (per, pos) = (self.input_len(), self.positions);
        let (mut loss, mut correct) = (0.0f64, 0usize);
        for start in (0..samples).step_by(chunk) {
            let end = (start + chunk).min(samples);
            let batch = end - start;
            let part = match x {
                Batch::Values(v) => Batch::Values(&v[start * per..end * per]),
                Batch::Tokens(t) => Batch::Tokens(&t[start * per..end * per]),
            };
            self.forward(params, State::Eval(state), part, batch);
            let out = batch * self.root.output().features();
            let (l, c) =
                self.loss.run_with(self.order, &self.logits[..out], &y[start * pos..end * pos], None);
            loss += l;
            correct += c;
        }
        Ok(BatchStats { loss: (loss / y.len() as f64) as f32, correct, targets: y.len() })
    }

    /// Logits of `x` in evaluation mode, target-major: `[batch × classes]` for a classifier,
    /// `[batch·t × vocab]` for a sequence model (tests and inference).
    pub fn logits(
        &mut self,
        params: &[f32],
        state: &[f32],
        x: Batch<'_>,
        out: &mut Vec<f32>,
    ) -> Result<(), NetError> {
        check("params", params.len(), self.num_params())?;
        check("state", state.len(), self.num_state())?;
        let batch = self.samples_of(x)?;
        self.reserve(batch);
        self.forward(params, State::Eval(state), x, batch);
        let (c, n) = (self.classes(), batch * self.positions);
        out.resize(n * c, 0.0);
        match self.order {
            LogitsOrder::FeatureMajor => transpose(&self.logits[..c * n], c, n, out),
            LogitsOrder::TargetMajor => out.copy_from_slice(&self.logits[..c * n]),
        }
        Ok(())
    }
}

pub(crate) fn check(what: &'static str, got: usize, expected: usize) -> Result<(), NetError> {
    if got == expected { Ok(()) } else { Err(NetError::Length { what, expected, got }) }
}

/// Whether float samples (NCHW, sample-major) must be re-laid for the first layer.
pub(crate) fn needs_layout(input: Layout) -> bool {
    match input {
        Layout::Features(_) => true,
        Layout::Image { c, .. } => c > 1,
        Layout::Sequence { .. } | Layout::Tokens { .. } => false,
    }
}

/// Re-lays float samples into `x0` for the first layer when the layout needs it.
pub(crate) fn lay_out(input: Layout, x: Batch<'_>, batch: usize, x0: &mut [f32]) {
    let Batch::Values(v) = x else { return };
    if !needs_layout(input) {
        return;
    }
    let dst = &mut x0[..batch * input.features()];
    match input {
        Layout::Features(f) => transpose(v, batch, f, dst),
        Layout::Image { c, h, w } => {
            let img = c * h * w;
            for (src, out) in v.chunks_exact(img).zip(dst.chunks_exact_mut(img)) {
                transpose(src, c, h * w, out);
            }
        }
        Layout::Sequence { .. } | Layout::Tokens { .. } => {}
    }
}

/// The first layer's input: its floats (the caller's, or their re-laid copy) and token ids.
fn view<'a>(input: Layout, x: Batch<'a>, batch: usize, x0: &'a [f32]) -> (&'a [f32], &'a [u32]) {
    match x {
        Batch::Tokens(t) => (&[], t),
        Batch::Values(_) if needs_layout(input) => (&x0[..batch * input.features()], &[]),
        Batch::Values(v) => (v, &[]),
    }
}
