//! `report`: the group's progress as the launch contract's progress lines
//! ([`tandem_api::contract::UserProgress`]) in the file `TANDEM_PROGRESS_FILE` names.
//!
//! Guarantees: rank 0 writes, so a script may call `report` on every rank without duplicate
//! lines; each line is one `write` in append mode, so a reader never sees half a line from this
//! process; a value the reader would skip (a non-finite loss, an accuracy outside [0, 1]) is a
//! `ValueError` here instead of a silently missing point.

use std::io::Write;

use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use tandem_api::contract::UserProgress;

use crate::session;

/// Appends one line; returns whether this rank wrote it (rank 0 with a progress file).
pub fn report(
    step: u64,
    loss: Option<f64>,
    accuracy: Option<f64>,
    samples: Option<u64>,
    epoch: Option<u64>,
) -> PyResult<bool> {
    let (rank, file) = session::with_info("report", |i| (i.rank, i.progress_file.clone()))?;
    if let Some(loss) = loss.filter(|l| !l.is_finite()) {
        return Err(PyValueError::new_err(format!(
            "tandem.torch.report(): loss {loss} is not finite; the job's progress takes finite losses only"
        )));
    }
    if let Some(a) = accuracy.filter(|a| !(0.0..=1.0).contains(a)) {
        return Err(PyValueError::new_err(format!(
            "tandem.torch.report(): accuracy {a} is outside [0, 1]; pass a fraction, not a percentage"
        )));
    }
    let Some(path) = file.filter(|_| rank == 0) else { return Ok(false) };
    let line = UserProgress { step, loss, accuracy, samples, epoch }.to_line() + "\n";
    let append = || -> std::io::Result<()> {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::OpenOptions::new().create(true).append(true).open(&path)?.write_all(line.as_bytes())
    };
    append().map_err(|e| {
        PyOSError::new_err(format!(
            "tandem.torch.report(): cannot append to the progress file {} (TANDEM_PROGRESS_FILE): {e}",
            path.display()
        ))
    })?;
    Ok(true)
}
