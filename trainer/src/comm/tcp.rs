//! The built-in `tcp` backend: a full mesh of authenticated TCP connections between the ranks of a
//! group, driven by the algorithms of [`super::algo`].
//!
//! Expected flow: every rank calls [`connect`] with the group's peer list (the launch contract's
//! `JobConfig.groups[g].peers`, in rank order), its rank, the address to bind and the job token.
//! Rank `r` listens on its own peer's port, dials every lower rank and accepts every higher one; each
//! pair gets a *data* connection (collective payloads) and a *control* connection (goodbye, abort,
//! liveness probes). Every connection is authenticated by [`super::auth`] before it is used.
//!
//! Guarantees:
//! - Each exchange sends, receives and reduces in chunks of [`TcpConfig::chunk_bytes`] from a single
//!   `poll` loop, so the kernel moves one chunk while this rank reduces the previous one.
//! - Every message carries its length; a mismatch is an error, never a silent desynchronisation.
//! - A peer that dies (its connections close without a goodbye) fails the current call on every rank
//!   that is inside a collective at once, naming it. A peer that stops making progress for
//!   [`TcpConfig::timeout`] is probed on its control connection; if it does not answer it is declared
//!   hung and named; if it answers it is itself waiting, and this rank keeps waiting one more timeout
//!   for the culprit to be reported. A rank that fails tells every other rank which peer failed, so
//!   all ranks name the same culprit.
//! - After any failure the communicator is poisoned: every later call returns the same error.
//!
//! Assumptions: all ranks run the same build (little-endian `f32` on the wire). A rank that spends
//! longer than `timeout` outside collectives while its peers wait is indistinguishable from a hung
//! one: set the timeout above the longest compute step.

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::{AsRawFd, RawFd};
use std::thread;
use std::time::{Duration, Instant};

use tandem_api::contract::{Endpoint, JobConfig};

use super::algo::{AlgoConfig, Collectives};
use super::auth::{self, ACCEPTED, Hello, MAC_LEN};
use super::transport::{Recv, Transport};
use super::{CommError, Peer};

/// Settings of the `tcp` backend.
#[derive(Clone, Debug)]
pub struct TcpConfig {
    /// Longest wait without progress inside a collective before the stalled peer is probed. A dead
    /// peer is reported at once; a hung one within `timeout` + 2 s by its neighbours and, through
    /// their abort notice, by everyone else (at worst 2·`timeout` + 2 s after the last progress).
    pub timeout: Duration,
    /// Longest time to form the group: every peer must have connected by then.
    pub connect_timeout: Duration,
    /// Pipelining granularity: bytes moved per send/receive step and reduced per step.
    pub chunk_bytes: usize,
    /// Algorithm thresholds.
    pub algo: AlgoConfig,
}

impl Default for TcpConfig {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(120),
            chunk_bytes: 256 * 1024,
            algo: AlgoConfig::default(),
        }
    }
}

/// A communicator over TCP.
pub type TcpComm = Collectives<TcpTransport>;

const DATA: u8 = 0;
const CONTROL: u8 = 1;

const MSG_BYE: u8 = 1;
const MSG_ABORT: u8 = 2;
const MSG_PING: u8 = 3;
const MSG_PONG: u8 = 4;

/// Joins group `group` of `job` as `rank`, listening on `bind`.
pub fn connect_from_contract(
    job: &JobConfig,
    group: u32,
    rank: usize,
    bind: &str,
    token: &[u8],
    config: TcpConfig,
) -> Result<TcpComm, CommError> {
    let topology = job.group(group).ok_or_else(|| {
        CommError::Invalid(format!(
            "the job config has no worker group {group}; the config is stale or wrong"
        ))
    })?;
    connect(rank, &topology.peers, bind, token, config)
}

