//! One fork-join thread pool per job, sized by the job's thread count.
//!
//! [`Pool::run`] calls a closure once per thread with the thread's index (the caller is index 0)
//! and returns when every call has returned: an OpenMP-style parallel region. Layers split their
//! work statically by index ([`split`]), so the result of a region depends only on the thread count,
//! never on timing.
//!
//! With one thread there is no pool at all: `run` calls the closure inline. With more, the helper
//! threads spin briefly on an epoch counter after each region (the gaps between a step's regions
//! are microseconds) and then park, so an idle pool costs no CPU.
//!
//! Guarantees: every index in `0..threads` runs exactly once per region; a region started while
//! another is running on the same pool (from another thread) runs all indices inline on its caller
//! instead of waiting; a panic in a helper is re-raised on the caller after the region ends.

use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

type Job = dyn Fn(usize) + Sync;

/// How long a helper spins for the next region before it parks.
const SPIN: Duration = Duration::from_micros(200);

struct Shared {
    /// Incremented once per region; helpers run when it changes.
    epoch: AtomicU64,
    /// Helpers still running the current region.
    remaining: AtomicUsize,
    /// The current region's closure, valid while `remaining > 0` (lifetime erased by `run`).
    job: Mutex<Option<JobPtr>>,
    stop: AtomicBool,
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
    /// A helper's panic payload, re-raised by `run`.
    panic: Mutex<Option<Box<dyn std::any::Any + Send>>>,
}

#[derive(Clone, Copy)]
struct JobPtr(*const Job);
// SAFETY: the pointee is `Sync` and outlives every use (see `Pool::run`).
unsafe impl Send for JobPtr {}

/// A fork-join pool of `threads` threads, the caller included.
pub struct Pool {
    threads: usize,
    shared: Option<Arc<Shared>>,
    busy: AtomicBool,
    handles: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool").field("threads", &self.threads).finish()
    }
}

impl Pool {
    /// A pool of `threads` threads (at least 1; the caller is one of them, so `threads - 1` helper
    /// threads are started).
    pub fn new(threads: usize) -> Self {
        let threads = threads.max(1);
        if threads == 1 {
            return Self { threads, shared: None, busy: AtomicBool::new(false), handles: Vec::new() };
        }
        let shared = Arc::new(Shared {
            epoch: AtomicU64::new(0),
            remaining: AtomicUsize::new(0),
            job: Mutex::new(None),
            stop: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
            panic: Mutex::new(None),
        });
        let mut handles = Vec::with_capacity(threads - 1);
        for tid in 1..threads {
            let shared = Arc::clone(&shared);
            let spawned = std::thread::Builder::new()
                .name(format!("tandem-kernels-{tid}"))
                .spawn(move || helper(&shared, tid));
            match spawned {
                Ok(h) => handles.push(h),
                // Could not start a thread (limits): run with the ones we have.
                Err(_) => break,
            }
        }
        let threads = handles.len() + 1;
        if threads == 1 {
            return Self { threads, shared: None, busy: AtomicBool::new(false), handles: Vec::new() };
        }
        Self { threads, shared: Some(shared), busy: AtomicBool::new(false), handles }
    }

    /// A one-thread pool: regions run inline.
    pub fn single() -> Self {
        Self::new(1)
    }

