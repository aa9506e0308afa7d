//! Model parallelism (PCL-DNN, Das et al. 2016, §3): a network whose dense layers are split over
//! the `p` ranks of a group by output features, while its other layers (convolutions, pooling,
//! batch norm) stay data-parallel.
//!
//! ## The scheme
//!
//! The group trains on a global batch of `N = p·B` samples, `B` per rank, in rank order: rank
//! `r`'s samples are columns `r·B..(r+1)·B`, the batch one process with `N` samples would see.
//! Every rank holds the whole flat parameter vector, in the unsplit network's layout, so that the
//! group's step, checkpoints and the parameter servers treat it like any other; a split layer
//! reads and writes only its own rows of it.
//!
//! A split dense layer `in → out` (weight `[out × in]`, row-major) with `k = ⌈out/p⌉` gives rank
//! `r` the output rows `r·k .. min((r+1)·k, out)`: a contiguous run of the weight and of the bias.
//! - Forward: each rank computes its rows for all `N` samples, `Y_r = relu(W_r·X + b_r)`, into
//!   block `r` of a `[p·k × N]` buffer (the last blocks padded with zero rows); an **allgather**
//!   gives every rank the whole activation `[out × N]`, the next split layer's input.
//! - Backward: rank `r` holds `dY_r` (its rows, all `N` samples) and computes `dW_r = dY_r·Xᵀ`,
//!   `db_r` and its part `W_rᵀ·dY_r` of the input gradient. The input gradient is the sum of the
//!   parts over the ranks: a **reduce-scatter** (sum) of the `[p·k_in × N]` parts leaves on each
//!   rank exactly the rows of the previous split layer that it owns (PCL-DNN's "part-reduce" of
//!   the activation gradients), so no rank ever holds a whole weight gradient.
//! - Data-parallel → split: the `B`-sample activations `[F × B]` are allgathered by samples into
//!   `[F × N]`; backward, the input-gradient parts are reduce-scattered by samples, so each rank
//!   gets the summed gradient of its own `B` columns.
//! - Split → data-parallel: each rank takes its own `B` columns (no communication); backward, the
//!   `B`-column gradients are allgathered by samples into the `[F × N]` gradient of the split
//!   layer's output.
//! - Loss: after a split last layer every rank has all `N` logits and the labels of all `N`
//!   samples (allgathered once per step) and computes the loss gradient of all of them; after a
//!   data-parallel last layer each rank has its own, as in data parallelism.
//!
//! ## Guarantees
//!
//! - The gradient convention of data parallelism holds: on rank `r`, [`SplitNetwork::forward_backward`]
//!   writes for every data-parallel tensor the gradient of the mean loss over the rank's own `B`
//!   samples, and for a split tensor `p ×` the gradient of the group's mean loss on the rank's own
//!   rows and zero on the others. Hence the **average of the ranks' gradient vectors is the
//!   gradient of one process on all `N` samples** (up to the order of float sums), and a group
//!   step that averages gradients (allreduce, the parameter-server exchange) trains the split
//!   network exactly like the unsplit one. The returned loss and correct count are those of the
//!   rank's own samples, so the group's sums are the one process's.
//! - Every rank makes the same collective calls in the same order, with buffers of equal length
//!   (the ranks' batches must be of equal size; a mismatch is the collective's error).
//! - Nothing allocates once the largest batch has been seen.
//!
//! Caveats: every rank keeps the whole parameter vector (the split saves the dense layers'
//! compute and activation memory, not their parameter memory); a rank's step may update its own
//! rows alone ([`SplitNetwork::split_tensors`]) and must then gather them before anything reads
//! the whole vector. Batch norm in a data-parallel stage uses the rank's own batch statistics,
//! as in data parallelism, so a network with it matches one process only up to that.

use std::ops::Range;

use crate::layers::{
    Chain, ChainBuilder, Ctx, Dense, Layer, Layout, NamedLayers, SoftmaxCrossEntropy, State, transpose,
};
use crate::net::{Batch, BatchStats, NetError, check, lay_out, needs_layout};
use crate::pool::Pool;

/// A failed collective of the group, as the caller's communicator reported it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct GroupError {
    /// What failed, naming the peer when one was at fault.
    pub message: String,
    /// Whether a peer rank was lost (died, hung): restarting the group can cure it.
    pub peer_lost: bool,
}