/// Forms the group: listens on `bind`:`peers[rank].port`, connects to every peer and authenticates
/// every connection with `token`.
pub fn connect(
    rank: usize,
    peers: &[Endpoint],
    bind: &str,
    token: &[u8],
    config: TcpConfig,
) -> Result<TcpComm, CommError> {
    let size = peers.len();
    if rank >= size {
        return Err(CommError::Invalid(format!("rank {rank} is not in a peer list of {size}")));
    }
    if token.is_empty() {
        return Err(CommError::Invalid("the job token is empty; every connection needs it".to_owned()));
    }
    if config.chunk_bytes < 4 {
        return Err(CommError::Invalid(format!("chunk size {} is below one element", config.chunk_bytes)));
    }
    let names: Vec<Peer> =
        peers.iter().enumerate().map(|(rank, e)| Peer { rank, addr: e.to_string() }).collect();
    let port = peers[rank].port;
    let listener = TcpListener::bind((bind, port)).map_err(|e| {
        CommError::Rendezvous(format!(
            "rank {rank} cannot listen on {bind}:{port}: {e}; check that the port is free and the address \
             belongs to this host"
        ))
    })?;
    let deadline = Instant::now() + config.connect_timeout;
    let mut data: Vec<Option<TcpStream>> = (0..size).map(|_| None).collect();
    let mut control: Vec<Option<TcpStream>> = (0..size).map(|_| None).collect();

    let accepted = {
        let token = token.to_vec();
        let names = names.clone();
        thread::spawn(move || accept_all(listener, rank, &names, &token, deadline))
    };
    let mut dial_error = None;
    'dial: for (peer, endpoint) in peers.iter().enumerate().take(rank) {
        for channel in [DATA, CONTROL] {
            match dial(rank, size, peer, endpoint, channel, token, deadline) {
                Ok(stream) => {
                    let slot = if channel == DATA { &mut data } else { &mut control };
                    slot[peer] = Some(stream);
                }
                Err(e) => {
                    dial_error = Some(e);
                    break 'dial;
                }
            }
        }
    }
    let accepted =
        accepted.join().map_err(|_| CommError::Rendezvous("the accepting thread panicked".to_owned()))?;
    if let Some(e) = dial_error {
        return Err(e);
    }
    for (peer, channel, stream) in accepted? {
        let slot = if channel == DATA { &mut data } else { &mut control };
        slot[peer] = Some(stream);
    }
    let mut links = Vec::with_capacity(size);
    for (peer, (d, c)) in data.into_iter().zip(control).enumerate() {
        links.push(match (d, c) {
            (Some(d), Some(c)) => {
                for s in [&d, &c] {
                    s.set_nodelay(true).and_then(|_| s.set_nonblocking(true)).map_err(|e| {
                        CommError::Rendezvous(format!(
                            "cannot configure the connection to {}: {e}",
                            names[peer]
                        ))
                    })?;
                }
                Some(Link {
                    data: d,
                    control: c,
                    inbox: Vec::new(),
                    said_bye: false,
                    closed: false,
                    ponged: false,
                })
            }
            _ if peer == rank => None,
            _ => return Err(CommError::Rendezvous(format!("{} is not connected", names[peer]))),
        });
    }
    let transport = TcpTransport {
        rank,
        names,
        links,
        timeout: config.timeout,
        chunk: config.chunk_bytes / 4 * 4,
        scratch: Vec::new(),
        failed: None,
    };
    Ok(Collectives::new(transport, config.algo, "tcp"))
}

fn rendezvous_io(peer: &Peer, what: &str, e: io::Error) -> CommError {
    CommError::Rendezvous(format!("{what} {peer}: {e}"))
}

