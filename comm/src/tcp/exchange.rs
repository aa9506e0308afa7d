//! One exchange on the data connections: send a message to one peer while receiving one from a
//! peer (possibly the same), copying or reducing what arrives, in chunks, from one `poll` loop.
//!
//! A message is an 8-byte little-endian element count followed by the elements. The parts:
//! [`Outgoing`] (what is left to send), [`Incoming`] (what is left to receive, and where it goes:
//! in place, or through a chunk-sized staging buffer that is reduced into the destination after
//! every read), the loop [`TcpTransport::run_exchange`] that drives both and, when neither can
//! move, sleeps in [`TcpTransport::wait`] on the data sockets and every control connection, with a
//! [`Watchdog`] for peers that stop moving.
//!
//! Guarantees: a received length that differs from the expected one is a
//! [`CommError::Mismatch`]; in a swap-reduce ([`Transport::swap_reduce`]) an element is combined
//! only after it has been sent, so the peer always receives the values from before the call.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::time::Instant;

use super::super::liveness::Watchdog;
use super::super::transport::{Recv, Transport};
use super::super::{CommError, ReduceOp, kernel};
use super::TcpTransport;

/// The length header of every message.
const HEADER: usize = 8;

/// What is left to send of one message.
struct Outgoing<'a> {
    peer: usize,
    fd: RawFd,
    header: [u8; HEADER],
    /// The payload, or `None` for the receive buffer itself (a swap-reduce).
    payload: Option<&'a [u8]>,
    total: usize,
    done: usize,
}

impl<'a> Outgoing<'a> {
    fn new(peer: usize, fd: RawFd, payload: Option<&'a [u8]>, len_bytes: usize) -> Self {
        let header = (len_bytes as u64 / 4).to_le_bytes();
        Self { peer, fd, header, payload, total: HEADER + len_bytes, done: 0 }
    }

    fn finished(&self) -> bool {
        self.done >= self.total
    }

    /// Payload bytes sent so far.
    fn payload_sent(&self) -> usize {
        self.done.saturating_sub(HEADER)
    }

    /// Sends what the socket takes of the next `chunk` bytes; returns the bytes sent.
    fn advance(&mut self, payload: &[u8], chunk: usize) -> io::Result<usize> {
        let (h, p) = if self.done < HEADER {
            (&self.header[self.done..], &payload[..payload.len().min(chunk)])
        } else {
            let start = self.done - HEADER;
            (&[][..], &payload[start..payload.len().min(start + chunk)])
        };
        let n = send_parts(self.fd, h, p)?;
        self.done += n;
        Ok(n)
    }
}

/// Where received elements go.
enum Sink<'a> {
    /// Straight into place.
    Copy(&'a mut [u8]),
    /// Through `staged` (chunk-sized, cache-resident), then combined into `dst`.
    Reduce {
        dst: &'a mut [f32],
        op: ReduceOp,
        incoming_first: bool,
        staged: &'a mut [u8],
        pending: usize,
        reduced: usize,
    },
}

/// What is left to receive of one message.
struct Incoming<'a> {
    peer: usize,
    fd: RawFd,
    header: [u8; HEADER],
    expected: usize,
    total: usize,
    received: usize,
    sink: Sink<'a>,
}

impl<'a> Incoming<'a> {
    fn new(peer: usize, fd: RawFd, recv: Recv<'a>, staging: &'a mut Vec<f32>, chunk: usize) -> Self {
        let expected = recv.len();
        let sink = match recv {
            Recv::Copy(dst) => Sink::Copy(bytemuck::cast_slice_mut(dst)),
            Recv::Reduce { buf, op, incoming_first } => {
                staging.resize(buf.len().min(chunk / 4).max(1), 0.0);
                Sink::Reduce {
                    dst: buf,
                    op,
                    incoming_first,
                    staged: bytemuck::cast_slice_mut(&mut staging[..]),
                    pending: 0,
                    reduced: 0,
                }
            }
        };
        Self { peer, fd, header: [0; HEADER], expected, total: HEADER + expected * 4, received: 0, sink }
    }

    fn finished(&self) -> bool {
        self.received >= self.total
    }

    /// The destination as bytes (the payload of a swap-reduce's send).
    fn dst_bytes(&self) -> &[u8] {
        match &self.sink {
            Sink::Copy(b) => b,
            Sink::Reduce { dst, .. } => bytemuck::cast_slice(dst),
        }
    }

