//! One parameter-server shard as a protocol state machine: frames in, frames out, no I/O.
//!
//! The driver ([`super`]) feeds it [`ShardState::connect`], [`ShardState::handle`] and
//! [`ShardState::disconnect`] events per connection (a *session*) and carries out the returned
//! [`Output`]s; tests feed it the same events from a simulated network.
//!
//! Expected flow: see [`crate::ps`]. The driver announces each connection with a fresh nonce,
//! which the shard sends as a challenge; every session must then start with a hello that proves
//! the job token over it ([`tandem_ps::wire::hello_proof`]); anything else, or a wrong proof, is
//! refused and the session closed.
//!
//! Guarantees, per [`PsMode`]:
//! - A group's *contribution* for a step is complete when its ranks' pushes cover this shard's
//!   whole range exactly once; overlapping pushes in one step are refused, so a gradient is never
//!   counted twice. The group's *clock* on the shard counts its complete contributions.
//! - `Sync`: the shard applies one update per step, with the mean of the contributions of every
//!   member group, once all have contributed. A member's pull waits until that update is applied.
//!   A group that joins takes part from the open step on; one that leaves (or whose last
//!   connection closes) is no longer waited for and its unfinished contribution is dropped.
//! - `Async`: each complete contribution is applied at once. With staleness `s`, a member's pull
//!   waits while its clock is more than `s` ahead of the slowest member's (SSP).
//! - `Elastic`: each push is added to the centre at once (`centre += e`, commutative).
//! - In async and elastic modes a step whose contribution already reached this shard whole
//!   (before the group restarted) is taken again but not applied again: a restarted group
//!   continues at the least of its shards' last whole steps, so it retrains the steps that reached
//!   some shards but not all, and each shard applies each of the group's steps once. The repeated
//!   contribution still moves the group's clock, as it does on the shards that apply it, so the
//!   clocks that a staleness bound compares stay in step across shards.
//! - In sync and async modes a member's pull of a range that its group has partly pushed in the
//!   open step waits until the group's contribution is complete and applied (read-my-writes), so
//!   a rank that pushed its range and pulls it back sees its own gradient in the result.
//! - A hello with a higher attempt number for a group replaces the earlier attempt: its sessions
//!   are closed and its unfinished contribution dropped.
//! - Shard 0 holds the job's epoch plan: how many groups split each epoch's data. An epoch's
//!   count is fixed when a group first asks for it (`GetEpochs`), from the job config's group
//!   count then ([`ShardState::set_planned_groups`]), raised to include the group that asks,
//!   unless the operator posted the count ([`ShardState::post_groups`]), which then wins over
//!   the config and over a group beyond it (one being removed, which sits the epoch out). A
//!   count never changes afterwards and is kept in checkpoints, so every group splits an epoch
//!   alike whatever the config says when it gets there.
//!
//! Bounds: an authenticated peer is trusted with nothing the job does not allow. Before a frame
//! touches the shard, each of its fields is checked: a worker's group below `workers.maxGroups`
//! and its rank below `workers.groupSize` ([`JobBounds`]), a push's step within the run
//! ([`ShardState::step_bound`]) and within its mode's window ahead of the group's last whole step
//! (the staleness bound `s` in bounded async mode, τ in elastic mode), offsets and lengths within
//! the shard's range, a report's step, samples and cursors within the run and the group. Values
//! must all be finite: a push, init or model state holding a NaN or an infinity is refused, naming
//! the group, the step and the value, so one group's diverged model never reaches the weights the
//! other groups read. A frame that fails gets one error frame ([`ErrorCode::OutOfBounds`],
//! [`ErrorCode::BadRange`] or [`ErrorCode::NonFinite`]) naming the field, its value and the bound,
//! and its session ends at once (frames it pipelined behind are dropped unread); nothing of it
//! reaches the shard, so neither the state nor the next checkpoint changes.
//!
//! Caveats: waiting pulls have no timeout here; clients time out, and a group that disappears is
//! detected by its connections closing.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::ops::Range;

use serde::Serialize;
use tandem_api::job::OptimizerSpec;

use tandem_compute::checkpoint::MAX_COUNT;
use tandem_compute::optim::OptimizerState;
use tandem_util::token;

use super::finite::{copy_finite, first_non_finite};
use super::optim::ShardOptimizer;
use tandem_api::PsMode;
use tandem_ps::shard;
use tandem_ps::wire::{
    ErrorCode, Frame, MAX_EPOCHS, NONCE_LEN, Peer, Progress, WireError, hello_proof, welcome_proof,
};

/// Identifies one connection for the lifetime of a server.
pub type SessionId = u64;

/// What a shard is and how it updates.
#[derive(Clone, Debug)]
pub struct ShardConfig {
    /// This shard's index.
    pub index: u32,
    /// Number of shards in the job.
    pub replicas: u32,
    /// Consistency mode.
    pub mode: PsMode,
    /// The job token every session must present.
    pub token: String,
    /// Ask for a checkpoint every this many updates (0: never).
    pub checkpoint_every: u64,
    /// The update rule for sync and async modes; its learning-rate schedule spans the run's step
    /// count, which the first worker's hello gives.
    pub optimizer: OptimizerSpec,
    /// The longest parameter vector a worker's hello may declare: the job plan's parameter count
    /// where the spec tells it, else what the server's memory can hold. A longer one is refused
    /// before the shard allocates anything.
    pub max_total_len: u64,
    /// The job config's group count when the server starts (shard 0's first epoch plan).
    pub groups: u32,
    /// What the job allows a worker's frames to say (group and rank indices, steps).
    pub bounds: JobBounds,
}

/// What a job allows the fields of its workers' frames to say, beyond the shard's layout: every
/// authenticated frame is checked against it before it touches the shard, so that a buggy worker
/// holding the token cannot put the shard (or its next checkpoint) in a state it cannot resume.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JobBounds {
    /// `workers.maxGroups` (at least `workers.groups`): group indices lie below it.
    pub max_groups: u32,
    /// `workers.groupSize`: rank indices lie below it, and a report carries at most one data
    /// cursor per rank.
    pub group_size: u32,
    /// `training.steps` of a run given in steps: its steps lie below it. `None` for a run in
    /// epochs, whose step count depends on the data and on each epoch's group count (see
    /// [`ShardState::step_bound`]).
    pub steps: Option<u64>,
}

