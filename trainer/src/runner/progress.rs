//! The line protocol between `tandem worker` and the runner, and the merge of every group's
//! progress into one view.
//!
//! Protocol: a worker prints [`WorkerLine`]s, JSON objects one per line, on stdout:
//! `{"event":"progress","group":G,"progress":{"step":S,"loss":L,"accuracy":A,"samples":N,"epoch":E,"data_wait":W,"skipped":K}}`
//! (rank 0 of each group, at its report steps) and, when it ends,
//! `{"event":"finished","group":G,"rank":R,"steps":S,"start_step":K,"accuracy":A}`. A parameter server prints
//! `status on <addr>` once its HTTP status endpoint listens. Other lines (logs, `listening on …`)
//! are not protocol and are ignored.
//!
//! Guarantees: the merged step never goes backwards (a restarted group starts its count again,
//! but the merged step is the furthest step any group reached); samples of earlier attempts are
//! kept.

use std::collections::BTreeMap;

use tandem_api::contract::{GroupReport, WorkerLine};

use super::Event;

/// A protocol line from a worker.
#[derive(Clone, Debug, PartialEq)]
pub enum Line {
    /// Rank 0 of `group` reached `step`.
    Progress {
        /// Group index.
        group: u32,
        /// Steps the group completed.
        step: u64,
        /// Latest training loss.
        loss: Option<f64>,
        /// Latest test accuracy.
        accuracy: Option<f64>,
        /// Samples the group processed in this attempt.
        samples: u64,
        /// Fraction of its step time the group waited for data since its last report.
        data_wait: f64,
        /// Samples the group skipped as unreadable in this attempt.
        skipped: u64,
    },
    /// A rank finished all its steps.
    Finished {
        /// Group index.
        group: u32,
        /// Rank.
        rank: u32,
        /// Steps it ran.
        steps: u64,
        /// Its final test accuracy.
        accuracy: Option<f64>,
    },
    /// A parameter server's status endpoint listens on `addr`.
    Status {
        /// `host:port`.
        addr: String,
    },
}

/// Reads one stdout line; `None` for lines that are not protocol.
pub fn parse(line: &str) -> Option<Line> {
    let line = line.trim();
    if let Some(addr) = line.strip_prefix("status on ") {
        return Some(Line::Status { addr: addr.trim().to_owned() });
    }
    Some(match WorkerLine::parse(line)? {
        WorkerLine::Progress { group, progress: p } => Line::Progress {
            group,
            step: p.step,
            loss: p.loss,
            accuracy: p.accuracy,
            samples: p.samples,
            data_wait: p.data_wait,
            skipped: p.skipped,
        },
        WorkerLine::Finished { group, rank, steps, accuracy, .. } => {
            Line::Finished { group, rank, steps, accuracy }
        }
    })
}

#[derive(Clone, Debug, Default)]
struct GroupProgress {
    step: u64,
    loss: Option<f64>,
    accuracy: Option<f64>,
    samples: u64,
    earlier_samples: u64,
    data_wait: f64,
    skipped: u64,
    earlier_skipped: u64,
}

/// Every group's latest progress, merged.
#[derive(Clone, Debug, Default)]
pub struct Merged {
    groups: BTreeMap<u32, GroupProgress>,
    step: u64,
    accuracy: Option<f64>,
}

impl Merged {
    /// Records a progress line; returns the merged step afterwards.
    pub fn record(
        &mut self,
        group: u32,
        step: u64,
        loss: Option<f64>,
        accuracy: Option<f64>,
        samples: u64,
    ) -> u64 {
        let g = self.groups.entry(group).or_default();
        g.step = step;
        if loss.is_some() {
            g.loss = loss;
        }
        g.samples = samples;
        if accuracy.is_some() {
            g.accuracy = accuracy;
            self.accuracy = accuracy;
        }
        self.step = self.step.max(step);
        self.step
    }

    /// Records rank 0 of `group`'s report and returns the merged view as the runner's
    /// [`Event::Progress`] (the one progress event of every job, one process or many).
    pub fn report(&mut self, group: u32, r: &GroupReport) -> Event {
        let step = self.record(group, r.step, r.loss, r.accuracy, r.samples);
        let g = self.groups.entry(group).or_default();
        (g.data_wait, g.skipped) = (r.data_wait, r.skipped);
        Event::Progress {
            step,
            group,
            group_step: r.step,
            loss: self.loss(),
            group_loss: r.loss,
            accuracy: r.accuracy,
            samples: self.samples(),
            data_wait: self.data_wait(),
            skipped: self.skipped(),
        }
    }

    /// `group` restarts: its step count starts again, its samples so far are kept.
    pub fn restart(&mut self, group: u32) {
        let g = self.groups.entry(group).or_default();
        g.earlier_samples += g.samples;
        g.samples = 0;
        g.earlier_skipped += g.skipped;
        g.skipped = 0;
        g.step = 0;
    }

    /// The furthest step any group reached.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// Mean of the groups' latest training losses.
    pub fn loss(&self) -> Option<f64> {
        let losses: Vec<f64> = self.groups.values().filter_map(|g| g.loss).collect();
        (!losses.is_empty()).then(|| losses.iter().sum::<f64>() / losses.len() as f64)
    }

    /// The latest test accuracy any group reported.
    pub fn accuracy(&self) -> Option<f64> {
        self.accuracy
    }

    /// Mean of every group's latest test accuracy, over the groups that reported one.
    pub fn groups_accuracy(&self) -> Option<f64> {
        let all: Vec<f64> = self.groups.values().filter_map(|g| g.accuracy).collect();
        (!all.is_empty()).then(|| all.iter().sum::<f64>() / all.len() as f64)
    }

    /// Mean over the groups of the fraction of step time they last reported waiting for data.
    pub fn data_wait(&self) -> f64 {
        let n = self.groups.len().max(1) as f64;
        self.groups.values().map(|g| g.data_wait).sum::<f64>() / n
    }

    /// Samples skipped as unreadable by every group over every attempt.
    pub fn skipped(&self) -> u64 {
        self.groups.values().map(|g| g.skipped + g.earlier_skipped).sum()
    }

    /// Samples processed by every group over every attempt.
    pub fn samples(&self) -> u64 {
        self.groups.values().map(|g| g.samples + g.earlier_samples).sum()
    }
}
