//! The one front-end of `tandem train`, for a job of one process and of many alike: it shows the
//! runner's [`Event`]s — a progress bar (or plain lines when stderr is not a terminal) and a
//! summary, or with `--output json` each event as one JSON line on stdout — and draws their
//! progress as the training curve ([`Curve`]), written into the job's output folder when the job
//! finishes.
//!
//! Guarantees: in JSON mode stdout carries only one JSON object per line, the last one
//! `{"event":"finished",…}` when the job succeeds; the training curve's path comes just before it
//! (`{"event":"curve","path":…}`, or a line on stderr in text mode).

use std::io::{IsTerminal, Write};
use std::path::PathBuf;

use anyhow::anyhow;
use tandem::runner::Event;

use super::curve::Curve;

/// Renders events as they come and collects the curve.
pub struct Display {
    json: bool,
    name: String,
    bar: Option<indicatif::ProgressBar>,
    total: u64,
    curve: Curve,
    title: String,
    output: PathBuf,
    failure: Option<anyhow::Error>,
}

impl Display {
    /// A display for job `name`; `json` selects one JSON object per line. The curve, titled
    /// `title`, goes into `output`.
    pub fn new(name: &str, json: bool, title: String, output: PathBuf) -> Self {
        Self {
            json,
            name: name.to_owned(),
            bar: None,
            total: 0,
            curve: Curve::default(),
            title,
            output,
            failure: None,
        }
    }

    /// Shows one event and records its points on the curve; at `Finished` the curve is written
    /// first.
    pub fn show(&mut self, event: &Event) {
        self.record(event);
        if self.json {
            if let Ok(line) = serde_json::to_string(event) {
                let mut out = std::io::stdout().lock();
                let _ = writeln!(out, "{line}");
                let _ = out.flush();
            }
            return;
        }
        match event {
            Event::Started { processes, total_steps, output, .. } => {
                self.total = *total_steps;
                match processes {
                    1 => eprintln!("{}: training in this process; checkpoints in {output}", self.name),
                    _ => eprintln!(
                        "{}: {processes} processes started; logs and checkpoints in {output}",
                        self.name
                    ),
                }
                if std::io::stderr().is_terminal() {
                    let bar = indicatif::ProgressBar::new(*total_steps);
                    bar.set_style(
                        indicatif::ProgressStyle::with_template(
                            "{bar:40} {pos}/{len} steps {elapsed_precise} eta {eta} {msg}",
                        )
                        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
                    );
                    self.bar = Some(bar);
                }
            }
            Event::Progress { step, loss, accuracy, data_wait, skipped, .. } => {
                let loss = loss.map(|l| format!("loss {l:.4}")).unwrap_or_default();
                let acc = accuracy.map(|a| format!(" test acc {a:.4}")).unwrap_or_default();
                // Shown once it matters: a step that waits on data, a sample that was skipped.
                let wait = if *data_wait >= 0.01 {
                    format!(" waiting on data {:.0}%", data_wait * 100.0)
                } else {
                    String::new()
                };
                let skip = if *skipped > 0 { format!(" {skipped} skipped") } else { String::new() };
                match &self.bar {
                    Some(bar) => {
                        bar.set_position(*step);
                        bar.set_message(format!("{loss}{acc}{wait}{skip}"));
                    }
                    None => eprintln!("step {step}/{}: {loss}{acc}{wait}{skip}", self.total),
                }
            }
            Event::Status { ps, addr } => self.note(&format!(
                "parameter server {ps}: status on http://{addr}{} (Tandem-HMAC proof of the job token, see tandem_api::contract::status_auth)",
                tandem_api::contract::STATUS_PATH
            )),
            Event::Chaos { target, step, action } => {
                let did = if *action == "term" { "sent SIGTERM to" } else { "killed" };
                self.note(&format!("chaos: {did} {target} at step {step}"))
            }
            Event::Restart { message, .. } => self.note(message),
            Event::Stalled { message, .. } => self.note(&format!("stalled: {message}")),
            Event::Unstalled { step } => self.note(&format!("no longer stalled: the step advanced to {step}")),
            Event::Finished {
                test_accuracy,
                test_loss,
                steps,
                samples_per_second,
                wall_seconds,
                restarts,
            } => {
                if let Some(bar) = self.bar.take() {
                    bar.finish_and_clear();
                }
                let loss = test_loss.map(|l| format!(", test loss {l:.4}")).unwrap_or_default();
                let accuracy = match test_accuracy {
                    Some(a) => format!("test accuracy {a:.4}"),
                    None => "no test accuracy reported".to_owned(),
                };
                println!(
                    "{}: {accuracy}{loss} after {steps} steps; \
                     {samples_per_second:.0} samples/s, {wall_seconds:.1} s, {restarts} restart(s)",
                    self.name
                );
            }
        }
    }

    /// Records the event's points on the curve; writes the curve at `Finished`.
    fn record(&mut self, event: &Event) {
        match *event {
            Event::Progress { step, loss, accuracy, .. } => {
                self.curve.record_merged(step, loss, accuracy, None)
            }
            Event::Finished { test_accuracy, test_loss, steps, .. } => {
                self.curve.record_merged(steps, None, test_accuracy, test_loss);
                match self.curve.write(&self.output, &self.title) {
                    Ok(path) => self.show_curve(&path),
                    Err(e) => {
                        self.failure = Some(anyhow!("writing the curve into {}: {e}", self.output.display()))
                    }
                }
            }
            _ => {}
        }
    }

    /// Whether the curve could not be written.
    pub fn finish(self) -> anyhow::Result<()> {
        match self.failure {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn show_curve(&mut self, path: &std::path::Path) {
        if self.json {
            let line = serde_json::json!({"event": "curve", "path": path.display().to_string()});
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
        } else {
            self.note(&format!("training curve written to {}", path.display()));
        }
    }

    /// A line for the person watching (on stderr, above the bar).
    pub fn note(&self, text: &str) {
        match &self.bar {
            Some(bar) => bar.println(text),
            None => eprintln!("{text}"),
        }
    }
}
