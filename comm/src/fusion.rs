//! Tensor fusion: many tensors allreduced as a few fused buffers (Horovod's fusion buffer, DDP's
//! buckets, MXNET-MPI's tensor collectives).
//!
//! Tensors are packed in the order given into buckets of at most `threshold` bytes; each bucket is
//! copied into one reusable buffer, allreduced once and copied back. A tensor larger than the
//! threshold is reduced in place on its own (no copy), and a threshold of 0 turns fusion off.
//!
//! Guarantees: the result equals per-tensor allreduce — every element is reduced over the same
//! operands and `Average` divides it once; only the association of a floating-point sum may differ
//! (a fused bucket can take the ring where a lone small tensor takes recursive doubling), so results
//! are bit-identical whenever sums are exact and agree to rounding otherwise. Every rank must pass
//! tensors of the same lengths in the same order.

use super::{CommError, Communicator, ReduceOp};

/// Horovod's default fusion threshold (`HOROVOD_FUSION_THRESHOLD`, 128 MiB).
pub const DEFAULT_THRESHOLD: usize = 128 << 20;

/// A fusion buffer with its threshold, reused across calls.
#[derive(Debug, Default)]
pub struct Fusion {
    threshold: usize,
    buffer: Vec<f32>,
}

impl Fusion {
    /// Fusion into buckets of at most `threshold_bytes` (0: every tensor on its own).
    pub fn new(threshold_bytes: usize) -> Self {
        Self { threshold: threshold_bytes, buffer: Vec::new() }
    }

    /// The threshold in bytes.
    pub fn threshold(&self) -> usize {
        self.threshold
    }

    /// The buckets `allreduce` would use for tensors of `lengths`: index ranges into `lengths`.
    pub fn plan(&self, lengths: &[usize]) -> Vec<std::ops::Range<usize>> {
        let limit = self.threshold / size_of::<f32>();
        let mut buckets = Vec::new();
        let (mut start, mut filled) = (0, 0);
        for (i, &len) in lengths.iter().enumerate() {
            if filled > 0 && filled + len > limit {
                buckets.push(start..i);
                (start, filled) = (i, 0);
            }
            filled += len;
        }
        if start < lengths.len() {
            buckets.push(start..lengths.len());
        }
        buckets
    }

    /// Allreduces every tensor in `tensors` with `op`, fused into buckets.
    pub fn allreduce<C: Communicator + ?Sized>(
        &mut self,
        comm: &mut C,
        tensors: &mut [&mut [f32]],
        op: ReduceOp,
    ) -> Result<(), CommError> {
        let lengths: Vec<usize> = tensors.iter().map(|t| t.len()).collect();
        for bucket in self.plan(&lengths) {
            let members = &mut tensors[bucket];
            if let [single] = members {
                comm.allreduce(single, op)?;
                continue;
            }
            self.buffer.clear();
            for t in members.iter() {
                self.buffer.extend_from_slice(t);
            }
            comm.allreduce(&mut self.buffer, op)?;
            let mut offset = 0;
            for t in members.iter_mut() {
                t.copy_from_slice(&self.buffer[offset..offset + t.len()]);
                offset += t.len();
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn buckets_respect_the_threshold_and_keep_order() {
        let f = Fusion::new(40); // 10 elements
        assert_eq!(f.plan(&[4, 4, 4, 20, 1, 0, 9]), vec![0..2, 2..3, 3..4, 4..7]);
        assert_eq!(Fusion::new(0).plan(&[1, 2]), vec![0..1, 1..2]);
        assert_eq!(Fusion::new(usize::MAX).plan(&[1, 2, 3]), vec![0..3]);
        assert!(Fusion::new(8).plan(&[]).is_empty());
    }
}
