//! Collective communication between the ranks of a worker group.
//!
//! One blocking interface, [`Communicator`], with two backends: [`tcp`] (built in: authenticated
//! TCP between hosts, shared memory ([`shm`]) between the ranks of one host, hierarchical
//! allreduce across both, chosen at rendezvous by [`group`]) and `mpi` (rsmpi over OpenMPI, cargo
//! feature `mpi`). [`fusion`] reduces many tensors as a few fused buffers.
//!
//! # Decision table
//!
//! Which path (by rank layout, found at rendezvous from [`host`] identities and a successful
//! shared-memory mapping; logged at info as `collectives: …`):
//!
//! | ranks per host | path | allreduce |
//! |---|---|---|
//! | 1 everywhere (or `--shm off`) | TCP | the TCP table below |
//! | all ranks on one host | shared memory | [`shm`]: reduce-scatter + allgather through slots |
//! | several hosts, some with several ranks | hierarchical | shm reduce, TCP allreduce per channel, shm gather |
//!
//! Which TCP algorithm ([`algo::AlgoConfig::allreduce`]; `p` ranks, `n` bytes per buffer; the
//! same rule as OpenMPI's `coll/tuned` fixed decision and MPICH's):
//!
//! | ranks | bytes | algorithm | why |
//! |---|---|---|---|
//! | 2 | `n ≤ pair_bytes` (8 MiB) | direct exchange (recursive doubling, one round) | one round trip, both send everything once: the least latency, and at 2 ranks the same bytes as the ring |
//! | 2 | `n > pair_bytes` | ring | the same bytes in two half-size rounds, and each rank reduces `n/2` instead of `n`: wins once reduction, not latency, bounds the time |
//! | ≥ 3 | `n ≤ small_bytes` (64 KiB) | recursive doubling | `⌈lg p⌉` rounds: latency-bound sizes |
//! | ≥ 3 | `small_bytes < n ≤ halving_bytes` (1 MiB) | Rabenseifner (halving + doubling) | bandwidth-optimal bytes in `2⌈lg p⌉` rounds instead of `2(p−1)` |
//! | ≥ 3 | `n > halving_bytes` | ring | bandwidth-bound: neighbours only, the least reduction per round |
//!
//! Broadcast: binomial tree up to `small_bytes` (or fewer elements than ranks), scatter + ring
//! allgather above. Reduce-scatter and allgather: the ring. Every threshold is a flag of
//! `tandem bench allreduce` (`--small-bytes`, `--pair-bytes`, `--halving-bytes`, `--algo` to force
//! one), so the table can be re-measured on a given machine with `bench/allreduce.sh`.
//!
//! Expected flow: every rank of a group builds its communicator (for `tcp` from the group's peer
//! list, see [`tcp::connect`]), then all ranks call the same collectives in the same order
//! with buffers of the same length — the contract of MPI and NCCL.
//!
//! Guarantees:
//! - any rank count (1 included) and any length (0 and lengths not divisible by the rank count);
//! - after an allreduce every rank holds bit-identical values (each element is reduced in one
//!   order and then copied, or reduced commutatively), so replicas never drift apart (a NaN sum is
//!   NaN on every rank, with a payload the compiler chooses, [`kernel`]);
//! - reduce-scatter and allgather split a buffer of `n` elements into [`block_range`] blocks, the
//!   first `n % size` ranks one element longer;
//! - with `tcp`, a dead, hung or missing peer turns every call on every other rank into an error
//!   naming that peer within the configured timeout; a call never hangs.
//!
//! Caveats: element-wise sums in floating point depend on the algorithm's order, so results can
//! differ from a serial sum in the last bits (exactly equal for small integers).

pub mod algo;
pub mod auth;
pub mod fusion;
pub mod group;
pub mod host;
pub mod kernel;
pub mod liveness;
#[cfg(feature = "mpi")]
pub mod mpi;
pub mod reach;
pub mod selftest;
pub mod shm;
pub mod tcp;
pub mod transport;
pub mod words;

use std::fmt;
use std::ops::Range;

use tandem_api::ExitClass;

/// How elements are combined.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Element-wise sum.
    Sum,
    /// Element-wise sum divided by the number of ranks.
    Average,
    /// Element-wise maximum.
    Max,
}

impl ReduceOp {
    /// Every op, for tests and benchmarks.
    pub const ALL: [ReduceOp; 3] = [ReduceOp::Sum, ReduceOp::Average, ReduceOp::Max];

