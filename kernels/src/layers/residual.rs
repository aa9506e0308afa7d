//! A residual connection: `y = post(main(x) + shortcut(x))`, where the shortcut is the identity or
//! a chain of its own (a ResNet projection: 1×1 convolution with stride, then batch norm) and
//! `post` is ReLU (ResNet) or nothing (a pre-LN transformer block).
//!
//! Tensors: the main chain's (unprefixed, so the block's name is theirs: `layer1.0.conv1.weight`),
//! then the shortcut's under its name (`layer1.0.downsample.0.weight`). Backward sends the same
//! gradient down both paths and adds their input gradients. The sums and the ReLU run on all
//! threads, each its part of the values.

use super::chain::join;
use super::simple::par_ranges;
use super::{Chain, Ctx, Layer, LayerTime, Layout, ParamSpec, State, StateSpec};
use crate::pool::SharedMut;

/// `post(main(x) + shortcut(x))`.
pub struct Residual {
    main: Chain,
    shortcut: Option<(String, Chain)>,
    relu: bool,
    /// Main path's output.
    m: Vec<f32>,
    /// Shortcut's output.
    s: Vec<f32>,
    /// A copy of the gradient after `post`, for the second path (the first may overwrite it).
    dz: Vec<f32>,
    /// The shortcut's input gradient.
    dxs: Vec<f32>,
}

impl std::fmt::Debug for Residual {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

impl Residual {
    /// `post(main(x) + shortcut(x))`, the shortcut named `name` (its tensors' prefix) or the
    /// identity when `None`; `relu` applies ReLU after the sum. Errors when the paths' layouts
    /// disagree.
    pub fn new(main: Chain, shortcut: Option<(&str, Chain)>, relu: bool) -> Result<Self, String> {
        let (input, output) = (main.input(), main.output());
        match &shortcut {
            Some((name, s)) if s.input() != input || s.output() != output => {
                return Err(format!(
                    "the shortcut {name} maps {:?} to {:?} but the main path maps {input:?} to {output:?}",
                    s.input(),
                    s.output()
                ));
            }
            None if input != output => {
                return Err(format!(
                    "an identity shortcut needs the main path to keep its layout, but it maps {input:?} to {output:?}; add a projection"
                ));
            }
            _ => {}
        }
        Ok(Self {
            main,
            shortcut: shortcut.map(|(n, c)| (n.to_owned(), c)),
            relu,
            m: Vec::new(),
            s: Vec::new(),
            dz: Vec::new(),
            dxs: Vec::new(),
        })
    }

    fn split_at(&self) -> (usize, usize) {
        (self.main.num_params(), self.main.num_state())
    }
}

fn prefixed(specs: Vec<ParamSpec>, prefix: &str) -> impl Iterator<Item = ParamSpec> {
    specs.into_iter().map(move |mut s| {
        s.name = join(prefix, &s.name);
        s
    })
}

impl Layer for Residual {
    fn describe(&self) -> String {
        let short = match &self.shortcut {
            Some((name, s)) => format!("{name}: [{}]", s.describe()),
            None => "identity".into(),
        };
        format!("residual [{}] + {short}{}", self.main.describe(), if self.relu { ", relu" } else { "" })
    }

    fn input(&self) -> Layout {
        self.main.input()
    }

    fn output(&self) -> Layout {
        self.main.output()
    }

    fn params(&self) -> Vec<ParamSpec> {
        let mut p = self.main.params();
        if let Some((name, s)) = &self.shortcut {
            p.extend(prefixed(s.params(), name));
        }
        p
    }

    fn state(&self) -> Vec<StateSpec> {
        let mut p = self.main.state();
        if let Some((name, s)) = &self.shortcut {
            p.extend(prefixed(s.state(), name));
        }
        p
    }

    fn forward_macs(&self) -> usize {
        self.main.forward_macs() + self.shortcut.as_ref().map_or(0, |(_, s)| s.forward_macs())
    }

    fn backward_macs(&self, input_grad: bool) -> usize {
        self.main.backward_macs(input_grad)
            + self.shortcut.as_ref().map_or(0, |(_, s)| s.backward_macs(input_grad))
    }

    fn set_profiling(&mut self, on: bool) {
        self.main.set_profiling(on);
        if let Some((_, s)) = &mut self.shortcut {
            s.set_profiling(on);
        }
    }

    fn times(&self, prefix: &str, out: &mut Vec<LayerTime>) {
        self.main.times(prefix, out);
        if let Some((name, s)) = &self.shortcut {
            s.times(&join(prefix, name), out);
        }
    }

