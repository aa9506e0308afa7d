//! Collectives between the ranks of one host through shared memory: each rank has a ring of slots
//! in one mapped [`segment`], and the ranks move data by copying into their own slots and reading
//! each other's, synchronised by one step counter per rank.
//!
//! Expected flow: [`super::group`] creates the segment at rendezvous and builds a [`ShmGroup`] on
//! every rank of the host; the group's collectives call [`ShmGroup::allreduce`] and the other ops,
//! passing a [`Liveness`] (the TCP control connections) that detects dead and hung peers.
//!
//! The algorithm (a reduce-scatter and an allgather through memory, as NCCL's and OpenMPI's
//! shared-memory collectives do): the buffer is cut into pieces, one slot per piece. For each piece
//! a rank copies the parts of the piece that other ranks own into its slot (*post*); each owner
//! reduces its part from its own buffer and every other rank's slot, in rank order, and writes the
//! result back into its slot (*reduce*); every rank copies the results of the other owners
//! (*gather*). Slots rotate, so a rank posts the next piece while others still read the last one.
//! A rank moves about `2 − 1/p` buffer lengths in copies and one in reads per allreduce, with no
//! system call on the data path.
//!
//! Synchronisation: after each phase a rank bumps its counter (a release store; a `FUTEX_WAKE`
//! only when someone sleeps on it). A waiting rank waits the way OpenMPI's shared-memory BTL and
//! NCCL's proxies do, in three stages, so that a peer that answers within microseconds is seen
//! within nanoseconds, one that shares a core gets it, and one that is gone costs no core:
//! 1. it polls the counter with a pause instruction between polls for [`SPIN`] (no system call),
//!    but only while the peer last ran on another CPU: spinning on the CPU the peer needs only
//!    delays it by a time slice;
//! 2. it polls with a `sched_yield` between polls until [`ShmConfig::spin`] has passed since the
//!    wait began (a peer descheduled on this core, as when ranks outnumber cores or the machine is
//!    busy, runs at once instead of after this rank's time slice);
//! 3. it sleeps on the counter's futex in slices of [`SLICE`], checking the [`Liveness`] between
//!    slices.
//!
//! Guarantees:
//! - The same semantics as every [`super::Communicator`]: any length, bit-identical results (each
//!   part is reduced once, by its owner, in a fixed order, and then copied).
//! - Ranks that call different collectives or lengths get [`CommError::Mismatch`] or
//!   [`CommError::Invalid`] naming the peer (the first piece of each call carries its signature).
//! - A peer that dies is named within [`ShmConfig::spin`] and a slice (its control connection
//!   closes); a hung one after the collective timeout and a probe, as over TCP
//!   ([`super::liveness`]). Never a hang, and a rank whose peer is gone sleeps: it does not spin.

pub mod segment;

use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use segment::{Segment, futex_wait, futex_wake};

use super::liveness::{Liveness, Watchdog};
use super::{CommError, ReduceOp, block_range, kernel};

/// Longest sleep on a futex before the liveness check.
pub const SLICE: Duration = Duration::from_millis(10);

/// How long a waiting rank polls with a pause instruction before it starts yielding its core
/// (at most [`ShmConfig::spin`]; none when the host's ranks outnumber its cores).
pub const SPIN: Duration = Duration::from_micros(10);

/// Polls between two readings of the clock while spinning.
const POLLS_PER_CLOCK: usize = 64;

/// Settings of the shared-memory transport.
#[derive(Clone, Debug)]
pub struct ShmConfig {
    /// Use shared memory between ranks that share a host.
    pub enabled: bool,
    /// Bytes per slot (a multiple of 64).
    pub slot_bytes: usize,
    /// Slots per rank (1..=[`segment::MAX_SLOTS`]).
    pub slots: usize,
    /// Where segments are created.
    pub dir: PathBuf,
    /// How long a waiting rank stays awake (spinning for up to [`SPIN`], then yielding its core
    /// between polls) before it sleeps on the futex.
    pub spin: Duration,
}

impl Default for ShmConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            slot_bytes: 256 * 1024,
            slots: 4,
            dir: PathBuf::from("/dev/shm"),
            spin: Duration::from_micros(1000),
        }
    }
}

/// Which collective a call is, stored with its first piece so that mismatched calls are caught.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Call {
    Reduce { gather: bool, owners: usize },
    Gather { owners: usize },
    Broadcast { root: usize },
}