/// The collectives a split network needs from its group, on buffers whose length is a multiple
/// of the group's size, split into equal blocks in rank order (the caller's communicator).
pub trait Group: Send {
    /// This rank, in `0..size()`.
    fn rank(&self) -> usize;
    /// Ranks in the group.
    fn size(&self) -> usize;
    /// Gathers every rank's block of `buf` into every rank's `buf`.
    fn allgather(&mut self, buf: &mut [f32]) -> Result<(), GroupError>;
    /// Sums `buf` over the ranks, leaving this rank's block summed in place (the rest of `buf` is
    /// unspecified afterwards).
    fn reduce_scatter_sum(&mut self, buf: &mut [f32]) -> Result<(), GroupError>;
}

/// A dense layer's rows on this rank.
#[derive(Debug)]
struct SplitDense {
    /// `inputs → rows.len()`.
    dense: Dense,
    inputs: usize,
    outputs: usize,
    /// Rows per rank (`⌈outputs / p⌉`): the block of the gathered activation.
    k: usize,
    /// This rank's rows.
    rows: Range<usize>,
}

enum Kind {
    /// Data-parallel layers, run on the rank's own samples.
    Local(Chain),
    /// A dense layer split by output rows.
    Split(SplitDense),
}

struct Stage {
    name: String,
    kind: Kind,
    params: Range<usize>,
    state: Range<usize>,
    /// Input values per sample.
    fin: usize,
    /// Output values per sample.
    fout: usize,
    /// The stage's input when it is not the previous stage's output as it stands.
    input: Vec<f32>,
    /// Output: `[fout × B]` (local) or `[p·k × N]` (split).
    out: Vec<f32>,
    /// Gradient of the output, same shape (a split stage uses its own block).
    dout: Vec<f32>,
    /// Gradient of the input: `[fin × B]` (local) or the summands `[p·⌈fin/p⌉ × N]` (split).
    din: Vec<f32>,
}

impl Stage {
    fn is_split(&self) -> bool {
        matches!(self.kind, Kind::Split(_))
    }
}

/// Appends the data-parallel layers of `local` (named after their first layer) as one stage.
fn push_local(
    local: Option<(String, ChainBuilder)>,
    stages: &mut Vec<Stage>,
    poff: &mut usize,
    soff: &mut usize,
) -> Result<(), NetError> {
    let Some((name, b)) = local else { return Ok(()) };
    let chain = b.build().map_err(NetError::Build)?;
    let (np, ns) = (chain.num_params(), chain.num_state());
    stages.push(Stage {
        name,
        fin: chain.input().features(),
        fout: chain.output().features(),
        kind: Kind::Local(chain),
        params: *poff..*poff + np,
        state: *soff..*soff + ns,
        input: Vec::new(),
        out: Vec::new(),
        dout: Vec::new(),
        din: Vec::new(),
    });
    *poff += np;
    *soff += ns;
    Ok(())
}

/// `⌈n / p⌉`.
fn per_rank(n: usize, p: usize) -> usize {
    n.div_ceil(p)
}

/// A network with some dense layers split over a group (see the module documentation).
pub struct SplitNetwork {
    input: Layout,
    stages: Vec<Stage>,
    loss: SoftmaxCrossEntropy,
    group: Box<dyn Group>,
    pool: Pool,
    num_params: usize,
    num_state: usize,
    /// Per-rank batch the buffers hold.
    capacity: usize,
    /// The input laid out for a local first stage.
    x0: Vec<f32>,
    /// Sample-major scratch of `N` samples for transitions by samples.
    samples: Vec<f32>,
    /// Every rank's labels (when the last layer is split).
    labels: Vec<u32>,
    label_buf: Vec<f32>,
    /// The rank's own logits (for its statistics when the last layer is split).
    own_logits: Vec<f32>,
}

impl std::fmt::Debug for SplitNetwork {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SplitNetwork")
            .field("stages", &self.describe())
            .field("rank", &self.group.rank())
            .field("size", &self.group.size())
            .finish()
    }
}

/// Names of the top-level dense layers of `layers`, in order: those that can be split.
pub fn dense_layers(layers: &NamedLayers) -> Vec<String> {
    layers.iter().filter(|(_, l)| l.dense_shape().is_some()).map(|(n, _)| n.clone()).collect()
}

