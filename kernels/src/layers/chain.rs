//! Layers in sequence, as one layer: the body of a network, a ResNet block's main path, a
//! transformer block.
//!
//! A chain owns the activations between its layers (and their gradients); its first layer reads
//! the chain's input and its last layer writes the chain's output in place, so nesting chains adds
//! no copies. Parameter and state tensors are its layers' in order, named `<layer>.<tensor>`
//! (a layer with an empty name adds no prefix, so a residual wrapper can stay invisible in the
//! names: `h.0.ln_1.weight`, not `h.0.0.ln_1.weight`).
//!
//! Weight tying ([`ChainBuilder::push_tied`]): a layer may read an earlier tensor of the same chain
//! instead of owning parameters (a language model's output projection reading the token
//! embedding). Its gradient goes to a scratch buffer and is added to the tensor's gradient after
//! the chain's backward pass, so the tensor's slice holds the sum of both uses.

use std::ops::Range;

use std::time::Instant;

use super::{Ctx, Init, Layer, LayerTime, Layout, ParamSpec, State, StateSpec};

/// One tensor's place in a flat vector.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Entry {
    /// `<layer>.<tensor>`, nested layers joined by dots (`layer1.0.conv1.weight`).
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

impl Entry {
    /// The entry's values in a flat vector.
    pub fn range(&self) -> Range<usize> {
        self.offset..self.offset + self.len
    }
}

/// Layers with their names, in order: a chain's body taken apart ([`Chain::into_layers`]).
pub type NamedLayers = Vec<(String, Box<dyn Layer>)>;

struct Node {
    name: String,
    layer: Box<dyn Layer>,
    params: Range<usize>,
    state: Range<usize>,
    /// For a layer tied to an earlier tensor: its gradient, added to the tensor's after backward.
    tied: Option<Vec<f32>>,
}

/// `prefix.name`, leaving out empty parts.
pub(crate) fn join(prefix: &str, name: &str) -> String {
    match (prefix.is_empty(), name.is_empty()) {
        (true, _) => name.to_owned(),
        (_, true) => prefix.to_owned(),
        _ => format!("{prefix}.{name}"),
    }
}

/// Builds a [`Chain`] layer by layer; the first error is kept and returned by
/// [`ChainBuilder::build`].
pub struct ChainBuilder {
    input: Layout,
    nodes: Vec<Node>,
    params: Vec<Entry>,
    state: Vec<Entry>,
    error: Option<String>,
}

impl ChainBuilder {
    /// A chain whose input has `input`'s layout.
    pub fn new(input: Layout) -> Self {
        Self { input, nodes: Vec::new(), params: Vec::new(), state: Vec::new(), error: None }
    }

    /// The output layout of the chain so far.
    pub fn output(&self) -> Layout {
        self.nodes.last().map_or(self.input, |n| n.layer.output())
    }

    fn fail(mut self, msg: String) -> Self {
        if self.error.is_none() {
            self.error = Some(msg);
        }
        self
    }

    fn check_input(&self, name: &str, layer: &dyn Layer) -> Result<(), String> {
        let previous = self.output();
        if layer.input() != previous {
            return Err(format!(
                "layer {} ({}) takes {:?} but the previous layer produces {previous:?}",
                if name.is_empty() { "(unnamed)" } else { name },
                layer.describe(),
                layer.input()
            ));
        }
        Ok(())
    }

    /// Appends `layer` under `name` (may be empty: no prefix for its tensors).
    pub fn push(self, name: &str, layer: impl Layer + 'static) -> Self {
        self.push_boxed(name, Box::new(layer))
    }

    /// [`ChainBuilder::push`] for a boxed layer.
    pub fn push_boxed(mut self, name: &str, layer: Box<dyn Layer>) -> Self {
        if self.error.is_some() {
            return self;
        }
        if let Err(e) = self.check_input(name, layer.as_ref()) {
            return self.fail(e);
        }
        let p0 = self.params.last().map_or(0, |e| e.offset + e.len);
        let s0 = self.state.last().map_or(0, |e| e.offset + e.len);
        let (mut p, mut s) = (p0, s0);
        for spec in layer.params() {
            let len = spec.len();
            self.params.push(Entry {
                name: join(name, &spec.name),
                shape: spec.shape,
                offset: p,
                len,
                init: spec.init,
            });
            p += len;
        }
        for spec in layer.state() {
            let len = spec.len();
            self.state.push(Entry {
                name: join(name, &spec.name),
                shape: spec.shape,
                offset: s,
                len,
                init: spec.init,
            });
            s += len;
        }
        self.nodes.push(Node { name: name.to_owned(), layer, params: p0..p, state: s0..s, tied: None });
        self
    }