impl Call {
    fn signature(self, len: usize) -> u64 {
        let (kind, param) = match self {
            Call::Reduce { gather, owners } => (1 + u64::from(gather), owners as u64),
            Call::Gather { owners } => (3, owners as u64),
            Call::Broadcast { root } => (4, root as u64),
        };
        (kind << 56) | ((param & 0xffff) << 40) | (len as u64 & ((1 << 40) - 1))
    }

    fn describe(signature: u64) -> String {
        let (kind, param, len) = (signature >> 56, (signature >> 40) & 0xffff, signature & ((1 << 40) - 1));
        let what = match kind {
            1 => format!("a reduce-scatter over {param} blocks"),
            2 => format!("an allreduce over {param} blocks"),
            3 => format!("an allgather of {param} blocks"),
            4 => format!("a broadcast from local rank {param}"),
            _ => "nothing known".to_owned(),
        };
        format!("{what} of {len} elements")
    }
}

/// One rank's view of its host's segment.
pub struct ShmGroup {
    seg: Segment,
    me: usize,
    /// The group rank of each local rank (for errors and the liveness checks).
    ranks: Vec<usize>,
    seq: u32,
    /// Per slot: the step every other rank must have reached before this rank rewrites it.
    free_at: Vec<u32>,
    next: usize,
    /// Stage 1 of a wait (zero when the host's ranks outnumber its cores).
    pause: Duration,
    /// Stages 1 and 2 together ([`ShmConfig::spin`]).
    awake: Duration,
}

impl std::fmt::Debug for ShmGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmGroup").field("me", &self.me).field("ranks", &self.ranks).finish()
    }
}

/// Whether counter value `seen` is at or past `target` (wrapping: counters run for ever).
fn reached(seen: u32, target: u32) -> bool {
    seen.wrapping_sub(target) as i32 >= 0
}

/// Stages 1 and 2 of a wait: polls `word` until it reaches `target` (true) or `awake` has passed
/// (false), with a pause instruction between polls for the first `spin` while the peer's last CPU
/// (`peer_cpu`) is not this one, and a `sched_yield` between polls after.
fn poll(word: &AtomicU32, peer_cpu: &AtomicU32, target: u32, spin: Duration, awake: Duration) -> bool {
    let start = Instant::now();
    let mut spinning = !spin.is_zero();
    loop {
        let waited = start.elapsed();
        if waited >= awake {
            return false;
        }
        spinning = spinning && waited < spin && peer_cpu.load(Ordering::Relaxed) != current_cpu();
        if spinning {
            for _ in 0..POLLS_PER_CLOCK {
                std::hint::spin_loop();
                if reached(word.load(Ordering::Acquire), target) {
                    return true;
                }
            }
        } else {
            std::thread::yield_now();
            if reached(word.load(Ordering::Acquire), target) {
                return true;
            }
        }
    }
}

/// The CPU this thread runs on (`u32::MAX` when the kernel cannot say): a read of the rseq
/// area or the vDSO, no system call.
fn current_cpu() -> u32 {
    // SAFETY: no arguments, no memory touched.
    u32::try_from(unsafe { libc::sched_getcpu() }).unwrap_or(u32::MAX)
}

/// Piece `k` of `block` when every piece holds `q` elements of each block.
fn piece(block: &Range<usize>, k: usize, q: usize) -> Range<usize> {
    let start = (block.start + k * q).min(block.end);
    start..(start + q).min(block.end)
}

impl ShmGroup {
    /// Local rank `me` of the ranks `ranks` (group ranks, in local order) over `seg`.
    ///
    /// When the ranks outnumber the cores this process may run on, a waiting rank yields from the
    /// start (stage 2, as OpenMPI does when oversubscribed): spinning would only keep the peer it
    /// waits for off the core.
    pub fn new(seg: Segment, me: usize, ranks: Vec<usize>, spin: Duration) -> Self {
        let slots = seg.slots();
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        let pause = if ranks.len() > cores { Duration::ZERO } else { SPIN.min(spin) };
        Self { seg, me, ranks, seq: 0, free_at: vec![0; slots], next: 0, pause, awake: spin }
    }

    /// Number of local ranks.
    pub fn size(&self) -> usize {
        self.ranks.len()
    }

    /// This rank's local index.
    pub fn local_rank(&self) -> usize {
        self.me
    }

