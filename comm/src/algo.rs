//! Collective algorithms over any [`Transport`]: recursive doubling, Rabenseifner's recursive
//! halving + doubling, ring, binomial tree.
//!
//! Allreduce is chosen per call from the rank count and the message size, the way OpenMPI's
//! `coll/tuned` and MPICH (Thakur, Rabenseifner & Gropp 2005) decide, with thresholds measured on
//! loopback TCP ([`AlgoConfig::default`], the decision table in the `comm` module docs):
//! - **recursive doubling** — `⌈lg p⌉` rounds, each rank sends the whole buffer every round:
//!   latency-optimal; at 2 ranks it is the *direct exchange* (one round, both send everything);
//! - **Rabenseifner** — reduce-scatter by recursive halving, then allgather by recursive doubling:
//!   `2⌈lg p⌉` rounds moving `2(p−1)/p·n` per rank, bandwidth-optimal with few rounds;
//! - **ring** — reduce-scatter and allgather around the ring: `2(p−1)` rounds of `n/p`, the same
//!   bytes as Rabenseifner with every transfer between neighbours and the least reduction work
//!   per round.
//!
//! Reduce-scatter and allgather use the ring (their results are [`block_range`] blocks), broadcast
//! a binomial tree for small messages and scatter + ring allgather for large ones. Non-power-of-two
//! rank counts fold the surplus ranks into partners first (MPICH's scheme).
//!
//! Guarantees: every rank ends an allreduce with bit-identical values. Ring and Rabenseifner reduce
//! each block along one path and then copy it; in recursive doubling both partners combine the same
//! two operands, and they pass the operands in the same order (the lower rank's first,
//! [`super::transport::Recv::Reduce`]), so even `max(-0, +0)` agrees (a NaN sum is NaN on every
//! rank; its payload is the compiler's choice, see [`super::kernel`]).

use std::ops::Range;

use super::transport::{Recv, Transport};
use super::{CommError, Communicator, ReduceOp, block_range, check_root};

/// An allreduce algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AllreduceAlgo {
    /// Recursive doubling (the direct exchange at 2 ranks).
    RecursiveDoubling,
    /// Recursive-halving reduce-scatter + recursive-doubling allgather.
    Rabenseifner,
    /// Ring reduce-scatter + ring allgather.
    Ring,
}

impl AllreduceAlgo {
    /// Every algorithm, for tests and benchmarks.
    pub const ALL: [AllreduceAlgo; 3] =
        [AllreduceAlgo::RecursiveDoubling, AllreduceAlgo::Rabenseifner, AllreduceAlgo::Ring];

    /// The algorithm named `name` (`rd`, `rabenseifner`, `ring`).
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "rd" | "recursive-doubling" | "direct" => Some(AllreduceAlgo::RecursiveDoubling),
            "rabenseifner" | "halving" => Some(AllreduceAlgo::Rabenseifner),
            "ring" => Some(AllreduceAlgo::Ring),
            _ => None,
        }
    }
}

impl std::fmt::Display for AllreduceAlgo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            AllreduceAlgo::RecursiveDoubling => "recursive-doubling",
            AllreduceAlgo::Rabenseifner => "rabenseifner",
            AllreduceAlgo::Ring => "ring",
        })
    }
}

/// Where the algorithms switch, in bytes per buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AlgoConfig {
    /// From 3 ranks, allreduce and broadcast of up to this many bytes use the latency-optimal
    /// algorithms (recursive doubling, binomial tree).
    pub small_bytes: usize,
    /// At 2 ranks, allreduce of up to this many bytes uses the direct exchange; above, the ring.
    pub pair_bytes: usize,
    /// From 3 ranks, allreduce above `small_bytes` and up to this many bytes uses Rabenseifner;
    /// above, the ring.
    pub halving_bytes: usize,
    /// One allreduce algorithm for every size (tests and benchmarks), instead of the table.
    pub force: Option<AllreduceAlgo>,
}

