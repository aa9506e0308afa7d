//! The prefetching pipeline of the image sources ([`super::ImageFolder`], [`super::ShardReader`]):
//! a producer thread lists (or reads) a rank's samples in the order of its epoch sequence, a
//! bounded pool of threads decodes and augments them, and an assembler puts them back in sequence
//! order into batches, queued ahead of the step.
//!
//! Expected flow: [`Pipeline::start`] at a [`DataCursor`]; [`Pipeline::next`] hands the batches
//! over in order, each with the cursor after it; dropping the pipeline stops its threads (each
//! notices its closed channel).
//!
//! Guarantees:
//! - Memory is bounded by the queues, not by the data set: `prefetch` ready batches, the batch
//!   being assembled, and at most `6 × threads` samples between the producer and the assembler
//!   (raw, decoding, or decoded out of order).
//! - Batches do not depend on the thread count: samples are put back in sequence order, and
//!   their random augmentation depends only on (seed, epoch, sample).
//! - A sample that cannot be decoded is skipped with a warning naming it and counted; its place
//!   goes to the next sample of the sequence, so the cursor after a batch ([`DataCursor::sample`])
//!   records the position of the next unseen sample and a stream started there continues exactly.
//! - The producer sends an epoch only the samples its remaining batches need (asking for more
//!   only when one failed), so no sample is read for an epoch that does not use it.
//!
//! Caveats: a sequence whose every sample fails ends with an error rather than spinning.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, Sender, SyncSender, channel, sync_channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{DataCursor, DataError};

/// Where a sample's encoded image is.
#[derive(Debug)]
pub(crate) enum Load {
    /// In a file.
    File(PathBuf),
    /// Read already (a tar member, an object fetched ahead).
    Bytes(Vec<u8>),
    /// Could not be read: why (the sample is skipped with a warning naming it).
    Unreadable(String),
}

/// One sample of a rank's epoch sequence, as the producer sends it.
#[derive(Debug)]
pub(crate) struct Item {
    /// Position in the rank's epoch sequence (0 is its first sample; it grows past the rank's own
    /// run when samples fail).
    pub pos: u64,
    /// The sample's identity in the data set (what its augmentation is drawn from).
    pub id: u64,
    /// Its class.
    pub label: u32,
    /// What a warning calls it.
    pub name: String,
    /// Its bytes.
    pub load: Load,
}

/// A decoded sample as the assembler gets it.
struct Decoded {
    epoch: u64,
    seq: u64,
    pos: u64,
    label: u32,
    name: String,
    pixels: Result<Vec<f32>, String>,
}

/// What the assembler tells the producer once the producer has sent what it was asked for.
enum Control {
    /// Send this many more samples of the epoch (some failed).
    More(u64),
    /// The epoch is complete: go on to the next.
    Next,
}

/// Whether the producer goes on after [`Feed::send`].
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Flow {
    /// Send the next sample of the epoch.
    Continue,
    /// The epoch's batches are complete: return `Ok(true)`.
    EpochDone,
    /// The pipeline is gone: return `Ok(false)`.
    Gone,
}

/// The producer's side of the pipeline: sends an epoch's samples, as many as asked for.
pub(crate) struct Feed {
    epoch: u64,
    seq: u64,
    budget: u64,
    work: SyncSender<(u64, u64, Item)>,
    control: Receiver<Control>,
}

impl Feed {
    /// Sends `item`; when it spent what was asked for, waits for the assembler's word.
    pub(crate) fn send(&mut self, item: Item) -> Flow {
        if self.work.send((self.epoch, self.seq, item)).is_err() {
            return Flow::Gone;
        }
        self.seq += 1;
        self.budget = self.budget.saturating_sub(1);
        if self.budget > 0 {
            return Flow::Continue;
        }
        match self.control.recv() {
            Ok(Control::More(n)) => {
                self.budget = n;
                Flow::Continue
            }
            Ok(Control::Next) => Flow::EpochDone,
            Err(_) => Flow::Gone,
        }
    }
}

/// The source-specific part: the samples of a rank's epoch sequence.
pub(crate) trait Producer: Send + 'static {
    /// Sends epoch `epoch`'s samples from position `from` on, in sequence order, through
    /// `feed` until it answers [`Flow::EpochDone`] (`Ok(true)`) or [`Flow::Gone`] (`Ok(false)`).
    /// The sequence goes on past the rank's own run (wrapping as the source says) for as long as
    /// the feed asks.
    fn epoch(&mut self, epoch: u64, from: u64, feed: &mut Feed) -> Result<bool, DataError>;
}

