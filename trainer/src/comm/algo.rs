//! Collective algorithms over any [`Transport`]: ring, recursive doubling, binomial tree.
//!
//! Choices follow MPICH (Thakur, Rabenseifner & Gropp 2005): allreduce by recursive doubling for
//! messages up to [`AlgoConfig::small_bytes`] (`lg p` rounds, latency-optimal) and by ring
//! reduce-scatter + ring allgather above it (each rank sends `2(p-1)/p·n`, bandwidth-optimal);
//! broadcast by binomial tree for small messages and scatter + ring allgather for large ones.
//! Non-power-of-two rank counts fold the surplus ranks into partners first (MPICH's scheme).
//!
//! Guarantees: every rank ends an allreduce with bit-identical values (ring: each block is reduced
//! along one path and then copied; recursive doubling: partners combine the same two operands, and
//! `+` and `max` are commutative).

use std::ops::Range;

use super::transport::{Recv, Transport};
use super::{CommError, Communicator, ReduceOp, block_range, check_root};

/// Algorithm thresholds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AlgoConfig {
    /// Messages up to this many bytes use the latency-optimal algorithms.
    pub small_bytes: usize,
}

impl Default for AlgoConfig {
    fn default() -> Self {
        // Measured on loopback TCP: recursive doubling wins below roughly 64 KiB at 4 ranks.
        Self { small_bytes: 64 * 1024 }
    }
}

/// A [`Communicator`] made of the algorithms in this module over a transport.
pub struct Collectives<T> {
    transport: T,
    config: AlgoConfig,
    backend: &'static str,
    scratch: Vec<f32>,
}

impl<T: Transport> Collectives<T> {
    /// Collectives over `transport`, reported as backend `backend`.
    pub fn new(transport: T, config: AlgoConfig, backend: &'static str) -> Self {
        Self { transport, config, backend, scratch: Vec::new() }
    }

    /// The transport underneath.
    pub fn transport(&self) -> &T {
        &self.transport
    }

    /// The transport underneath, mutably.
    pub fn transport_mut(&mut self) -> &mut T {
        &mut self.transport
    }

    fn is_small(&self, len: usize) -> bool {
        len * size_of::<f32>() <= self.config.small_bytes
    }

    /// Allreduce by recursive doubling; `op` must not be `Average` (the caller finishes).
    fn allreduce_recursive_doubling(&mut self, buf: &mut [f32], op: ReduceOp) -> Result<(), CommError> {
        let (rank, size) = (self.transport.rank(), self.transport.size());
        let pof2 = 1usize << (usize::BITS - 1 - size.leading_zeros());
        let rem = size - pof2;
        // Fold: of the first 2·rem ranks, each even one hands its data to the odd one after it.
        let new_rank = if rank < 2 * rem {
            if rank % 2 == 0 {
                self.transport.exchange(Some((rank + 1, &*buf)), None)?;
                None
            } else {
                self.transport.exchange(None, Some((rank - 1, Recv::Reduce(buf, op))))?;
                Some(rank / 2)
            }
        } else {
            Some(rank - rem)
        };
        if let Some(new_rank) = new_rank {
            let mut mask = 1;
            while mask < pof2 {
                let partner_new = new_rank ^ mask;
                let partner = if partner_new < rem { partner_new * 2 + 1 } else { partner_new + rem };
                self.scratch.clear();
                self.scratch.extend_from_slice(buf);
                self.transport
                    .exchange(Some((partner, &self.scratch)), Some((partner, Recv::Reduce(buf, op))))?;
                mask <<= 1;
            }
        }
        if rank < 2 * rem {
            if rank % 2 == 0 {
                self.transport.exchange(None, Some((rank + 1, Recv::Copy(buf))))?;
            } else {
                self.transport.exchange(Some((rank - 1, &*buf)), None)?;
            }
        }
        Ok(())
    }

    /// Ring reduce-scatter in place: afterwards this rank's block holds the reduction.
    fn ring_reduce_scatter(&mut self, buf: &mut [f32], op: ReduceOp) -> Result<Range<usize>, CommError> {
        let (rank, size) = (self.transport.rank(), self.transport.size());
        let (right, left) = ((rank + 1) % size, (rank + size - 1) % size);
        for step in 0..size - 1 {
            let send = block_range(buf.len(), size, (rank + 2 * size - step - 1) % size);
            let recv = block_range(buf.len(), size, (rank + 2 * size - step - 2) % size);
            let (send_buf, recv_buf) = disjoint(buf, send, recv);
            self.transport.exchange(Some((right, send_buf)), Some((left, Recv::Reduce(recv_buf, op))))?;
        }
        Ok(block_range(buf.len(), size, rank))
    }

    /// Ring allgather in place: every rank's block travels once around the ring.
    fn ring_allgather(&mut self, buf: &mut [f32]) -> Result<(), CommError> {
        let (rank, size) = (self.transport.rank(), self.transport.size());
        let (right, left) = ((rank + 1) % size, (rank + size - 1) % size);
        for step in 0..size - 1 {
            let send = block_range(buf.len(), size, (rank + size - step) % size);
            let recv = block_range(buf.len(), size, (rank + 2 * size - step - 1) % size);
            let (send_buf, recv_buf) = disjoint(buf, send, recv);
            self.transport.exchange(Some((right, send_buf)), Some((left, Recv::Copy(recv_buf))))?;
        }
        Ok(())
    }

