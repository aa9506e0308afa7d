//! One rank's part of the collective self-test, soak and benchmark, run by `tandem comm-rank`.
//!
//! Inputs are small integers generated from `(rank, length, salt)`, so every rank can compute the
//! naive serial reference for the whole group itself and sums are exact in `f32`: the self-test
//! compares results bit for bit.

use std::io::Write;
use std::time::Instant;

use super::fusion::Fusion;
use super::{CommError, Communicator, ReduceOp, block_range};

/// A self-test that found a wrong result or could not run.
#[derive(Debug, thiserror::Error)]
pub enum SelfTestError {
    /// A collective failed.
    #[error(transparent)]
    Comm(#[from] CommError),
    /// A collective returned a result different from the reference.
    #[error(
        "rank {rank}: {what} differs from the serial reference at element {index}: got {got}, want {want}"
    )]
    Wrong {
        /// Rank that saw the difference.
        rank: usize,
        /// The collective and its arguments.
        what: String,
        /// First differing element.
        index: usize,
        /// Value found.
        got: f32,
        /// Value expected.
        want: f32,
    },
}

impl SelfTestError {
    /// How a rank that this error ends exits: a failed collective's class; a wrong result is
    /// permanent.
    pub fn exit_class(&self) -> tandem_api::ExitClass {
        match self {
            SelfTestError::Comm(e) => e.exit_class(),
            SelfTestError::Wrong { .. } => tandem_api::ExitClass::Permanent,
        }
    }
}

/// The input of `rank` for a buffer of `len` elements: small integers, so sums are exact.
pub fn input(rank: usize, len: usize, salt: usize) -> Vec<f32> {
    (0..len).map(|i| ((rank * 131 + i * 31 + salt * 17) % 29) as f32 - 14.0).collect()
}

/// The serial reference of an allreduce over `size` ranks of [`input`] (ranks combined in order).
pub fn reference_allreduce(size: usize, len: usize, salt: usize, op: ReduceOp) -> Vec<f32> {
    let mut acc = input(0, len, salt);
    for rank in 1..size {
        op.combine(&mut acc, &input(rank, len, salt));
    }
    op.finish(&mut acc, size);
    acc
}

fn compare(rank: usize, what: impl Fn() -> String, got: &[f32], want: &[f32]) -> Result<(), SelfTestError> {
    if got.len() != want.len() {
        return Err(SelfTestError::Wrong {
            rank,
            what: format!("{} (length)", what()),
            index: 0,
            got: 0.0,
            want: 0.0,
        });
    }
    match got.iter().zip(want).position(|(g, w)| g.to_bits() != w.to_bits()) {
        None => Ok(()),
        Some(index) => {
            Err(SelfTestError::Wrong { rank, what: what(), index, got: got[index], want: want[index] })
        }
    }
}

/// Runs every collective on lengths that exercise both algorithms and uneven blocks, and fused
/// against per-tensor allreduce; returns the number of checks passed.
pub fn run_selftest(comm: &mut dyn Communicator) -> Result<usize, SelfTestError> {
    let (rank, size) = (comm.rank(), comm.size());
    let mut checks = 0;
    let lengths = [0, 1, size.saturating_sub(1), size + 1, 1000, 4097, 100_003, 1_048_579];
    for (salt, &len) in lengths.iter().enumerate() {
        for op in ReduceOp::ALL {
            let want = reference_allreduce(size, len, salt, op);
            let mut buf = input(rank, len, salt);
            comm.allreduce(&mut buf, op)?;
            compare(rank, || format!("allreduce {op} of {len}"), &buf, &want)?;

            let mut buf = input(rank, len, salt);
            let mine = comm.reduce_scatter(&mut buf, op)?;
            if mine != block_range(len, size, rank) {
                return Err(SelfTestError::Wrong {
                    rank,
                    what: format!("reduce-scatter {op} of {len} returned block {mine:?}"),
                    index: 0,
                    got: 0.0,
                    want: 0.0,
                });
            }
            compare(rank, || format!("reduce-scatter {op} of {len}"), &buf[mine.clone()], &want[mine])?;
            checks += 2;
        }
        let mut buf = input(rank, len, salt);
        comm.allgather(&mut buf)?;
        let mut want = vec![0.0; len];
        for r in 0..size {
            let block = block_range(len, size, r);
            want[block.clone()].copy_from_slice(&input(r, len, salt)[block]);
        }
        compare(rank, || format!("allgather of {len}"), &buf, &want)?;
        for root in [len % size, size - 1] {
            let mut buf = input(rank, len, salt);
            comm.broadcast(&mut buf, root)?;
            compare(rank, || format!("broadcast of {len} from {root}"), &buf, &input(root, len, salt))?;
        }
        comm.barrier()?;
        checks += 4;
    }
    checks += fused_equals_unfused(comm)?;
    checks += identical_on_every_rank(comm)?;
    Ok(checks)
}