    /// Combines `src` into `dst` element-wise, `dst[i] ⊕ src[i]` (`Average` sums; the caller
    /// divides once at the end), with the vectorised kernels of [`kernel`].
    pub fn combine(self, dst: &mut [f32], src: &[f32]) {
        kernel::combine(self, dst, src, false);
    }

    /// Finishes a reduction over `size` ranks: divides by `size` for `Average`, nothing otherwise.
    pub fn finish(self, buf: &mut [f32], size: usize) {
        if self == ReduceOp::Average && size > 1 {
            kernel::finish_average(buf, size);
        }
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Average => "average",
            ReduceOp::Max => "max",
        })
    }
}

/// The block of a buffer of `len` elements that rank `rank` of `size` owns in reduce-scatter and
/// allgather: contiguous, in rank order, the first `len % size` blocks one element longer.
pub fn block_range(len: usize, size: usize, rank: usize) -> Range<usize> {
    let size = size.max(1);
    let (base, extra) = (len / size, len % size);
    let start = rank * base + rank.min(extra);
    start..start + base + usize::from(rank < extra)
}

/// A peer, as named in errors: its rank and where it lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    /// Rank in the group.
    pub rank: usize,
    /// Address (`host:port`), or a description for in-process peers.
    pub addr: String,
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rank {} ({})", self.rank, self.addr)
    }
}

/// A collective that failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CommError {
    /// A peer died, closed its connections or was reported failed by another rank.
    #[error("{peer} failed: {reason}")]
    PeerFailed {
        /// The failed peer.
        peer: Peer,
        /// What was observed.
        reason: String,
    },
    /// A peer made no progress for the configured timeout and did not answer a liveness probe.
    #[error(
        "{peer} made no progress for {timeout_s:.1} s and did not answer a liveness probe; it is hung or \
         unreachable (raise the collective timeout if ranks legitimately spend longer outside collectives)"
    )]
    PeerTimeout {
        /// The silent peer.
        peer: Peer,
        /// The timeout that expired, in seconds.
        timeout_s: f64,
    },
    /// Ranks called collectives that do not match (different lengths or order).
    #[error(
        "{peer} sent {got} elements where this rank expected {expected}: every rank must call the same \
         collectives in the same order with buffers of the same length"
    )]
    Mismatch {
        /// The peer whose message did not fit.
        peer: Peer,
        /// Elements announced by the peer.
        got: usize,
        /// Elements this rank expected.
        expected: usize,
    },
    /// The group could not be formed (a peer missing or unreachable): another attempt may succeed.
    #[error("rendezvous failed: {0}")]
    Rendezvous(String),
    /// A peer proved it is not part of this group (another job token, another peer list, another
    /// protocol): retrying cannot help until the job's configuration is fixed.
    #[error("{peer} was refused: {reason}")]
    Refused {
        /// The endpoint that was refused.
        peer: Peer,
        /// What it proved or failed to prove.
        reason: String,
    },
    /// A caller passed arguments that cannot work.
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// The MPI library reported an error.
    #[error("mpi: {0}")]
    Mpi(String),
}

/// Collectives over the ranks of one group, on `f32` buffers.
///
/// Every method blocks until this rank's part is done. All ranks must make the same calls in the same
/// order with buffers of equal length; `root` must be equal on all ranks.
pub trait Communicator {
    /// This process's rank, in `0..size()`.
    fn rank(&self) -> usize;
    /// Number of ranks in the group.
    fn size(&self) -> usize;
    /// Name of the backend (`tcp`, `mpi`, `local`).
    fn backend(&self) -> &'static str;
    /// Reduces `buf` over all ranks in place; every rank ends with the result.
    fn allreduce(&mut self, buf: &mut [f32], op: ReduceOp) -> Result<(), CommError>;
    /// Reduces `buf` over all ranks, leaving this rank's block ([`block_range`]) reduced in place and
    /// returning that block's range; the rest of `buf` is unspecified afterwards.
    fn reduce_scatter(&mut self, buf: &mut [f32], op: ReduceOp) -> Result<Range<usize>, CommError>;
    /// Gathers every rank's block ([`block_range`]) of `buf` into every rank's `buf`.
    fn allgather(&mut self, buf: &mut [f32]) -> Result<(), CommError>;
    /// Copies `root`'s `buf` into every rank's `buf`.
    fn broadcast(&mut self, buf: &mut [f32], root: usize) -> Result<(), CommError>;
    /// Returns once every rank has entered the barrier.
    fn barrier(&mut self) -> Result<(), CommError>;
}

