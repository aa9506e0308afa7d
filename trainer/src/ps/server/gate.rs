//! What a connection may cost before it has proven the job token: admission bounds on
//! not-yet-authenticated connections, per source address and in all, shared by the training port
//! and the HTTP status port, and a rate limit on the log lines refused peers cause.
//!
//! Expected flow: the accept loop calls [`Admission::admit`] for every new connection and keeps
//! the [`Ticket`] until the peer has proven the token (or its request head is read); the task
//! serving the connection races its work against [`Ticket::evicted`] and drops the ticket when done.
//!
//! Guarantees: a new connection is always admitted, so a peer that holds many idle connections
//! cannot lock anyone out. When its source already holds `per_source` unauthenticated
//! connections, the oldest of them is evicted; when `total` are held in all, the oldest
//! connection of the source holding the most is evicted. A real client — one connection that
//! proves the token within a round trip — is therefore never the one evicted while any other
//! source holds more than it does, and one hostile address can hold at most `per_source`
//! connections' worth of server memory. The count of refusals and evictions is kept
//! ([`Admission::refused`]).

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// Bounds on connections that have not yet proven the token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// Most held at once from one source address.
    pub per_source: usize,
    /// Most held at once in all.
    pub total: usize,
}

/// The registry of connections not yet authenticated. Cheap to clone (shared).
#[derive(Clone)]
pub struct Admission {
    inner: Arc<Inner>,
}

struct Inner {
    bounds: Bounds,
    held: Mutex<Held>,
    refused: AtomicU64,
    log: LogLimit,
}

#[derive(Default)]
struct Held {
    next: u64,
    total: usize,
    by_source: HashMap<IpAddr, VecDeque<(u64, Arc<Notify>)>>,
}

impl Held {
    /// Evicts the oldest connection of `source`; `false` if it holds none.
    fn evict_oldest(&mut self, source: IpAddr) -> bool {
        let Some(queue) = self.by_source.get_mut(&source) else { return false };
        let Some((_, evicted)) = queue.pop_front() else { return false };
        if queue.is_empty() {
            self.by_source.remove(&source);
        }
        self.total -= 1;
        // `notify_one` keeps the permit if the task is not waiting yet.
        evicted.notify_one();
        true
    }
}

impl Admission {
    /// An empty registry with `bounds` (each at least 1).
    pub fn new(bounds: Bounds) -> Self {
        let bounds = Bounds { per_source: bounds.per_source.max(1), total: bounds.total.max(1) };
        Self {
            inner: Arc::new(Inner {
                bounds,
                held: Mutex::new(Held::default()),
                refused: AtomicU64::new(0),
                log: LogLimit::new(10, Duration::from_secs(10)),
            }),
        }
    }

    /// Admits a new connection from `source`, evicting an older one if a bound is reached.
    pub fn admit(&self, source: IpAddr) -> Ticket {
        let evicted = Arc::new(Notify::new());
        let mut guard = self.inner.held.lock().unwrap_or_else(|p| p.into_inner());
        let held = &mut *guard;
        let bounds = self.inner.bounds;
        let mut dropped = 0u64;
        if held.by_source.get(&source).is_some_and(|q| q.len() >= bounds.per_source) {
            dropped += u64::from(held.evict_oldest(source));
        }
        if held.total >= bounds.total {
            let largest = held.by_source.iter().max_by_key(|(_, q)| q.len()).map(|(ip, _)| *ip);
            if let Some(ip) = largest {
                dropped += u64::from(held.evict_oldest(ip));
            }
        }
        let id = held.next;
        held.next += 1;
        held.total += 1;
        held.by_source.entry(source).or_default().push_back((id, evicted.clone()));
        drop(guard);
        if dropped > 0 {
            self.inner.refused.fetch_add(dropped, Ordering::Relaxed);
            self.log_refusal(source, "too many unauthenticated connections; the oldest was closed");
        }
        Ticket { admission: self.clone(), source, id, evicted, released: false }
    }

    /// Unauthenticated connections held now.
    pub fn held(&self) -> usize {
        self.inner.held.lock().map(|h| h.total).unwrap_or(0)
    }

    /// Connections refused or evicted before authenticating, since start.
    pub fn refused(&self) -> u64 {
        self.inner.refused.load(Ordering::Relaxed)
    }

    /// Counts a refusal of a peer from `source` and logs it, at most ten lines per ten seconds
    /// (the next line says how many were left out).
    pub fn refuse(&self, source: IpAddr, reason: &str) {
        self.inner.refused.fetch_add(1, Ordering::Relaxed);
        self.log_refusal(source, reason);
    }