/// Inputs whose sums depend on the order of association (non-integers, signed zeros): the serial
/// reference cannot predict the last bits, but every rank must hold the same ones.
pub fn awkward_input(rank: usize, len: usize, salt: usize) -> Vec<f32> {
    (0..len)
        .map(|i| match (i + rank + salt) % 11 {
            0 => 0.0,
            1 => -0.0,
            _ => ((i * 7919 + rank * 104_729 + salt * 31) % 100_003) as f32 / 7.3 - 6_000.0,
        })
        .collect()
}

/// Allreduce of [`awkward_input`] leaves bit-identical buffers on every rank (checked against rank
/// 0's result, broadcast); returns the number of checks.
pub fn identical_on_every_rank(comm: &mut dyn Communicator) -> Result<usize, SelfTestError> {
    let (rank, size) = (comm.rank(), comm.size());
    let mut checks = 0;
    for (salt, len) in [3, 1000, 65_537, 1_048_579].into_iter().enumerate() {
        for op in ReduceOp::ALL {
            let mut buf = awkward_input(rank, len, salt);
            comm.allreduce(&mut buf, op)?;
            let mut first = buf.clone();
            comm.broadcast(&mut first, 0)?;
            if let Some(index) = buf.iter().zip(&first).position(|(a, b)| a.to_bits() != b.to_bits()) {
                return Err(SelfTestError::Wrong {
                    rank,
                    what: format!("allreduce {op} of {len} awkward values on {size} ranks (vs rank 0)"),
                    index,
                    got: buf[index],
                    want: first[index],
                });
            }
            checks += 1;
        }
    }
    Ok(checks)
}

/// Lengths of the tensors of a small model: uneven, with an empty one and one above the threshold.
pub const TENSOR_LENGTHS: [usize; 9] = [3, 0, 1000, 17, 70_000, 5, 300_001, 2, 4096];

/// Fused allreduce (several thresholds) equals per-tensor allreduce and the reference, bit for bit.
pub fn fused_equals_unfused(comm: &mut dyn Communicator) -> Result<usize, SelfTestError> {
    let (rank, size) = (comm.rank(), comm.size());
    let mut checks = 0;
    for op in ReduceOp::ALL {
        let fresh = || -> Vec<Vec<f32>> {
            TENSOR_LENGTHS.iter().enumerate().map(|(i, &len)| input(rank, len, 100 + i)).collect()
        };
        let mut unfused = fresh();
        for t in &mut unfused {
            comm.allreduce(t, op)?;
        }
        for (i, t) in unfused.iter().enumerate() {
            let want = reference_allreduce(size, TENSOR_LENGTHS[i], 100 + i, op);
            compare(rank, || format!("per-tensor allreduce {op} of tensor {i}"), t, &want)?;
        }
        for threshold in [0, 4096, 64 * 1024, 1 << 20, 128 << 20] {
            let mut fused = fresh();
            let mut views: Vec<&mut [f32]> = fused.iter_mut().map(|t| t.as_mut_slice()).collect();
            Fusion::new(threshold).allreduce(comm, &mut views, op)?;
            for (i, (f, u)) in fused.iter().zip(&unfused).enumerate() {
                compare(
                    rank,
                    || format!("fused allreduce {op} (threshold {threshold}) of tensor {i}"),
                    f,
                    u,
                )?;
            }
            checks += 1;
        }
    }
    Ok(checks)
}

