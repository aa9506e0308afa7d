//! MNIST's IDX format (optionally gzipped): an images file (magic 2051, u8 N×H×W) and a labels
//! file (magic 2049, u8 N).
//!
//! Guarantees: a wrong magic number, a header that ends early, a file shorter than its header
//! promises, or a label out of range is refused with an error naming the file and the record.

use std::io::Read;
use std::path::Path;

use super::{DataError, Dataset, InputShape, format_err, open};

/// IDX magic numbers (big-endian): unsigned bytes, 3 dimensions (images) or 1 (labels).
const IDX_IMAGES: u32 = 0x0000_0803;
const IDX_LABELS: u32 = 0x0000_0801;

fn read_idx_file(path: &Path, magic: u32) -> Result<(Vec<usize>, Vec<u8>), DataError> {
    let mut bytes = Vec::new();
    open(path)?.read_to_end(&mut bytes).map_err(|e| {
        format_err(path, "record 1".into(), format!("cannot decompress ({e}): truncated or corrupt file"))
    })?;
    let word = |i: usize| -> Option<u32> {
        bytes.get(4 * i..4 * i + 4).map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    };
    let found = word(0).ok_or_else(|| format_err(path, "header".into(), "shorter than an IDX header"))?;
    if found != magic {
        return Err(format_err(
            path,
            "header".into(),
            format!(
                "magic number {found:#010x}, expected {magic:#010x} (IDX {})",
                if magic == IDX_IMAGES { "images" } else { "labels" }
            ),
        ));
    }
    let ndims = (magic & 0xff) as usize;
    let dims: Vec<usize> = (1..=ndims)
        .map(|i| word(i).map(|d| d as usize))
        .collect::<Option<_>>()
        .ok_or_else(|| format_err(path, "header".into(), "header ends before its dimensions"))?;
    let start = 4 * (1 + ndims);
    let record: usize = dims[1..].iter().product();
    let body = &bytes[start..];
    if body.len() < dims[0] * record {
        let complete = body.len() / record.max(1);
        return Err(format_err(
            path,
            format!("record {}", complete + 1),
            format!(
                "file ends early: header promises {} records, only {complete} are complete (truncated?)",
                dims[0]
            ),
        ));
    }
    let body = body[..dims[0] * record].to_vec();
    Ok((dims, body))
}

/// Reads an MNIST-format pair of IDX files (optionally gzipped): images (magic 2051, u8 N×H×W) and
/// labels (magic 2049, u8 N), with `classes` classes.
pub fn read_idx(images: &Path, labels: &Path, classes: usize) -> Result<Dataset, DataError> {
    let (dims, pixels) = read_idx_file(images, IDX_IMAGES)?;
    let (ldims, lab) = read_idx_file(labels, IDX_LABELS)?;
    if ldims[0] != dims[0] {
        return Err(DataError::Config(format!(
            "{} has {} images but {} has {} labels",
            images.display(),
            dims[0],
            labels.display(),
            ldims[0]
        )));
    }
    if let Some(i) = lab.iter().position(|&l| l as usize >= classes) {
        return Err(format_err(
            labels,
            format!("record {}", i + 1),
            format!("label {} is out of range [0, {classes})", lab[i]),
        ));
    }
    Ok(Dataset::classified(
        images.display().to_string(),
        InputShape { channels: 1, height: dims[1], width: dims[2] },
        classes,
        pixels.iter().map(|&p| p as f32 / 255.0).collect(),
        lab.iter().map(|&l| l as u32).collect(),
    ))
}