impl Default for AlgoConfig {
    fn default() -> Self {
        // Measured with `tandem bench allreduce` on loopback TCP (bench/allreduce.sh): the
        // module docs of `comm` keep the table and how it was taken.
        Self { small_bytes: 64 * 1024, pair_bytes: 8 << 20, halving_bytes: 1 << 20, force: None }
    }
}

impl AlgoConfig {
    /// The allreduce algorithm for `bytes` over `ranks` ranks.
    pub fn allreduce(&self, ranks: usize, bytes: usize) -> AllreduceAlgo {
        if let Some(forced) = self.force {
            return forced;
        }
        if ranks <= 2 {
            return if bytes <= self.pair_bytes {
                AllreduceAlgo::RecursiveDoubling
            } else {
                AllreduceAlgo::Ring
            };
        }
        if bytes <= self.small_bytes {
            AllreduceAlgo::RecursiveDoubling
        } else if bytes <= self.halving_bytes {
            AllreduceAlgo::Rabenseifner
        } else {
            AllreduceAlgo::Ring
        }
    }
}

/// The algorithms with their thresholds and scratch space, run over a transport passed per call
/// (so that one set can drive a whole group or a [`super::transport::Subgroup`] of it).
#[derive(Debug, Default)]
pub struct Algorithms {
    config: AlgoConfig,
    scratch: Vec<f32>,
}

/// The largest power of two not above `size` (`size >= 1`).
fn pof2_below(size: usize) -> usize {
    1usize << (usize::BITS - 1 - size.leading_zeros())
}

/// Recursive doubling and halving run on the largest power of two of ranks: of the first `2·rem`
/// ranks, each even one hands its data to the odd one after it and waits for the result.
struct Fold {
    rem: usize,
    pof2: usize,
}

impl Fold {
    fn new(size: usize) -> Self {
        let pof2 = pof2_below(size);
        Self { rem: size - pof2, pof2 }
    }

    /// This rank's rank among the `pof2` that take part, `None` for a rank folded away.
    fn new_rank(&self, rank: usize) -> Option<usize> {
        if rank < 2 * self.rem { (rank % 2 == 1).then_some(rank / 2) } else { Some(rank - self.rem) }
    }

    /// The real rank of participant `new_rank`.
    fn real(&self, new_rank: usize) -> usize {
        if new_rank < self.rem { new_rank * 2 + 1 } else { new_rank + self.rem }
    }

    /// Before: folded ranks hand their data over. Returns this rank's participant rank.
    fn fold<T: Transport + ?Sized>(
        &self,
        t: &mut T,
        buf: &mut [f32],
        op: ReduceOp,
    ) -> Result<Option<usize>, CommError> {
        let rank = t.rank();
        if rank < 2 * self.rem {
            if rank.is_multiple_of(2) {
                t.exchange(Some((rank + 1, &*buf)), None)?;
            } else {
                t.exchange(None, Some((rank - 1, Recv::reduce(buf, op))))?;
            }
        }
        Ok(self.new_rank(rank))
    }

    /// After: folded ranks receive the result.
    fn unfold<T: Transport + ?Sized>(&self, t: &mut T, buf: &mut [f32]) -> Result<(), CommError> {
        let rank = t.rank();
        if rank < 2 * self.rem {
            if rank.is_multiple_of(2) {
                t.exchange(None, Some((rank + 1, Recv::Copy(buf))))?;
            } else {
                t.exchange(Some((rank - 1, &*buf)), None)?;
            }
        }
        Ok(())
    }
}

impl Algorithms {
    /// The algorithms with `config`'s thresholds.
    pub fn new(config: AlgoConfig) -> Self {
        Self { config, scratch: Vec::new() }
    }

    /// The thresholds.
    pub fn config(&self) -> &AlgoConfig {
        &self.config
    }

