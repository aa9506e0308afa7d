//! A network: a chain of [`Layer`]s with a fused softmax cross-entropy head, over one flat
//! parameter vector, one flat gradient vector and one flat state vector that the caller owns.
//!
//! Flat order (the trainer's wire and checkpoint format): layers in forward order, each layer's
//! tensors in its declared order (weight before bias), row-major inside a tensor. Names are
//! `<layer>.<tensor>` (`fc1.weight`, `conv2.bias`, `bn1.running_mean`).
//!
//! A step ([`Network::forward_backward`]) builds no graph and allocates nothing once the largest
//! batch has been seen: activations and their gradients live in buffers the network owns, the
//! layers read their weights in place from `params` and overwrite their slices of `grads`. Input
//! batches are sample-major `[batch × features]` with each sample in NCHW order (as data sets
//! store them); the network lays them out for its first layer.

use crate::layers::{Ctx, Init, Layer, Layout, ParamSpec, SoftmaxCrossEntropy, State, transpose};
use crate::pool::Pool;

/// Errors of building or running a network.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum NetError {
    /// Two consecutive layers disagree on the activation between them.
    #[error("layer {index} ({layer}) takes {input:?} but the previous layer produces {previous:?}")]
    Mismatch {
        /// Position of the layer.
        index: usize,
        /// The layer.
        layer: String,
        /// What it takes.
        input: Layout,
        /// What it gets.
        previous: Layout,
    },
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
    #[error("label {label} of sample {sample} is not below the network's {classes} classes")]
    Label {
        /// The label.
        label: u32,
        /// Its sample.
        sample: usize,
        /// Classes.
        classes: usize,
    },
}

/// One tensor's place in a flat vector.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Entry {
    /// `<layer>.<tensor>`.
    pub name: String,
    /// Row-major shape.
    pub shape: Vec<usize>,
    /// First value in the flat vector.
    pub offset: usize,
    /// Number of values.
    pub len: usize,
    /// Initialisation.
    pub init: Init,
}

/// Loss and accuracy of a batch.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BatchStats {
    /// Mean cross-entropy over the batch.
    pub loss: f32,
    /// Correct predictions.
    pub correct: usize,
    /// Samples.
    pub samples: usize,
}

struct Node {
    name: String,
    layer: Box<dyn Layer>,
    params: std::ops::Range<usize>,
    state: std::ops::Range<usize>,
}

/// Builds a [`Network`] layer by layer.
pub struct NetworkBuilder {
    input: Layout,
    nodes: Vec<Node>,
    params: Vec<Entry>,
    state: Vec<Entry>,
    error: Option<NetError>,
}

impl NetworkBuilder {
    /// A network whose samples have the shape of `input` (an image's channels, height and width, or
    /// a number of features).
    pub fn new(input: Layout) -> Self {
        Self { input, nodes: Vec::new(), params: Vec::new(), state: Vec::new(), error: None }
    }

    /// The output layout of the network so far.
    pub fn output(&self) -> Layout {
        self.nodes.last().map_or(self.input, |n| n.layer.output())
    }

    /// Appends `layer` under `name`. Errors (kept until [`NetworkBuilder::build`]) when its input
    /// does not match the previous output.
    pub fn push(mut self, name: &str, layer: impl Layer + 'static) -> Self {
        if self.error.is_some() {
            return self;
        }
        let previous = self.output();
        let input = layer.input();
        let same = input == previous
            || matches!((input, previous), (Layout::Features(f), Layout::Image { c, h, w }) if f == c * h * w && self.nodes.is_empty());
        if !same {
            self.error = Some(NetError::Mismatch {
                index: self.nodes.len(),
                layer: layer.describe(),
                input,
                previous,
            });
            return self;
        }
        let add = |list: &mut Vec<Entry>, specs: Vec<ParamSpec>| {
            let start = list.last().map_or(0, |e| e.offset + e.len);
            let mut at = start;
            for s in specs {
                list.push(Entry {
                    name: format!("{name}.{}", s.name),
                    len: s.len(),
                    shape: s.shape,
                    offset: at,
                    init: s.init,
                });
                at += list.last().map_or(0, |e| e.len);
            }
            start..at
        };
        let params = add(&mut self.params, layer.params());
        let state = add(&mut self.state, layer.state());
        self.nodes.push(Node { name: name.to_owned(), layer: Box::new(layer), params, state });
        self
    }

