//! How `tandem train` shows the runner's [`Event`]s: a progress bar (or plain lines when stderr is
//! not a terminal) and a summary, or with `--output json` each event as one JSON line on stdout.
//!
//! Guarantees: in JSON mode stdout carries only one JSON object per line, the last one
//! `{"event":"finished",…}` when the job succeeds; the training curve's path comes just before it
//! (`{"event":"curve","path":…}`, or a line on stderr in text mode), as single-process training
//! prints it.

use std::io::{IsTerminal, Write};

use tandem::runner::Event;

/// Renders events as they come.
pub struct Display {
    json: bool,
    name: String,
    bar: Option<indicatif::ProgressBar>,
    total: u64,
}

impl Display {
    /// A display for job `name`; `json` selects one JSON object per line.
    pub fn new(name: &str, json: bool) -> Self {
        Self { json, name: name.to_owned(), bar: None, total: 0 }
    }

    /// Shows one event.
    pub fn show(&mut self, event: &Event) {
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
                eprintln!("{}: {processes} processes started; logs and checkpoints in {output}", self.name);
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
            Event::Progress { step, loss, accuracy, .. } => {
                let loss = loss.map(|l| format!("loss {l:.4}")).unwrap_or_default();
                let acc = accuracy.map(|a| format!(" test acc {a:.4}")).unwrap_or_default();
                match &self.bar {
                    Some(bar) => {
                        bar.set_position(*step);
                        bar.set_message(format!("{loss}{acc}"));
                    }
                    None => eprintln!("step {step}/{}: {loss}{acc}", self.total),
                }
            }
            Event::Status { ps, addr } => self.note(&format!(
                "parameter server {ps}: status on http://{addr}{} (job token as bearer)",
                tandem_api::contract::STATUS_PATH
            )),
            Event::Chaos { target, step } => self.note(&format!("chaos: killed {target} at step {step}")),
            Event::Restart { message, .. } => self.note(message),
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
                println!(
                    "{}: test accuracy {test_accuracy:.4}{loss} after {steps} steps; \
                     {samples_per_second:.0} samples/s, {wall_seconds:.1} s, {restarts} restart(s)",
                    self.name
                );
            }
        }
    }

    /// Shows where the training curve was written; call it before showing `Finished`.
    pub fn curve(&mut self, path: &std::path::Path) {
        if self.json {
            let line = serde_json::json!({"event": "curve", "path": path.display().to_string()});
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
        } else {
            self.note(&format!("training curve written to {}", path.display()));
        }
    }

    fn note(&self, text: &str) {
        match &self.bar {
            Some(bar) => bar.println(text),
            None => eprintln!("{text}"),
        }
    }
}