/// Dials `endpoint` until `deadline` and runs the connector's side of the handshake.
fn dial(
    rank: usize,
    size: usize,
    peer_rank: usize,
    endpoint: &Endpoint,
    channel: u8,
    token: &[u8],
    deadline: Instant,
) -> Result<TcpStream, CommError> {
    let peer = Peer { rank: peer_rank, addr: endpoint.to_string() };
    let mut last_error = String::from("no attempt finished");
    let mut stream = loop {
        let now = Instant::now();
        if now >= deadline {
            return Err(CommError::Rendezvous(format!(
                "{peer} did not accept a connection in time (last error: {last_error}); is that rank running \
                 and is its address right?"
            )));
        }
        let attempt = (endpoint.host.as_str(), endpoint.port)
            .to_socket_addrs()
            .and_then(|mut addrs| addrs.next().ok_or_else(|| io::Error::other("name resolves to no address")))
            .and_then(|addr| TcpStream::connect_timeout(&addr, (deadline - now).min(Duration::from_secs(2))));
        match attempt {
            Ok(s) => break s,
            Err(e) => {
                last_error = e.to_string();
                thread::sleep(Duration::from_millis(50));
            }
        }
    };
    let io_timeout = Some(deadline.saturating_duration_since(Instant::now()).max(Duration::from_secs(1)));
    stream
        .set_read_timeout(io_timeout)
        .and_then(|_| stream.set_write_timeout(io_timeout))
        .map_err(|e| rendezvous_io(&peer, "cannot configure the connection to", e))?;
    let mine = Hello {
        channel,
        rank: rank as u32,
        size: size as u32,
        nonce: auth::nonce().map_err(|e| rendezvous_io(&peer, "no randomness for the handshake with", e))?,
    };
    mine.write_to(&mut stream).map_err(|e| rendezvous_io(&peer, "handshake with", e))?;
    let refused = |e: io::Error| {
        CommError::Rendezvous(format!(
            "{peer} closed the connection during the handshake ({e}): it refused this rank's job token, rank \
             or group size — check that every rank got the same job config and token"
        ))
    };
    let theirs = Hello::read_from(&mut stream)
        .map_err(refused)?
        .map_err(|why| CommError::Rendezvous(format!("{peer} cannot be joined: {why}")))?;
    if theirs.rank as usize != peer_rank || theirs.size as usize != size || theirs.channel != channel {
        return Err(CommError::Rendezvous(format!(
            "{peer} answered as rank {} of {} but this rank expected rank {peer_rank} of {size}: the ranks \
             were given different peer lists",
            theirs.rank, theirs.size
        )));
    }
    let mut mac = [0u8; MAC_LEN];
    stream.read_exact(&mut mac).map_err(refused)?;
    if !auth::macs_equal(&mac, &auth::transcript_mac(token, b"accept", &mine, &theirs)) {
        return Err(CommError::Rendezvous(format!(
            "{peer} does not hold this job's token: refusing to exchange data with it"
        )));
    }
    stream
        .write_all(&auth::transcript_mac(token, b"connect", &mine, &theirs))
        .map_err(|e| rendezvous_io(&peer, "handshake with", e))?;
    let mut ack = [0u8];
    stream.read_exact(&mut ack).map_err(refused)?;
    if ack[0] != ACCEPTED {
        return Err(refused(io::Error::other("negative acknowledgement")));
    }
    Ok(stream)
}

/// Accepts and authenticates both connections of every higher rank before `deadline`.
fn accept_all(
    listener: TcpListener,
    rank: usize,
    names: &[Peer],
    token: &[u8],
    deadline: Instant,
) -> Result<Vec<(usize, u8, TcpStream)>, CommError> {
    let size = names.len();
    let expected = 2 * (size - rank - 1);
    let mut got: Vec<(usize, u8, TcpStream)> = Vec::with_capacity(expected);
    let mut rejected: Vec<String> = Vec::new();
    listener
        .set_nonblocking(true)
        .map_err(|e| CommError::Rendezvous(format!("cannot poll the listening socket: {e}")))?;
    while got.len() < expected {
        if Instant::now() >= deadline {
            let missing: Vec<String> = (rank + 1..size)
                .filter(|&p| got.iter().filter(|(r, _, _)| *r == p).count() < 2)
                .map(|p| names[p].to_string())
                .collect();
            let mut msg = format!("{} did not connect in time", missing.join(", "));
            if !rejected.is_empty() {
                msg.push_str(&format!("; refused connections: {}", rejected.join("; ")));
            }
            return Err(CommError::Rendezvous(msg));
        }
        match listener.accept() {
            Ok((stream, from)) => match handshake_as_acceptor(stream, rank, size, token, deadline, &got) {
                Ok((peer, channel, stream)) => got.push((peer, channel, stream)),
                Err(why) => rejected.push(format!("{from}: {why}")),
            },
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => thread::sleep(Duration::from_millis(5)),
            Err(e) => rejected.push(format!("accept failed: {e}")),
        }
    }
    Ok(got)
}