    /// Elements per slot.
    fn slot_len(&self) -> usize {
        self.seg.slot_bytes() / 4
    }

    fn others(&self) -> impl Iterator<Item = usize> + use<> {
        let me = self.me;
        (0..self.ranks.len()).filter(move |&j| j != me)
    }

    /// Ends this rank's current phase: publishes the counter and wakes sleepers.
    fn step(&mut self) {
        self.seq = self.seq.wrapping_add(1);
        self.seg.cpu(self.me).store(current_cpu(), Ordering::Relaxed);
        self.seg.seq(self.me).store(self.seq, Ordering::SeqCst);
        if self.seg.waiters(self.me).load(Ordering::SeqCst) != 0 {
            futex_wake(self.seg.seq(self.me));
        }
    }

    /// Waits until local rank `j` has reached step `target` (the three stages of the module docs).
    fn await_rank(&self, j: usize, target: u32, live: &mut dyn Liveness) -> Result<(), CommError> {
        let word = self.seg.seq(j);
        if reached(word.load(Ordering::Acquire), target)
            || poll(word, self.seg.cpu(j), target, self.pause, self.awake)
        {
            return Ok(());
        }
        self.sleep_until(j, target, live)
    }

    /// Stage 3 of a wait: sleeps on `j`'s counter until it reaches `target`, a peer is found dead,
    /// or the watchdog names a hung one.
    fn sleep_until(&self, j: usize, target: u32, live: &mut dyn Liveness) -> Result<(), CommError> {
        let word = self.seg.seq(j);
        let waiters = self.seg.waiters(j);
        let mut watchdog = Watchdog::new(live.timeout());
        let mut last = word.load(Ordering::Acquire);
        loop {
            waiters.fetch_add(1, Ordering::SeqCst);
            let seen = word.load(Ordering::SeqCst);
            if !reached(seen, target) {
                let left = watchdog.deadline().saturating_duration_since(Instant::now());
                futex_wait(word, seen, SLICE.min(left).max(Duration::from_micros(100)));
            }
            waiters.fetch_sub(1, Ordering::SeqCst);
            let seen = word.load(Ordering::Acquire);
            if reached(seen, target) {
                return Ok(());
            }
            live.check()?;
            if seen != last {
                last = seen;
                watchdog.progressed();
                continue;
            }
            watchdog.after_sleep(live);
            if Instant::now() >= watchdog.deadline() {
                watchdog.expired(live, self.ranks[j])?;
            }
        }
    }

    fn await_others(&self, target: u32, live: &mut dyn Liveness) -> Result<(), CommError> {
        for j in self.others() {
            self.await_rank(j, target, live)?;
        }
        Ok(())
    }

    /// The next slot, once every other rank is done reading this rank's last use of it.
    fn take_slot(&mut self, live: &mut dyn Liveness) -> Result<usize, CommError> {
        let s = self.next;
        self.next = (self.next + 1) % self.free_at.len();
        self.await_others(self.free_at[s], live)?;
        Ok(s)
    }

    /// Stores this call's signature with slot `s` (before the post that publishes it).
    fn sign(&self, s: usize, call: Call, len: usize) {
        self.seg.signature(self.me, s).store(call.signature(len), Ordering::Relaxed);
    }

    /// After the first post of a call: checks that `peers` (local ranks) make the same call.
    fn check_signatures(
        &self,
        s: usize,
        call: Call,
        len: usize,
        peers: impl Iterator<Item = usize>,
        live: &mut dyn Liveness,
    ) -> Result<(), CommError> {
        let mine = call.signature(len);
        for j in peers {
            let theirs = self.seg.signature(j, s).load(Ordering::Relaxed);
            if theirs == mine {
                continue;
            }
            let peer = live.name(self.ranks[j]);
            let their_len = (theirs & ((1 << 40) - 1)) as usize;
            if theirs >> 40 == mine >> 40 {
                return Err(CommError::Mismatch { peer, got: their_len, expected: len });
            }
            return Err(CommError::Invalid(format!(
                "{peer} called {} where this rank called {}: every rank must call the same collectives in \
                 the same order",
                Call::describe(theirs),
                Call::describe(mine)
            )));
        }
        Ok(())
    }

