//! The built-in `tcp` backend: a full mesh of authenticated TCP connections between the ranks of a
//! group, driven by the algorithms of [`super::algo`], with shared memory between the ranks that
//! share a host ([`super::group`]).
//!
//! Expected flow: every rank calls [`connect`] with the group's peer list (the launch contract's
//! `JobConfig.groups[g].peers`, in rank order), its rank, the address to bind and the job token.
//! Rank `r` listens on its own peer's port, dials every lower rank and accepts every higher one; each
//! pair gets a *data* connection (collective payloads) and a *control* connection (goodbye, abort,
//! liveness probes). Every connection is authenticated by [`super::auth`] before it is used
//! ([`rendezvous`]).
//!
//! Parts: [`rendezvous`] forms the mesh; `control` speaks the control protocol (goodbye,
//! abort, probe) and detects dead and hung peers; `exchange` moves one message each way.
//!
//! Guarantees:
//! - Each exchange sends, receives and reduces in chunks of [`TcpConfig::chunk_bytes`] from a single
//!   `poll` loop, so the kernel moves one chunk while this rank reduces the previous one.
//! - Every message carries its length; a mismatch is an error, never a silent desynchronisation.
//! - A peer that dies (its connections close without a goodbye) fails the current call on every rank
//!   that is inside a collective at once, naming it. A peer that stops making progress for
//!   [`TcpConfig::timeout`] is probed on its control connection; if it does not answer it is declared
//!   hung and named; if it answers it is itself waiting, and this rank keeps waiting one more timeout
//!   for the culprit to be reported. A rank that fails tells every other rank which peer failed, so
//!   all ranks name the same culprit.
//! - After any failure the communicator is poisoned: every later call returns the same error.
//!
//! Assumptions: all ranks run the same build (little-endian `f32` on the wire). A rank that spends
//! longer than `timeout` outside collectives while its peers wait is indistinguishable from a hung
//! one: set the timeout above the longest compute step.

mod control;
mod exchange;
pub mod rendezvous;

use std::net::TcpStream;
use std::time::Duration;

use tandem_api::contract::{Endpoint, JobConfig};

use super::algo::AlgoConfig;
use super::group::{self, Group};
use super::shm::ShmConfig;
use super::{CommError, Peer};

/// Settings of the `tcp` backend.
#[derive(Clone, Debug)]
pub struct TcpConfig {
    /// Longest wait without progress inside a collective before the stalled peer is probed. A dead
    /// peer is reported at once; a hung one within `timeout` + 2 s by its neighbours and, through
    /// their abort notice, by everyone else (at worst 2·`timeout` + 2 s after the last progress).
    pub timeout: Duration,
    /// Longest time to form the group: every peer must have connected by then.
    pub connect_timeout: Duration,
    /// Pipelining granularity: bytes moved per send/receive step and reduced per step.
    pub chunk_bytes: usize,
    /// `SO_SNDBUF`/`SO_RCVBUF` of the data connections; 0 keeps the kernel's autotuning.
    pub socket_buffer_bytes: usize,
    /// Algorithm thresholds.
    pub algo: AlgoConfig,
    /// Shared memory between ranks on one host.
    pub shm: ShmConfig,
    /// This rank's host identity instead of the detected one ([`super::host`]): ranks that pass the
    /// same string are treated as sharing a host (if they can also map the same segment). For
    /// tests and benchmarks that lay ranks out over simulated hosts.
    pub host: Option<String>,
}

impl Default for TcpConfig {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(120),
            chunk_bytes: 256 * 1024,
            socket_buffer_bytes: 0,
            algo: AlgoConfig::default(),
            shm: ShmConfig::default(),
            host: None,
        }
    }
}

/// The communicator of the `tcp` backend: TCP between hosts, shared memory inside one.
pub type TcpComm = Group;

const DATA: u8 = 0;
const CONTROL: u8 = 1;

/// Joins group `group` of `job` as `rank`, listening on `bind`.
pub fn connect_from_contract(
    job: &JobConfig,
    group: u32,
    rank: usize,
    bind: &str,
    token: &[u8],
    config: TcpConfig,
) -> Result<TcpComm, CommError> {
    let topology = job.group(group).ok_or_else(|| {
        CommError::Invalid(format!(
            "the job config has no worker group {group}; the config is stale or wrong"
        ))
    })?;
    connect(rank, &topology.peers, bind, token, config)
}

/// Forms the group: listens on `bind`:`peers[rank].port`, connects to every peer, authenticates
/// every connection with `token`, then finds which ranks share a host and maps shared memory
/// between them ([`group::assemble`]).
pub fn connect(
    rank: usize,
    peers: &[Endpoint],
    bind: &str,
    token: &[u8],
    config: TcpConfig,
) -> Result<TcpComm, CommError> {
    let size = peers.len();
    if rank >= size {
        return Err(CommError::Invalid(format!("rank {rank} is not in a peer list of {size}")));
    }
    if token.is_empty() {
        return Err(CommError::Invalid("the job token is empty; every connection needs it".to_owned()));
    }
    if config.chunk_bytes < 4 {
        return Err(CommError::Invalid(format!("chunk size {} is below one element", config.chunk_bytes)));
    }
    let mesh = rendezvous::form_mesh(rank, peers, bind, token, &config)?;
    group::assemble(mesh, token, config)
}

/// The two connections to one peer and what its control connection has said.
struct Link {
    data: TcpStream,
    control: TcpStream,
    inbox: Vec<u8>,
    said_bye: bool,
    closed: bool,
    ponged: bool,
}

impl Link {
    fn new(data: TcpStream, control: TcpStream) -> Self {
        Self { data, control, inbox: Vec::new(), said_bye: false, closed: false, ponged: false }
    }
}

/// The [`super::transport::Transport`] of the `tcp` backend.
pub struct TcpTransport {
    rank: usize,
    names: Vec<Peer>,
    links: Vec<Option<Link>>,
    timeout: Duration,
    chunk: usize,
    scratch: Vec<f32>,
    failed: Option<CommError>,
}

impl std::fmt::Debug for TcpTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpTransport").field("rank", &self.rank).field("size", &self.names.len()).finish()
    }
}

impl TcpTransport {
    fn new(rank: usize, names: Vec<Peer>, links: Vec<Option<Link>>, config: &TcpConfig) -> Self {
        Self {
            rank,
            names,
            links,
            timeout: config.timeout,
            chunk: (config.chunk_bytes / 4 * 4).max(4),
            scratch: Vec::new(),
            failed: None,
        }
    }

    /// Rank `peer` as named in errors.
    pub fn name(&self, peer: usize) -> Peer {
        self.names
            .get(peer)
            .cloned()
            .unwrap_or_else(|| Peer { rank: peer, addr: "not in the group".to_owned() })
    }

    /// The collective timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The error every call returns since the communicator failed, if it has.
    pub fn failure(&self) -> Option<&CommError> {
        self.failed.as_ref()
    }

    fn link(&mut self, peer: usize) -> Result<&mut Link, CommError> {
        let name = self.names.get(peer).cloned();
        self.links.get_mut(peer).and_then(Option::as_mut).ok_or_else(|| {
            CommError::Invalid(match name {
                Some(p) => format!("{p} is this rank itself"),
                None => format!("rank {peer} is not in the group"),
            })
        })
    }

    fn peer_failed(&self, peer: usize, reason: impl Into<String>) -> CommError {
        CommError::PeerFailed { peer: self.name(peer), reason: reason.into() }
    }
}