    /// Receives what is there of the next `chunk` bytes and reduces what is complete, combining
    /// no element at or beyond `limit`. Returns the bytes received, `Ok(None)` at end of stream.
    fn advance(&mut self, chunk: usize, limit: usize) -> Result<Option<usize>, io::Error> {
        let payload_done = self.received.saturating_sub(HEADER);
        let payload_left = self.total - HEADER - payload_done;
        let header: &mut [u8] =
            if self.received < HEADER { &mut self.header[self.received..] } else { &mut [] };
        let room: &mut [u8] = match &mut self.sink {
            Sink::Copy(dst) => {
                let end = dst.len().min(payload_done + chunk);
                &mut dst[payload_done..end]
            }
            Sink::Reduce { staged, pending, .. } => {
                let end = staged.len().min(*pending + payload_left);
                &mut staged[*pending..end]
            }
        };
        if header.is_empty() && room.is_empty() {
            return Ok(Some(0));
        }
        let n = recv_parts(self.fd, header, room)?;
        if n == 0 {
            return Ok(None);
        }
        let header_part = HEADER.saturating_sub(self.received).min(n);
        self.received += n;
        if let Sink::Reduce { pending, .. } = &mut self.sink {
            *pending += n - header_part;
        }
        self.reduce_ready(limit);
        Ok(Some(n))
    }

    /// Combines every complete staged element below `limit` into the destination.
    fn reduce_ready(&mut self, limit: usize) {
        if let Sink::Reduce { dst, op, incoming_first, staged, pending, reduced } = &mut self.sink {
            let complete = (*pending / 4).min(limit.saturating_sub(*reduced));
            if complete == 0 {
                return;
            }
            let incoming: &[f32] = bytemuck::cast_slice(&staged[..complete * 4]);
            kernel::combine(*op, &mut dst[*reduced..*reduced + complete], incoming, *incoming_first);
            *reduced += complete;
            staged.copy_within(complete * 4..*pending, 0);
            *pending -= complete * 4;
        }
    }

    /// The element count the header announced, once it is complete.
    fn announced(&self) -> Option<usize> {
        (self.received >= HEADER).then(|| u64::from_le_bytes(self.header) as usize)
    }
}

impl TcpTransport {
    fn fd(&mut self, peer: usize) -> Result<RawFd, CommError> {
        Ok(self.link(peer)?.data.as_raw_fd())
    }

    /// Drives `out` and `inc` to completion (either may be absent; `out` without a payload sends
    /// `inc`'s destination).
    fn run_exchange(
        &mut self,
        mut out: Option<Outgoing<'_>>,
        mut inc: Option<Incoming<'_>>,
    ) -> Result<(), CommError> {
        let chunk = self.chunk;
        let mut watchdog = Watchdog::new(self.timeout);
        let mut header_checked = false;
        loop {
            let mut progressed = false;
            if let Some(o) = out.as_mut().filter(|o| !o.finished()) {
                let payload = match (o.payload, &inc) {
                    (Some(p), _) => p,
                    (None, Some(i)) => i.dst_bytes(),
                    (None, None) => &[],
                };
                match o.advance(payload, chunk) {
                    Ok(n) => progressed |= n > 0,
                    Err(e) if would_block(&e) => {}
                    Err(e) => {
                        let peer = o.peer;
                        return Err(self.data_closed(peer, &e.to_string()));
                    }
                }
            }
            if let Some(i) = inc.as_mut() {
                // In a swap-reduce only what has been sent may be overwritten.
                let limit = match &out {
                    Some(o) if o.payload.is_none() => o.payload_sent() / 4,
                    _ => usize::MAX,
                };
                if !i.finished() {
                    match i.advance(chunk, limit) {
                        Ok(None) => return Err(self.data_closed(i.peer, "end of stream")),
                        Ok(Some(n)) => progressed |= n > 0,
                        Err(e) if would_block(&e) => {}
                        Err(e) => return Err(self.data_closed(i.peer, &e.to_string())),
                    }
                }
                if !header_checked && let Some(got) = i.announced() {
                    header_checked = true;
                    if got != i.expected {
                        return Err(CommError::Mismatch {
                            peer: self.name(i.peer),
                            got,
                            expected: i.expected,
                        });
                    }
                }
                i.reduce_ready(limit);
            }
            let sent = out.as_ref().is_none_or(Outgoing::finished);
            let received = inc.as_ref().is_none_or(|i| {
                i.finished() && !matches!(&i.sink, Sink::Reduce { pending, .. } if *pending > 0)
            });
            if sent && received {
                return Ok(());
            }
            if progressed {
                watchdog.progressed();
                continue;
            }
            let now = Instant::now();
            if now >= watchdog.deadline() {
                let stalled = match (&inc, &out) {
                    (Some(i), _) if !i.finished() => i.peer,
                    (_, Some(o)) => o.peer,
                    (Some(i), None) => i.peer,
                    (None, None) => return Ok(()),
                };
                watchdog.expired(self, stalled)?;
                continue;
            }
            let send_fd = out.as_ref().filter(|o| !o.finished()).map(|o| o.fd);
            let recv_fd = inc.as_ref().filter(|i| !i.finished()).map(|i| i.fd);
            self.wait(send_fd, recv_fd, watchdog.deadline() - now)?;
            watchdog.after_sleep(self);
        }
    }