    /// Copies `src` into local rank `rank`'s slot `s` at element `at`.
    ///
    /// Only this rank writes its own slots, and only while the protocol has handed the slot to it.
    fn put(&self, s: usize, at: usize, src: &[f32]) {
        debug_assert!(at + src.len() <= self.slot_len());
        // SAFETY: the range lies within this rank's slot `s` (pieces never exceed the slot), which
        // no other rank reads until the next step publishes it.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.seg.slot(self.me, s).add(at), src.len()) };
    }

    /// Local rank `j`'s slot `s` from element `at`, `len` elements long.
    fn view(&self, j: usize, s: usize, at: usize, len: usize) -> &[f32] {
        debug_assert!(at + len <= self.slot_len());
        // SAFETY: within rank j's slot `s`; rank j published it (this rank awaited its step) and
        // will not rewrite it before this rank's next step reaches its `free_at`.
        unsafe { std::slice::from_raw_parts(self.seg.slot(j, s).add(at), len) }
    }

    /// Reduces `buf` into blocks of `owners` owners (local ranks `0..owners`): afterwards each
    /// owner's [`block_range`] block holds the reduction (divided by `finish` for an `Average`,
    /// when given); with `gather`, every rank's whole `buf` does.
    pub fn reduce(
        &mut self,
        buf: &mut [f32],
        op: ReduceOp,
        owners: usize,
        gather: bool,
        finish: Option<usize>,
        live: &mut dyn Liveness,
    ) -> Result<(), CommError> {
        let (n, size, me) = (buf.len(), self.size(), self.me);
        let owners = owners.clamp(1, size);
        let call = Call::Reduce { gather, owners };
        let q = (self.slot_len() / owners).max(1);
        let blocks: Vec<Range<usize>> = (0..owners).map(|b| block_range(n, owners, b)).collect();
        let pieces = n.div_ceil(owners).div_ceil(q).max(1);
        let own = (me < owners).then_some(me);
        for k in 0..pieces {
            let s = self.take_slot(live)?;
            for (b, block) in blocks.iter().enumerate().filter(|(b, _)| Some(*b) != own) {
                self.put(s, b * q, &buf[piece(block, k, q)]);
            }
            if k == 0 {
                self.sign(s, call, n);
            }
            self.step();
            let posted = self.seq;
            if k == 0 {
                self.await_others(posted, live)?;
                self.check_signatures(s, call, n, self.others(), live)?;
            }
            if let Some(b) = own {
                self.await_others(posted, live)?;
                let part = piece(&blocks[b], k, q);
                let dst = &mut buf[part.clone()];
                for j in self.others() {
                    kernel::combine(op, dst, self.view(j, s, b * q, part.len()), false);
                }
                if let Some(size) = finish {
                    op.finish(dst, size);
                }
                if gather {
                    self.put(s, b * q, dst);
                }
            }
            self.step();
            if gather {
                let reduced = self.seq;
                self.copy_others_pieces(s, buf, &blocks, own, (k, q), reduced, live)?;
                self.step();
            }
            self.free_at[s] = self.seq;
        }
        Ok(())
    }

    /// Copies piece `k` (of `q` values) of every block but `own` from its owner's part of slot `s`
    /// into `buf`, once each owner has posted `seq`.
    #[allow(clippy::too_many_arguments)]
    fn copy_others_pieces(
        &mut self,
        s: usize,
        buf: &mut [f32],
        blocks: &[Range<usize>],
        own: Option<usize>,
        (k, q): (usize, usize),
        seq: u32,
        live: &mut dyn Liveness,
    ) -> Result<(), CommError> {
        for (b, block) in blocks.iter().enumerate().filter(|(b, _)| Some(*b) != own) {
            self.await_rank(b, seq, live)?;
            let part = piece(block, k, q);
            let len = part.len();
            buf[part].copy_from_slice(self.view(b, s, b * q, len));
        }
        Ok(())
    }

    /// Copies each owner's [`block_range`] block (of `owners` blocks) of `buf` to every rank.
    pub fn gather(
        &mut self,
        buf: &mut [f32],
        owners: usize,
        live: &mut dyn Liveness,
    ) -> Result<(), CommError> {
        let (n, size, me) = (buf.len(), self.size(), self.me);
        let owners = owners.clamp(1, size);
        let call = Call::Gather { owners };
        let q = (self.slot_len() / owners).max(1);
        let blocks: Vec<Range<usize>> = (0..owners).map(|b| block_range(n, owners, b)).collect();
        let pieces = n.div_ceil(owners).div_ceil(q).max(1);
        let own = (me < owners).then_some(me);
        for k in 0..pieces {
            let s = self.take_slot(live)?;
            if let Some(b) = own {
                self.put(s, b * q, &buf[piece(&blocks[b], k, q)]);
            }
            if k == 0 {
                self.sign(s, call, n);
            }
            self.step();
            let posted = self.seq;
            if k == 0 {
                self.await_others(posted, live)?;
                self.check_signatures(s, call, n, self.others(), live)?;
            }
            self.copy_others_pieces(s, buf, &blocks, own, (k, q), posted, live)?;
            self.step();
            self.free_at[s] = self.seq;
        }
        Ok(())
    }