    /// Allreduce of `buf` over the ranks of `t`, finished (an `Average` divided).
    pub fn allreduce<T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
        buf: &mut [f32],
        op: ReduceOp,
    ) -> Result<(), CommError> {
        let size = t.size();
        if size == 1 {
            return Ok(());
        }
        match self.config.allreduce(size, std::mem::size_of_val(buf)) {
            AllreduceAlgo::RecursiveDoubling => {
                self.recursive_doubling(t, buf, op)?;
                op.finish(buf, size);
            }
            AllreduceAlgo::Rabenseifner => self.rabenseifner(t, buf, op)?,
            AllreduceAlgo::Ring => {
                let mine = ring_reduce_scatter(t, buf, op)?;
                // Divide only this rank's block: the allgather copies it, so every rank agrees.
                op.finish(&mut buf[mine], size);
                ring_allgather(t, buf)?;
            }
        }
        Ok(())
    }

    /// Reduce-scatter by the ring, finished; returns this rank's block.
    pub fn reduce_scatter<T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
        buf: &mut [f32],
        op: ReduceOp,
    ) -> Result<Range<usize>, CommError> {
        let size = t.size();
        if size == 1 {
            return Ok(0..buf.len());
        }
        let mine = ring_reduce_scatter(t, buf, op)?;
        op.finish(&mut buf[mine.clone()], size);
        Ok(mine)
    }

    /// Allgather by the ring.
    pub fn allgather<T: Transport + ?Sized>(&mut self, t: &mut T, buf: &mut [f32]) -> Result<(), CommError> {
        if t.size() == 1 {
            return Ok(());
        }
        ring_allgather(t, buf)
    }

    /// Broadcast from `root`: binomial tree when small, scatter + ring allgather when large.
    pub fn broadcast<T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
        buf: &mut [f32],
        root: usize,
    ) -> Result<(), CommError> {
        let size = t.size();
        check_root(root, size)?;
        if size == 1 {
            return Ok(());
        }
        if std::mem::size_of_val(buf) <= self.config.small_bytes || buf.len() < size {
            binomial_broadcast(t, buf, root)
        } else {
            scatter_allgather_broadcast(t, buf, root)
        }
    }

    /// A one-element recursive-doubling allreduce: no rank leaves before every rank has arrived.
    pub fn barrier<T: Transport + ?Sized>(&mut self, t: &mut T) -> Result<(), CommError> {
        if t.size() == 1 {
            return Ok(());
        }
        let mut token = [0.0f32];
        self.recursive_doubling(t, &mut token, ReduceOp::Sum)
    }

    /// Allreduce by recursive doubling, unfinished (`Average` is left summed).
    fn recursive_doubling<T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
        buf: &mut [f32],
        op: ReduceOp,
    ) -> Result<(), CommError> {
        let fold = Fold::new(t.size());
        if let Some(new_rank) = fold.fold(t, buf, op)? {
            let mut mask = 1;
            while mask < fold.pof2 {
                let partner_new = new_rank ^ mask;
                // The lower participant's operand first, on both sides.
                let incoming_first = partner_new < new_rank;
                t.swap_reduce(fold.real(partner_new), buf, op, incoming_first, &mut self.scratch)?;
                mask <<= 1;
            }
        }
        fold.unfold(t, buf)
    }

    /// Allreduce by Rabenseifner's algorithm, finished.
    fn rabenseifner<T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
        buf: &mut [f32],
        op: ReduceOp,
    ) -> Result<(), CommError> {
        let size = t.size();
        let fold = Fold::new(size);
        let pof2 = fold.pof2;
        let len = buf.len();
        // Elements of the participant blocks `lo..hi`.
        let span =
            |lo: usize, hi: usize| block_range(len, pof2, lo).start..block_range(len, pof2, hi - 1).end;
        if let Some(me) = fold.fold(t, buf, op)? {
            // Recursive halving: keep the half of the current blocks that holds block `me`.
            let (mut lo, mut hi) = (0, pof2);
            let mut mask = pof2 / 2;
            while mask > 0 {
                let partner = fold.real(me ^ mask);
                let mid = lo + mask;
                let (keep, give) =
                    if me & mask == 0 { ((lo, mid), (mid, hi)) } else { ((mid, hi), (lo, mid)) };
                let (send, recv) = disjoint(buf, span(give.0, give.1), span(keep.0, keep.1));
                t.exchange(Some((partner, send)), Some((partner, Recv::reduce(recv, op))))?;
                (lo, hi) = keep;
                mask /= 2;
            }
            op.finish(&mut buf[span(me, me + 1)], size);
            // Recursive doubling of the blocks: exchange the held range with the partner's.
            let mut mask = 1;
            while mask < pof2 {
                let partner = fold.real(me ^ mask);
                // Held: the `mask` blocks aligned to `mask` that contain `me`; the partner holds
                // the neighbouring ones.
                let base = me & !(mask - 1);
                let (send, recv) =
                    disjoint(buf, span(base, base + mask), span(base ^ mask, (base ^ mask) + mask));
                t.exchange(Some((partner, send)), Some((partner, Recv::Copy(recv))))?;
                mask <<= 1;
            }
        }
        fold.unfold(t, buf)
    }
}

