//! A decoder-only transformer (GPT-2's shape, nanoGPT's parameter names) over token ids:
//! token and position embeddings (`wte`, `wpe`), `layers` pre-LN blocks `h.{i}` of causal
//! self-attention and a GELU MLP, each added to its input (`x + attn(ln_1(x))`,
//! `x + mlp(ln_2(x))`), a final layer norm `ln_f`, and the output projection `lm_head` tied to
//! `wte` (it reads the token table, and its gradient is added to the table's).
//!
//! Block tensors: `h.{i}.ln_1`, `h.{i}.attn.c_attn` (`[3d × d]`: q, k, v), `h.{i}.attn.c_proj`,
//! `h.{i}.ln_2`, `h.{i}.mlp.c_fc` (`[4d × d]`), `h.{i}.mlp.c_proj`. Initialisation as GPT-2's
//! (std 0.02, the residual projections std 0.02/√(2·layers), biases zero), drawn uniform with that
//! standard deviation. The targets are the next tokens, one per position; the loss is the mean
//! cross-entropy per token (nats; perplexity is its exponential).

use crate::layers::{
    CausalSelfAttention, ChainBuilder, Embedding, Gelu, Init, LayerNorm, Layout, Linear, PositionEmbedding,
    Residual,
};
use crate::net::{NetError, Network, NetworkBuilder};

/// A GPT's shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct GptConfig {
    /// Distinct token ids (65 characters of Shakespeare, 256 bytes).
    pub vocab: usize,
    /// Tokens per sample (context length).
    pub context: usize,
    /// Transformer blocks.
    pub layers: usize,
    /// Attention heads per block (must divide `width`).
    pub heads: usize,
    /// Features per token.
    pub width: usize,
}

/// Uniform init with standard deviation `std`.
fn normal_like(std: f32) -> Init {
    Init::Uniform { bound: std * 3.0f32.sqrt() }
}

/// One pre-LN block on `t × d` sequences.
fn block(cfg: &GptConfig) -> Result<crate::layers::Chain, String> {
    let (t, d) = (cfg.context, cfg.width);
    let seq = Layout::Sequence { t, d };
    let w = normal_like(0.02);
    let proj = normal_like(0.02 / (2.0 * cfg.layers as f32).sqrt());
    let attn = ChainBuilder::new(seq)
        .push("c_attn", Linear::new(t, d, 3 * d, true, w))
        .try_push("", CausalSelfAttention::new(t, d, cfg.heads))
        .push("c_proj", Linear::new(t, d, d, true, proj))
        .build()?;
    let mlp = ChainBuilder::new(seq)
        .push("c_fc", Linear::new(t, d, 4 * d, true, w))
        .push("gelu", Gelu::new(Layout::Sequence { t, d: 4 * d }))
        .push("c_proj", Linear::new(t, 4 * d, d, true, proj))
        .build()?;
    let first = ChainBuilder::new(seq).push("ln_1", LayerNorm::new(t, d)).push("attn", attn).build()?;
    let second = ChainBuilder::new(seq).push("ln_2", LayerNorm::new(t, d)).push("mlp", mlp).build()?;
    ChainBuilder::new(seq)
        .try_push("", Residual::new(first, None, false))
        .try_push("", Residual::new(second, None, false))
        .build()
}

/// The GPT `cfg`, on `threads` threads.
pub fn gpt(cfg: GptConfig, threads: usize) -> Result<Network, NetError> {
    let GptConfig { vocab, context: t, layers, heads, width: d } = cfg;
    if vocab < 2 || t == 0 || layers == 0 || d == 0 || heads == 0 {
        return Err(NetError::Build(format!(
            "a GPT needs a vocabulary of at least 2 and a context, layers, heads and width of at least 1, got {cfg:?}"
        )));
    }
    let w = normal_like(0.02);
    let mut b = ChainBuilder::new(Layout::Tokens { t, vocab })
        .push("wte", Embedding::new(t, vocab, d, w))
        .push("wpe", PositionEmbedding::new(t, d, w));
    for i in 0..layers {
        b = b.try_push(&format!("h.{i}"), block(&cfg));
    }
    let b = b.push("ln_f", LayerNorm::new(t, d)).push_tied(
        "lm_head",
        Linear::new(t, d, vocab, false, w),
        "wte.weight",
    );
    NetworkBuilder::from(b).build(threads)
}
