//! How a waiting rank tells a slow peer from a dead or hung one, whatever it waits on (a socket
//! or a shared-memory counter).
//!
//! Expected flow: a wait loop creates a [`Watchdog`], calls [`Watchdog::progressed`] whenever the
//! awaited peer moves, [`Liveness::check`] between sleeps (deaths and aborts arrive there), and
//! [`Watchdog::expired`] once [`Watchdog::deadline`] passes without progress.
//!
//! Guarantees: a peer silent for the timeout is probed; if it does not answer within
//! [`PROBE_GRACE`] it is named as hung ([`CommError::PeerTimeout`]); if it answers it is alive and
//! itself waiting on someone, so the wait goes on for one more timeout, by which time the real
//! culprit's neighbours have reported it.

use std::time::{Duration, Instant};

use super::{CommError, Peer};

/// How long a probed peer has to answer.
pub const PROBE_GRACE: Duration = Duration::from_secs(2);

/// What a wait needs to know about the other ranks.
pub trait Liveness {
    /// Without blocking: answers probes from peers, and returns the error for a peer that died
    /// or that another rank reported failed (or the error that already poisoned the group).
    fn check(&mut self) -> Result<(), CommError>;
    /// Asks `peer` (a rank of the whole group) whether it is alive.
    fn probe(&mut self, peer: usize);
    /// Whether `peer` answered the last probe.
    fn answered(&self, peer: usize) -> bool;
    /// The collective timeout.
    fn timeout(&self) -> Duration;
    /// `peer` as named in errors.
    fn name(&self, peer: usize) -> Peer;
}

/// What the wait for a stalled peer has found so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stall {
    Waiting,
    Probing { peer: usize },
    Extended,
}

/// The timeout state of one wait.
#[derive(Debug)]
pub struct Watchdog {
    stall: Stall,
    deadline: Instant,
    timeout: Duration,
}

impl Watchdog {
    /// A wait that starts now.
    pub fn new(timeout: Duration) -> Self {
        Self { stall: Stall::Waiting, deadline: Instant::now() + timeout, timeout }
    }

    /// When to act if nothing moves.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// The awaited peer moved: start the timeout over.
    pub fn progressed(&mut self) {
        self.stall = Stall::Waiting;
        self.deadline = Instant::now() + self.timeout;
    }

    /// The deadline passed without progress from `stalled`: probe it, or name it as hung if a probe
    /// already went unanswered (or the extra timeout after an answer ran out).
    pub fn expired(&mut self, live: &mut (impl Liveness + ?Sized), stalled: usize) -> Result<(), CommError> {
        match self.stall {
            Stall::Waiting => {
                live.probe(stalled);
                self.stall = Stall::Probing { peer: stalled };
                self.deadline = Instant::now() + self.timeout.min(PROBE_GRACE);
                Ok(())
            }
            Stall::Probing { .. } | Stall::Extended => Err(CommError::PeerTimeout {
                peer: live.name(stalled),
                timeout_s: self.timeout.as_secs_f64(),
            }),
        }
    }

    /// After a sleep: a probed peer that answered is alive and itself waiting, so give the real
    /// culprit's neighbours one more timeout to detect and report it.
    pub fn after_sleep(&mut self, live: &(impl Liveness + ?Sized)) {
        if let Stall::Probing { peer } = self.stall
            && live.answered(peer)
        {
            self.stall = Stall::Extended;
            self.deadline = Instant::now() + self.timeout;
        }
    }
}