impl<C: Communicator + ?Sized> Communicator for Box<C> {
    fn rank(&self) -> usize {
        (**self).rank()
    }
    fn size(&self) -> usize {
        (**self).size()
    }
    fn backend(&self) -> &'static str {
        (**self).backend()
    }
    fn allreduce(&mut self, buf: &mut [f32], op: ReduceOp) -> Result<(), CommError> {
        (**self).allreduce(buf, op)
    }
    fn reduce_scatter(&mut self, buf: &mut [f32], op: ReduceOp) -> Result<Range<usize>, CommError> {
        (**self).reduce_scatter(buf, op)
    }
    fn allgather(&mut self, buf: &mut [f32]) -> Result<(), CommError> {
        (**self).allgather(buf)
    }
    fn broadcast(&mut self, buf: &mut [f32], root: usize) -> Result<(), CommError> {
        (**self).broadcast(buf, root)
    }
    fn barrier(&mut self) -> Result<(), CommError> {
        (**self).barrier()
    }
}

/// A communicator whose collectives are counted in the process's metrics
/// ([`tandem_util::metrics`]: time and bytes by operation); otherwise `C` itself.
#[derive(Debug)]
pub struct Metered<C>(pub C);

impl<C: Communicator> Metered<C> {
    fn timed<T>(
        op: &tandem_util::metrics::Op,
        len: usize,
        call: impl FnOnce() -> Result<T, CommError>,
    ) -> Result<T, CommError> {
        let started = std::time::Instant::now();
        let result = call();
        op.record(started.elapsed(), len * std::mem::size_of::<f32>());
        result
    }
}

impl<C: Communicator> Communicator for Metered<C> {
    fn rank(&self) -> usize {
        self.0.rank()
    }
    fn size(&self) -> usize {
        self.0.size()
    }
    fn backend(&self) -> &'static str {
        self.0.backend()
    }
    fn allreduce(&mut self, buf: &mut [f32], op: ReduceOp) -> Result<(), CommError> {
        let m = tandem_util::metrics::metrics();
        Self::timed(&m.allreduce, buf.len(), || self.0.allreduce(buf, op))
    }
    fn reduce_scatter(&mut self, buf: &mut [f32], op: ReduceOp) -> Result<Range<usize>, CommError> {
        let m = tandem_util::metrics::metrics();
        Self::timed(&m.reduce_scatter, buf.len(), || self.0.reduce_scatter(buf, op))
    }
    fn allgather(&mut self, buf: &mut [f32]) -> Result<(), CommError> {
        let m = tandem_util::metrics::metrics();
        Self::timed(&m.allgather, buf.len(), || self.0.allgather(buf))
    }
    fn broadcast(&mut self, buf: &mut [f32], root: usize) -> Result<(), CommError> {
        let m = tandem_util::metrics::metrics();
        Self::timed(&m.broadcast, buf.len(), || self.0.broadcast(buf, root))
    }
    fn barrier(&mut self) -> Result<(), CommError> {
        Self::timed(&tandem_util::metrics::metrics().barrier, 0, || self.0.barrier())
    }
}

impl CommError {
    /// Whether another rank was lost (died, hung, never came), rather than this rank or the
    /// caller being wrong: restarting the group can cure it.
    pub fn is_peer_lost(&self) -> bool {
        matches!(
            self,
            CommError::PeerFailed { .. } | CommError::PeerTimeout { .. } | CommError::Rendezvous(_)
        )
    }

    /// How a process that this error ends exits: [`ExitClass::PeerLost`] for a lost rank,
    /// [`ExitClass::Permanent`] otherwise.
    pub fn exit_class(&self) -> ExitClass {
        if self.is_peer_lost() { ExitClass::PeerLost } else { ExitClass::Permanent }
    }
}

pub(crate) fn check_root(root: usize, size: usize) -> Result<(), CommError> {
    if root >= size {
        return Err(CommError::Invalid(format!("broadcast root {root} is not a rank of a group of {size}")));
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn blocks_cover_the_buffer_in_order() {
        for len in [0, 1, 5, 6, 7, 100] {
            for size in 1..=6 {
                let mut next = 0;
                for r in 0..size {
                    let b = block_range(len, size, r);
                    assert_eq!(b.start, next);
                    assert!(b.len() == len / size || b.len() == len / size + 1);
                    next = b.end;
                }
                assert_eq!(next, len);
            }
        }
    }
}