    /// Number of threads, the caller included.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Runs `f(tid)` for every `tid` in `0..threads()` in parallel (`tid` 0 on the caller) and
    /// returns when all have returned.
    pub fn run<F: Fn(usize) + Sync>(&self, f: F) {
        let Some(shared) = &self.shared else {
            f(0);
            return;
        };
        if self.busy.swap(true, Ordering::Acquire) {
            // Another thread is inside a region of this pool: do this one alone.
            for tid in 0..self.threads {
                f(tid);
            }
            return;
        }
        let job: &(dyn Fn(usize) + Sync + '_) = &f;
        // SAFETY: the pointer is only dereferenced by helpers between the epoch increment below and
        // their decrement of `remaining`, and this function does not return (so `f` stays alive)
        // until `remaining` is back to zero.
        let ptr: *const Job =
            unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync + '_), &'static Job>(job) };
        *lock(&shared.job) = Some(JobPtr(ptr));
        shared.remaining.store(self.threads - 1, Ordering::SeqCst);
        shared.epoch.fetch_add(1, Ordering::SeqCst);
        if shared.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = lock(&shared.lock);
            shared.wake.notify_all();
        }
        let mine = catch_unwind(AssertUnwindSafe(|| f(0)));
        let start = Instant::now();
        while shared.remaining.load(Ordering::Acquire) != 0 {
            if start.elapsed() < SPIN {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        *lock(&shared.job) = None;
        self.busy.store(false, Ordering::Release);
        if let Err(p) = mine {
            resume_unwind(p);
        }
        if let Some(p) = lock(&shared.panic).take() {
            resume_unwind(p);
        }
    }
}

impl Pool {
    /// Runs `f` on one contiguous part per thread of the vectors `a`, `b` and `c`, parts at the
    /// same positions together (an optimizer's update of the flat parameters from the gradient
    /// and its own state, on the job's threads). The vectors are meant to be equally long; beyond
    /// the shortest one's length nothing is touched.
    pub fn for_parts(
        &self,
        a: &mut [f32],
        b: &[f32],
        c: &mut [f32],
        f: impl Fn(&mut [f32], &[f32], &mut [f32]) + Sync,
    ) {
        let n = a.len().min(b.len()).min(c.len());
        let threads = self.threads;
        let (sa, sc) = (SharedMut::new(&mut a[..n]), SharedMut::new(&mut c[..n]));
        self.run(|tid| {
            let r = split(n, tid, threads);
            // SAFETY: `split` gives each thread its own part of 0..n, within both views (length
            // n) and disjoint from every other thread's.
            let (pa, pc) = unsafe { (sa.range(r.clone()), sc.range(r.clone())) };
            f(pa, &b[r], pc);
        });
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        if let Some(shared) = &self.shared {
            shared.stop.store(true, Ordering::SeqCst);
            shared.epoch.fetch_add(1, Ordering::SeqCst);
            let _g = lock(&shared.lock);
            shared.wake.notify_all();
        }
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn helper(shared: &Shared, tid: usize) {
    let mut seen = 0u64;
    loop {
        // Wait for the next region: spin, then park.
        let start = Instant::now();
        let mut epoch = shared.epoch.load(Ordering::Acquire);
        while epoch == seen {
            if start.elapsed() < SPIN {
                std::hint::spin_loop();
            } else {
                let mut g = lock(&shared.lock);
                shared.sleepers.fetch_add(1, Ordering::SeqCst);
                while shared.epoch.load(Ordering::SeqCst) == seen {
                    g = shared.wake.wait(g).unwrap_or_else(|p| p.into_inner());
                }
                shared.sleepers.fetch_sub(1, Ordering::SeqCst);
            }
            epoch = shared.epoch.load(Ordering::Acquire);
        }
        seen = epoch;
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        let job = *lock(&shared.job);
        if let Some(JobPtr(ptr)) = job {
            // SAFETY: see `Pool::run`: the closure is alive until `remaining` reaches zero.
            let f = unsafe { &*ptr };
            if let Err(p) = catch_unwind(AssertUnwindSafe(|| f(tid))) {
                *lock(&shared.panic) = Some(p);
            }
        }
        shared.remaining.fetch_sub(1, Ordering::Release);
    }
}

/// The part of `0..n` that thread `tid` of `threads` handles: contiguous, balanced to within one.
pub fn split(n: usize, tid: usize, threads: usize) -> std::ops::Range<usize> {
    let threads = threads.max(1);
    let base = n / threads;
    let extra = n % threads;
    let start = tid * base + tid.min(extra);
    let len = base + usize::from(tid < extra);
    start.min(n)..(start + len).min(n)
}

/// A shared mutable slice that threads of one region write disjoint parts of.
///
/// The pool's regions hand every thread the same closure, so per-thread outputs (a batch range of
/// an activation, a thread's scratch) are reached through this wrapper; each call site documents
/// why the ranges it writes are disjoint.
#[derive(Clone, Copy)]
pub(crate) struct SharedMut<T> {
    ptr: *mut T,
    len: usize,
}

// SAFETY: the wrapper only hands out disjoint ranges (the caller's obligation, see `range`).
unsafe impl<T: Send> Send for SharedMut<T> {}
unsafe impl<T: Send> Sync for SharedMut<T> {}

impl<T> SharedMut<T> {
    pub(crate) fn new(s: &mut [T]) -> Self {
        Self { ptr: s.as_mut_ptr(), len: s.len() }
    }

    /// The start of the slice, for writers that address disjoint parts themselves.
    pub(crate) fn as_ptr(&self) -> *mut T {
        self.ptr
    }

    /// The sub-slice `r`.
    ///
    /// # Safety
    /// No two live results of this call on the same wrapper may overlap, and the source slice must
    /// outlive them (it does: the wrapper is made from a borrow held across the region).
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn range(&self, r: std::ops::Range<usize>) -> &mut [T] {
        let end = r.end.min(self.len);
        let start = r.start.min(end);
        // SAFETY: in bounds by the clamping above; disjointness is the caller's obligation.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(start), end - start) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_index_runs_once_per_region() {
        for threads in [1, 2, 3] {
            let pool = Pool::new(threads);
            let counts: Vec<AtomicUsize> = (0..threads).map(|_| AtomicUsize::new(0)).collect();
            for _ in 0..1000 {
                pool.run(|tid| {
                    counts[tid].fetch_add(1, Ordering::Relaxed);
                });
            }
            for c in &counts {
                assert_eq!(c.load(Ordering::Relaxed), 1000);
            }
        }
    }

    #[test]
    fn parks_and_wakes_after_idle() {
        let pool = Pool::new(2);
        let hits = AtomicUsize::new(0);
        pool.run(|_| {
            hits.fetch_add(1, Ordering::Relaxed);
        });
        std::thread::sleep(Duration::from_millis(5));
        pool.run(|_| {
            hits.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(hits.load(Ordering::Relaxed), 4);
    }

    #[test]
    fn for_parts_visits_every_position_once() {
        for threads in 1..4 {
            let pool = Pool::new(threads);
            let n = 1003;
            let mut a: Vec<f32> = (0..n).map(|i| i as f32).collect();
            let b: Vec<f32> = (0..n).map(|i| 2.0 * i as f32).collect();
            let mut c = vec![1.0f32; n + 5];
            pool.for_parts(&mut a, &b, &mut c, |a, b, c| {
                for ((a, b), c) in a.iter_mut().zip(b).zip(c.iter_mut()) {
                    *a += b;
                    *c += 1.0;
                }
            });
            assert!(a.iter().enumerate().all(|(i, &v)| v == 3.0 * i as f32), "{threads} thread(s)");
            assert!(c[..n].iter().all(|&v| v == 2.0) && c[n..].iter().all(|&v| v == 1.0));
        }
    }

    #[test]
    fn split_covers_the_range() {
        for n in [0, 1, 5, 64] {
            for threads in 1..5 {
                let mut next = 0;
                for tid in 0..threads {
                    let r = split(n, tid, threads);
                    assert_eq!(r.start, next);
                    next = r.end;
                }
                assert_eq!(next, n);
            }
        }
    }
}
