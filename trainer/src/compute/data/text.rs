//! Text as training data for a language model: byte-level tokens (each byte of the file is one
//! token, a vocabulary of 256; Shakespeare's text is ASCII, so a token is a character and a loss
//! in nats per token is one in nats per character), cut into windows of `context` tokens whose
//! targets are the next token at every position.
//!
//! Guarantees: the split is contiguous and depends only on the text: the first 90 % of the text
//! trains, the rest is held out, and the held-out windows are thinned evenly to at most
//! [`MAX_TEST_WINDOWS`] (so that an evaluation costs a bounded number of tokens: 64 Ki at a
//! context of 128). A text too short for one window is refused with its length and the context.

use std::io::Read;
use std::path::Path;

use super::split::Splits;
use super::{DataError, Dataset, InputShape};

/// Distinct byte-level tokens.
pub const BYTE_VOCAB: usize = 256;

/// Most windows of the held-out split.
pub const MAX_TEST_WINDOWS: usize = 512;

/// The bytes of the text file at `path` (gzip-decompressed when its name ends in `.gz`) as tokens.
pub fn read_bytes(path: &Path) -> Result<Vec<u32>, DataError> {
    let mut bytes = Vec::new();
    super::open(path)?
        .read_to_end(&mut bytes)
        .map_err(|e| DataError::Io { path: path.to_owned(), source: e })?;
    Ok(bytes.into_iter().map(u32::from).collect())
}

/// The windows `stream[k·t .. k·t + t]` of `t = context` tokens, each with the next `t` tokens
/// as its targets.
pub fn windows(stream: &[u32], context: usize, vocab: usize, name: String) -> Dataset {
    let t = context.max(1);
    let n = stream.len().saturating_sub(1) / t;
    let mut features = Vec::with_capacity(n * t);
    let mut labels = Vec::with_capacity(n * t);
    for k in 0..n {
        features.extend(stream[k * t..k * t + t].iter().map(|&id| id as f32));
        labels.extend_from_slice(&stream[k * t + 1..k * t + t + 1]);
    }
    Dataset {
        name,
        shape: InputShape { channels: 1, height: 1, width: t },
        classes: vocab,
        features,
        labels,
        positions: t,
    }
}

/// The training and held-out windows of `stream` (see the module documentation).
pub fn split_text(stream: &[u32], context: usize, vocab: usize, name: &str) -> Result<Splits, DataError> {
    let cut = stream.len() / 10 * 9;
    let train = windows(&stream[..cut], context, vocab, format!("{name} (first 90 %)"));
    let held = windows(&stream[cut..], context, vocab, format!("{name} (last 10 %)"));
    if train.is_empty() || held.is_empty() {
        return Err(DataError::Config(format!(
            "{name}: {} tokens are too few for windows of model.context {context} in both a 90 % training \
             and a 10 % held-out part; lower model.context",
            stream.len()
        )));
    }
    let stride = held.len().div_ceil(MAX_TEST_WINDOWS);
    let picked: Vec<u32> = (0..held.len()).step_by(stride).map(|i| i as u32).collect();
    Ok(Splits { train, test: held.select(&picked) })
}