/// Ring reduce-scatter in place: afterwards this rank's block holds the (unfinished) reduction.
fn ring_reduce_scatter<T: Transport + ?Sized>(
    t: &mut T,
    buf: &mut [f32],
    op: ReduceOp,
) -> Result<Range<usize>, CommError> {
    let (rank, size) = (t.rank(), t.size());
    let (right, left) = ((rank + 1) % size, (rank + size - 1) % size);
    for step in 0..size - 1 {
        let send = block_range(buf.len(), size, (rank + 2 * size - step - 1) % size);
        let recv = block_range(buf.len(), size, (rank + 2 * size - step - 2) % size);
        let (send_buf, recv_buf) = disjoint(buf, send, recv);
        t.exchange(Some((right, send_buf)), Some((left, Recv::reduce(recv_buf, op))))?;
    }
    Ok(block_range(buf.len(), size, rank))
}

/// Ring allgather in place: every rank's block travels once around the ring.
fn ring_allgather<T: Transport + ?Sized>(t: &mut T, buf: &mut [f32]) -> Result<(), CommError> {
    let (rank, size) = (t.rank(), t.size());
    let (right, left) = ((rank + 1) % size, (rank + size - 1) % size);
    for step in 0..size - 1 {
        let send = block_range(buf.len(), size, (rank + size - step) % size);
        let recv = block_range(buf.len(), size, (rank + 2 * size - step - 1) % size);
        let (send_buf, recv_buf) = disjoint(buf, send, recv);
        t.exchange(Some((right, send_buf)), Some((left, Recv::Copy(recv_buf))))?;
    }
    Ok(())
}

fn binomial_broadcast<T: Transport + ?Sized>(
    t: &mut T,
    buf: &mut [f32],
    root: usize,
) -> Result<(), CommError> {
    let (rank, size) = (t.rank(), t.size());
    let vrank = (rank + size - root) % size;
    let mut mask = 1;
    while mask < size {
        if vrank & mask != 0 {
            let src = (vrank - mask + root) % size;
            t.exchange(None, Some((src, Recv::Copy(buf))))?;
            break;
        }
        mask <<= 1;
    }
    mask >>= 1;
    while mask > 0 {
        if vrank + mask < size {
            let dst = (vrank + mask + root) % size;
            t.exchange(Some((dst, &*buf)), None)?;
        }
        mask >>= 1;
    }
    Ok(())
}

fn scatter_allgather_broadcast<T: Transport + ?Sized>(
    t: &mut T,
    buf: &mut [f32],
    root: usize,
) -> Result<(), CommError> {
    let (rank, size) = (t.rank(), t.size());
    if rank == root {
        for offset in 1..size {
            let dst = (root + offset) % size;
            let block = block_range(buf.len(), size, dst);
            t.exchange(Some((dst, &buf[block])), None)?;
        }
    } else {
        let block = block_range(buf.len(), size, rank);
        t.exchange(None, Some((root, Recv::Copy(&mut buf[block]))))?;
    }
    ring_allgather(t, buf)
}