    fn log_refusal(&self, source: IpAddr, reason: &str) {
        if let Some(suppressed) = self.inner.log.allow(Instant::now()) {
            if suppressed > 0 {
                tracing::warn!(%source, suppressed, "unauthenticated peer refused: {reason} ({suppressed} similar lines left out)");
            } else {
                tracing::warn!(%source, "unauthenticated peer refused: {reason}");
            }
        }
    }

    fn release(&self, source: IpAddr, id: u64) {
        let mut held = self.inner.held.lock().unwrap_or_else(|p| p.into_inner());
        let Some(queue) = held.by_source.get_mut(&source) else { return };
        let Some(at) = queue.iter().position(|(i, _)| *i == id) else { return };
        queue.remove(at);
        if queue.is_empty() {
            held.by_source.remove(&source);
        }
        held.total -= 1;
    }
}

/// One admitted connection's place in the registry; dropping it frees the place.
pub struct Ticket {
    admission: Admission,
    source: IpAddr,
    id: u64,
    evicted: Arc<Notify>,
    released: bool,
}

impl Ticket {
    /// Completes when this connection was evicted to make room for a newer one.
    pub async fn evicted(&self) {
        self.eviction().await;
    }

    /// [`Ticket::evicted`] as a future that owns what it waits on, for a task that hands the
    /// ticket to the code that learns when the peer is through (the HTTP service, once hyper has
    /// parsed the head).
    pub fn eviction(&self) -> impl Future<Output = ()> + Send + 'static {
        let evicted = self.evicted.clone();
        async move { evicted.notified().await }
    }

    /// The peer's address.
    pub fn source(&self) -> IpAddr {
        self.source
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.released {
            self.released = true;
            self.admission.release(self.source, self.id);
        }
    }
}

/// At most `lines` log lines per `window`; counts the ones it holds back.
struct LogLimit {
    lines: u32,
    window: Duration,
    state: Mutex<(Instant, u32, u64)>,
}

impl LogLimit {
    fn new(lines: u32, window: Duration) -> Self {
        Self { lines, window, state: Mutex::new((Instant::now(), 0, 0)) }
    }

    /// `Some(lines held back since the last one written)` if a line may be written now.
    fn allow(&self, now: Instant) -> Option<u64> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let (start, written, held_back) = &mut *s;
        if now.duration_since(*start) >= self.window {
            *start = now;
            *written = 0;
        }
        if *written < self.lines {
            *written += 1;
            Some(std::mem::take(held_back))
        } else {
            *held_back += 1;
            None
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    #[tokio::test]
    async fn a_full_source_loses_its_oldest_and_others_keep_theirs() {
        let a = Admission::new(Bounds { per_source: 2, total: 100 });
        let first = a.admit(ip(2));
        let real = a.admit(ip(1));
        let _second = a.admit(ip(2));
        let _third = a.admit(ip(2));
        // The first of 127.0.0.2 made room; 127.0.0.1's one connection stays.
        tokio::time::timeout(Duration::from_secs(5), first.evicted()).await.unwrap();
        assert_eq!(a.held(), 3);
        assert_eq!(a.refused(), 1);
        drop(real);
        assert_eq!(a.held(), 2);
    }

    #[tokio::test]
    async fn at_the_global_bound_the_largest_source_pays() {
        let a = Admission::new(Bounds { per_source: 10, total: 3 });
        let real = a.admit(ip(1));
        let oldest = a.admit(ip(2));
        let _b = a.admit(ip(2));
        let _c = a.admit(ip(3));
        tokio::time::timeout(Duration::from_secs(5), oldest.evicted()).await.unwrap();
        let woke = tokio::time::timeout(Duration::from_millis(50), real.evicted()).await;
        assert!(woke.is_err(), "the single connection of 127.0.0.1 must not be evicted");
        assert_eq!(a.held(), 3);
    }

    #[test]
    fn the_log_limit_holds_back_lines_and_counts_them() {
        let limit = LogLimit::new(2, Duration::from_secs(10));
        let t = Instant::now();
        assert_eq!(limit.allow(t), Some(0));
        assert_eq!(limit.allow(t), Some(0));
        assert_eq!(limit.allow(t), None);
        assert_eq!(limit.allow(t), None);
        assert_eq!(limit.allow(t + Duration::from_secs(11)), Some(2));
    }
}