impl SplitNetwork {
    /// The network of `layers` (from [`crate::net::Network::into_layers`]) on samples of `input`,
    /// with the dense layers named in `split` split over `group`, on `threads` threads. Errors
    /// name a layer of `split` that is not a dense layer of the network.
    pub fn new(
        input: Layout,
        layers: NamedLayers,
        split: &[String],
        group: Box<dyn Group>,
        threads: usize,
    ) -> Result<Self, NetError> {
        let dense = dense_layers(&layers);
        if let Some(name) = split.iter().find(|n| !dense.contains(n)) {
            let what = match layers.iter().find(|(n, _)| n == name) {
                Some((_, l)) => format!("{name} is a {} layer", l.describe()),
                None => format!("{name} is not a layer of this model"),
            };
            return Err(NetError::Build(format!(
                "{what}; only dense layers can be split over a group, and this model's are [{}]",
                dense.join(", ")
            )));
        }
        let (p, r) = (group.size().max(1), group.rank());
        let mut stages: Vec<Stage> = Vec::new();
        let mut local: Option<(String, ChainBuilder)> = None;
        let (mut poff, mut soff) = (0usize, 0usize);
        let mut previous = input;
        for (name, layer) in layers {
            match layer.dense_shape().filter(|_| split.contains(&name)) {
                Some((inputs, outputs, relu)) => {
                    push_local(local.take(), &mut stages, &mut poff, &mut soff)?;
                    if previous != Layout::Features(inputs) {
                        return Err(NetError::Build(format!(
                            "layer {name} ({}) takes {:?} but the previous layer produces {previous:?}",
                            layer.describe(),
                            layer.input()
                        )));
                    }
                    let k = per_rank(outputs, p);
                    let rows = (r * k).min(outputs)..((r + 1) * k).min(outputs);
                    let len = outputs * inputs + outputs;
                    stages.push(Stage {
                        name: name.clone(),
                        kind: Kind::Split(SplitDense {
                            dense: Dense::new(inputs, rows.len(), relu),
                            inputs,
                            outputs,
                            k,
                            rows,
                        }),
                        params: poff..poff + len,
                        state: soff..soff,
                        fin: inputs,
                        fout: outputs,
                        input: Vec::new(),
                        out: Vec::new(),
                        dout: Vec::new(),
                        din: Vec::new(),
                    });
                    poff += len;
                    previous = Layout::Features(outputs);
                }
                None => {
                    let before = previous;
                    previous = layer.output();
                    local = Some(match local.take() {
                        Some((first, b)) => (first, b.push_boxed(&name, layer)),
                        None => (name.clone(), ChainBuilder::new(before).push_boxed(&name, layer)),
                    });
                }
            }
        }
        push_local(local.take(), &mut stages, &mut poff, &mut soff)?;
        let classes = match stages.last().map(|s| s.fout) {
            Some(c) if c >= 2 && matches!(previous, Layout::Features(_)) => c,
            _ => {
                return Err(NetError::Build(format!(
                    "a split network must end in at least 2 class scores per sample, this one produces {previous:?}"
                )));
            }
        };
        Ok(Self {
            input,
            stages,
            loss: SoftmaxCrossEntropy::new(classes),
            group,
            pool: Pool::new(threads),
            num_params: poff,
            num_state: soff,
            capacity: 0,
            x0: Vec::new(),
            samples: Vec::new(),
            labels: Vec::new(),
            label_buf: Vec::new(),
            own_logits: Vec::new(),
        })
    }

    /// Length of the flat parameter (and gradient) vector: the unsplit network's.
    pub fn num_params(&self) -> usize {
        self.num_params
    }

    /// Length of the flat state vector.
    pub fn num_state(&self) -> usize {
        self.num_state
    }

    /// The rows of each split layer this rank owns: `(layer, rows)`.
    pub fn owned_rows(&self) -> Vec<(String, Range<usize>)> {
        (self.stages.iter())
            .filter_map(|s| match &s.kind {
                Kind::Split(d) => Some((s.name.clone(), d.rows.clone())),
                Kind::Local(_) => None,
            })
            .collect()
    }

