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

/// Shown once it matters: a step that waits on data, a sample that was skipped.
fn extras(data_wait: f64, skipped: u64) -> String {
    let wait =
        if data_wait >= 0.01 { format!(" waiting on data {:.0}%", data_wait * 100.0) } else { String::new() };
    let skip = if skipped > 0 { format!(" {skipped} skipped") } else { String::new() };
    format!("{wait}{skip}")
}

/// The plain line of a progress report, when stderr is not a terminal (a log, `make demo`
/// piped): the reporting group, its own step of `total` and its own loss, and the test accuracy
/// only when this report measured it — `g1 step 10/600: loss 1.5801`, then
/// `g0 step 200/600: loss 0.4210 test acc 0.9120`. Every group reports each step, so a line
/// without its group would show one step twice with two losses.
fn progress_line(event: &Event, total: u64) -> Option<String> {
    let Event::Progress { group, group_step, group_loss, accuracy, data_wait, skipped, .. } = event else {
        return None;
    };
    let mut details: Vec<String> = group_loss.iter().map(|l| format!("loss {l:.4}")).collect();
    details.extend(accuracy.map(|a| format!("test acc {a:.4}")));
    let details = format!("{}{}", details.join(" "), extras(*data_wait, *skipped));
    let head = format!("g{group} step {group_step}/{total}");
    Some(if details.is_empty() { head } else { format!("{head}: {}", details.trim_start()) })
}

/// Renders events as they come and collects the curve.
pub struct Display {
    json: bool,
    name: String,
    bar: Option<indicatif::ProgressBar>,
    total: u64,
    curve: Curve,
    /// The last test accuracy measured, for the progress bar.
    last_accuracy: Option<f64>,
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
            last_accuracy: None,
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
                if accuracy.is_some() {
                    self.last_accuracy = *accuracy;
                }
                match &self.bar {
                    Some(bar) => {
                        // The bar is the job's: the groups' mean loss, the last evaluation.
                        let loss = loss.map(|l| format!("loss {l:.4}")).unwrap_or_default();
                        let acc = self.last_accuracy.map(|a| format!(" test acc {a:.4}")).unwrap_or_default();
                        bar.set_position(*step);
                        bar.set_message(format!("{loss}{acc}{}", extras(*data_wait, *skipped)));
                    }
                    None => {
                        if let Some(line) = progress_line(event, self.total) {
                            eprintln!("{line}");
                        }
                    }
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

#[cfg(test)]
mod tests {
    use tandem::runner::progress::Merged;
    use tandem_api::contract::GroupReport;

    use super::*;

    fn report(step: u64, loss: f64, accuracy: Option<f64>) -> GroupReport {
        GroupReport {
            step,
            loss: Some(loss),
            accuracy,
            samples: step * 64,
            epoch: 0,
            data_wait: 0.0,
            skipped: 0,
        }
    }

    /// Two groups report each step: without a terminal each line names its group, with that
    /// group's own loss, and the test accuracy only on the report that measured it.
    #[test]
    fn each_progress_line_names_its_group_and_shows_only_what_it_measured() {
        let mut merged = Merged::default();
        let lines: Vec<String> = [
            (0, report(10, 1.6199, None)),
            (1, report(10, 1.5801, None)),
            (0, report(20, 1.2, Some(0.9120))),
            (1, report(20, 1.1, None)),
        ]
        .iter()
        .filter_map(|(group, r)| progress_line(&merged.report(*group, r), 600))
        .collect();
        assert_eq!(
            lines,
            [
                "g0 step 10/600: loss 1.6199",
                "g1 step 10/600: loss 1.5801",
                "g0 step 20/600: loss 1.2000 test acc 0.9120",
                "g1 step 20/600: loss 1.1000",
            ]
        );
    }

    /// The curve holds a test accuracy only where an evaluation measured one, and the final
    /// evaluation's test loss: not the last evaluation again at every later report.
    #[test]
    fn the_curve_records_test_accuracy_only_at_evaluations() {
        let dir = std::env::temp_dir().join(format!("tandem-display-{}", std::process::id()));
        let mut display = Display::new("j", true, "j".to_owned(), dir.clone());
        let mut merged = Merged::default();
        for step in (10..=100).step_by(10) {
            for group in 0..2 {
                let accuracy = match (group, step) {
                    (0, 50) => Some(0.8),
                    (0, 100) => Some(0.9),
                    _ => None,
                };
                display.record(&merged.report(group, &report(step, 2.0 - step as f64 / 100.0, accuracy)));
            }
        }
        let measured: Vec<(u64, f64)> = display.curve.test.iter().map(|p| (p.0, p.2)).collect();
        assert_eq!(measured, [(50, 0.8), (100, 0.9)]);
        assert_eq!(display.curve.train.len(), 10, "one training point per step");
        let done = Event::Finished {
            test_accuracy: Some(0.61),
            test_loss: Some(0.9),
            steps: 100,
            samples_per_second: 1.0,
            wall_seconds: 1.0,
            restarts: 0,
        };
        display.record(&done);
        let test: Vec<(u64, f64, f64)> = display.curve.test.clone();
        assert_eq!(test.len(), 2, "the final evaluation replaces the point at its step: {test:?}");
        assert_eq!(test[1], (100, 0.9, 0.61));
        assert!(display.finish().is_ok());
        let _ = std::fs::remove_dir_all(dir);
    }
}