    /// Blocks until a data socket is ready, a control message arrives or `timeout` passes.
    fn wait(
        &mut self,
        send_fd: Option<RawFd>,
        recv_fd: Option<RawFd>,
        timeout: std::time::Duration,
    ) -> Result<(), CommError> {
        let controls = self.control_fds();
        let mut fds = Vec::with_capacity(controls.len() + 2);
        if let Some(fd) = send_fd {
            fds.push(libc::pollfd { fd, events: libc::POLLOUT, revents: 0 });
        }
        if let Some(fd) = recv_fd {
            fds.push(libc::pollfd { fd, events: libc::POLLIN, revents: 0 });
        }
        let first_control = fds.len();
        fds.extend(controls.iter().map(|&(fd, _)| libc::pollfd { fd, events: libc::POLLIN, revents: 0 }));
        let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
        // SAFETY: `fds` is a valid, exclusively borrowed array of `fds.len()` pollfds during the call.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                return Ok(());
            }
            return Err(CommError::Invalid(format!("poll failed: {e}")));
        }
        for (i, &(_, peer)) in controls.iter().enumerate() {
            if fds[first_control + i].revents != 0 {
                self.read_control(peer)?;
            }
        }
        Ok(())
    }

    /// Runs `f` unless the communicator already failed, and poisons it if `f` fails.
    fn guarded(&mut self, f: impl FnOnce(&mut Self) -> Result<(), CommError>) -> Result<(), CommError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let result = f(self);
        if let Err(e) = &result {
            self.fail(e);
        }
        result
    }
}

impl Transport for TcpTransport {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.names.len()
    }

    fn exchange(
        &mut self,
        send: Option<(usize, &[f32])>,
        recv: Option<(usize, Recv<'_>)>,
    ) -> Result<(), CommError> {
        let mut staging = std::mem::take(&mut self.scratch);
        let result = self.guarded(|t| {
            let out = match send {
                Some((to, data)) => {
                    let bytes: &[u8] = bytemuck::cast_slice(data);
                    Some(Outgoing::new(to, t.fd(to)?, Some(bytes), bytes.len()))
                }
                None => None,
            };
            let inc = match recv {
                Some((from, sink)) => Some(Incoming::new(from, t.fd(from)?, sink, &mut staging, t.chunk)),
                None => None,
            };
            t.run_exchange(out, inc)
        });
        self.scratch = staging;
        result
    }

    fn swap_reduce(
        &mut self,
        peer: usize,
        buf: &mut [f32],
        op: ReduceOp,
        incoming_first: bool,
        _scratch: &mut Vec<f32>,
    ) -> Result<(), CommError> {
        let mut staging = std::mem::take(&mut self.scratch);
        let result = self.guarded(|t| {
            let fd = t.fd(peer)?;
            let out = Outgoing::new(peer, fd, None, buf.len() * 4);
            let inc =
                Incoming::new(peer, fd, Recv::Reduce { buf, op, incoming_first }, &mut staging, t.chunk);
            t.run_exchange(Some(out), Some(inc))
        });
        self.scratch = staging;
        result
    }
}

fn would_block(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted)
}

/// `sendmsg` of two parts, non-blocking, without SIGPIPE.
pub(super) fn send_parts(fd: RawFd, a: &[u8], b: &[u8]) -> io::Result<usize> {
    let iov = [
        libc::iovec { iov_base: a.as_ptr() as *mut libc::c_void, iov_len: a.len() },
        libc::iovec { iov_base: b.as_ptr() as *mut libc::c_void, iov_len: b.len() },
    ];
    // SAFETY: msghdr is plain data; all-zero is a valid empty header, filled in below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = 2;
    // SAFETY: the iovecs point into live slices that outlive the call; the kernel only reads them.
    let n = unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) };
    if n < 0 { Err(io::Error::last_os_error()) } else { Ok(n as usize) }
}

/// `readv` into two parts, non-blocking (the socket is in non-blocking mode).
fn recv_parts(fd: RawFd, a: &mut [u8], b: &mut [u8]) -> io::Result<usize> {
    let iov = [
        libc::iovec { iov_base: a.as_mut_ptr() as *mut libc::c_void, iov_len: a.len() },
        libc::iovec { iov_base: b.as_mut_ptr() as *mut libc::c_void, iov_len: b.len() },
    ];
    // SAFETY: the iovecs point into live, exclusively borrowed slices that outlive the call.
    let n = unsafe { libc::readv(fd, iov.as_ptr(), 2) };
    if n < 0 { Err(io::Error::last_os_error()) } else { Ok(n as usize) }
}