    /// Appends a layer built by a fallible constructor (a shape error becomes the build error).
    pub fn try_push<L: Layer + 'static>(self, name: &str, layer: Result<L, String>) -> Self {
        match layer {
            Ok(l) => self.push(name, l),
            Err(e) => {
                let mut s = self;
                if s.error.is_none() {
                    s.error = Some(NetError::Build(format!("layer {name}: {e}")));
                }
                s
            }
        }
    }

    /// The network, with `classes` outputs into softmax cross-entropy, running on `threads`
    /// threads.
    pub fn build(self, threads: usize) -> Result<Network, NetError> {
        if let Some(e) = self.error {
            return Err(e);
        }
        let Some(last) = self.nodes.last() else {
            return Err(NetError::Build("a network needs at least one layer".into()));
        };
        let classes = match last.layer.output() {
            Layout::Features(c) if c >= 2 => c,
            other => {
                return Err(NetError::Build(format!(
                    "the last layer must produce at least 2 class scores as features, it produces {other:?}"
                )));
            }
        };
        let pool = Pool::new(threads);
        Ok(Network {
            input: self.input,
            nodes: self.nodes,
            params: self.params,
            state: self.state,
            loss: SoftmaxCrossEntropy::new(classes),
            acts: Vec::new(),
            dacts: Vec::new(),
            capacity: 0,
            pool,
        })
    }
}

/// A network over flat parameter, gradient and state vectors.
pub struct Network {
    input: Layout,
    nodes: Vec<Node>,
    params: Vec<Entry>,
    state: Vec<Entry>,
    loss: SoftmaxCrossEntropy,
    /// `acts[0]`: the input laid out for the first layer; `acts[i + 1]`: output of layer i.
    acts: Vec<Vec<f32>>,
    /// Gradients of `acts[i]` (index 0 unused).
    dacts: Vec<Vec<f32>>,
    capacity: usize,
    pool: Pool,
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
    /// Parameter tensors in flat order.
    pub fn params(&self) -> &[Entry] {
        &self.params
    }

    /// State tensors in flat order.
    pub fn state(&self) -> &[Entry] {
        &self.state
    }

    /// Length of the flat parameter (and gradient) vector.
    pub fn num_params(&self) -> usize {
        self.params.last().map_or(0, |e| e.offset + e.len)
    }

    /// Length of the flat state vector.
    pub fn num_state(&self) -> usize {
        self.state.last().map_or(0, |e| e.offset + e.len)
    }

    /// Output classes.
    pub fn classes(&self) -> usize {
        self.loss.classes()
    }

    /// Values per input sample.
    pub fn input_features(&self) -> usize {
        self.input.features()
    }

    /// Threads of the network's pool.
    pub fn threads(&self) -> usize {
        self.pool.threads()
    }

    /// One line per layer.
    pub fn describe(&self) -> Vec<String> {
        self.nodes.iter().map(|n| format!("{}: {}", n.name, n.layer.describe())).collect()
    }

    /// Floating-point operations of one training step on `batch` samples (2 per multiply-add, GEMM
    /// work only), for GFLOP/s reports.
    pub fn step_flops(&self, batch: usize) -> f64 {
        let mut macs = 0usize;
        for (i, n) in self.nodes.iter().enumerate() {
            macs += n.layer.forward_macs() + n.layer.backward_macs(i > 0);
        }
        2.0 * macs as f64 * batch as f64
    }