    fn binomial_broadcast(&mut self, buf: &mut [f32], root: usize) -> Result<(), CommError> {
        let (rank, size) = (self.transport.rank(), self.transport.size());
        let vrank = (rank + size - root) % size;
        let mut mask = 1;
        while mask < size {
            if vrank & mask != 0 {
                let src = (vrank - mask + root) % size;
                self.transport.exchange(None, Some((src, Recv::Copy(buf))))?;
                break;
            }
            mask <<= 1;
        }
        mask >>= 1;
        while mask > 0 {
            if vrank + mask < size {
                let dst = (vrank + mask + root) % size;
                self.transport.exchange(Some((dst, &*buf)), None)?;
            }
            mask >>= 1;
        }
        Ok(())
    }

    fn scatter_allgather_broadcast(&mut self, buf: &mut [f32], root: usize) -> Result<(), CommError> {
        let (rank, size) = (self.transport.rank(), self.transport.size());
        if rank == root {
            for offset in 1..size {
                let dst = (root + offset) % size;
                let block = block_range(buf.len(), size, dst);
                self.transport.exchange(Some((dst, &buf[block])), None)?;
            }
        } else {
            let block = block_range(buf.len(), size, rank);
            self.transport.exchange(None, Some((root, Recv::Copy(&mut buf[block]))))?;
        }
        self.ring_allgather(buf)
    }
}

/// Splits `buf` into a shared view of `a` and a mutable view of `b`; the ranges must not overlap
/// (ring steps always name two different blocks, and empty blocks never overlap anything).
fn disjoint(buf: &mut [f32], a: Range<usize>, b: Range<usize>) -> (&[f32], &mut [f32]) {
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
        let size = self.size();
        if size == 1 {
            return Ok(());
        }
        if self.is_small(buf.len()) {
            self.allreduce_recursive_doubling(buf, op)?;
            op.finish(buf, size);
        } else {
            let mine = self.ring_reduce_scatter(buf, op)?;
            // Divide only this rank's block: the allgather copies it, so every rank agrees.
            op.finish(&mut buf[mine], size);
            self.ring_allgather(buf)?;
        }
        Ok(())
    }

    fn reduce_scatter(&mut self, buf: &mut [f32], op: ReduceOp) -> Result<Range<usize>, CommError> {
        let size = self.size();
        if size == 1 {
            return Ok(0..buf.len());
        }
        let mine = self.ring_reduce_scatter(buf, op)?;
        op.finish(&mut buf[mine.clone()], size);
        Ok(mine)
    }

    fn allgather(&mut self, buf: &mut [f32]) -> Result<(), CommError> {
        if self.size() == 1 {
            return Ok(());
        }
        self.ring_allgather(buf)
    }

    fn broadcast(&mut self, buf: &mut [f32], root: usize) -> Result<(), CommError> {
        let size = self.size();
        check_root(root, size)?;
        if size == 1 {
            return Ok(());
        }
        if self.is_small(buf.len()) || buf.len() < size {
            self.binomial_broadcast(buf, root)
        } else {
            self.scatter_allgather_broadcast(buf, root)
        }
    }

    fn barrier(&mut self) -> Result<(), CommError> {
        if self.size() == 1 {
            return Ok(());
        }
        // A one-element recursive-doubling allreduce: no rank leaves before every rank has arrived.
        let mut token = [0.0f32];
        self.allreduce_recursive_doubling(&mut token, ReduceOp::Sum)
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
        small_bytes: usize,
        f: impl Fn(&mut Collectives<LocalTransport>) -> R + Send + Sync + Copy + 'static,
    ) -> Vec<R> {
        let handles: Vec<_> = LocalTransport::group(size, Duration::from_secs(30))
            .into_iter()
            .map(|t| thread::spawn(move || f(&mut Collectives::new(t, AlgoConfig { small_bytes }, "local"))))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    }

    #[test]
    fn allreduce_matches_reference_for_every_size_length_op_and_algorithm() {
        for size in 1..=6 {
            for len in [0, 1, 3, 5, 6, 7, 64, 1001] {
                for op in ReduceOp::ALL {
                    for small_bytes in [0, usize::MAX] {
                        let want = reference_allreduce(size, len, 1, op);
                        let got = on_group(size, small_bytes, move |c| {
                            let mut buf = input(c.rank(), len, 1);
                            c.allreduce(&mut buf, op).unwrap();
                            buf
                        });
                        for (rank, g) in got.iter().enumerate() {
                            assert_eq!(
                                g, &want,
                                "size {size} len {len} {op} small {small_bytes} rank {rank}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn broadcast_reaches_every_rank_from_every_root() {
        for size in 1..=5 {
            for root in 0..size {
                for (len, small_bytes) in [(0, 0), (7, 0), (7, usize::MAX), (1000, 0)] {
                    let got = on_group(size, small_bytes, move |c| {
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
        let got = on_group(2, 0, |c| {
            let mut buf = vec![1.0; 10 + c.rank()];
            c.allreduce(&mut buf, ReduceOp::Sum).map(|_| ())
        });
        assert!(got.iter().any(|r| matches!(r, Err(CommError::Mismatch { .. }))), "{got:?}");
    }
}