    /// Copies local rank `root`'s `buf` to every rank.
    pub fn broadcast(
        &mut self,
        buf: &mut [f32],
        root: usize,
        live: &mut dyn Liveness,
    ) -> Result<(), CommError> {
        let n = buf.len();
        let call = Call::Broadcast { root };
        let q = self.slot_len();
        let pieces = n.div_ceil(q).max(1);
        let whole = 0..n;
        for k in 0..pieces {
            let s = self.take_slot(live)?;
            let part = piece(&whole, k, q);
            if self.me == root {
                self.put(s, 0, &buf[part.clone()]);
                if k == 0 {
                    self.sign(s, call, n);
                }
            }
            self.step();
            let posted = self.seq;
            if self.me != root {
                self.await_rank(root, posted, live)?;
                if k == 0 {
                    self.check_signatures(s, call, n, std::iter::once(root), live)?;
                }
                let len = part.len();
                buf[part].copy_from_slice(self.view(root, s, 0, len));
            }
            self.step();
            self.free_at[s] = self.seq;
        }
        Ok(())
    }

    /// Returns once every local rank has entered the barrier.
    pub fn barrier(&mut self, live: &mut dyn Liveness) -> Result<(), CommError> {
        self.step();
        self.await_others(self.seq, live)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::thread;

    use super::super::Peer;
    use super::super::selftest::{input, reference_allreduce};
    use super::*;

    /// Liveness for ranks that are threads of this test: nobody dies, nobody is probed.
    struct Threads;

    impl Liveness for Threads {
        fn check(&mut self) -> Result<(), CommError> {
            Ok(())
        }
        fn probe(&mut self, _: usize) {}
        fn answered(&self, _: usize) -> bool {
            true
        }
        fn timeout(&self) -> Duration {
            Duration::from_secs(30)
        }
        fn name(&self, peer: usize) -> Peer {
            Peer { rank: peer, addr: "in-process".to_owned() }
        }
    }

    fn dir() -> PathBuf {
        std::env::temp_dir()
    }

    /// Liveness of a peer that is gone: `check` reports it once `after` has passed since the
    /// start, and counts how often the waiter asked.
    struct GoneAfter {
        since: Instant,
        after: Duration,
        checks: usize,
    }

    impl Liveness for GoneAfter {
        fn check(&mut self) -> Result<(), CommError> {
            self.checks += 1;
            if self.since.elapsed() < self.after {
                return Ok(());
            }
            Err(CommError::PeerFailed { peer: self.name(1), reason: "its connection closed".to_owned() })
        }
        fn probe(&mut self, _: usize) {}
        fn answered(&self, _: usize) -> bool {
            true
        }
        fn timeout(&self) -> Duration {
            Duration::from_secs(30)
        }
        fn name(&self, peer: usize) -> Peer {
            Peer { rank: peer, addr: "in-process".to_owned() }
        }
    }

    /// CPU time this thread has used.
    fn thread_cpu() -> Duration {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: a valid clock id and a live timespec to write.
        unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
    }

    /// A fresh two-rank segment, both mappings.
    fn pair(slot_bytes: usize) -> (Segment, Segment) {
        let token = b"test-token".to_vec();
        let nonce = super::super::auth::nonce().unwrap();
        let mut a = Segment::create(&dir(), &token, &nonce, 2, 2, slot_bytes).unwrap();
        let b = Segment::attach(&dir(), &token, &nonce, 2, 2, slot_bytes).unwrap();
        a.unlink();
        (a, b)
    }

    /// Runs `f` on `size` threads, each with its own mapping of one fresh segment.
    fn on_host<R: Send + 'static>(
        size: usize,
        slot_bytes: usize,
        f: impl Fn(&mut ShmGroup) -> R + Send + Sync + Copy + 'static,
    ) -> Vec<R> {
        let token = b"test-token".to_vec();
        let nonce = super::super::auth::nonce().unwrap();
        let created = Segment::create(&dir(), &token, &nonce, size, 2, slot_bytes).unwrap();
        let mut segments = vec![created];
        for _ in 1..size {
            segments.push(Segment::attach(&dir(), &token, &nonce, size, 2, slot_bytes).unwrap());
        }
        segments[0].unlink();
        let handles: Vec<_> = segments
            .into_iter()
            .enumerate()
            .map(|(me, seg)| {
                thread::spawn(move || {
                    let mut g = ShmGroup::new(seg, me, (0..size).collect(), Duration::from_micros(20));
                    f(&mut g)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    }

    #[test]
    fn allreduce_gather_and_broadcast_match_the_reference_for_every_size_and_length() {
        for size in 1..=5 {
            // 256-byte slots: 64 elements, so most lengths take many pieces and uneven blocks.
            for len in [0, 1, 5, 63, 64, 65, 1000, 4099] {
                for op in ReduceOp::ALL {
                    let want = reference_allreduce(size, len, 4, op);
                    let got = on_host(size, 256, move |g| {
                        let mut buf = input(g.local_rank(), len, 4);
                        g.reduce(&mut buf, op, g.size(), true, Some(g.size()), &mut Threads).unwrap();
                        let mut again = input(g.local_rank(), len, 4);
                        g.reduce(&mut again, op, 1, false, None, &mut Threads).unwrap();
                        let mut bcast = input(g.local_rank(), len, 5);
                        g.broadcast(&mut bcast, g.size() - 1, &mut Threads).unwrap();
                        g.barrier(&mut Threads).unwrap();
                        (buf, again, bcast)
                    });
                    for (rank, (buf, again, bcast)) in got.iter().enumerate() {
                        assert_eq!(buf, &want, "allreduce size {size} len {len} {op} rank {rank}");
                        if rank == 0 && op != ReduceOp::Average {
                            assert_eq!(again, &want, "reduce to one owner, size {size} len {len} {op}");
                        }
                        assert_eq!(bcast, &input(size - 1, len, 5), "broadcast size {size} len {len}");
                    }
                }
            }
        }
    }

    #[test]
    fn a_wait_ends_when_the_peer_arrives_in_any_stage_of_it() {
        // The peer steps at once (stage 1), after the spin (stage 2: yielding), and after the
        // whole awake time (stage 3: the futex); with no awake time at all every wait sleeps. Each
        // wait must end with the peer's step: a lost wake-up would hang here.
        for (awake, delays) in
            [(Duration::from_millis(2), [0, 100, 5_000]), (Duration::ZERO, [0, 100, 20_000])]
        {
            let (a, b) = pair(256);
            let waiter = ShmGroup::new(a, 0, vec![0, 1], awake);
            let mut peer = ShmGroup::new(b, 1, vec![0, 1], awake);
            let stepper = thread::spawn(move || {
                for us in delays {
                    thread::sleep(Duration::from_micros(us));
                    peer.step();
                }
                peer
            });
            for target in 1..=3 {
                waiter.await_rank(1, target, &mut Threads).unwrap();
                assert!(reached(waiter.seg.seq(1).load(Ordering::Acquire), target));
            }
            stepper.join().unwrap();
        }
    }

    #[test]
    fn many_collectives_in_a_row_never_lose_a_wake_up_even_when_every_wait_sleeps() {
        // No awake time: every wait that does not find its peer there goes to the futex, so this
        // races the sleeper's registration against the waker's check hundreds of times per rank.
        for size in [2, 3, 4] {
            let token = b"test-token".to_vec();
            let nonce = super::super::auth::nonce().unwrap();
            let mut segments = vec![Segment::create(&dir(), &token, &nonce, size, 2, 256).unwrap()];
            for _ in 1..size {
                segments.push(Segment::attach(&dir(), &token, &nonce, size, 2, 256).unwrap());
            }
            segments[0].unlink();
            let want = reference_allreduce(size, 100, 4, ReduceOp::Sum);
            let handles: Vec<_> = segments
                .into_iter()
                .enumerate()
                .map(|(me, seg)| {
                    let want = want.clone();
                    thread::spawn(move || {
                        let mut g = ShmGroup::new(seg, me, (0..size).collect(), Duration::ZERO);
                        for _ in 0..500 {
                            let mut buf = input(me, 100, 4);
                            g.reduce(&mut buf, ReduceOp::Sum, size, true, None, &mut Threads).unwrap();
                            assert_eq!(buf, want, "size {size} rank {me}");
                        }
                    })
                })
                .collect();
            for h in handles {
                h.join().unwrap();
            }
        }
    }

    #[test]
    fn a_rank_waiting_on_a_gone_peer_sleeps_and_returns_its_error() {
        // The peer never steps; its liveness reports it gone after 300 ms. The wait must return
        // that error (not hang), having slept on the futex between checks rather than spun: a few
        // dozen checks, and far less CPU time than the wait took.
        let (a, _b) = pair(256);
        let waiter = ShmGroup::new(a, 0, vec![0, 1], ShmConfig::default().spin);
        let mut live = GoneAfter { since: Instant::now(), after: Duration::from_millis(300), checks: 0 };
        let (cpu, wall) = (thread_cpu(), Instant::now());
        let err = waiter.await_rank(1, 1, &mut live).unwrap_err();
        let (cpu, wall) = (thread_cpu() - cpu, wall.elapsed());
        assert!(matches!(&err, CommError::PeerFailed { peer, .. } if peer.rank == 1), "{err:?}");
        let most = 2 * (wall.as_millis() / SLICE.as_millis()) as usize + 10;
        assert!(live.checks <= most, "{} liveness checks in {wall:?}: it spun", live.checks);
        assert!(cpu < wall / 2, "the wait used {cpu:?} of CPU in {wall:?}: it burnt a core");
    }

    #[test]
    fn gather_copies_every_owners_block() {
        for (size, owners) in [(3, 3), (4, 2), (5, 1)] {
            let len = 1001;
            let got = on_host(size, 512, move |g| {
                let mut buf = input(g.local_rank(), len, 6);
                g.gather(&mut buf, owners, &mut Threads).unwrap();
                buf
            });
            let mut want = vec![0.0; len];
            for b in 0..owners {
                let r = block_range(len, owners, b);
                want[r.clone()].copy_from_slice(&input(b, len, 6)[r]);
            }
            for g in &got {
                assert_eq!(g, &want, "size {size} owners {owners}");
            }
        }
    }

    #[test]
    fn a_different_call_or_length_is_named_not_garbage() {
        let got = on_host(2, 256, |g| {
            let mut buf = vec![1.0; 100 + g.local_rank()];
            g.reduce(&mut buf, ReduceOp::Sum, 2, true, None, &mut Threads)
        });
        assert!(got.iter().all(|r| matches!(r, Err(CommError::Mismatch { .. }))), "{got:?}");
        let got = on_host(2, 256, |g| {
            let mut buf = vec![1.0; 100];
            if g.local_rank() == 0 {
                g.reduce(&mut buf, ReduceOp::Sum, 2, true, None, &mut Threads)
            } else {
                g.gather(&mut buf, 2, &mut Threads)
            }
        });
        assert!(
            got.iter().all(|r| matches!(r, Err(CommError::Invalid(m)) if m.contains("same collectives"))),
            "{got:?}"
        );
    }

    #[test]
    fn a_segment_of_another_token_is_refused_and_the_name_needs_the_token() {
        let nonce = super::super::auth::nonce().unwrap();
        let seg = Segment::create(&dir(), b"right", &nonce, 2, 2, 256).unwrap();
        assert_ne!(Segment::file_name(b"right", &nonce), Segment::file_name(b"wrong", &nonce));
        let err = Segment::attach(&dir(), b"wrong", &nonce, 2, 2, 256).unwrap_err();
        assert!(err.contains("cannot open"), "{err}");
        // Same name but a forged header: copy the file under the name the wrong token derives.
        let forged = dir().join(Segment::file_name(b"wrong", &nonce));
        std::fs::copy(dir().join(Segment::file_name(b"right", &nonce)), &forged).unwrap();
        let err = Segment::attach(&dir(), b"wrong", &nonce, 2, 2, 256).unwrap_err();
        std::fs::remove_file(&forged).unwrap();
        assert!(err.contains("not created by a holder"), "{err}");
        let path = dir().join(Segment::file_name(b"right", &nonce));
        assert!(path.exists());
        drop(seg);
        assert!(!path.exists(), "the creator's drop removes an unlinked-never file");
    }
}