    /// Fills `params` and `state` with their initial values; `uniform(lo, hi)` draws the random
    /// ones in flat order, so a seeded generator reproduces the same weights.
    pub fn init(
        &self,
        params: &mut [f32],
        state: &mut [f32],
        uniform: &mut dyn FnMut(f32, f32) -> f32,
    ) -> Result<(), NetError> {
        self.check("params", params.len(), self.num_params())?;
        self.check("state", state.len(), self.num_state())?;
        for (list, buf) in [(&self.params, &mut *params), (&self.state, &mut *state)] {
            for e in list {
                let dst = &mut buf[e.offset..e.offset + e.len];
                match e.init {
                    Init::Zeros => dst.fill(0.0),
                    Init::Ones => dst.fill(1.0),
                    Init::HeUniform { fan_in } => {
                        let bound = (6.0 / fan_in.max(1) as f32).sqrt();
                        for v in dst {
                            *v = uniform(-bound, bound);
                        }
                    }
                }
            }
        }
        Ok(())
    }

    fn check(&self, what: &'static str, got: usize, expected: usize) -> Result<(), NetError> {
        if got == expected { Ok(()) } else { Err(NetError::Length { what, expected, got }) }
    }

    fn check_batch(&self, x: &[f32], y: &[u32]) -> Result<(), NetError> {
        self.check("the input batch", x.len(), y.len() * self.input.features())?;
        let classes = self.classes();
        if let Some((sample, &label)) = y.iter().enumerate().find(|&(_, &l)| l as usize >= classes) {
            return Err(NetError::Label { label, sample, classes });
        }
        Ok(())
    }

    /// Makes room for batches of `batch` samples (allocates only when it grows).
    pub fn reserve(&mut self, batch: usize) {
        if batch <= self.capacity {
            return;
        }
        let threads = self.pool.threads();
        let mut sizes = vec![self.input.features()];
        for n in &mut self.nodes {
            n.layer.reserve(batch, threads);
            sizes.push(n.layer.output().features());
        }
        self.acts = sizes.iter().map(|f| vec![0.0; f * batch]).collect();
        self.dacts = sizes.iter().map(|f| vec![0.0; f * batch]).collect();
        self.capacity = batch;
    }

    /// Lays the sample-major NCHW batch `x` out as the first layer's input.
    fn load_input(&mut self, x: &[f32], batch: usize) {
        let first = self.nodes.first().map(|n| n.layer.input()).unwrap_or(self.input);
        let dst = &mut self.acts[0];
        match (first, self.input) {
            (Layout::Features(f), _) => transpose(x, batch, f, &mut dst[..batch * f]),
            (Layout::Image { c, h, w }, _) => {
                let hw = h * w;
                for b in 0..batch {
                    let (src, out) =
                        (&x[b * c * hw..(b + 1) * c * hw], &mut dst[b * c * hw..(b + 1) * c * hw]);
                    if c == 1 {
                        out.copy_from_slice(src);
                    } else {
                        transpose(src, c, hw, out);
                    }
                }
            }
        }
    }

    fn forward(&mut self, params: &[f32], state: State<'_>, batch: usize) {
        let cx = Ctx { pool: &self.pool, batch };
        let mut state = state;
        for (i, node) in self.nodes.iter_mut().enumerate() {
            let (done, rest) = self.acts.split_at_mut(i + 1);
            let x = &done[i];
            let y = &mut rest[0];
            let p = &params[node.params.clone()];
            let s = match &mut state {
                State::Train(s) => State::Train(&mut s[node.state.clone()]),
                State::Eval(s) => State::Eval(&s[node.state.clone()]),
            };
            node.layer.forward(&cx, p, s, x, y);
        }
    }

