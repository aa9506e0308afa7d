//! CSV files (optionally gzipped) of numeric features and an integer label per line, read whole
//! ([`read_csv`]) or one row at a time ([`CsvReader`], what the streamed source uses).
//!
//! Guarantees: a first line that is not all numbers is taken as a header and skipped; empty lines
//! are skipped; a line with the wrong number of columns, a value that is not a number, or a label
//! out of range is refused with an error naming the file and the line.

use std::io::{BufRead, BufReader, Lines};
use std::path::{Path, PathBuf};

use super::{DataError, Dataset, InputShape, format_err, open};

/// How to read a CSV file.
#[derive(Clone, Debug, PartialEq)]
pub struct CsvOptions {
    /// Zero-based label column; `None` means the last one.
    pub label_column: Option<usize>,
    /// Number of classes; labels must lie in `[0, classes)`. `None`: labels must lie in
    /// `[0, MAX_CLASSES)` and the class count is the largest label + 1.
    pub classes: Option<usize>,
    /// Divide feature values by this (e.g. 255 for 8-bit pixels).
    pub scale: f32,
    /// Sample shape; `None`: a square image when the feature count is a square, else 1×1×n.
    pub shape: Option<InputShape>,
}

/// Largest class count accepted when a CSV's classes are not known in advance.
pub const MAX_CLASSES: usize = 1000;

fn square_shape(features: usize) -> InputShape {
    let side = (features as f64).sqrt().round() as usize;
    if side * side == features {
        InputShape { channels: 1, height: side, width: side }
    } else {
        InputShape { channels: 1, height: 1, width: features }
    }
}

/// Reads the rows of one CSV file in order, checking each as [`read_csv`] does.
pub struct CsvReader {
    path: PathBuf,
    lines: Lines<BufReader<Box<dyn std::io::Read + Send>>>,
    line: usize,
    rows: usize,
    columns: Option<usize>,
    opts: CsvOptions,
    row: Vec<f32>,
}

impl std::fmt::Debug for CsvReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CsvReader").field("path", &self.path).field("line", &self.line).finish()
    }
}

impl CsvReader {
    /// Opens `path` (decompressing a `.gz`).
    pub fn open(path: &Path, opts: &CsvOptions) -> Result<Self, DataError> {
        Ok(Self {
            path: path.to_owned(),
            lines: BufReader::new(open(path)?).lines(),
            line: 0,
            rows: 0,
            columns: opts.shape.map(|s| s.features() + 1),
            opts: opts.clone(),
            row: Vec::new(),
        })
    }

    /// Columns per line (features and label), once the first row was read.
    pub fn columns(&self) -> Option<usize> {
        self.columns
    }

    /// Appends the next row's features (scaled) to `features` and returns its label; `None` at the
    /// end of the file.
    pub fn next_row(&mut self, features: &mut Vec<f32>) -> Result<Option<u32>, DataError> {
        let path = self.path.as_path();
        let max_classes = self.opts.classes.unwrap_or(MAX_CLASSES);
        loop {
            let Some(line) = self.lines.next() else { return Ok(None) };
            self.line += 1;
            let n = self.line;
            let place = || format!("line {n}");
            let line = line.map_err(|e| {
                let why = if e.kind() == std::io::ErrorKind::UnexpectedEof {
                    "file ends early (truncated download?); delete it and run `make data` again".to_owned()
                } else {
                    e.to_string()
                };
                format_err(path, place(), why)
            })?;
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            self.row.clear();
            let mut bad = None;
            for (c, field) in line.split(',').enumerate() {
                match field.trim().parse::<f32>() {
                    Ok(v) if v.is_finite() => self.row.push(v),
                    _ => {
                        bad = Some((c, field.to_owned()));
                        break;
                    }
                }
            }
            if let Some((c, field)) = bad {
                if n == 1 && self.rows == 0 {
                    continue; // header
                }
                return Err(format_err(
                    path,
                    place(),
                    format!("column {} is {field:?}, not a number", c + 1),
                ));
            }
            let expected = *self.columns.get_or_insert(self.row.len());
            if self.row.len() != expected {
                return Err(format_err(
                    path,
                    place(),
                    format!(
                        "has {} columns, expected {expected} like the lines before (truncated file?)",
                        self.row.len()
                    ),
                ));
            }
            if expected < 2 {
                return Err(format_err(
                    path,
                    place(),
                    "needs at least one feature column and a label column",
                ));
            }
            let lc = self.opts.label_column.unwrap_or(expected - 1);
            if lc >= expected {
                return Err(DataError::Config(format!(
                    "{}: label column {lc} does not exist, lines have {expected} columns (0-based index)",
                    path.display()
                )));
            }
            let label = self.row[lc];
            if label < 0.0 || label.fract() != 0.0 || label as usize >= max_classes {
                return Err(format_err(
                    path,
                    place(),
                    format!(
                        "label {label} in column {} is out of range: labels are integers in [0, {max_classes})",
                        lc + 1
                    ),
                ));
            }
            let scale = self.opts.scale;
            features.extend(self.row.iter().enumerate().filter(|&(c, _)| c != lc).map(|(_, &v)| v / scale));
            self.rows += 1;
            return Ok(Some(label as u32));
        }
    }
}

/// Reads a CSV file (optionally gzipped) of numeric features and an integer label per line. A first
/// line that is not all numbers is taken as a header and skipped; empty lines are skipped.
pub fn read_csv(path: &Path, opts: &CsvOptions) -> Result<Dataset, DataError> {
    let mut reader = CsvReader::open(path, opts)?;
    let mut features = Vec::new();
    let mut labels = Vec::new();
    while let Some(label) = reader.next_row(&mut features)? {
        labels.push(label);
    }
    let Some(columns) = reader.columns().filter(|_| !labels.is_empty()) else {
        return Err(format_err(path, "line 1".into(), "no data rows"));
    };
    let shape = opts.shape.unwrap_or_else(|| square_shape(columns - 1));
    let classes = opts.classes.unwrap_or_else(|| labels.iter().max().map_or(0, |&m| m as usize + 1));
    Ok(Dataset::classified(path.display().to_string(), shape, classes, features, labels))
}