fn handshake_as_acceptor(
    mut stream: TcpStream,
    rank: usize,
    size: usize,
    token: &[u8],
    deadline: Instant,
    got: &[(usize, u8, TcpStream)],
) -> Result<(usize, u8, TcpStream), String> {
    let io_timeout = Some(
        deadline
            .saturating_duration_since(Instant::now())
            .clamp(Duration::from_secs(1), Duration::from_secs(10)),
    );
    stream
        .set_nonblocking(false)
        .and_then(|_| stream.set_read_timeout(io_timeout))
        .and_then(|_| stream.set_write_timeout(io_timeout))
        .map_err(|e| e.to_string())?;
    let theirs = Hello::read_from(&mut stream).map_err(|e| format!("no hello: {e}"))??;
    let peer = theirs.rank as usize;
    if theirs.size as usize != size {
        return Err(format!("it believes the group has {} ranks, this rank has {size}", theirs.size));
    }
    if peer <= rank || peer >= size || theirs.channel > CONTROL {
        return Err(format!(
            "it claims rank {} channel {}, which may not dial rank {rank}",
            theirs.rank, theirs.channel
        ));
    }
    if got.iter().any(|(r, c, _)| *r == peer && *c == theirs.channel) {
        return Err(format!("rank {peer} connected twice"));
    }
    let nonce = auth::nonce().map_err(|e| format!("no randomness: {e}"))?;
    let mine = Hello { channel: theirs.channel, rank: rank as u32, size: size as u32, nonce };
    mine.write_to(&mut stream).map_err(|e| e.to_string())?;
    stream.write_all(&auth::transcript_mac(token, b"accept", &theirs, &mine)).map_err(|e| e.to_string())?;
    let mut mac = [0u8; MAC_LEN];
    stream.read_exact(&mut mac).map_err(|e| {
        format!("rank {peer} hung up instead of answering the token challenge: it holds a different job token ({e})")
    })?;
    if !auth::macs_equal(&mac, &auth::transcript_mac(token, b"connect", &theirs, &mine)) {
        return Err(format!("rank {peer}'s job token does not match"));
    }
    stream.write_all(&[ACCEPTED]).map_err(|e| e.to_string())?;
    Ok((peer, theirs.channel, stream))
}

struct Link {
    data: TcpStream,
    control: TcpStream,
    inbox: Vec<u8>,
    said_bye: bool,
    closed: bool,
    ponged: bool,
}

/// The [`Transport`] of the `tcp` backend.
pub struct TcpTransport {
    rank: usize,
    names: Vec<Peer>,
    links: Vec<Option<Link>>,
    timeout: Duration,
    chunk: usize,
    scratch: Vec<f32>,
    failed: Option<CommError>,
}

impl std::fmt::Debug for TcpTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpTransport").field("rank", &self.rank).field("size", &self.names.len()).finish()
    }
}

/// What the wait for a stalled peer has found so far.
enum Stall {
    Waiting,
    Probing { peer: usize },
    Extended,
}

impl TcpTransport {
    fn link(&mut self, peer: usize) -> Result<&mut Link, CommError> {
        let name = self.names.get(peer).cloned();
        self.links.get_mut(peer).and_then(Option::as_mut).ok_or_else(|| {
            CommError::Invalid(match name {
                Some(p) => format!("{p} is this rank itself"),
                None => format!("rank {peer} is not in the group"),
            })
        })
    }

    fn fd(&mut self, peer: usize) -> Result<RawFd, CommError> {
        Ok(self.link(peer)?.data.as_raw_fd())
    }