    /// One training step's compute: forward in training mode (batch statistics; running statistics
    /// updated in `state`), loss, backward. Overwrites `grads` with the gradient of the mean loss.
    pub fn forward_backward(
        &mut self,
        params: &[f32],
        state: &mut [f32],
        grads: &mut [f32],
        x: &[f32],
        y: &[u32],
    ) -> Result<BatchStats, NetError> {
        self.check("params", params.len(), self.num_params())?;
        self.check("grads", grads.len(), self.num_params())?;
        self.check("state", state.len(), self.num_state())?;
        self.check_batch(x, y)?;
        let batch = y.len();
        if batch == 0 {
            grads.fill(0.0);
            return Ok(BatchStats { loss: 0.0, correct: 0, samples: 0 });
        }
        self.reserve(batch);
        self.load_input(x, batch);
        self.forward(params, State::Train(state), batch);
        let last = self.nodes.len();
        let classes = self.classes();
        let (loss, correct) = {
            let logits = &self.acts[last][..classes * batch];
            let grad = &mut self.dacts[last][..classes * batch];
            self.loss.run(logits, y, Some(grad))
        };
        let cx = Ctx { pool: &self.pool, batch };
        for (i, node) in self.nodes.iter_mut().enumerate().rev() {
            let (below, above) = self.dacts.split_at_mut(i + 1);
            let dy = &mut above[0];
            let dx = if i > 0 { Some(&mut below[i][..]) } else { None };
            let g = &mut grads[node.params.clone()];
            node.layer.backward(
                &cx,
                &params[node.params.clone()],
                &self.acts[i],
                &self.acts[i + 1],
                dy,
                dx,
                g,
            );
        }
        Ok(BatchStats { loss: (loss / batch as f64) as f32, correct, samples: batch })
    }

    /// Loss and correct predictions in evaluation mode (running statistics), in chunks of the
    /// largest batch seen so far (or the whole batch when none was).
    pub fn evaluate(
        &mut self,
        params: &[f32],
        state: &[f32],
        x: &[f32],
        y: &[u32],
    ) -> Result<BatchStats, NetError> {
        self.check("params", params.len(), self.num_params())?;
        self.check("state", state.len(), self.num_state())?;
        self.check_batch(x, y)?;
        if y.is_empty() {
            return Ok(BatchStats { loss: 0.0, correct: 0, samples: 0 });
        }
        if self.capacity == 0 {
            self.reserve(y.len().min(1024));
        }
        let chunk = self.capacity;
        let f = self.input.features();
        let (mut loss, mut correct) = (0.0f64, 0usize);
        for start in (0..y.len()).step_by(chunk) {
            let end = (start + chunk).min(y.len());
            let batch = end - start;
            self.load_input(&x[start * f..end * f], batch);
            self.forward(params, State::Eval(state), batch);
            let logits = &self.acts[self.nodes.len()][..self.classes() * batch];
            let (l, c) = self.loss.run(logits, &y[start..end], None);
            loss += l;
            correct += c;
        }
        Ok(BatchStats { loss: (loss / y.len() as f64) as f32, correct, samples: y.len() })
    }

    /// Sample-major logits `[batch × classes]` of `x` in evaluation mode (tests and inference).
    pub fn logits(
        &mut self,
        params: &[f32],
        state: &[f32],
        x: &[f32],
        out: &mut Vec<f32>,
    ) -> Result<(), NetError> {
        self.check("params", params.len(), self.num_params())?;
        self.check("state", state.len(), self.num_state())?;
        let f = self.input.features();
        if f == 0 || !x.len().is_multiple_of(f) {
            return Err(NetError::Length { what: "the input batch", expected: f, got: x.len() });
        }
        let batch = x.len() / f;
        self.reserve(batch);
        self.load_input(x, batch);
        self.forward(params, State::Eval(state), batch);
        let c = self.classes();
        out.resize(batch * c, 0.0);
        transpose(&self.acts[self.nodes.len()][..c * batch], c, batch, out);
        Ok(())
    }
}