impl JobBounds {
    /// Bounds that refuse no index and bound steps only by [`MAX_COUNT`] and the run's length in
    /// epochs (tests of the state machine that are not about bounds).
    pub fn loose() -> Self {
        Self { max_groups: u32::MAX, group_size: u32::MAX, steps: None }
    }
}

/// The refusal of a hello whose proof does not match the job token.
pub const WRONG_TOKEN: &str = "wrong job token: the hello's proof does not match this job's token; workers and \
                               parameter servers must read the same token file (TANDEM_TOKEN_FILE)";

/// Something the driver must do.
#[derive(Debug, PartialEq)]
pub enum Output {
    /// Send `frame` to `session`.
    Send(SessionId, Frame),
    /// Close `session` after sending what was queued for it.
    Close(SessionId),
    /// An update count multiple of `checkpoint_every` was reached: write [`ShardState::snapshot`].
    Checkpoint,
}

/// The durable part of a shard: what a checkpoint holds.
#[derive(Clone, Debug, PartialEq)]
pub struct Snapshot {
    /// Shard index.
    pub index: u32,
    /// Number of shards.
    pub replicas: u32,
    /// Length of the whole vector.
    pub total_len: u64,
    /// Steps of the run the schedule spans (0 when unknown: it comes with the next worker hello).
    pub total_steps: u64,
    /// Updates applied.
    pub version: u64,
    /// The shard's weights (or EASGD centre).
    pub values: Vec<f32>,
    /// Optimizer state (momentum, Adam moments, update count).
    pub optimizer: OptimizerState,
    /// The latest progress each group reported, by group index: a group restarted together with
    /// the PS continues its step count from it (async, bounded-staleness and elastic modes).
    pub groups: Vec<(u32, Progress)>,
    /// Each group's steps whose contribution this shard applied whole (its last such step + 1),
    /// by group index (async and elastic modes): a restarted group continues at the least of its
    /// shards' and this shard does not apply those steps again.
    pub contributed: Vec<(u32, u64)>,
    /// The model's non-trainable state as the shard holds it (the groups' mean; shard 0 only,
    /// empty for a model without state).
    pub model_state: Vec<f32>,
    /// The epoch plan fixed so far (shard 0 only): groups per epoch, epoch 0 first.
    pub epochs: Vec<u32>,
}

/// A snapshot that does not fit this shard.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RestoreError {
    /// Written by another shard or a job with another number of shards.
    #[error(
        "checkpoint belongs to shard {found_index} of {found_replicas}, this is shard {index} of {replicas}; point each PS replica at its own checkpoint folder"
    )]
    WrongShard {
        /// Index in the file.
        found_index: u32,
        /// Replicas in the file.
        found_replicas: u32,
        /// This shard's index.
        index: u32,
        /// This job's replicas.
        replicas: u32,
    },
    /// The value count does not match the shard's range.
    #[error(
        "checkpoint holds {found} values but shard {index} of a {total_len}-value vector holds {expected}"
    )]
    WrongLength {
        /// Values in the file.
        found: usize,
        /// Values expected.
        expected: u64,
        /// Shard index.
        index: u32,
        /// Vector length.
        total_len: u64,
    },
    /// The optimizer state does not fit.
    #[error("checkpoint optimizer state does not fit: {0}")]
    Optimizer(String),
}

/// Disjoint sorted ranges (relative to the shard start) and their total length.
#[derive(Clone, Debug, Default)]
struct Coverage {
    parts: Vec<Range<u64>>,
    covered: u64,
}

impl Coverage {
    fn overlaps(&self, r: &Range<u64>) -> bool {
        self.parts.iter().any(|p| p.start < r.end && r.start < p.end)
    }

    /// Adds `r`, merging with what it touches or overlaps.
    fn insert(&mut self, r: Range<u64>) {
        let mut merged = r;
        let mut rest = Vec::with_capacity(self.parts.len() + 1);
        for p in self.parts.drain(..) {
            if p.end < merged.start || merged.end < p.start {
                rest.push(p);
            } else {
                merged = merged.start.min(p.start)..merged.end.max(p.end);
            }
        }
        rest.push(merged);
        rest.sort_by_key(|p| p.start);
        self.covered = rest.iter().map(|p| p.end - p.start).sum();
        self.parts = rest;
    }

    fn clear(&mut self) {
        self.parts.clear();
        self.covered = 0;
    }
}

struct Weights {
    total_len: u64,
    /// Steps of the run, from the workers' hellos (0 while unknown).
    total_steps: u64,
    range: Range<u64>,
    values: Vec<f32>,
    /// What initial weights have arrived, while the shard is not ready.
    init: Option<Coverage>,
}

impl Weights {
    fn len(&self) -> u64 {
        self.range.end - self.range.start
    }
    fn ready(&self) -> bool {
        self.init.is_none()
    }
}

struct Group {
    attempt: u32,
    sessions: BTreeSet<SessionId>,
    member: bool,
    clock: u64,
    pending: Coverage,
    /// This step's gradient, as pushed so far (sync and async modes).
    grad: Vec<f32>,
    progress: Option<Progress>,
    /// The group's steps whose contribution reached this shard whole (its last such step + 1),
    /// kept across its attempts: where a restarted group continues in the asynchronous modes.
    contributed: Option<u64>,
}

impl Group {
    fn new(attempt: u32) -> Self {
        Self {
            attempt,
            sessions: BTreeSet::new(),
            member: false,
            clock: 0,
            pending: Coverage::default(),
            grad: Vec::new(),
            progress: None,
            contributed: None,
        }
    }
}

struct Session {
    peer: Option<Peer>,
    /// The challenge sent on connect.
    nonce: [u8; NONCE_LEN],
}

struct Waiting {
    session: SessionId,
    offset: u64,
    len: u64,
}

/// What the status frame reports about one group.
#[derive(Clone, Debug, Serialize)]
pub struct GroupStatus {
    /// Group index.
    pub group: u32,
    /// Launch attempt.
    pub attempt: u32,
    /// Whether the group is a member (waited for and counted).
    pub member: bool,
    /// Complete contributions to this shard.
    pub clock: u64,
    /// Open connections of the group to this shard.
    pub connections: usize,
    /// Latest progress the group reported, with the latest accuracy and loss it ever reported
    /// (light reports carry none).
    pub progress: Option<Progress>,
    /// The group's steps whose contribution reached this shard whole: its last such step + 1
    /// (absent before its first; kept in the shard's checkpoints).
    pub contributed: Option<u64>,
}

