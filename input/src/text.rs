//! Text as training data for a language model: byte-level tokens (each byte of the file is one
//! token, a vocabulary of 256; Shakespeare's text is ASCII, so a token is a character and a loss
//! in nats per token is one in nats per character), cut into windows of `context` tokens whose
//! targets are the next token at every position.
//!
//! A user's text (`source: text`, [`read_text`]) is a UTF-8 file or a folder of `.txt` files read
//! in name order, on a local path or in object storage (`s3://<bucket>/<key or prefix>`), cut
//! into bytes (as above) or into Unicode characters ([`TextTokens::Characters`]: the vocabulary
//! is the text's distinct characters, in code-point order).
//!
//! Guarantees: the split is contiguous and depends only on the text: the first 90 % of the text
//! trains, the rest is held out, and the held-out windows are thinned evenly to at most
//! [`MAX_TEST_WINDOWS`] (so that an evaluation costs a bounded number of tokens: 64 Ki at a
//! context of 128). A text too short for one window is refused with its length and the context;
//! a missing path, an empty text or one that is not UTF-8 is refused naming the file (and, for
//! bad UTF-8, the line and byte). The training windows are sharded over the ranks as every table
//! is ([`super::Loader`]).

use std::io::Read;
use std::path::{Path, PathBuf};

use tandem_api::TextTokens;

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

/// A user's text at `path` (a file, or a folder whose `.txt` files are read in name order) as
/// tokens, with the vocabulary size.
pub fn read_text(path: &Path, tokens: TextTokens) -> Result<(Vec<u32>, usize), DataError> {
    let files: Vec<PathBuf> = if super::store::is_dir(path)? {
        let found = super::stream::shard_files(path, ".txt")?;
        if found.is_empty() {
            return Err(DataError::Config(format!(
                "data.path {}: the folder has no .txt file; put the text in .txt files (read in name order)",
                path.display()
            )));
        }
        found
    } else if super::store::exists(path)? {
        vec![path.to_owned()]
    } else {
        return Err(DataError::Config(format!(
            "data.path {}: no such file or folder; give the UTF-8 text file (or a folder of .txt files) to train on",
            path.display()
        )));
    };
    let mut text = String::new();
    for file in &files {
        let mut bytes = Vec::new();
        super::open(file)?
            .read_to_end(&mut bytes)
            .map_err(|source| DataError::Io { path: file.clone(), source })?;
        match std::str::from_utf8(&bytes) {
            Ok(t) => text.push_str(t),
            Err(e) => {
                let at = e.valid_up_to();
                let line = bytes[..at].iter().filter(|&&b| b == b'\n').count() + 1;
                return Err(super::format_err(
                    file,
                    format!("line {line}"),
                    format!(
                        "byte {at} is not UTF-8; data.source text reads UTF-8: convert the file (for example \
                         `iconv -f LATIN1 -t UTF-8`), or train on it as data.source path"
                    ),
                ));
            }
        }
    }
    if text.is_empty() {
        return Err(DataError::Config(format!(
            "data.path {}: the text is empty; a language model needs text to train on",
            path.display()
        )));
    }
    Ok(match tokens {
        TextTokens::Bytes => (text.bytes().map(u32::from).collect(), BYTE_VOCAB),
        TextTokens::Characters => {
            let mut vocab: Vec<char> = text.chars().collect();
            vocab.sort_unstable();
            vocab.dedup();
            let ids: Vec<u32> =
                text.chars().map(|c| vocab.binary_search(&c).map_or(0, |i| i as u32)).collect();
            (ids, vocab.len())
        }
    })
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