    /// Each split tensor's range in the flat vector with the part of it this rank owns (its rows
    /// of the weight, its entries of the bias), in flat order.
    pub fn split_tensors(&self) -> Vec<(Range<usize>, Range<usize>)> {
        let mut out = Vec::new();
        for s in &self.stages {
            if let Kind::Split(d) = &s.kind {
                let (w, b) = (s.params.start, s.params.start + d.outputs * d.inputs);
                out.push((w..b, w + d.rows.start * d.inputs..w + d.rows.end * d.inputs));
                out.push((b..s.params.end, b + d.rows.start..b + d.rows.end));
            }
        }
        out
    }

    /// Ranks in the group.
    pub fn ranks(&self) -> usize {
        self.group.size().max(1)
    }

    /// One line per stage: `name: split rows a..b of n` or the local layers.
    pub fn describe(&self) -> Vec<String> {
        (self.stages.iter())
            .map(|s| match &s.kind {
                Kind::Split(d) => format!(
                    "{}: dense {}→{} split, rows {:?} on this rank",
                    s.name, d.inputs, d.outputs, d.rows
                ),
                Kind::Local(c) => format!("data-parallel: {}", c.describe()),
            })
            .collect()
    }

    fn reserve(&mut self, b: usize) {
        if b <= self.capacity {
            return;
        }
        let p = self.group.size().max(1);
        let n = p * b;
        let threads = self.pool.threads();
        let mut widest = self.input.features();
        for s in &mut self.stages {
            widest = widest.max(s.fin).max(s.fout);
            match &mut s.kind {
                Kind::Local(chain) => {
                    chain.reserve(b, threads);
                    s.input = vec![0.0; s.fin * b];
                    s.out = vec![0.0; s.fout * b];
                    s.dout = vec![0.0; s.fout * b];
                    s.din = vec![0.0; s.fin * b];
                }
                Kind::Split(d) => {
                    d.dense.reserve(n, threads);
                    s.input = vec![0.0; s.fin * n];
                    s.out = vec![0.0; p * d.k * n];
                    s.dout = vec![0.0; p * d.k * n];
                    s.din = vec![0.0; p * per_rank(s.fin, p) * n];
                }
            }
        }
        self.x0 = vec![0.0; self.input.features() * b];
        self.samples = vec![0.0; widest * n];
        self.labels = vec![0; n];
        self.label_buf = vec![0.0; n];
        self.own_logits = vec![0.0; self.loss.classes() * b];
        self.capacity = b;
    }

    /// One training step's compute on this rank's `x` (sample-major, NCHW) and labels `y`, a
    /// collective over the group: overwrites `grads` and moves `state` as the module
    /// documentation says; returns the loss and correct count of this rank's samples.
    pub fn forward_backward(
        &mut self,
        params: &[f32],
        state: &mut [f32],
        grads: &mut [f32],
        x: Batch<'_>,
        y: &[u32],
    ) -> Result<BatchStats, NetError> {
        check("params", params.len(), self.num_params)?;
        check("grads", grads.len(), self.num_params)?;
        check("state", state.len(), self.num_state)?;
        let Batch::Values(values) = x else {
            return Err(NetError::InputKind { expected: "float values", got: "token ids" });
        };
        let per = self.input.features();
        if per == 0 || !values.len().is_multiple_of(per) {
            return Err(NetError::Length { what: "the input batch", expected: per, got: values.len() });
        }
        let b = values.len() / per;
        check("the targets", y.len(), b)?;
        let classes = self.loss.classes();
        if let Some((target, &label)) = y.iter().enumerate().find(|&(_, &l)| l as usize >= classes) {
            return Err(NetError::Label { label, target, classes });
        }
        self.reserve(b);
        self.forward(params, state, values, b)?;
        let stats = self.loss_gradient(y, b)?;
        self.backward(params, grads, values, b)?;
        Ok(stats)
    }