    fn peer_failed(&self, peer: usize, reason: impl Into<String>) -> CommError {
        CommError::PeerFailed { peer: self.names[peer].clone(), reason: reason.into() }
    }

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
    fn read_control(&mut self, peer: usize) -> Result<(), CommError> {
        let mut buf = [0u8; 2048];
        let mut eof = false;
        {
            let link = self.link(peer)?;
            if link.closed {
                return Ok(());
            }
            loop {
                match (&link.control).read(&mut buf) {
                    Ok(0) => {
                        eof = true;
                        break;
                    }
                    Ok(n) => link.inbox.extend_from_slice(&buf[..n]),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(_) => {
                        eof = true;
                        break;
                    }
                }
            }
        }
        loop {
            let link = self.link(peer)?;
            if link.inbox.len() < 7 {
                break;
            }
            let len = usize::from(u16::from_le_bytes([link.inbox[5], link.inbox[6]]));
            if link.inbox.len() < 7 + len {
                break;
            }
            let msg: Vec<u8> = link.inbox.drain(..7 + len).collect();
            let culprit = u32::from_le_bytes([msg[1], msg[2], msg[3], msg[4]]) as usize;
            match msg[0] {
                MSG_BYE => link.said_bye = true,
                MSG_PONG => link.ponged = true,
                MSG_PING => self.send_control(peer, MSG_PONG, 0, ""),
                MSG_ABORT => {
                    let reason = String::from_utf8_lossy(&msg[7..]).into_owned();
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

    /// The error for a data connection that `peer` closed: an abort it sent first wins.
    fn data_closed(&mut self, peer: usize, detail: &str) -> CommError {
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

    /// Tells every peer which rank failed, so that all ranks name the same culprit.
    fn fail(&mut self, error: &CommError) {
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

    fn exchange_inner(
        &mut self,
        send: Option<(usize, &[f32])>,
        recv: Option<(usize, Recv<'_>)>,
    ) -> Result<(), CommError> {
        let send_fd = match send {
            Some((to, _)) => Some(self.fd(to)?),
            None => None,
        };
        let recv_fd = match &recv {
            Some((from, _)) => Some(self.fd(*from)?),
            None => None,
        };
        let payload: &[u8] = send.map_or(&[], |(_, d)| bytemuck::cast_slice(d));
        let send_header = (payload.len() as u64 / 4).to_le_bytes();
        let send_total = if send.is_some() { 8 + payload.len() } else { 0 };
        let mut sent = 0;

        let from = recv.as_ref().map_or(0, |(f, _)| *f);
        let expected = recv.as_ref().map_or(0, |(_, r)| r.len());
        let chunk = self.chunk;
        let mut scratch = std::mem::take(&mut self.scratch);
        // Copy lands in place; Reduce lands in a chunk-sized, cache-resident scratch holding the
        // received but not yet reduced bytes, and is combined into `dst` after every read.
        let (target, mut reduce): (&mut [f32], _) = match recv {
            Some((_, Recv::Copy(dst))) => (dst, None),
            Some((_, Recv::Reduce(dst, op))) => {
                scratch.resize(dst.len().min(chunk / 4).max(1), 0.0);
                (&mut scratch[..], Some((dst, op)))
            }
            None => (&mut [], None),
        };
        let target: &mut [u8] = bytemuck::cast_slice_mut(target);
        let mut recv_header = [0u8; 8];
        let recv_total = if recv_fd.is_some() { 8 + expected * 4 } else { 0 };
        let mut received = 0;
        let mut reduced = 0;

        let chunk = self.chunk;
        let mut stall = Stall::Waiting;
        let mut deadline = Instant::now() + self.timeout;
        let result = loop {
            let mut progressed = false;
            if let Some(fd) = send_fd
                && sent < send_total
            {
                let (h, p) = split_progress(&send_header, payload, sent, chunk);
                match send_parts(fd, h, p) {
                    Ok(n) => {
                        sent += n;
                        progressed |= n > 0;
                    }
                    Err(e) if would_block(&e) => {}
                    Err(e) => {
                        let to = send.map_or(0, |(t, _)| t);
                        break Err(self.data_closed(to, &e.to_string()));
                    }
                }
            }
            if let Some(fd) = recv_fd
                && received < recv_total
            {
                let payload_done = received.saturating_sub(8);
                let header: &mut [u8] = if received < 8 { &mut recv_header[received..] } else { &mut [] };
                let room: &mut [u8] = if reduce.is_some() {
                    let pending = payload_done - reduced * 4;
                    let end = target.len().min(pending + (recv_total - 8 - payload_done));
                    &mut target[pending..end]
                } else {
                    let end = target.len().min(payload_done + chunk);
                    &mut target[payload_done..end]
                };
                match recv_parts(fd, header, room) {
                    Ok(0) => break Err(self.data_closed(from, "end of stream")),
                    Ok(n) => {
                        let before = received;
                        received += n;
                        progressed = true;
                        if before < 8 && received >= 8 {
                            let got = u64::from_le_bytes(recv_header) as usize;
                            if got != expected {
                                break Err(CommError::Mismatch {
                                    peer: self.names[from].clone(),
                                    got,
                                    expected,
                                });
                            }
                        }
                        if let Some((dst, op)) = reduce.as_mut() {
                            let pending = received.saturating_sub(8) - reduced * 4;
                            let complete = pending / 4;
                            let incoming: &[f32] = bytemuck::cast_slice(&target[..complete * 4]);
                            op.combine(&mut dst[reduced..reduced + complete], incoming);
                            reduced += complete;
                            target.copy_within(complete * 4..pending, 0);
                        }
                    }
                    Err(e) if would_block(&e) => {}
                    Err(e) => break Err(self.data_closed(from, &e.to_string())),
                }
            }
            if sent >= send_total && received >= recv_total {
                break Ok(());
            }
            if progressed {
                deadline = Instant::now() + self.timeout;
                stall = Stall::Waiting;
                continue;
            }
            let now = Instant::now();
            if now >= deadline {
                let stalled = if received < recv_total { from } else { send.map_or(0, |(t, _)| t) };
                match stall {
                    Stall::Waiting => {
                        if let Ok(link) = self.link(stalled) {
                            link.ponged = false;
                        }
                        self.send_control(stalled, MSG_PING, 0, "");
                        stall = Stall::Probing { peer: stalled };
                        deadline = now + self.timeout.min(Duration::from_secs(2));
                    }
                    Stall::Probing { .. } | Stall::Extended => {
                        break Err(CommError::PeerTimeout {
                            peer: self.names[stalled].clone(),
                            timeout_s: self.timeout.as_secs_f64(),
                        });
                    }
                }
                continue;
            }
            if let Err(e) = self.wait(
                send_fd.filter(|_| sent < send_total),
                recv_fd.filter(|_| received < recv_total),
                deadline - now,
            ) {
                break Err(e);
            }
            if let Stall::Probing { peer } = stall
                && self.links[peer].as_ref().is_some_and(|l| l.ponged)
            {
                // The stalled peer is alive and itself waiting: give the real culprit's neighbours
                // one more timeout to detect and report it.
                stall = Stall::Extended;
                deadline = Instant::now() + self.timeout;
            }
        };
        self.scratch = scratch;
        result
    }

    /// Blocks until a data socket is ready, a control message arrives or `timeout` passes.
    fn wait(
        &mut self,
        send_fd: Option<RawFd>,
        recv_fd: Option<RawFd>,
        timeout: Duration,
    ) -> Result<(), CommError> {
        let mut fds = Vec::with_capacity(self.links.len() + 2);
        if let Some(fd) = send_fd {
            fds.push(libc::pollfd { fd, events: libc::POLLOUT, revents: 0 });
        }
        if let Some(fd) = recv_fd {
            fds.push(libc::pollfd { fd, events: libc::POLLIN, revents: 0 });
        }
        let first_control = fds.len();
        let mut control_peers = Vec::with_capacity(self.links.len());
        for (peer, link) in self.links.iter().enumerate() {
            if let Some(link) = link
                && !link.closed
            {
                fds.push(libc::pollfd { fd: link.control.as_raw_fd(), events: libc::POLLIN, revents: 0 });
                control_peers.push(peer);
            }
        }
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
        for (i, peer) in control_peers.into_iter().enumerate() {
            if fds[first_control + i].revents != 0 {
                self.read_control(peer)?;
            }
        }
        Ok(())
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
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let result = self.exchange_inner(send, recv);
        if let Err(e) = &result {
            self.fail(e);
        }
        result
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

fn would_block(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted)
}

/// The unsent rest of `header ++ payload` after `done` bytes, at most `chunk` payload bytes.
fn split_progress<'a>(
    header: &'a [u8],
    payload: &'a [u8],
    done: usize,
    chunk: usize,
) -> (&'a [u8], &'a [u8]) {
    if done < header.len() {
        (&header[done..], &payload[..payload.len().min(chunk)])
    } else {
        let start = done - header.len();
        (&[], &payload[start..payload.len().min(start + chunk)])
    }
}

/// `sendmsg` of two parts, non-blocking, without SIGPIPE.
fn send_parts(fd: RawFd, a: &[u8], b: &[u8]) -> io::Result<usize> {
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