    fn reserve(&mut self, batch: usize, threads: usize) {
        self.main.reserve(batch, threads);
        let out = batch * self.output().features();
        let inp = batch * self.input().features();
        self.m.resize(out, 0.0);
        self.dz.resize(out, 0.0);
        if let Some((_, s)) = &mut self.shortcut {
            s.reserve(batch, threads);
            self.s.resize(out, 0.0);
            self.dxs.resize(inp, 0.0);
        }
    }

    fn forward(&mut self, cx: &Ctx<'_>, params: &[f32], state: State<'_>, x: &[f32], y: &mut [f32]) {
        let (pm, sm) = self.split_at();
        let n = cx.batch * self.output().features();
        let (main_state, short_state) = match state {
            State::Train(s) => {
                let (a, b) = s.split_at_mut(sm);
                (State::Train(a), State::Train(b))
            }
            State::Eval(s) => {
                let (a, b) = s.split_at(sm);
                (State::Eval(a), State::Eval(b))
            }
        };
        let m = &mut self.m[..n];
        self.main.forward(cx, &params[..pm], main_state, x, m);
        let other: &[f32] = match &mut self.shortcut {
            Some((_, sc)) => {
                let s = &mut self.s[..n];
                sc.forward(cx, &params[pm..], short_state, x, s);
                s
            }
            None => &x[..n],
        };
        let (ys, relu) = (SharedMut::new(&mut y[..n]), self.relu);
        let m = &*m;
        par_ranges(cx.pool, n, |r| {
            // SAFETY: the threads' parts are disjoint.
            let yo = unsafe { ys.range(r.clone()) };
            add_relu(yo, &m[r.clone()], &other[r], relu);
        });
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
        let (pm, _) = self.split_at();
        let n = cx.batch * self.output().features();
        let nin = cx.batch * self.input().features();
        let dy = &mut dy[..n];
        let dz = &mut self.dz[..n];
        let (dys, dzs, relu) = (SharedMut::new(dy), SharedMut::new(dz), self.relu);
        par_ranges(cx.pool, n, |r| {
            // SAFETY: the threads' parts are disjoint.
            let (g, z) = unsafe { (dys.range(r.clone()), dzs.range(r.clone())) };
            if relu {
                relu_mask(g, &y[r]);
            }
            z.copy_from_slice(g);
        });
        let (dy, dz) = (&mut *dy, &mut *dz);
        let (gm, gs) = grads.split_at_mut(pm);
        let mut dx = dx.map(|d| &mut d[..nin]);
        self.main.backward(cx, &params[..pm], x, &self.m[..n], dy, dx.as_deref_mut(), gm);
        match &mut self.shortcut {
            Some((_, sc)) => {
                let dxs = &mut self.dxs[..nin];
                let want = dx.is_some();
                sc.backward(
                    cx,
                    &params[pm..],
                    x,
                    &self.s[..n],
                    dz,
                    if want { Some(&mut *dxs) } else { None },
                    gs,
                );
                if let Some(dx) = dx {
                    add_in_parts(cx, dx, dxs);
                }
            }
            None => {
                if let Some(dx) = dx {
                    add_in_parts(cx, dx, dz);
                }
            }
        }
    }
}

/// `d += s` on all threads.
fn add_in_parts(cx: &Ctx<'_>, d: &mut [f32], s: &[f32]) {
    let ds = SharedMut::new(d);
    par_ranges(cx.pool, s.len(), |r| {
        // SAFETY: the threads' parts are disjoint.
        let part = unsafe { ds.range(r.clone()) };
        add_into(part, &s[r]);
    });
}

crate::simd::multiversion! {
/// `y = relu?(a + b)`.
fn add_relu(y: &mut [f32], a: &[f32], b: &[f32], relu: bool) {
    if relu {
        for ((o, &p), &q) in y.iter_mut().zip(a).zip(b) {
            *o = (p + q).max(0.0);
        }
    } else {
        for ((o, &p), &q) in y.iter_mut().zip(a).zip(b) {
            *o = p + q;
        }
    }
}
}

crate::simd::multiversion! {
/// `g = 0` where the ReLU's output `y` is not positive.
pub(crate) fn relu_mask(g: &mut [f32], y: &[f32]) {
    for (d, &v) in g.iter_mut().zip(y) {
        *d = if v > 0.0 { *d } else { 0.0 };
    }
}
}

crate::simd::multiversion! {
/// `d += s`.
pub(crate) fn add_into(d: &mut [f32], s: &[f32]) {
    for (a, &b) in d.iter_mut().zip(s) {
        *a += b;
    }
}
}