    /// Appends a layer built by a fallible constructor (its error becomes the chain's).
    pub fn try_push<L: Layer + 'static>(self, name: &str, layer: Result<L, String>) -> Self {
        match layer {
            Ok(l) => self.push(name, l),
            Err(e) => self.fail(format!("layer {name}: {e}")),
        }
    }

    /// Appends `layer`, whose one parameter tensor is the chain's existing tensor `tensor` (same
    /// shape): weight tying. The layer owns no parameters; its gradient is added to the tensor's.
    pub fn push_tied(mut self, name: &str, layer: impl Layer + 'static, tensor: &str) -> Self {
        if self.error.is_some() {
            return self;
        }
        if let Err(e) = self.check_input(name, &layer) {
            return self.fail(e);
        }
        let specs = layer.params();
        let Some(target) = self.params.iter().find(|e| e.name == tensor).cloned() else {
            return self.fail(format!("layer {name} is tied to {tensor}, which no earlier layer has"));
        };
        match specs.as_slice() {
            [only] if only.shape == target.shape => {}
            _ => {
                let shapes: Vec<&[usize]> = specs.iter().map(|s| s.shape.as_slice()).collect();
                return self.fail(format!(
                    "layer {name} has parameters of shapes {shapes:?}; to tie it to {tensor} it needs exactly one of shape {:?}",
                    target.shape
                ));
            }
        }
        if !layer.state().is_empty() {
            return self.fail(format!("layer {name} has state and cannot be tied"));
        }
        let s = self.state.last().map_or(0, |e| e.offset + e.len);
        self.nodes.push(Node {
            name: name.to_owned(),
            layer: Box::new(layer),
            params: target.range(),
            state: s..s,
            tied: Some(Vec::new()),
        });
        self
    }

    /// The chain. Errors when a layer did not fit or the chain is empty.
    pub fn build(self) -> Result<Chain, String> {
        if let Some(e) = self.error {
            return Err(e);
        }
        if self.nodes.is_empty() {
            return Err("a chain needs at least one layer".into());
        }
        let output = self.output();
        Ok(Chain {
            input: self.input,
            output,
            nodes: self.nodes,
            params: self.params,
            state: self.state,
            mid: Vec::new(),
            dmid: Vec::new(),
            capacity: 0,
            times: None,
        })
    }
}

/// Layers in sequence, as one layer.
pub struct Chain {
    input: Layout,
    output: Layout,
    nodes: Vec<Node>,
    params: Vec<Entry>,
    state: Vec<Entry>,
    /// `mid[i]`: output of layer i (input of layer i + 1), for all but the last layer.
    mid: Vec<Vec<f32>>,
    dmid: Vec<Vec<f32>>,
    capacity: usize,
    /// While profiling: per layer, forward seconds, backward seconds and forward calls.
    times: Option<Vec<(f64, f64, usize)>>,
}

impl std::fmt::Debug for Chain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Chain").field("layers", &self.describe_layers()).finish()
    }
}

impl Chain {
    /// Parameter tensors in flat order, offsets relative to the chain's slice.
    pub fn param_entries(&self) -> &[Entry] {
        &self.params
    }

    /// State tensors in flat order, offsets relative to the chain's slice.
    pub fn state_entries(&self) -> &[Entry] {
        &self.state
    }

    /// Length of the chain's parameter slice.
    pub fn num_params(&self) -> usize {
        self.params.last().map_or(0, |e| e.offset + e.len)
    }

    /// Length of the chain's state slice.
    pub fn num_state(&self) -> usize {
        self.state.last().map_or(0, |e| e.offset + e.len)
    }

    /// The chain's input layout and its layers with their names, in order, for a network that
    /// runs them differently ([`crate::split`]). Errors for a chain with a tied layer, whose
    /// parameters are another layer's.
    pub fn into_layers(self) -> Result<(Layout, NamedLayers), String> {
        if let Some(n) = self.nodes.iter().find(|n| n.tied.is_some()) {
            return Err(format!("layer {} reads another layer's weights (weight tying)", n.name));
        }
        Ok((self.input, self.nodes.into_iter().map(|n| (n.name, n.layer)).collect()))
    }

    /// One line per layer: `name: description`.
    pub fn describe_layers(&self) -> Vec<String> {
        self.nodes.iter().map(|n| format!("{}: {}", n.name, n.layer.describe())).collect()
    }
}

fn sub_state<'s>(state: &'s mut State<'_>, r: Range<usize>) -> State<'s> {
    match state {
        State::Train(s) => State::Train(&mut s[r]),
        State::Eval(s) => State::Eval(&s[r]),
    }
}

impl Layer for Chain {
    fn describe(&self) -> String {
        self.describe_layers().join(", ")
    }

    fn input(&self) -> Layout {
        self.input
    }

    fn output(&self) -> Layout {
        self.output
    }