/// Decodes (and augments) one sample of `epoch`.
pub(crate) type Decode = Arc<dyn Fn(&Item, u64) -> Result<Vec<f32>, String> + Send + Sync>;

/// A ready batch and the cursors before and after it.
struct Ready {
    x: Vec<f32>,
    y: Vec<u32>,
    names: Vec<String>,
    at: DataCursor,
    next: DataCursor,
}

/// How a pipeline is sized and what its epochs are.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Plan {
    /// Samples per batch.
    pub batch: usize,
    /// Batches per epoch.
    pub batches: u64,
    /// Values per sample.
    pub features: usize,
    /// Decoding threads.
    pub threads: usize,
    /// Ready batches queued.
    pub prefetch: usize,
    /// Positions of an epoch's sequence before it repeats (the guard against all-failing data).
    pub sequence: u64,
}

/// A running pipeline (see the module documentation).
pub(crate) struct Pipeline {
    ready: Receiver<Result<Ready, DataError>>,
    waited: Duration,
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline").field("waited", &self.waited).finish_non_exhaustive()
    }
}

/// The threads the CPU allows a loader by default (at most 8).
pub(crate) fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get()).min(8)
}

impl Pipeline {
    /// Starts the threads at `cursor` (its `sample`, or `batch × batch` samples into the epoch);
    /// `skipped` counts the samples that failed.
    pub(crate) fn start(
        producer: impl Producer,
        decode: Decode,
        plan: Plan,
        cursor: DataCursor,
        skipped: Arc<AtomicU64>,
    ) -> Self {
        let threads = plan.threads.max(1);
        let (work_tx, work_rx) = sync_channel::<(u64, u64, Item)>(2 * threads);
        let (done_tx, done_rx) = sync_channel::<Decoded>(2 * threads);
        let (control_tx, control_rx) = channel::<Control>();
        let (ready_tx, ready_rx) = sync_channel(plan.prefetch.max(1));
        let b = plan.batch as u64;
        let first_budget = plan.batches.saturating_sub(cursor.batch) * b;
        let from = cursor.sample.unwrap_or(cursor.batch * b);
        let failed = ready_tx.clone();
        let mut producer = producer;
        std::thread::spawn(move || {
            let mut feed = Feed {
                epoch: cursor.epoch,
                seq: 0,
                budget: first_budget,
                work: work_tx,
                control: control_rx,
            };
            let mut from = from;
            loop {
                match producer.epoch(feed.epoch, from, &mut feed) {
                    Ok(true) => {}
                    Ok(false) => return,
                    Err(e) => {
                        let _ = failed.send(Err(e));
                        return;
                    }
                }
                (feed.epoch, feed.seq, feed.budget, from) = (feed.epoch + 1, 0, plan.batches * b, 0);
            }
        });
        let work_rx = Arc::new(Mutex::new(work_rx));
        for _ in 0..threads {
            let (work_rx, done_tx, decode) = (Arc::clone(&work_rx), done_tx.clone(), Arc::clone(&decode));
            std::thread::spawn(move || {
                loop {
                    // A poisoned lock means another decoder panicked: stop too.
                    let next = match work_rx.lock() {
                        Ok(rx) => rx.recv(),
                        Err(_) => return,
                    };
                    let Ok((epoch, seq, item)) = next else { return };
                    let pixels = decode(&item, epoch);
                    let Item { pos, label, name, .. } = item;
                    if done_tx.send(Decoded { epoch, seq, pos, label, name, pixels }).is_err() {
                        return;
                    }
                }
            });
        }
        drop(done_tx);
        std::thread::spawn(move || {
            let assembler = Assembler { plan, control: control_tx, ready: ready_tx, skipped };
            assembler.run(done_rx, cursor, first_budget);
        });
        Self { ready: ready_rx, waited: Duration::ZERO }
    }