    fn forward(
        &mut self,
        params: &[f32],
        state: &mut [f32],
        values: &[f32],
        b: usize,
    ) -> Result<(), NetError> {
        let (p, r) = (self.group.size().max(1), self.group.rank());
        let n = p * b;
        let Self { stages, group, pool, input, x0, samples, .. } = self;
        for j in 0..stages.len() {
            let (done, rest) = stages.split_at_mut(j);
            let s = &mut rest[0];
            let prev = done.last();
            // The stage's input, moved into place.
            match (&s.kind, prev) {
                (Kind::Local(_), None) => lay_out(*input, Batch::Values(values), b, x0),
                (Kind::Split(_), None) => {
                    gather_samples(group.as_mut(), values, s.fin, b, true, samples, &mut s.input)?
                }
                (Kind::Split(_), Some(prev)) if !prev.is_split() => {
                    gather_samples(group.as_mut(), &prev.out, s.fin, b, false, samples, &mut s.input)?
                }
                (Kind::Local(_), Some(prev)) => own_columns(&prev.out, s.fin, b, r, p, &mut s.input),
                (Kind::Split(_), Some(_)) => {}
            }
            let xin: &[f32] = match (&s.kind, prev) {
                (Kind::Local(_), None) if needs_layout(*input) => &x0[..b * input.features()],
                (Kind::Local(_), None) => values,
                (Kind::Split(_), Some(prev)) if prev.is_split() => &prev.out[..s.fin * n],
                (Kind::Split(_), _) => &s.input[..s.fin * n],
                (Kind::Local(_), Some(_)) => &s.input[..s.fin * b],
            };
            match &mut s.kind {
                Kind::Local(chain) => {
                    let cx = Ctx { pool, batch: b, tokens: &[] };
                    let st = State::Train(&mut state[s.state.clone()]);
                    chain.forward(&cx, &params[s.params.clone()], st, xin, &mut s.out[..s.fout * b]);
                }
                Kind::Split(d) => {
                    let cx = Ctx { pool, batch: n, tokens: &[] };
                    let (w, bias) = params[s.params.clone()].split_at(d.outputs * d.inputs);
                    let block = &mut s.out[r * d.k * n..(r + 1) * d.k * n];
                    let mine = d.rows.len() * n;
                    if !d.rows.is_empty() {
                        let w = &w[d.rows.start * d.inputs..d.rows.end * d.inputs];
                        d.dense.forward_with(&cx, w, &bias[d.rows.clone()], xin, &mut block[..mine]);
                    }
                    block[mine..].fill(0.0);
                    group.allgather(&mut s.out).map_err(NetError::Group)?;
                }
            }
        }
        Ok(())
    }

    /// The loss of the rank's samples and the gradient of the logits in the last stage's `dout`.
    fn loss_gradient(&mut self, y: &[u32], b: usize) -> Result<BatchStats, NetError> {
        let (p, r) = (self.group.size().max(1), self.group.rank());
        let n = p * b;
        let c = self.loss.classes();
        let Self { stages, group, loss, labels, label_buf, own_logits, .. } = self;
        let Some(last) = stages.last_mut() else {
            return Err(NetError::Build("a split network needs at least one layer".into()));
        };
        if !last.is_split() {
            let (sum, correct) = loss.run(&last.out[..c * b], y, Some(&mut last.dout[..c * b]));
            return Ok(BatchStats { loss: (sum / b as f64) as f32, correct, targets: b });
        }
        // Every rank has all N logits: the labels of all N samples too (exact as floats: a class
        // index is far below 2^24).
        let mine = &mut label_buf[r * b..(r + 1) * b];
        for (dst, &l) in mine.iter_mut().zip(y) {
            *dst = l as f32;
        }
        group.allgather(&mut label_buf[..n]).map_err(NetError::Group)?;
        for (dst, &v) in labels[..n].iter_mut().zip(&label_buf[..n]) {
            *dst = v as u32;
        }
        own_columns(&last.out, c, b, r, p, own_logits);
        let (sum, correct) = loss.run(&own_logits[..c * b], y, None);
        loss.run(&last.out[..c * n], &labels[..n], Some(&mut last.dout[..c * n]));
        // The gradient of the group's mean loss, times p: see the gradient convention.
        let scale = p as f32;
        for g in &mut last.dout[..c * n] {
            *g *= scale;
        }
        Ok(BatchStats { loss: (sum / b as f64) as f32, correct, targets: b })
    }