/// Splits `buf` into a shared view of `a` and a mutable view of `b`; the ranges must not overlap
/// (the algorithms always name two different blocks, and empty blocks never overlap anything).
pub(crate) fn disjoint(buf: &mut [f32], a: Range<usize>, b: Range<usize>) -> (&[f32], &mut [f32]) {
    if a.is_empty() {
        return (&[], &mut buf[b]);
    }
    if b.is_empty() {
        return (&buf[a], &mut []);
    }
    if a.start < b.start {
        let (lo, hi) = buf.split_at_mut(b.start);
        (&lo[a], &mut hi[..b.len()])
    } else {
        let (lo, hi) = buf.split_at_mut(a.start);
        (&hi[..a.len()], &mut lo[b])
    }
}

/// A [`Communicator`] made of the algorithms in this module over a transport it owns.
pub struct Collectives<T> {
    transport: T,
    algorithms: Algorithms,
    backend: &'static str,
}

impl<T: Transport> Collectives<T> {
    /// Collectives over `transport`, reported as backend `backend`.
    pub fn new(transport: T, config: AlgoConfig, backend: &'static str) -> Self {
        Self { transport, algorithms: Algorithms::new(config), backend }
    }

    /// The transport underneath.
    pub fn transport(&self) -> &T {
        &self.transport
    }

    /// The transport underneath, mutably.
    pub fn transport_mut(&mut self) -> &mut T {
        &mut self.transport
    }

    /// The transport and the algorithms, to run them on a subgroup of the transport.
    pub fn parts_mut(&mut self) -> (&mut T, &mut Algorithms) {
        (&mut self.transport, &mut self.algorithms)
    }
}

impl<T: Transport> Communicator for Collectives<T> {
    fn rank(&self) -> usize {
        self.transport.rank()
    }

    fn size(&self) -> usize {
        self.transport.size()
    }