/// The status frame's JSON body.
#[derive(Clone, Debug, Serialize)]
pub struct ShardStatus {
    /// Shard index.
    pub shard: u32,
    /// Number of shards.
    pub replicas: u32,
    /// Consistency mode.
    pub mode: PsMode,
    /// Updates applied.
    pub version: u64,
    /// Whether the shard holds its initial weights.
    pub ready: bool,
    /// Length of the whole vector (0 while unknown).
    pub total_len: u64,
    /// Global range held.
    pub range: Range<u64>,
    /// Groups seen, by index.
    pub groups: Vec<GroupStatus>,
    /// The most advanced progress any group reported.
    pub progress: Option<Progress>,
    /// Frames refused since start (bad token, malformed, out of order…).
    pub refused: u64,
    /// Pulls waiting for their mode's condition.
    pub waiting_pulls: usize,
    /// The epoch plan fixed so far (shard 0): groups that split each epoch's data, epoch 0 first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub epochs: Vec<u32>,
    /// Shard 0: the group count the next epoch is planned with.
    #[serde(skip)]
    pub planned_groups: Option<u32>,
}

/// One shard's protocol state. See the module documentation for its guarantees.
pub struct ShardState {
    config: ShardConfig,
    weights: Option<Weights>,
    optimizer: Option<ShardOptimizer>,
    version: u64,
    groups: BTreeMap<u32, Group>,
    sessions: HashMap<SessionId, Session>,
    waiting: Vec<Waiting>,
    max_clock: u64,
    refused: u64,
    model_state: ModelState,
    /// Groups that split each epoch's data, epoch 0 first, fixed when first asked for (shard 0).
    epochs: Vec<u32>,
    /// The job config's group count now.
    planned_groups: u32,
    /// Whether the operator posted `planned_groups` ([`ShardState::post_groups`]): the count is
    /// then the job's own, not a mounted file's that may lag behind it.
    posted_groups: bool,
    /// Sessions refused and closed by the shard, until the driver reports them disconnected:
    /// frames they pipelined behind the refused one are dropped unread.
    closing: HashSet<SessionId>,
}

/// The model's non-trainable state (batch-norm running statistics and the like), which the
/// optimizer does not update: each group's rank 0 puts its group's state (already averaged over
/// the group's ranks) after every step, and the shard holds the mean of every group's latest,
/// as MXNet's and BytePS's parameter servers average running statistics over workers. A
/// restored shard holds the checkpointed mean until the first group puts again; a group that
/// starts (or restarts) takes it, so the state survives group and PS restarts.
#[derive(Debug, Default)]
struct ModelState {
    mean: Vec<f32>,
    by_group: BTreeMap<u32, Vec<f32>>,
}

impl ModelState {
    fn put(&mut self, group: u32, values: Vec<f32>) -> Result<(), String> {
        if let Some(held) = self.by_group.values().next().filter(|h| h.len() != values.len()) {
            return Err(format!(
                "model state of {} values, but the shard holds {} from another group; every group must \
                 train the same model",
                values.len(),
                held.len()
            ));
        }
        self.by_group.insert(group, values);
        let n = self.by_group.len() as f32;
        let mut mean = vec![0.0f32; self.by_group.values().next().map_or(0, Vec::len)];
        for v in self.by_group.values() {
            for (m, x) in mean.iter_mut().zip(v) {
                *m += x;
            }
        }
        mean.iter_mut().for_each(|m| *m /= n);
        self.mean = mean;
        Ok(())
    }
}

impl ShardState {
    /// A shard with no weights yet: the first worker's hello sizes it and `init` frames fill it.
    pub fn new(config: ShardConfig) -> Self {
        Self {
            weights: None,
            optimizer: None,
            version: 0,
            groups: BTreeMap::new(),
            sessions: HashMap::new(),
            waiting: Vec::new(),
            max_clock: 0,
            refused: 0,
            model_state: ModelState::default(),
            epochs: Vec::new(),
            planned_groups: config.groups.max(1),
            posted_groups: false,
            closing: HashSet::new(),
            config,
        }
    }

    /// A shard resumed from a checkpoint: ready, at the snapshot's version.
    pub fn restore(config: ShardConfig, snapshot: Snapshot) -> Result<Self, RestoreError> {
        let range = fits(&config, &snapshot)?;
        let mut optimizer =
            ShardOptimizer::new(&config.optimizer, snapshot.values.len(), snapshot.total_steps);
        optimizer.restore(&snapshot.optimizer).map_err(RestoreError::Optimizer)?;
        let mut state = Self::new(config);
        state.version = snapshot.version;
        state.max_clock = snapshot.version;
        state.weights = Some(Weights {
            total_len: snapshot.total_len,
            total_steps: snapshot.total_steps,
            range,
            values: snapshot.values,
            init: None,
        });
        state.optimizer = Some(optimizer);
        state.model_state.mean = snapshot.model_state;
        state.epochs = snapshot.epochs;
        // Not a member until it joins again; attempt 0 refuses no relaunched attempt.
        for (group, progress) in snapshot.groups {
            state.groups.entry(group).or_insert_with(|| Group::new(0)).progress = Some(progress);
        }
        for (group, steps) in snapshot.contributed {
            state.groups.entry(group).or_insert_with(|| Group::new(0)).contributed = Some(steps);
        }
        Ok(state)
    }

    /// The durable state, or `None` before the shard holds its initial weights.
    pub fn snapshot(&self) -> Option<Snapshot> {
        let w = self.weights.as_ref().filter(|w| w.ready())?;
        let optimizer = self.optimizer.as_ref()?.state();
        Some(Snapshot {
            index: self.config.index,
            replicas: self.config.replicas,
            total_len: w.total_len,
            total_steps: w.total_steps,
            version: self.version,
            values: w.values.clone(),
            optimizer,
            groups: self.groups.iter().filter_map(|(&i, g)| Some((i, g.progress.clone()?))).collect(),
            contributed: self.groups.iter().filter_map(|(&i, g)| Some((i, g.contributed?))).collect(),
            model_state: self.model_state.mean.clone(),
            epochs: self.epochs.clone(),
        })
    }

    /// Checks that [`ShardState::restore`] takes `snapshot` (this shard's own, about to be
    /// written): a checkpoint is never written in a state its own restore would refuse.
    pub fn check_restorable(&self, snapshot: &Snapshot) -> Result<(), RestoreError> {
        fits(&self.config, snapshot).map(drop)
    }

