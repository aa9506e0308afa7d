//! Embeddings of a language model: [`Embedding`] maps token ids to rows of a `[vocab × d]` table
//! (PyTorch's `nn.Embedding`), [`PositionEmbedding`] adds a learned `[t × d]` row per position.
//!
//! The table's gradient is a scatter-add of the output gradient's rows. Threads split the
//! vocabulary (each thread adds the rows of the ids it owns, in token order), so the result does
//! not depend on the thread count.

use super::{Ctx, Init, Layer, Layout, ParamSpec, State};
use crate::pool::{SharedMut, split};

/// Token ids `[batch × t]` to a token-major sequence `[batch·t × d]`: `y[n] = W[token[n]]`.
#[derive(Debug)]
pub struct Embedding {
    t: usize,
    vocab: usize,
    d: usize,
    init: Init,
}

impl Embedding {
    /// A `vocab × d` table for sequences of `t` tokens; rows start as `init`.
    pub fn new(t: usize, vocab: usize, d: usize, init: Init) -> Self {
        Self { t, vocab, d, init }
    }
}

impl Layer for Embedding {
    fn describe(&self) -> String {
        format!("embedding {}×{}", self.vocab, self.d)
    }

    fn input(&self) -> Layout {
        Layout::Tokens { t: self.t, vocab: self.vocab }
    }

    fn output(&self) -> Layout {
        Layout::Sequence { t: self.t, d: self.d }
    }

    fn params(&self) -> Vec<ParamSpec> {
        vec![ParamSpec::new("weight", &[self.vocab, self.d], self.init)]
    }

    fn reserve(&mut self, _batch: usize, _threads: usize) {}

    fn forward(&mut self, cx: &Ctx<'_>, params: &[f32], _state: State<'_>, _x: &[f32], y: &mut [f32]) {
        let (n, d) = (cx.batch * self.t, self.d);
        let threads = cx.pool.threads();
        let out = SharedMut::new(y);
        cx.pool.run(|tid| {
            let r = split(n, tid, threads);
            // SAFETY: the threads' token ranges are disjoint.
            let yo = unsafe { out.range(r.start * d..r.end * d) };
            for (row, &tok) in yo.chunks_exact_mut(d).zip(&cx.tokens[r]) {
                let at = tok as usize * d;
                row.copy_from_slice(&params[at..at + d]);
            }
        });
    }

    fn backward(
        &mut self,
        cx: &Ctx<'_>,
        _params: &[f32],
        _x: &[f32],
        _y: &[f32],
        dy: &mut [f32],
        _dx: Option<&mut [f32]>,
        grads: &mut [f32],
    ) {
        let (n, d, vocab) = (cx.batch * self.t, self.d, self.vocab);
        let threads = cx.pool.threads();
        let out = SharedMut::new(grads);
        let dy = &*dy;
        cx.pool.run(|tid| {
            let ids = split(vocab, tid, threads);
            // SAFETY: the threads' id ranges, hence their rows of the table, are disjoint.
            let g = unsafe { out.range(ids.start * d..ids.end * d) };
            g.fill(0.0);
            for (row, &tok) in dy[..n * d].chunks_exact(d).zip(cx.tokens) {
                let tok = tok as usize;
                if ids.contains(&tok) {
                    let at = (tok - ids.start) * d;
                    super::residual::add_into(&mut g[at..at + d], row);
                }
            }
        });
    }
}

/// Adds a learned vector per position to a token-major sequence: `y[b, i] = x[b, i] + P[i]`.
#[derive(Debug)]
pub struct PositionEmbedding {
    t: usize,
    d: usize,
    init: Init,
}

impl PositionEmbedding {
    /// A `t × d` table; rows start as `init`.
    pub fn new(t: usize, d: usize, init: Init) -> Self {
        Self { t, d, init }
    }
}

impl Layer for PositionEmbedding {
    fn describe(&self) -> String {
        format!("position embedding {}×{}", self.t, self.d)
    }

    fn input(&self) -> Layout {
        Layout::Sequence { t: self.t, d: self.d }
    }

    fn output(&self) -> Layout {
        self.input()
    }

    fn params(&self) -> Vec<ParamSpec> {
        vec![ParamSpec::new("weight", &[self.t, self.d], self.init)]
    }

    fn reserve(&mut self, _batch: usize, _threads: usize) {}

    fn forward(&mut self, cx: &Ctx<'_>, params: &[f32], _state: State<'_>, x: &[f32], y: &mut [f32]) {
        let (td, batch) = (self.t * self.d, cx.batch);
        let threads = cx.pool.threads();
        let out = SharedMut::new(y);
        cx.pool.run(|tid| {
            let r = split(batch, tid, threads);
            // SAFETY: the threads' samples are disjoint.
            let yo = unsafe { out.range(r.start * td..r.end * td) };
            for (ys, xs) in yo.chunks_exact_mut(td).zip(x[r.start * td..r.end * td].chunks_exact(td)) {
                for ((o, &a), &p) in ys.iter_mut().zip(xs).zip(&params[..td]) {
                    *o = a + p;
                }
            }
        });
    }

    fn backward(
        &mut self,
        cx: &Ctx<'_>,
        _params: &[f32],
        _x: &[f32],
        _y: &[f32],
        dy: &mut [f32],
        dx: Option<&mut [f32]>,
        grads: &mut [f32],
    ) {
        let (t, d, batch) = (self.t, self.d, cx.batch);
        let threads = cx.pool.threads();
        let out = SharedMut::new(grads);
        let dys = &*dy;
        cx.pool.run(|tid| {
            let pos = split(t, tid, threads);
            // SAFETY: the threads' positions, hence their rows of the table, are disjoint.
            let g = unsafe { out.range(pos.start * d..pos.end * d) };
            g.fill(0.0);
            for b in 0..batch {
                let at = (b * t + pos.start) * d;
                super::residual::add_into(g, &dys[at..at + g.len()]);
            }
        });
        if let Some(dx) = dx {
            dx[..batch * t * d].copy_from_slice(&dy[..batch * t * d]);
        }
    }
}
