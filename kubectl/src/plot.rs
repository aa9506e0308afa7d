//! `kubectl tandem plot NAME`: the training curve from the job's `status.history` (the points the
//! operator read from parameter server 0, see `tandem_api::TrainingJobStatus::record_history`),
//! drawn on the terminal and written as SVG or CSV by `tandem_curve`, the code that draws
//! `tandem train`'s curve.

use std::io::Write;
use std::path::Path;

use kube::Client;
use tandem_curve::Curve;

use crate::Error;
use crate::job;

/// Draws job `name`'s curve: `chart` (columns, rows per panel) on `out` unless `None`, and the file
/// `output` (`.svg` or `.csv`).
pub async fn show(
    client: &Client,
    namespace: &str,
    name: &str,
    output: &Path,
    chart: Option<(usize, usize)>,
    out: &mut (dyn Write + Send),
    notes: &mut (dyn Write + Send),
) -> Result<(), Error> {
    let format = output.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
    if !matches!(format.as_deref(), Some("svg" | "csv")) {
        return Err(Error::OutputFormat(output.to_owned()));
    }
    let job = job::find(client, namespace, name).await?;
    let status = job.status.unwrap_or_default();
    let mut curve = Curve::default();
    for p in &status.history {
        curve.record_merged(p.step, p.loss, p.accuracy, None);
    }
    if status.history.is_empty()
        && let Some(p) = &status.progress
    {
        curve.record_merged(p.step, p.loss, p.accuracy, None);
    }
    if curve.train.is_empty() && curve.test.is_empty() {
        let why = if job.spec.parameter_servers.replicas == 0 {
            "jobs without a parameter server (algorithm allreduce) report no progress to the operator"
                .to_owned()
        } else {
            let phase = status.phase.map_or_else(|| "none yet".to_owned(), |p| format!("{p:?}"));
            format!(
                "nothing was reported yet (phase: {phase}); the operator reads the progress from parameter server 0 \
                 every 10 s while the job runs"
            )
        };
        return Err(Error::NoCurve(format!(
            "TrainingJob {name:?} has no training curve in its status: {why}"
        )));
    }
    let title = format!("{namespace}/{name}");
    let text = if format.as_deref() == Some("csv") { curve.to_csv() } else { curve.to_svg(&title) };
    std::fs::write(output, text).map_err(|source| Error::Write { path: output.to_owned(), source })?;
    if let Some((width, height)) = chart {
        writeln!(out, "{title}: {} points", status.history.len().max(1))?;
        out.write_all(curve.to_text(width, height).as_bytes())?;
    }
    writeln!(notes, "wrote {}", output.display())?;
    Ok(())
}