    /// Updates applied so far.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The first step beyond every step this job's groups train, which bounds a push's step and a
    /// report's: a run in steps has `training.steps`. A run in epochs has as many as its epochs'
    /// shares of batches, which the first worker counted for the group count of its config (the
    /// run's length, [`Snapshot::total_steps`]); with fewer groups each share is larger, at most
    /// `g` times as many batches plus `g` for `g` groups, so a run scaled down to one group takes at
    /// most `2 × maxGroups` times the run's length. Never above [`MAX_COUNT`], the most a
    /// checkpoint takes.
    pub fn step_bound(&self) -> u64 {
        let bound = match self.config.bounds.steps {
            Some(steps) => steps,
            None => {
                let run = self.weights.as_ref().map_or(0, |w| w.total_steps);
                run.saturating_mul(2 * u64::from(self.config.bounds.max_groups.max(1)))
            }
        };
        bound.min(MAX_COUNT)
    }

    /// The bounds on workers' group and rank indices now: the driver reads the job config again
    /// when a hello names a group beyond them (the user may have raised `workers.maxGroups` on the
    /// running job).
    pub fn set_group_bounds(&mut self, max_groups: u32, group_size: u32) {
        self.config.bounds.max_groups = max_groups;
        self.config.bounds.group_size = group_size;
    }

    /// Counts `n` frames or connections the driver refused before they reached the shard (peers
    /// that never proved the token), so the status's `refused` covers them.
    pub fn add_refused(&mut self, n: u64) {
        self.refused = self.refused.saturating_add(n);
    }

    /// Who `session` said it is in its hello, if it has said hello.
    pub fn peer(&self, session: SessionId) -> Option<Peer> {
        self.sessions.get(&session).and_then(|s| s.peer)
    }

    /// The shard's configuration.
    pub fn config(&self) -> &ShardConfig {
        &self.config
    }

    /// The status frame's content.
    pub fn status(&self) -> ShardStatus {
        let groups: Vec<GroupStatus> = self
            .groups
            .iter()
            .map(|(&group, g)| GroupStatus {
                group,
                attempt: g.attempt,
                member: g.member,
                clock: g.clock,
                connections: g.sessions.len(),
                progress: g.progress.clone(),
                contributed: g.contributed,
            })
            .collect();
        let progress = groups.iter().filter_map(|g| g.progress.clone()).max_by_key(|p| p.step);
        let (total_len, range, ready) = match &self.weights {
            Some(w) => (w.total_len, w.range.clone(), w.ready()),
            None => (0, 0..0, false),
        };
        ShardStatus {
            shard: self.config.index,
            replicas: self.config.replicas,
            mode: self.config.mode,
            version: self.version,
            ready,
            total_len,
            range,
            groups,
            progress,
            refused: self.refused,
            waiting_pulls: self.waiting.len(),
            planned_groups: (self.config.index == 0).then_some(self.planned_groups),
            epochs: self.epochs.clone(),
        }
    }

    /// The job config's group count now (the driver reads the config as it changes): the count
    /// of the next epoch plan fixed, unless the operator posted one ([`ShardState::post_groups`]):
    /// the mounted config lags behind the posted count by as long as the kubelet takes to refresh
    /// the file.
    pub fn set_planned_groups(&mut self, groups: u32) {
        if !self.posted_groups {
            self.planned_groups = groups.max(1);
        }
    }

    /// The job's group count, posted by the operator when it scales the job: the count of every
    /// epoch fixed from now on. A group at or beyond it asking for an epoch is one being removed
    /// (its pods still draining), and no longer raises the epoch's count to include itself: the
    /// groups left split the data, and the leaving group sits the epoch out.
    pub fn post_groups(&mut self, groups: u32) {
        self.planned_groups = groups.max(1);
        self.posted_groups = true;
    }

    /// Whether the operator posted the group count ([`ShardState::post_groups`]).
    pub fn groups_posted(&self) -> bool {
        self.posted_groups
    }

    /// The group count the next epoch is planned with ([`ShardState::set_planned_groups`]).
    pub fn planned_groups(&self) -> u32 {
        self.planned_groups
    }

    /// A new connection, challenged with `nonce` (fresh random bytes from the driver): the
    /// session's hello must carry [`tandem_ps::wire::hello_proof`] over it.
    pub fn connect(&mut self, session: SessionId, nonce: [u8; NONCE_LEN]) -> Vec<Output> {
        self.sessions.insert(session, Session { peer: None, nonce });
        vec![Output::Send(session, Frame::Challenge { nonce })]
    }

    /// A connection closed (or was closed). A group whose last connection closes leaves.
    pub fn disconnect(&mut self, session: SessionId) -> Vec<Output> {
        let mut out = Vec::new();
        self.closing.remove(&session);
        self.end_session(&mut out, session);
        out
    }

    /// Forgets `session`; a group whose last session it was leaves.
    fn end_session(&mut self, out: &mut Vec<Output>, session: SessionId) {
        self.waiting.retain(|w| w.session != session);
        let Some(s) = self.sessions.remove(&session) else { return };
        if let Some(Peer::Worker { group, .. }) = s.peer
            && let Some(g) = self.groups.get_mut(&group)
            && g.sessions.remove(&session)
            && g.sessions.is_empty()
            && g.member
        {
            tracing::info!(
                shard = self.config.index,
                group,
                "last connection of the group closed; it leaves"
            );
            self.leave(group);
            self.progress(out);
        }
    }

    /// Refuses bytes that did not decode; the driver closes the session when the error is fatal.
    pub fn refuse_wire(&mut self, session: SessionId, error: &WireError) -> Vec<Output> {
        let mut out = Vec::new();
        self.refuse(&mut out, session, error.code(), error.to_string());
        if error.is_fatal() {
            out.push(Output::Close(session));
        }
        out
    }