    /// The next batch into `x` and `y`: returns the cursors before and after it. Its samples'
    /// names are logged at `trace` level under the target `tandem::samples` (one line per batch,
    /// `epoch E batch B served NAME …`), a record of what each step saw.
    pub(crate) fn next(
        &mut self,
        x: &mut Vec<f32>,
        y: &mut Vec<u32>,
    ) -> Result<(DataCursor, DataCursor), DataError> {
        let t = Instant::now();
        let got = self.ready.recv();
        self.waited += t.elapsed();
        let mut ready = got.map_err(|_| stopped())??;
        std::mem::swap(x, &mut ready.x);
        std::mem::swap(y, &mut ready.y);
        tracing::trace!(
            target: "tandem::samples",
            "epoch {} batch {} served {}",
            ready.at.epoch,
            ready.at.batch,
            ready.names.join(" ")
        );
        Ok((ready.at, ready.next))
    }

    /// Time [`Pipeline::next`] spent waiting for a batch.
    pub(crate) fn waited(&self) -> Duration {
        self.waited
    }
}

/// The error of a pipeline whose threads are gone.
pub(crate) fn stopped() -> DataError {
    DataError::Config("the data loader's threads stopped; see the warnings above".into())
}

/// Puts decoded samples back in order and cuts them into batches.
struct Assembler {
    plan: Plan,
    control: Sender<Control>,
    ready: SyncSender<Result<Ready, DataError>>,
    skipped: Arc<AtomicU64>,
}

impl Assembler {
    fn run(self, done: Receiver<Decoded>, start: DataCursor, first_budget: u64) {
        let (b, d) = (self.plan.batch, self.plan.features);
        let mut epoch = start.epoch;
        let mut batch = start.batch;
        let mut granted = first_budget;
        let mut seq = 0u64;
        let mut waiting: std::collections::BTreeMap<u64, Decoded> = Default::default();
        let mut failures_in_a_row = 0u64;
        let new_batch = || (Vec::with_capacity(b * d), Vec::with_capacity(b), Vec::with_capacity(b));
        let (mut x, mut y, mut names) = new_batch();
        let mut at = DataCursor { epoch, batch, sample: start.sample };
        while let Ok(s) = done.recv() {
            if s.epoch != epoch {
                continue; // cannot happen: the producer sends an epoch only once the last is done
            }
            waiting.insert(s.seq, s);
            while let Some(s) = waiting.remove(&seq) {
                seq += 1;
                match s.pixels {
                    Ok(pixels) if pixels.len() == d => {
                        failures_in_a_row = 0;
                        x.extend_from_slice(&pixels);
                        y.push(s.label);
                        names.push(s.name);
                    }
                    outcome => {
                        let why = match outcome {
                            Err(e) => e,
                            Ok(p) => format!("it decodes to {} values, not {d}", p.len()),
                        };
                        let n = self.skipped.fetch_add(1, Ordering::Relaxed) + 1;
                        tracing::warn!(
                            "skipping unreadable image {}: {why} ({n} skipped on this rank)",
                            s.name
                        );
                        failures_in_a_row += 1;
                        if failures_in_a_row > self.plan.sequence.max(1) {
                            let _ = self.ready.send(Err(DataError::Config(format!(
                                "none of the {} images of this rank's sequence can be decoded; see the warnings above",
                                self.plan.sequence
                            ))));
                            return;
                        }
                    }
                }
                if y.len() == b {
                    let last = batch + 1 == self.plan.batches;
                    let next = if last {
                        DataCursor { epoch: epoch + 1, batch: 0, sample: Some(0) }
                    } else {
                        DataCursor { epoch, batch: batch + 1, sample: Some(s.pos + 1) }
                    };
                    let (bx, by, bn) = (x, y, names);
                    (x, y, names) = new_batch();
                    if last {
                        // Tell the producer first, so the next epoch decodes while this batch waits.
                        let _ = self.control.send(Control::Next);
                    }
                    if self.ready.send(Ok(Ready { x: bx, y: by, names: bn, at, next })).is_err() {
                        return;
                    }
                    at = next;
                    batch = next.batch;
                    if last {
                        epoch += 1;
                        (seq, granted) = (0, self.plan.batches * b as u64);
                        waiting.clear();
                        continue;
                    }
                }
            }
            // Everything granted came back, yet the epoch is not complete: ask for the missing.
            if seq == granted && (batch < self.plan.batches) {
                let missing = (self.plan.batches - batch) * b as u64 - y.len() as u64;
                if missing > 0 {
                    granted += missing;
                    if self.control.send(Control::More(missing)).is_err() {
                        return;
                    }
                }
            }
        }
    }
}