    fn backend(&self) -> &'static str {
        self.backend
    }

    fn allreduce(&mut self, buf: &mut [f32], op: ReduceOp) -> Result<(), CommError> {
        self.algorithms.allreduce(&mut self.transport, buf, op)
    }

    fn reduce_scatter(&mut self, buf: &mut [f32], op: ReduceOp) -> Result<Range<usize>, CommError> {
        self.algorithms.reduce_scatter(&mut self.transport, buf, op)
    }

    fn allgather(&mut self, buf: &mut [f32]) -> Result<(), CommError> {
        self.algorithms.allgather(&mut self.transport, buf)
    }

    fn broadcast(&mut self, buf: &mut [f32], root: usize) -> Result<(), CommError> {
        self.algorithms.broadcast(&mut self.transport, buf, root)
    }

    fn barrier(&mut self) -> Result<(), CommError> {
        self.algorithms.barrier(&mut self.transport)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::thread;
    use std::time::Duration;

    use super::super::selftest::{input, reference_allreduce};
    use super::super::transport::LocalTransport;
    use super::*;

    /// Runs `f` on every rank of an in-process group and returns the per-rank results.
    fn on_group<R: Send + 'static>(
        size: usize,
        config: AlgoConfig,
        f: impl Fn(&mut Collectives<LocalTransport>) -> R + Send + Sync + Copy + 'static,
    ) -> Vec<R> {
        let handles: Vec<_> = LocalTransport::group(size, Duration::from_secs(30))
            .into_iter()
            .map(|t| thread::spawn(move || f(&mut Collectives::new(t, config, "local"))))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    }

    fn forced(algo: AllreduceAlgo) -> AlgoConfig {
        AlgoConfig { force: Some(algo), ..AlgoConfig::default() }
    }

    #[test]
    fn allreduce_matches_reference_for_every_size_length_op_and_algorithm() {
        for size in 1..=7 {
            for len in [0, 1, 3, 5, 6, 7, 64, 1001] {
                for op in ReduceOp::ALL {
                    for algo in AllreduceAlgo::ALL {
                        let want = reference_allreduce(size, len, 1, op);
                        let got = on_group(size, forced(algo), move |c| {
                            let mut buf = input(c.rank(), len, 1);
                            c.allreduce(&mut buf, op).unwrap();
                            buf
                        });
                        for (rank, g) in got.iter().enumerate() {
                            assert_eq!(g, &want, "size {size} len {len} {op} {algo} rank {rank}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn allreduce_of_arbitrary_floats_is_bit_identical_on_every_rank() {
        // Sums of non-integers depend on the order of association; every rank must still hold the
        // same bits, signed zeros included, and NaN where any rank has NaN (a NaN sum's payload
        // is the compiler's choice, see `kernel`).
        for size in 2..=6 {
            for algo in AllreduceAlgo::ALL {
                for op in ReduceOp::ALL {
                    let got = on_group(size, forced(algo), move |c| {
                        let rank = c.rank();
                        let mut buf: Vec<f32> = (0..1003)
                            .map(|i| match (i + rank) % 7 {
                                0 => 0.0,
                                1 => -0.0,
                                2 if i % 5 == 0 => f32::from_bits(0x7fc0_0000 | (rank as u32 + 1)),
                                _ => ((i * 7919 + rank * 104_729) % 1000) as f32 / 7.3 - 60.0,
                            })
                            .collect();
                        c.allreduce(&mut buf, op).unwrap();
                        let canonical = |x: &f32| {
                            if x.is_nan() && op != ReduceOp::Max { f32::NAN.to_bits() } else { x.to_bits() }
                        };
                        buf.iter().map(canonical).collect::<Vec<u32>>()
                    });
                    for (rank, g) in got.iter().enumerate() {
                        assert_eq!(g, &got[0], "size {size} {algo} {op}: rank {rank} differs from rank 0");
                    }
                }
            }
        }
    }

    #[test]
    fn the_decision_table_picks_by_rank_count_and_size() {
        let c = AlgoConfig::default();
        assert_eq!(c.allreduce(2, 4096), AllreduceAlgo::RecursiveDoubling);
        assert_eq!(c.allreduce(2, c.pair_bytes + 4), AllreduceAlgo::Ring);
        assert_eq!(c.allreduce(4, c.small_bytes), AllreduceAlgo::RecursiveDoubling);
        assert_eq!(c.allreduce(4, c.small_bytes + 4), AllreduceAlgo::Rabenseifner);
        assert_eq!(c.allreduce(5, c.halving_bytes + 4), AllreduceAlgo::Ring);
        assert_eq!(forced(AllreduceAlgo::Ring).allreduce(2, 4), AllreduceAlgo::Ring);
    }

    #[test]
    fn broadcast_reaches_every_rank_from_every_root() {
        for size in 1..=5 {
            for root in 0..size {
                for (len, small_bytes) in [(0, 0), (7, 0), (7, usize::MAX), (1000, 0)] {
                    let config = AlgoConfig { small_bytes, ..AlgoConfig::default() };
                    let got = on_group(size, config, move |c| {
                        let mut buf = input(c.rank(), len, 2);
                        c.broadcast(&mut buf, root).unwrap();
                        buf
                    });
                    for g in &got {
                        assert_eq!(g, &input(root, len, 2), "size {size} root {root} len {len}");
                    }
                }
            }
        }
    }

    #[test]
    fn mismatched_lengths_are_an_error_not_garbage() {
        for algo in AllreduceAlgo::ALL {
            let got = on_group(2, forced(algo), |c| {
                let mut buf = vec![1.0; 10 + c.rank()];
                c.allreduce(&mut buf, ReduceOp::Sum).map(|_| ())
            });
            assert!(got.iter().any(|r| matches!(r, Err(CommError::Mismatch { .. }))), "{algo}: {got:?}");
        }
    }
}