    /// Handles one frame from `session`.
    pub fn handle(&mut self, session: SessionId, frame: Frame) -> Vec<Output> {
        let mut out = Vec::new();
        if self.closing.contains(&session) {
            // Pipelined behind a frame the shard refused and closed the session for.
            return out;
        }
        let Some(&Session { peer, nonce }) = self.sessions.get(&session) else {
            // A frame for a session the driver never announced, so never challenged.
            let msg = format!("{} on a connection that was never challenged", frame.name());
            self.refuse(&mut out, session, ErrorCode::Protocol, msg);
            out.push(Output::Close(session));
            return out;
        };
        match (peer, frame) {
            (None, Frame::Hello { proof, nonce: client, peer, total_len, total_steps }) => {
                let token = self.config.token.as_bytes();
                let want = hello_proof(token, &nonce, &client, peer, total_len, total_steps);
                if token::same_bytes(&proof, &want) {
                    self.hello(&mut out, session, [nonce, client], peer, total_len, total_steps);
                } else {
                    self.refuse(&mut out, session, ErrorCode::Unauthenticated, WRONG_TOKEN.into());
                    out.push(Output::Close(session));
                }
            }
            (None, other) => {
                let msg = format!(
                    "{} before hello: every connection must first answer the challenge with a hello that proves the job token",
                    other.name()
                );
                self.refuse(&mut out, session, ErrorCode::Unauthenticated, msg);
                out.push(Output::Close(session));
            }
            (Some(_), Frame::Hello { .. }) => {
                self.refuse(&mut out, session, ErrorCode::Protocol, "second hello on one connection".into())
            }
            (Some(_), Frame::StatusRequest) => {
                let json = serde_json::to_string(&self.status())
                    .unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"));
                out.push(Output::Send(session, Frame::Status(json)));
            }
            (Some(_), Frame::Pull { offset, len }) => self.pull(&mut out, session, offset, len),
            (Some(_), Frame::GetState) => {
                let values = self.model_state.mean.clone();
                out.push(Output::Send(session, Frame::ModelState { values }));
            }
            (Some(Peer::Observer), other) => {
                let msg = format!(
                    "observers may only pull, get the model state and ask for status, not {}",
                    other.name()
                );
                self.refuse(&mut out, session, ErrorCode::Protocol, msg);
            }
            (Some(Peer::Worker { group, .. }), frame) => match frame {
                Frame::Init { offset, values } => self.init(&mut out, session, group, offset, values),
                Frame::Join => self.join(&mut out, session, group),
                Frame::Leave => {
                    if self.groups.get(&group).is_some_and(|g| g.member) {
                        tracing::info!(shard = self.config.index, group, "group leaves");
                        self.leave(group);
                    }
                    out.push(Output::Send(session, Frame::Left));
                }
                Frame::Push { offset, step, values } => {
                    self.push(&mut out, session, group, offset, step, values)
                }
                Frame::GetEpochs { epoch } => self.epochs(&mut out, session, group, epoch),
                Frame::PutState { values } => self.put_state(&mut out, session, group, values),
                Frame::Report(p) => self.report(&mut out, session, group, p),
                other => {
                    let msg = format!("{} is a server frame; clients may not send it", other.name());
                    self.refuse(&mut out, session, ErrorCode::UnknownFrame, msg);
                }
            },
        }
        self.progress(&mut out);
        out
    }

    fn refuse(&mut self, out: &mut Vec<Output>, session: SessionId, code: ErrorCode, message: String) {
        self.refused += 1;
        tracing::warn!(shard = self.config.index, session, ?code, %message, "frame refused");
        out.push(Output::Send(session, Frame::Error { code, message }));
    }

    fn put_state(&mut self, out: &mut Vec<Output>, session: SessionId, group: u32, values: Vec<f32>) {
        if let Some(i) = first_non_finite(&values) {
            let msg = format!(
                "model state of group {group} holds {} at index {i}: refused, the shard keeps the groups' \
                 last finite mean; the group's model diverged: lower training.optimizer.learningRate",
                values[i]
            );
            return self.refuse_and_close(out, session, ErrorCode::NonFinite, msg);
        }
        match self.model_state.put(group, values) {
            Ok(()) => {
                let clock = self.groups.get(&group).map_or(0, |g| g.clock);
                out.push(Output::Send(session, Frame::Ack { version: self.version, clock }));
            }
            Err(msg) => self.refuse(out, session, ErrorCode::Protocol, msg),
        }
    }

    fn report(&mut self, out: &mut Vec<Output>, session: SessionId, group: u32, mut p: Progress) {
        if let Err(msg) = self.check_report(group, &p) {
            return self.refuse_and_close(out, session, ErrorCode::OutOfBounds, msg);
        }
        let clock = self.groups.get_mut(&group).map_or(0, |g| {
            // Light reports carry no evaluation: the latest accuracy (and loss) stays.
            if let Some(prev) = &g.progress {
                p.accuracy = p.accuracy.or(prev.accuracy);
                p.loss = p.loss.or(prev.loss);
            }
            g.progress = Some(p);
            g.clock
        });
        out.push(Output::Send(session, Frame::Ack { version: self.version, clock }));
    }

    /// Refuses a frame with a field outside what the job allows and ends its session at once: the
    /// peer is broken, and what it pipelined behind the frame is not trusted either (dropped
    /// unread until the driver reports the close). Its group leaves if this was its last session.
    fn refuse_and_close(
        &mut self,
        out: &mut Vec<Output>,
        session: SessionId,
        code: ErrorCode,
        message: String,
    ) {
        self.refuse(out, session, code, message);
        out.push(Output::Close(session));
        self.closing.insert(session);
        self.end_session(out, session);
    }

    /// Checks a report's fields against the run and the group: they go into the status and the
    /// checkpoints, whose restore refuses counts beyond any run.
    fn check_report(&self, group: u32, p: &Progress) -> Result<(), String> {
        let bound = self.step_bound();
        let ranks = self.config.bounds.group_size;
        if p.step > bound {
            return Err(format!(
                "report of group {group}: step {} is beyond the run, whose steps number at most {bound}",
                p.step
            ));
        }
        if p.samples > MAX_COUNT {
            return Err(format!(
                "report of group {group}: samples {} is beyond any run (at most {MAX_COUNT})",
                p.samples
            ));
        }
        if p.cursors.len() as u64 > u64::from(ranks) {
            return Err(format!(
                "report of group {group}: {} data cursors, but a group has {ranks} ranks (workers.groupSize)",
                p.cursors.len()
            ));
        }
        Ok(())
    }

    /// Checks a push's step against the run ([`ShardState::step_bound`]) and against its mode's
    /// window ahead of the group's last whole step on this shard: a step beyond it would make the
    /// shard take the group's real steps for repeated ones and drop them.
    fn check_step(&self, group: u32, step: u64) -> Result<(), String> {
        let bound = self.step_bound();
        if step >= bound {
            return Err(format!(
                "push of group {group}: step {step} is beyond the run, whose steps lie below {bound}"
            ));
        }
        let window = match self.config.mode {
            PsMode::Async { staleness: Some(s) } => s,
            PsMode::Elastic { tau, .. } => tau.max(1),
            PsMode::Sync | PsMode::Async { staleness: None } => return Ok(()),
        };
        let Some(contributed) = self.groups.get(&group).and_then(|g| g.contributed) else { return Ok(()) };
        let most = contributed.saturating_add(window);
        if step > most {
            return Err(format!(
                "push of group {group}: step {step} is beyond the group's window: it contributed its steps \
                 below {contributed} to this shard, and in {} mode a push runs at most {window} steps ahead, \
                 so at most step {most}",
                self.config.mode
            ));
        }
        Ok(())
    }

