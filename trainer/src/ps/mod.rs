//! The parameter server: the flat parameter vector, sharded by key range over PS replicas.
//!
//! Two sides, one protocol. What workers and observers use: [`shard`] (who holds which range, a
//! pure function both sides share), [`wire`] (the framed binary protocol) and [`client`] (the
//! client end: push and pull across every shard). What only `tandem ps` runs: [`server`] (the
//! per-shard state machine, free of I/O, its tokio driver, its update rule, checkpoints and HTTP
//! status endpoint). Nothing here imports a role or the training loop.
//!
//! Expected flow, per worker rank: connect and say hello (job token, group, rank, attempt, vector
//! length) to every shard; `init` its range with the initial weights (ignored once a shard holds
//! weights); `join`; pull the current weights; then each step push its range and pull it back.
//! A group leaves explicitly, or implicitly when its last connection to a shard closes.
//!
//! Guarantees: see [`server::state`] for the consistency of each [`Mode`].

pub mod client;
pub mod server;
pub mod shard;
pub mod wire;

use serde::Serialize;

/// How a shard combines the contributions of worker groups.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Mode {
    /// One contribution from every member group per step, averaged, then one optimizer update.
    Sync,
    /// One optimizer update per group contribution. With `staleness: Some(s)`, a group more than
    /// `s` steps ahead of the slowest member waits (stale synchronous parallel); `None` never waits.
    Async {
        /// The bound `s`, or `None` for unbounded.
        staleness: Option<u64>,
    },
    /// EASGD centre: every push is an elastic difference added to the centre variable.
    Elastic,
}

impl Mode {
    /// The mode a job's algorithm asks of its parameter servers, or `None` for `allreduce`, which
    /// uses none. `hybrid` with staleness 0 is synchronous across groups.
    pub fn for_algorithm(algorithm: tandem_api::job::Algorithm, staleness: u32) -> Option<Self> {
        use tandem_api::job::Algorithm;
        match algorithm {
            Algorithm::Allreduce => None,
            Algorithm::PsSync => Some(Mode::Sync),
            Algorithm::Hybrid if staleness == 0 => Some(Mode::Sync),
            Algorithm::PsAsync | Algorithm::Hybrid => {
                Some(Mode::Async { staleness: Some(u64::from(staleness)) })
            }
            Algorithm::Easgd => Some(Mode::Elastic),
        }
    }

    /// The push kind this mode accepts.
    pub fn push_kind(self) -> wire::PushKind {
        match self {
            Mode::Elastic => wire::PushKind::Elastic,
            Mode::Sync | Mode::Async { .. } => wire::PushKind::Gradient,
        }
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Mode::Sync => write!(f, "sync"),
            Mode::Async { staleness: Some(s) } => write!(f, "async (staleness {s})"),
            Mode::Async { staleness: None } => write!(f, "async (unbounded)"),
            Mode::Elastic => write!(f, "elastic (EASGD centre)"),
        }
    }
}