    fn backward(
        &mut self,
        params: &[f32],
        grads: &mut [f32],
        values: &[f32],
        b: usize,
    ) -> Result<(), NetError> {
        let (p, r) = (self.group.size().max(1), self.group.rank());
        let n = p * b;
        let Self { stages, group, pool, input, x0, samples, .. } = self;
        for j in (0..stages.len()).rev() {
            let (done, rest) = stages.split_at_mut(j);
            let s = &mut rest[0];
            let prev = done.last();
            let xin: &[f32] = match (&s.kind, prev) {
                (Kind::Local(_), None) if needs_layout(*input) => &x0[..b * input.features()],
                (Kind::Local(_), None) => values,
                (Kind::Split(_), Some(prev)) if prev.is_split() => &prev.out[..s.fin * n],
                (Kind::Split(_), _) => &s.input[..s.fin * n],
                (Kind::Local(_), Some(_)) => &s.input[..s.fin * b],
            };
            let first = j == 0;
            match &mut s.kind {
                Kind::Local(chain) => {
                    let cx = Ctx { pool, batch: b, tokens: &[] };
                    let dx = if first { None } else { Some(&mut s.din[..s.fin * b]) };
                    let (out, dout) = (&s.out[..s.fout * b], &mut s.dout[..s.fout * b]);
                    chain.backward(
                        &cx,
                        &params[s.params.clone()],
                        xin,
                        out,
                        dout,
                        dx,
                        &mut grads[s.params.clone()],
                    );
                }
                Kind::Split(d) => {
                    let cx = Ctx { pool, batch: n, tokens: &[] };
                    let (w, _) = params[s.params.clone()].split_at(d.outputs * d.inputs);
                    let (gw, gb) = grads[s.params.clone()].split_at_mut(d.outputs * d.inputs);
                    gw.fill(0.0);
                    gb.fill(0.0);
                    let at = r * d.k * n..r * d.k * n + d.rows.len() * n;
                    let din = &mut s.din[..];
                    din.fill(0.0);
                    if !d.rows.is_empty() {
                        let w = &w[d.rows.start * d.inputs..d.rows.end * d.inputs];
                        let gw = &mut gw[d.rows.start * d.inputs..d.rows.end * d.inputs];
                        let dx = if first { None } else { Some(&mut din[..d.inputs * n]) };
                        let (y, dy) = (&s.out[at.clone()], &mut s.dout[at]);
                        d.dense.backward_with(&cx, w, xin, y, dy, dx, gw, &mut gb[d.rows.clone()]);
                    }
                }
            }
            let Some(prev) = done.last_mut() else { break };
            // The gradient of the previous stage's output, from this stage's input gradient.
            match (s.is_split(), prev.is_split()) {
                (true, true) => {
                    group.reduce_scatter_sum(&mut s.din).map_err(NetError::Group)?;
                    std::mem::swap(&mut s.din, &mut prev.dout);
                }
                (true, false) => {
                    let f = s.fin;
                    let sm = &mut samples[..n * f];
                    transpose(&s.din[..f * n], f, n, sm);
                    group.reduce_scatter_sum(sm).map_err(NetError::Group)?;
                    transpose(&sm[r * b * f..(r + 1) * b * f], b, f, &mut prev.dout[..f * b]);
                }
                (false, true) => {
                    let f = s.fin;
                    gather_samples(group.as_mut(), &s.din, f, b, false, samples, &mut prev.dout)?;
                }
                (false, false) => {}
            }
        }
        Ok(())
    }
}

/// Allgathers this rank's `b` samples of `f` values into all `N = p·b` samples, feature-major
/// `[f × N]` in `dst`. `src` is sample-major `[b × f]` (`sample_major`, the network's input) or
/// feature-major `[f × b]` (an activation).
fn gather_samples(
    group: &mut dyn Group,
    src: &[f32],
    f: usize,
    b: usize,
    sample_major: bool,
    samples: &mut [f32],
    dst: &mut [f32],
) -> Result<(), NetError> {
    let (p, r) = (group.size().max(1), group.rank());
    let n = p * b;
    let sm = &mut samples[..n * f];
    let mine = &mut sm[r * b * f..(r + 1) * b * f];
    if sample_major {
        mine.copy_from_slice(&src[..b * f]);
    } else {
        transpose(&src[..f * b], f, b, mine);
    }
    group.allgather(sm).map_err(NetError::Group)?;
    transpose(sm, n, f, &mut dst[..f * n]);
    Ok(())
}

/// Copies rank `r`'s `b` columns of the feature-major `[f × p·b]` `src` into `[f × b]` `dst`.
fn own_columns(src: &[f32], f: usize, b: usize, r: usize, p: usize, dst: &mut [f32]) {
    let n = p * b;
    for (row, out) in src[..f * n].chunks_exact(n).zip(dst[..f * b].chunks_exact_mut(b)) {
        out.copy_from_slice(&row[r * b..(r + 1) * b]);
    }
}