    /// A hello whose proof is valid; `nonces` are the challenge and the client's nonce.
    fn hello(
        &mut self,
        out: &mut Vec<Output>,
        session: SessionId,
        nonces: [[u8; NONCE_LEN]; 2],
        peer: Peer,
        total_len: u64,
        total_steps: u64,
    ) {
        if let Peer::Worker { group, rank, .. } = peer {
            let JobBounds { max_groups, group_size, .. } = self.config.bounds;
            let problem = if group >= max_groups {
                Some(format!(
                    "group {group} is outside this job: workers.maxGroups is {max_groups}, so groups are numbered below it"
                ))
            } else if rank >= group_size {
                Some(format!(
                    "rank {rank} of group {group} is outside the group: workers.groupSize is {group_size}, so ranks \
                     are numbered below it"
                ))
            } else if total_steps > MAX_COUNT {
                Some(format!(
                    "the hello's run of {total_steps} steps is beyond any run (at most {MAX_COUNT})"
                ))
            } else {
                None
            };
            if let Some(problem) = problem {
                let msg = format!("{problem}; workers and parameter servers must read the same job config");
                return self.refuse_and_close(out, session, ErrorCode::OutOfBounds, msg);
            }
        }
        if matches!(peer, Peer::Worker { .. }) && total_len > self.config.max_total_len {
            let msg = format!(
                "the hello declares a {total_len}-value parameter vector, but this job allows at most {} (the \
                 parameter count of its model, or what this parameter server's memory holds); workers and \
                 parameter servers must read the same job config",
                self.config.max_total_len
            );
            self.refuse(out, session, ErrorCode::Mismatch, msg);
            out.push(Output::Close(session));
            return;
        }
        if matches!(peer, Peer::Worker { .. }) && (total_len == 0 || total_steps == 0) {
            let msg =
                "a worker's hello must give the length of the flat parameter vector and the run's step count"
                    .into();
            self.refuse(out, session, ErrorCode::Mismatch, msg);
            out.push(Output::Close(session));
            return;
        }
        if matches!(peer, Peer::Worker { .. }) {
            match &mut self.weights {
                Some(w) if w.total_len != total_len => {
                    let msg = format!(
                        "this job's parameter servers hold a {}-value vector but the client trains {total_len} values; \
                         the model changed: start a new job (or clear the PS checkpoints)",
                        w.total_len
                    );
                    self.refuse(out, session, ErrorCode::Mismatch, msg);
                    out.push(Output::Close(session));
                    return;
                }
                Some(w) if w.total_steps != 0 && w.total_steps != total_steps => {
                    // The run keeps the length it started with; the welcome tells the worker.
                    tracing::info!(
                        shard = self.config.index,
                        ?peer,
                        steps = w.total_steps,
                        its_plan = total_steps,
                        "a worker whose plan counts another step count (its config has another group \
                         count, as after scaling an epochs job) takes the job's learning-rate schedule"
                    );
                }
                Some(w) => {
                    if w.total_steps == 0 {
                        // A checkpoint that did not record the run's length: the workers know it.
                        w.total_steps = total_steps;
                        if let Some(opt) = self.optimizer.as_mut() {
                            opt.set_total_steps(total_steps);
                        }
                    }
                }
                None => self.size(total_len, total_steps),
            }
        }
        if let Peer::Worker { group, attempt, .. } = peer {
            let g = self.groups.entry(group).or_insert_with(|| Group::new(attempt));
            if attempt < g.attempt {
                let msg = format!("group {group} attempt {attempt} was replaced by attempt {}", g.attempt);
                self.refuse(out, session, ErrorCode::Protocol, msg);
                out.push(Output::Close(session));
                return;
            }
            if attempt > g.attempt {
                tracing::info!(
                    shard = self.config.index,
                    group,
                    attempt,
                    "group restarted; its earlier attempt is dropped"
                );
                let old: Vec<SessionId> = std::mem::take(&mut g.sessions).into_iter().collect();
                g.attempt = attempt;
                for s in old {
                    self.sessions.remove(&s);
                    self.waiting.retain(|w| w.session != s);
                    out.push(Output::Close(s));
                }
                self.leave(group);
            }
            if let Some(g) = self.groups.get_mut(&group) {
                g.sessions.insert(session);
            }
        }
        if let Some(s) = self.sessions.get_mut(&session) {
            s.peer = Some(peer);
        }
        let (start, end, total_len, total_steps) = match &self.weights {
            Some(w) => (w.range.start, w.range.end, w.total_len, w.total_steps),
            None => (0, 0, 0, 0),
        };
        let (shard, replicas) = (self.config.index, self.config.replicas);
        let layout = [u64::from(shard), u64::from(replicas), start, end, total_len, total_steps];
        let proof = welcome_proof(self.config.token.as_bytes(), &nonces[0], &nonces[1], layout);
        out.push(Output::Send(
            session,
            Frame::Welcome {
                shard: self.config.index,
                replicas: self.config.replicas,
                start,
                end,
                total_len,
                total_steps,
                mode: self.config.mode,
                version: self.version,
                proof,
            },
        ));
    }

    fn size(&mut self, total_len: u64, total_steps: u64) {
        let range = shard::range_of(total_len, self.config.replicas, self.config.index).unwrap_or(0..0);
        let len = (range.end - range.start) as usize;
        let init = (len > 0).then(Coverage::default);
        self.optimizer = Some(ShardOptimizer::new(&self.config.optimizer, len, total_steps));
        self.weights = Some(Weights { total_len, total_steps, range, values: vec![0.0; len], init });
    }

    /// Checks that `offset..offset+len` lies in this shard and returns it relative to the shard.
    fn local(&self, offset: u64, len: u64) -> Result<Range<u64>, String> {
        let Some(w) = &self.weights else {
            return Err("the shard does not know the vector length yet".into());
        };
        let end = offset.checked_add(len).ok_or("range overflows")?;
        if len == 0 || offset < w.range.start || end > w.range.end {
            return Err(format!(
                "range {offset}..{end} is not inside shard {}'s range {}..{} (or is empty); split requests with tandem_ps::shard::ranges",
                self.config.index, w.range.start, w.range.end
            ));
        }
        Ok(offset - w.range.start..end - w.range.start)
    }

