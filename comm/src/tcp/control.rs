//! The control connections: goodbye, abort and liveness probes, and what they tell about peers.
//!
//! A control message is `kind (1) ‖ culprit rank (u32) ‖ reason length (u16) ‖ reason`. A rank that
//! leaves says goodbye; a rank that fails tells every other rank which peer failed (abort), so that
//! all ranks name the same culprit; a rank that waits too long probes the stalled peer (ping), which
//! answers (pong) from whatever wait it is in — a TCP exchange or a shared-memory wait.
//!
//! Guarantees: a control connection that closes without a goodbye is a dead peer, reported at once;
//! control messages are tiny and rare and never block the sender.

use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::time::Duration;

use super::super::liveness::Liveness;
use super::super::{CommError, Peer};
use super::TcpTransport;
use super::exchange::send_parts;

const MSG_BYE: u8 = 1;
const MSG_ABORT: u8 = 2;
const MSG_PING: u8 = 3;
const MSG_PONG: u8 = 4;

/// Header bytes of a control message.
const HEADER: usize = 7;

impl TcpTransport {
    /// Sends a control message to `peer`, best effort (control messages are tiny and rare).
    fn send_control(&mut self, peer: usize, kind: u8, culprit: u32, reason: &str) {
        let reason = &reason.as_bytes()[..reason.len().min(1024)];
        let mut msg = vec![kind];
        msg.extend_from_slice(&culprit.to_le_bytes());
        msg.extend_from_slice(&(reason.len() as u16).to_le_bytes());
        msg.extend_from_slice(reason);
        if let Some(Some(link)) = self.links.get_mut(peer)
            && !link.closed
        {
            let _ = send_parts(link.control.as_raw_fd(), &msg, &[]);
        }
    }

    /// Reads what `peer` said on its control connection and acts on it: answers probes, records
    /// goodbyes and pongs, and turns aborts and unannounced closes into errors.
    pub(super) fn read_control(&mut self, peer: usize) -> Result<(), CommError> {
        let eof = self.drain_control(peer)?;
        loop {
            let link = self.link(peer)?;
            if link.inbox.len() < HEADER {
                break;
            }
            let len = usize::from(u16::from_le_bytes([link.inbox[5], link.inbox[6]]));
            if link.inbox.len() < HEADER + len {
                break;
            }
            let msg: Vec<u8> = link.inbox.drain(..HEADER + len).collect();
            let culprit = u32::from_le_bytes([msg[1], msg[2], msg[3], msg[4]]) as usize;
            match msg[0] {
                MSG_BYE => link.said_bye = true,
                MSG_PONG => link.ponged = true,
                MSG_PING => self.send_control(peer, MSG_PONG, 0, ""),
                MSG_ABORT => {
                    let reason = String::from_utf8_lossy(&msg[HEADER..]).into_owned();
                    let culprit = culprit.min(self.names.len() - 1);
                    return Err(self.peer_failed(culprit, format!("reported by rank {peer}: {reason}")));
                }
                _ => {}
            }
        }
        if eof {
            let link = self.link(peer)?;
            link.closed = true;
            if !link.said_bye {
                return Err(self.peer_failed(
                    peer,
                    "its connection closed without a goodbye: the process exited or was killed",
                ));
            }
        }
        Ok(())
    }

    /// Moves everything readable on `peer`'s control connection into its inbox; returns whether
    /// the connection has ended.
    fn drain_control(&mut self, peer: usize) -> Result<bool, CommError> {
        let mut buf = [0u8; 2048];
        let link = self.link(peer)?;
        if link.closed {
            return Ok(false);
        }
        loop {
            match (&link.control).read(&mut buf) {
                Ok(0) => return Ok(true),
                Ok(n) => link.inbox.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return Ok(true),
            }
        }
    }

    /// The error for a data connection that `peer` closed: an abort it sent first wins.
    pub(super) fn data_closed(&mut self, peer: usize, detail: &str) -> CommError {
        if let Ok(link) = self.link(peer) {
            let fd = link.control.as_raw_fd();
            // The abort, if any, was written before the close; give it a moment to be readable.
            let mut pfd = [libc::pollfd { fd, events: libc::POLLIN, revents: 0 }];
            // SAFETY: `pfd` is a valid array of one pollfd for the duration of the call.
            unsafe { libc::poll(pfd.as_mut_ptr(), 1, 200) };
            if let Err(e) = self.read_control(peer) {
                return e;
            }
            if self.links[peer].as_ref().is_some_and(|l| l.said_bye) {
                return self.peer_failed(
                    peer,
                    "it left the group (closed its communicator) while this rank still expected data from it",
                );
            }
        }
        self.peer_failed(peer, format!("its connection broke ({detail}): the process exited or was killed"))
    }

    /// Poisons the communicator with `error` and tells every peer which rank failed, so that all
    /// ranks name the same culprit. Later calls return `error`.
    pub fn fail(&mut self, error: &CommError) {
        if self.failed.is_some() {
            return;
        }
        let culprit = match error {
            CommError::PeerFailed { peer, .. }
            | CommError::PeerTimeout { peer, .. }
            | CommError::Mismatch { peer, .. } => Some(peer.rank),
            _ => None,
        };
        if let Some(culprit) = culprit {
            let reason = error.to_string();
            for peer in 0..self.names.len() {
                if peer != culprit && peer != self.rank {
                    self.send_control(peer, MSG_ABORT, culprit as u32, &reason);
                }
            }
        }
        self.failed = Some(error.clone());
    }

    /// The control connections to poll (fds and their peers).
    pub(super) fn control_fds(&self) -> Vec<(libc::c_int, usize)> {
        self.links
            .iter()
            .enumerate()
            .filter_map(|(peer, l)| l.as_ref().filter(|l| !l.closed).map(|l| (l.control.as_raw_fd(), peer)))
            .collect()
    }

    /// Reads every control connection that is readable within `timeout` (0: only what is there).
    fn poll_control(&mut self, timeout: Duration) -> Result<(), CommError> {
        let peers = self.control_fds();
        let mut fds: Vec<libc::pollfd> =
            peers.iter().map(|&(fd, _)| libc::pollfd { fd, events: libc::POLLIN, revents: 0 }).collect();
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: `fds` is a valid, exclusively borrowed array of `fds.len()` pollfds.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if n <= 0 {
            return Ok(());
        }
        for (pfd, &(_, peer)) in fds.iter().zip(&peers) {
            if pfd.revents != 0 {
                self.read_control(peer)?;
            }
        }
        Ok(())
    }
}

impl Liveness for TcpTransport {
    fn check(&mut self) -> Result<(), CommError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        self.poll_control(Duration::ZERO)
    }

    fn probe(&mut self, peer: usize) {
        if let Some(Some(link)) = self.links.get_mut(peer) {
            link.ponged = false;
        }
        self.send_control(peer, MSG_PING, 0, "");
    }

    fn answered(&self, peer: usize) -> bool {
        self.links.get(peer).and_then(Option::as_ref).is_some_and(|l| l.ponged)
    }

    fn timeout(&self) -> Duration {
        self.timeout
    }

    fn name(&self, peer: usize) -> Peer {
        TcpTransport::name(self, peer)
    }
}

impl Drop for TcpTransport {
    fn drop(&mut self) {
        if self.failed.is_none() {
            for peer in 0..self.names.len() {
                self.send_control(peer, MSG_BYE, 0, "");
            }
        }
    }
}