/// Allreduces a buffer of `len` elements `iterations` times, printing `iteration N` after each so a
/// test can kill a rank mid-run; returns the first error.
pub fn run_soak(comm: &mut dyn Communicator, len: usize, iterations: usize) -> Result<(), CommError> {
    let mut buf = input(comm.rank(), len, 7);
    for i in 0..iterations {
        comm.allreduce(&mut buf, ReduceOp::Average)?;
        println!("iteration {i}");
        let _ = std::io::stdout().flush();
    }
    Ok(())
}

/// One size's benchmark figures, in nccl-tests' definitions.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BenchRecord {
    /// Backend measured.
    pub backend: String,
    /// Number of ranks.
    pub ranks: usize,
    /// Buffer size in bytes.
    pub bytes: usize,
    /// Bytes divided by time per allreduce, in GB/s.
    pub algbw_gbps: f64,
    /// `algbw · 2(n−1)/n`: comparable with link bandwidth whatever the rank count.
    pub busbw_gbps: f64,
    /// Time per allreduce (slowest rank), in microseconds.
    pub latency_us: f64,
    /// One core's memcpy bandwidth measured in the same run (GB/s; NaN when not measured), the
    /// ceiling of any copy between processes on one machine.
    pub memcpy_gbps: f64,
}

/// An out-of-place allreduce-sum, `send` into `recv`, for backends that offer one.
pub type OutOfPlace<'a> = &'a dyn Fn(&[f32], &mut [f32]) -> Result<(), CommError>;

/// Times allreduce-sum for each size; rank 0 prints one JSON [`BenchRecord`] per size on stdout.
/// With `out_of_place`, the timed loop calls it from a separate send buffer (as `osu_allreduce`
/// does for MPI) instead of the in-place [`Communicator::allreduce`].
pub fn run_bench(
    comm: &mut dyn Communicator,
    sizes: &[usize],
    out_of_place: Option<OutOfPlace<'_>>,
) -> Result<Vec<BenchRecord>, CommError> {
    let mut records = Vec::new();
    for &bytes in sizes {
        let len = bytes / size_of::<f32>();
        let send = input(comm.rank(), len, 3);
        let mut buf = send.clone();
        let iterations = ((512usize << 20) / bytes.max(1)).clamp(5, 2000);
        let warmup = (iterations / 10).clamp(2, 50);
        let step = |comm: &mut dyn Communicator, buf: &mut [f32]| match out_of_place {
            Some(f) => f(&send, buf),
            None => comm.allreduce(buf, ReduceOp::Sum),
        };
        for _ in 0..warmup {
            step(comm, &mut buf)?;
        }
        comm.barrier()?;
        let start = Instant::now();
        for _ in 0..iterations {
            step(comm, &mut buf)?;
        }
        let mut elapsed = [start.elapsed().as_secs_f32()];
        comm.allreduce(&mut elapsed, ReduceOp::Max)?;
        let seconds = f64::from(elapsed[0]) / iterations as f64;
        let n = comm.size() as f64;
        let algbw = (len * size_of::<f32>()) as f64 / seconds / 1e9;
        let record = BenchRecord {
            backend: comm.backend().to_owned(),
            ranks: comm.size(),
            bytes: len * size_of::<f32>(),
            algbw_gbps: algbw,
            busbw_gbps: algbw * 2.0 * (n - 1.0) / n,
            latency_us: seconds * 1e6,
            memcpy_gbps: f64::NAN,
        };
        if comm.rank() == 0 {
            println!("{}", serde_json::to_string(&record).unwrap_or_default());
            let _ = std::io::stdout().flush();
        }
        records.push(record);
    }
    Ok(records)
}