    fn init(&mut self, out: &mut Vec<Output>, session: SessionId, group: u32, offset: u64, values: Vec<f32>) {
        let local = match self.local(offset, values.len() as u64) {
            Ok(r) => r,
            Err(msg) => return self.refuse_and_close(out, session, ErrorCode::BadRange, msg),
        };
        if let Some(i) = first_non_finite(&values) {
            let msg = format!(
                "initial weights of group {group} hold {} at offset {}: refused, nothing of them taken",
                values[i],
                offset + i as u64
            );
            return self.refuse_and_close(out, session, ErrorCode::NonFinite, msg);
        }
        if let Some(w) = &mut self.weights
            && let Some(cov) = &mut w.init
        {
            w.values[local.start as usize..local.end as usize].copy_from_slice(&values);
            cov.insert(local);
            if cov.covered == w.len() {
                w.init = None;
                tracing::info!(shard = self.config.index, group, "shard initialised");
            }
        }
        let clock = self.groups.get(&group).map_or(0, |g| g.clock);
        out.push(Output::Send(session, Frame::Ack { version: self.version, clock }));
    }

    fn join(&mut self, out: &mut Vec<Output>, session: SessionId, group: u32) {
        let min_other = self.min_member_clock(Some(group));
        let clock = match self.config.mode {
            PsMode::Sync => self.version,
            PsMode::Async { .. } | PsMode::Elastic { .. } => min_other.unwrap_or(self.max_clock),
        };
        let version = self.version;
        let Some(g) = self.groups.get_mut(&group) else { return };
        if !g.member {
            g.member = true;
            g.clock = clock;
            g.pending.clear();
            tracing::info!(shard = self.config.index, group, clock, "group joins");
        }
        let clock = g.clock;
        out.push(Output::Send(session, Frame::Joined { clock, version }));
    }

    /// The epoch plan through `epoch`, fixing the epochs not fixed yet at the planned count (or,
    /// unless the operator posted the count, enough groups to include `group`, whose config may
    /// be newer than the one read here).
    fn epochs(&mut self, out: &mut Vec<Output>, session: SessionId, group: u32, epoch: u64) {
        if self.config.index != 0 {
            let msg = format!(
                "shard {} was asked for the epoch plan, which shard 0 holds; ask shard 0",
                self.config.index
            );
            return self.refuse(out, session, ErrorCode::Protocol, msg);
        }
        if epoch >= MAX_EPOCHS {
            let msg = format!("epoch {epoch} is beyond any run (the plan holds at most {MAX_EPOCHS} epochs)");
            return self.refuse_and_close(out, session, ErrorCode::BadRange, msg);
        }
        let fixed = self.epochs.len();
        while self.epochs.len() as u64 <= epoch {
            let groups = if self.posted_groups {
                self.planned_groups
            } else {
                self.planned_groups.max(group.saturating_add(1))
            };
            tracing::info!(shard = self.config.index, epoch = self.epochs.len(), groups, "epoch plan fixed");
            self.epochs.push(groups);
        }
        // Kept at once, so a restarted shard 0 does not plan an epoch some group already split.
        if self.epochs.len() > fixed && self.config.checkpoint_every > 0 {
            out.push(Output::Checkpoint);
        }
        let groups = self.epochs[..=epoch as usize].to_vec();
        out.push(Output::Send(session, Frame::Epochs { groups }));
    }

    fn leave(&mut self, group: u32) {
        if let Some(g) = self.groups.get_mut(&group) {
            g.member = false;
            g.pending.clear();
        }
    }

    fn min_member_clock(&self, except: Option<u32>) -> Option<u64> {
        self.groups.iter().filter(|(i, g)| g.member && Some(**i) != except).map(|(_, g)| g.clock).min()
    }

    fn push(
        &mut self,
        out: &mut Vec<Output>,
        session: SessionId,
        group: u32,
        offset: u64,
        step: u64,
        values: Vec<f32>,
    ) {
        let mode = self.config.mode;
        let local = match self.local(offset, values.len() as u64) {
            Ok(r) => r,
            Err(msg) => return self.refuse_and_close(out, session, ErrorCode::BadRange, msg),
        };
        if let Err(msg) = self.check_step(group, step) {
            return self.refuse_and_close(out, session, ErrorCode::OutOfBounds, msg);
        }
        let version = self.version;
        let (Some(w), Some(g)) = (self.weights.as_mut(), self.groups.get_mut(&group)) else {
            return self.refuse(
                out,
                session,
                ErrorCode::Protocol,
                "push before hello sized the shard".into(),
            );
        };
        if !w.ready() {
            let msg = "push before the shard holds its initial weights: init every range first".into();
            return self.refuse(out, session, ErrorCode::Protocol, msg);
        }
        if !g.member {
            let msg = format!("group {group} pushed without joining: send join first");
            return self.refuse(out, session, ErrorCode::Protocol, msg);
        }
        if mode == PsMode::Sync && g.clock > version {
            let msg =
                format!("group {group} already contributed to step {version}; pull to wait for it to finish");
            return self.refuse(out, session, ErrorCode::Protocol, msg);
        }
        if g.pending.overlaps(&local) {
            let msg = format!(
                "group {group} already pushed part of {offset}..{} in this step; each rank pushes its own range once per step",
                offset + values.len() as u64
            );
            return self.refuse(out, session, ErrorCode::Protocol, msg);
        }
        let len = w.len();
        let (a, b) = (local.start as usize, local.end as usize);
        // A step this shard already applied for the group, retrained after its restart.
        let repeated = mode != PsMode::Sync && g.contributed.is_some_and(|c| step < c);
        // Every value must be finite before any reaches the weights (module docs). The gradient
        // is checked as it is copied, in the same pass; the range it is copied to is not part of
        // the group's contribution until `pending` covers it, so a refused copy is scratch.
        let finite = match mode {
            _ if repeated => first_non_finite(&values).is_none(),
            PsMode::Elastic { .. } => {
                let finite = first_non_finite(&values).is_none();
                if finite {
                    for (c, e) in w.values[a..b].iter_mut().zip(&values) {
                        *c += *e;
                    }
                }
                finite
            }
            PsMode::Sync | PsMode::Async { .. } => {
                if g.grad.len() != len as usize {
                    g.grad = vec![0.0; len as usize];
                }
                let finite = copy_finite(&mut g.grad[a..b], &values);
                if !finite {
                    g.grad[a..b].fill(0.0);
                }
                finite
            }
        };
        if !finite {
            let i = first_non_finite(&values).unwrap_or(0);
            let msg = format!(
                "push of group {group} for step {step} holds {} at offset {}: refused, nothing of it applied \
                 (the shard's weights stay finite); the group's model diverged: lower \
                 training.optimizer.learningRate",
                values[i],
                offset + i as u64
            );
            return self.refuse_and_close(out, session, ErrorCode::NonFinite, msg);
        }
        g.pending.insert(local);
        if g.pending.covered == len {
            g.clock += 1;
            if !repeated {
                g.contributed = Some(step.saturating_add(1));
            }
            match mode {
                _ if repeated => {
                    tracing::debug!(
                        shard = self.config.index,
                        group,
                        step,
                        "step already applied here; not again"
                    );
                    g.pending.clear();
                }
                PsMode::Sync => {}
                PsMode::Async { .. } => {
                    if let Some(opt) = self.optimizer.as_mut() {
                        opt.step(&mut w.values, &g.grad, g.clock - 1);
                    }
                    g.pending.clear();
                    self.version += 1;
                    self.after_update(out);
                }
                PsMode::Elastic { .. } => {
                    g.pending.clear();
                    self.version += 1;
                    self.after_update(out);
                }
            }
        }
        let clock = self.groups.get(&group).map_or(0, |g| g.clock);
        self.max_clock = self.max_clock.max(clock);
        out.push(Output::Send(session, Frame::Ack { version: self.version, clock }));
    }