    fn params(&self) -> Vec<ParamSpec> {
        self.params
            .iter()
            .map(|e| ParamSpec { name: e.name.clone(), shape: e.shape.clone(), init: e.init })
            .collect()
    }

    fn state(&self) -> Vec<StateSpec> {
        self.state
            .iter()
            .map(|e| ParamSpec { name: e.name.clone(), shape: e.shape.clone(), init: e.init })
            .collect()
    }

    fn forward_macs(&self) -> usize {
        self.nodes.iter().map(|n| n.layer.forward_macs()).sum()
    }

    fn backward_macs(&self, input_grad: bool) -> usize {
        self.nodes.iter().enumerate().map(|(i, n)| n.layer.backward_macs(i > 0 || input_grad)).sum()
    }

    fn set_profiling(&mut self, on: bool) {
        self.times = on.then(|| vec![(0.0, 0.0, 0); self.nodes.len()]);
        for n in &mut self.nodes {
            n.layer.set_profiling(on);
        }
    }

    fn times(&self, prefix: &str, out: &mut Vec<LayerTime>) {
        let Some(times) = &self.times else { return };
        for (n, &(forward, backward, calls)) in self.nodes.iter().zip(times) {
            let name = join(prefix, &n.name);
            let at = out.len();
            n.layer.times(&name, out);
            let leaf = out.len() == at;
            out.insert(at, LayerTime { name, kind: n.layer.describe(), leaf, forward, backward, calls });
        }
    }

    fn reserve(&mut self, batch: usize, threads: usize) {
        for n in &mut self.nodes {
            n.layer.reserve(batch, threads);
            if let Some(scratch) = &mut n.tied {
                scratch.resize(n.params.len(), 0.0);
            }
        }
        if batch > self.capacity {
            let boundaries = &self.nodes[..self.nodes.len() - 1];
            self.mid = boundaries.iter().map(|n| vec![0.0; batch * n.layer.output().features()]).collect();
            self.dmid = boundaries.iter().map(|n| vec![0.0; batch * n.layer.output().features()]).collect();
            self.capacity = batch;
        }
    }

    fn forward(&mut self, cx: &Ctx<'_>, params: &[f32], state: State<'_>, x: &[f32], y: &mut [f32]) {
        let mut state = state;
        let last = self.nodes.len() - 1;
        for (i, node) in self.nodes.iter_mut().enumerate() {
            let (done, rest) = self.mid.split_at_mut(i);
            let xi: &[f32] =
                if i == 0 { x } else { &done[i - 1][..cx.batch * node.layer.input().features()] };
            let out = cx.batch * node.layer.output().features();
            let yi: &mut [f32] = if i == last { &mut *y } else { &mut rest[0][..out] };
            let s = sub_state(&mut state, node.state.clone());
            let t0 = self.times.as_ref().map(|_| Instant::now());
            node.layer.forward(cx, &params[node.params.clone()], s, xi, yi);
            if let (Some(t0), Some(times)) = (t0, self.times.as_mut()) {
                times[i].0 += t0.elapsed().as_secs_f64();
                times[i].2 += 1;
            }
        }
    }

    fn backward(
        &mut self,
        cx: &Ctx<'_>,
        params: &[f32],
        x: &[f32],
        y: &[f32],
        dy: &mut [f32],
        dx: Option<&mut [f32]>,
        grads: &mut [f32],
    ) {
        let Self { nodes, mid, dmid, times, .. } = self;
        let last = nodes.len() - 1;
        let mut dx = dx;
        for (i, node) in nodes.iter_mut().enumerate().rev() {
            let fin = cx.batch * node.layer.input().features();
            let fout = cx.batch * node.layer.output().features();
            let xi: &[f32] = if i == 0 { x } else { &mid[i - 1][..fin] };
            let yi: &[f32] = if i == last { y } else { &mid[i][..fout] };
            let (below, above) = dmid.split_at_mut(i);
            let dyi: &mut [f32] = if i == last { &mut *dy } else { &mut above[0][..fout] };
            let dxi: Option<&mut [f32]> =
                if i == 0 { dx.as_deref_mut() } else { Some(&mut below[i - 1][..fin]) };
            let p = &params[node.params.clone()];
            let t0 = times.as_ref().map(|_| Instant::now());
            match &mut node.tied {
                Some(scratch) => node.layer.backward(cx, p, xi, yi, dyi, dxi, scratch),
                None => node.layer.backward(cx, p, xi, yi, dyi, dxi, &mut grads[node.params.clone()]),
            }
            if let (Some(t0), Some(times)) = (t0, times.as_mut()) {
                times[i].1 += t0.elapsed().as_secs_f64();
            }
        }
        for node in nodes.iter() {
            if let Some(scratch) = &node.tied {
                for (g, &v) in grads[node.params.clone()].iter_mut().zip(scratch) {
                    *g += v;
                }
            }
        }
    }
}