    fn after_update(&mut self, out: &mut Vec<Output>) {
        let every = self.config.checkpoint_every;
        if every > 0 && self.version.is_multiple_of(every) {
            out.push(Output::Checkpoint);
        }
    }

    /// Applies the open sync step if every member has contributed.
    fn try_complete_round(&mut self, out: &mut Vec<Output>) {
        if self.config.mode != PsMode::Sync {
            return;
        }
        let version = self.version;
        let members: Vec<u32> = self.groups.iter().filter(|(_, g)| g.member).map(|(i, _)| *i).collect();
        if members.is_empty()
            || !members.iter().all(|i| self.groups.get(i).is_some_and(|g| g.clock > version))
        {
            return;
        }
        let Some(w) = self.weights.as_mut() else { return };
        let mut mean = vec![0.0f32; w.values.len()];
        for i in &members {
            if let Some(g) = self.groups.get(i) {
                for (m, x) in mean.iter_mut().zip(&g.grad) {
                    *m += *x;
                }
            }
        }
        let scale = 1.0 / members.len() as f32;
        mean.iter_mut().for_each(|m| *m *= scale);
        if let Some(opt) = self.optimizer.as_mut() {
            opt.step(&mut w.values, &mean, version);
        }
        for i in &members {
            if let Some(g) = self.groups.get_mut(i) {
                g.pending.clear();
            }
        }
        self.version += 1;
        self.after_update(out);
    }

    fn pull(&mut self, out: &mut Vec<Output>, session: SessionId, offset: u64, len: u64) {
        if let Err(msg) = self.local(offset, len) {
            return self.refuse_and_close(out, session, ErrorCode::BadRange, msg);
        }
        self.waiting.push(Waiting { session, offset, len });
    }

    /// Whether `session` may read now, by its mode's rule.
    fn may_read(&self, session: SessionId, offset: u64, len: u64) -> bool {
        let Some(w) = self.weights.as_ref().filter(|w| w.ready()) else { return false };
        let local = offset - w.range.start..offset - w.range.start + len;
        let Some(Peer::Worker { group, .. }) = self.sessions.get(&session).and_then(|s| s.peer) else {
            return true;
        };
        let Some(g) = self.groups.get(&group).filter(|g| g.member) else { return true };
        let partly_pushed = g.pending.covered < w.len() && g.pending.overlaps(&local);
        match self.config.mode {
            PsMode::Elastic { .. } => true,
            PsMode::Sync => !partly_pushed && g.clock <= self.version,
            PsMode::Async { staleness } => {
                let min = self.min_member_clock(None).unwrap_or(g.clock);
                !partly_pushed && staleness.is_none_or(|s| g.clock - min <= s)
            }
        }
    }

    /// Completes what can complete and answers the pulls that may now read.
    fn progress(&mut self, out: &mut Vec<Output>) {
        self.try_complete_round(out);
        let waiting = std::mem::take(&mut self.waiting);
        for w in waiting {
            if self.may_read(w.session, w.offset, w.len) {
                let values = self.weights.as_ref().map_or_else(Vec::new, |ws| {
                    let a = (w.offset - ws.range.start) as usize;
                    ws.values[a..a + w.len as usize].to_vec()
                });
                let frame = Frame::Weights { version: self.version, offset: w.offset, values };
                out.push(Output::Send(w.session, frame));
            } else {
                self.waiting.push(w);
            }
        }
    }
}

/// Checks that `snapshot` fits the shard `config` describes (its index, replicas and range, and its
/// optimizer buffers that range): what [`ShardState::restore`] requires, also checked before a
/// checkpoint is written. Returns the shard's range.
fn fits(config: &ShardConfig, snapshot: &Snapshot) -> Result<Range<u64>, RestoreError> {
    if snapshot.index != config.index || snapshot.replicas != config.replicas {
        return Err(RestoreError::WrongShard {
            found_index: snapshot.index,
            found_replicas: snapshot.replicas,
            index: config.index,
            replicas: config.replicas,
        });
    }
    let range = shard::range_of(snapshot.total_len, config.replicas, config.index).unwrap_or(0..0);
    let expected = range.end - range.start;
    if snapshot.values.len() as u64 != expected {
        return Err(RestoreError::WrongLength {
            found: snapshot.values.len(),
            expected,
            index: config.index,
            total_len: snapshot.total_len,
        });
    }
    if let Some((name, b)) = snapshot.optimizer.buffers.iter().find(|(_, b)| b.len() != snapshot.values.len())
    {
        return Err(RestoreError::Optimizer(format!(
            "buffer {name} has {} values, expected {}",
            b.len(),
            snapshot.values.len()
        )));
    }
    Ok(range)
}

#[cfg(test)]
mod tests;
