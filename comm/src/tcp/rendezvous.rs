//! Forming the full mesh: every rank listens on its own port, dials every lower rank and accepts
//! every higher one, twice per pair (a data and a control connection), each authenticated by the
//! job token ([`super::super::auth`]).
//!
//! Expected flow: [`form_mesh`], then small setup messages on the still-blocking sockets
//! ([`Mesh::all_to_all`], [`Mesh::send_frame`], [`Mesh::recv_frame`]), then
//! [`Mesh::into_transport`].
//!
//! Guarantees:
//! - Handshakes run concurrently (at most [`MAX_HANDSHAKES`] at a time), each within
//!   [`HANDSHAKE_TIMEOUT`]: connections that never speak, or speak something else, cost the group
//!   nothing but a thread for a few seconds, and are refused without delaying real peers.
//! - A dialer retries until the connect deadline (the peer may not listen yet, may restart, or
//!   the address may still belong to someone else), and its error names the real cause: nobody
//!   listening, a handshake that timed out, a listener without this job's token, or a peer that
//!   describes a different group. The last two are [`CommError::Refused`] (a restart cannot cure
//!   them); the others are [`CommError::Rendezvous`] (retryable).
//! - An acceptor never fails because of a stranger: it refuses the connection, remembers why, and
//!   names the refusals if a peer is still missing at the deadline.

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread;
use std::time::{Duration, Instant};

use tandem_api::contract::Endpoint;

use super::super::auth::{self, ACCEPTED, Hello, MAC_LEN};
use super::super::{CommError, Peer};
use super::{CONTROL, DATA, Link, TcpConfig, TcpTransport};

/// Longest time one handshake may take, on either side.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// Handshakes an acceptor runs at once; connections beyond are closed at once (a real dialer
/// retries).
pub const MAX_HANDSHAKES: usize = 64;

/// Largest setup frame ([`Mesh::send_frame`]).
const MAX_FRAME: usize = 64 * 1024;

/// The authenticated connections of one rank, before the collectives start.
pub struct Mesh {
    /// This rank.
    pub rank: usize,
    /// Every rank, as named in errors.
    pub names: Vec<Peer>,
    data: Vec<Option<TcpStream>>,
    control: Vec<Option<TcpStream>>,
    deadline: Instant,
}

/// Listens on `bind`:`peers[rank].port`, connects to every peer and authenticates every
/// connection with `token`, all before `config.connect_timeout` has passed. A group of one rank
/// listens on nothing.
pub fn form_mesh(
    rank: usize,
    peers: &[Endpoint],
    bind: &str,
    token: &[u8],
    config: &TcpConfig,
) -> Result<Mesh, CommError> {
    let size = peers.len();
    let names: Vec<Peer> =
        peers.iter().enumerate().map(|(rank, e)| Peer { rank, addr: e.to_string() }).collect();
    let deadline = Instant::now() + config.connect_timeout;
    if size == 1 {
        // A group of one has no peer to accept: it needs no port, so none can be taken from it.
        return Ok(Mesh { rank, names, data: vec![None], control: vec![None], deadline });
    }
    let port = peers[rank].port;
    let listener = TcpListener::bind((bind, port)).map_err(|e| {
        CommError::Rendezvous(format!(
            "rank {rank} cannot listen on {bind}:{port}: {e}; check that the port is free and the address \
             belongs to this host"
        ))
    })?;
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
            match dial(rank, size, &names[peer], endpoint, channel, token, deadline) {
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
    for peer in (0..size).filter(|&p| p != rank) {
        if data[peer].is_none() || control[peer].is_none() {
            return Err(CommError::Rendezvous(format!("{} is not connected", names[peer])));
        }
    }
    Ok(Mesh { rank, names, data, control, deadline })
}

/// Why one dial attempt failed, and whether another attempt can succeed.
enum DialFailure {
    /// Worth retrying: nobody listening yet, a reset, a handshake cut short or timed out.
    Transient(String),
    /// The listener proved it is not this job's peer (token or group differ).
    Refused(String),
}

/// Dials `endpoint` until `deadline`, retrying failed attempts, and runs the connector's side of
/// the handshake.
fn dial(
    rank: usize,
    size: usize,
    peer: &Peer,
    endpoint: &Endpoint,
    channel: u8,
    token: &[u8],
    deadline: Instant,
) -> Result<TcpStream, CommError> {
    let mut transient = String::from("no attempt finished");
    let mut refused: Option<String> = None;
    loop {
        let now = Instant::now();
        if now >= deadline {
            return Err(match refused {
                Some(why) => CommError::Refused { peer: peer.clone(), reason: why },
                None => CommError::Rendezvous(format!(
                    "{peer} did not complete a connection in time (last error: {transient}); is that rank \
                     running and is its address right?"
                )),
            });
        }
        let attempt = (endpoint.host.as_str(), endpoint.port)
            .to_socket_addrs()
            .and_then(|mut addrs| addrs.next().ok_or_else(|| io::Error::other("name resolves to no address")))
            .and_then(|addr| TcpStream::connect_timeout(&addr, (deadline - now).min(Duration::from_secs(2))));
        let stream = match attempt {
            Ok(s) => s,
            Err(e) => {
                transient = format!("cannot connect: {e}");
                thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        let limit = deadline.min(Instant::now() + HANDSHAKE_TIMEOUT);
        match connector_handshake(stream, rank, size, peer, channel, token, limit) {
            Ok(stream) => return Ok(stream),
            Err(DialFailure::Transient(why)) => transient = why,
            Err(DialFailure::Refused(why)) => refused = Some(why),
        }
        thread::sleep(Duration::from_millis(100));
    }
}

/// Read and write timeouts until `limit` (at least 10 ms, so that a timeout is never "none").
fn set_timeouts(stream: &TcpStream, limit: Instant) -> io::Result<()> {
    let left = Some(limit.saturating_duration_since(Instant::now()).max(Duration::from_millis(10)));
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(left)?;
    stream.set_write_timeout(left)
}

fn describe_io(e: &io::Error) -> String {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
            format!("no answer within {} s", HANDSHAKE_TIMEOUT.as_secs())
        }
        io::ErrorKind::UnexpectedEof => "it closed the connection".to_owned(),
        _ => e.to_string(),
    }
}

fn connector_handshake(
    mut stream: TcpStream,
    rank: usize,
    size: usize,
    peer: &Peer,
    channel: u8,
    token: &[u8],
    limit: Instant,
) -> Result<TcpStream, DialFailure> {
    let transient = |what: &str, e: io::Error| DialFailure::Transient(format!("{what}: {}", describe_io(&e)));
    set_timeouts(&stream, limit).map_err(|e| transient("cannot configure the connection", e))?;
    let mine = Hello {
        channel,
        rank: rank as u32,
        size: size as u32,
        nonce: auth::nonce().map_err(|e| transient("no randomness for the handshake", e))?,
    };
    mine.write_to(&mut stream).map_err(|e| transient("sending the hello", e))?;
    let theirs = Hello::read_from(&mut stream)
        .map_err(|e| transient("waiting for its hello", e))?
        .map_err(|why| DialFailure::Refused(format!("its hello is not ours: {why}")))?;
    let mut mac = [0u8; MAC_LEN];
    stream.read_exact(&mut mac).map_err(|e| transient("waiting for its token proof", e))?;
    if !auth::macs_equal(&mac, &auth::transcript_mac(token, b"accept", &mine, &theirs)) {
        return Err(DialFailure::Refused(
            "it does not hold this job's token (its proof does not match): check that every rank was given \
             the same job token"
                .to_owned(),
        ));
    }
    // Its claims count only now that it has proved the token.
    if theirs.rank as usize != peer.rank || theirs.size as usize != size || theirs.channel != channel {
        return Err(DialFailure::Refused(format!(
            "it answered as rank {} of {} but this rank expected rank {} of {size}: the ranks were given \
             different peer lists",
            theirs.rank, theirs.size, peer.rank
        )));
    }
    stream
        .write_all(&auth::transcript_mac(token, b"connect", &mine, &theirs))
        .map_err(|e| transient("sending this rank's token proof", e))?;
    let mut ack = [0u8];
    stream.read_exact(&mut ack).map_err(|e| {
        // It proved the same token, so it refused something else (a duplicate, a restart).
        transient("waiting for its acceptance after the token check", e)
    })?;
    if ack[0] != ACCEPTED {
        return Err(DialFailure::Transient("it answered the token proof with a refusal".to_owned()));
    }
    Ok(stream)
}

/// One authenticated connection from a higher rank.
type Accepted = (usize, u8, TcpStream);

/// Accepts and authenticates both connections of every higher rank before `deadline`, running
/// handshakes concurrently.
fn accept_all(
    listener: TcpListener,
    rank: usize,
    names: &[Peer],
    token: &[u8],
    deadline: Instant,
) -> Result<Vec<Accepted>, CommError> {
    let size = names.len();
    let mut got: Vec<Accepted> = Vec::with_capacity(2 * (size - rank - 1));
    let mut refused = Refusals::default();
    listener
        .set_nonblocking(true)
        .map_err(|e| CommError::Rendezvous(format!("cannot poll the listening socket: {e}")))?;
    let (done_tx, done): (_, Receiver<Result<Accepted, String>>) = mpsc::channel();
    let mut in_flight = 0usize;
    let complete =
        |got: &[Accepted]| (rank + 1..size).all(|p| got.iter().filter(|(r, _, _)| *r == p).count() == 2);
    while !complete(&got) {
        if Instant::now() >= deadline {
            let missing: Vec<String> = (rank + 1..size)
                .filter(|&p| got.iter().filter(|(r, _, _)| *r == p).count() < 2)
                .map(|p| names[p].to_string())
                .collect();
            let mut msg = format!("{} did not connect in time", missing.join(", "));
            if let Some(refusals) = refused.summary() {
                msg.push_str(&format!("; refused connections: {refusals}"));
            }
            return Err(CommError::Rendezvous(msg));
        }
        loop {
            match listener.accept() {
                Ok((stream, from)) if in_flight >= MAX_HANDSHAKES => {
                    drop(stream);
                    refused
                        .add(format!("{from}: closed unheard, {MAX_HANDSHAKES} handshakes already running"));
                }
                Ok((stream, from)) => {
                    in_flight += 1;
                    let (tx, token) = (done_tx.clone(), token.to_vec());
                    let limit = deadline.min(Instant::now() + HANDSHAKE_TIMEOUT);
                    thread::spawn(move || {
                        let result = acceptor_handshake(stream, rank, size, &token, limit)
                            .map_err(|why| format!("{from}: {why}"));
                        let _ = tx.send(result);
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    refused.add(format!("accept failed: {e}"));
                    break;
                }
            }
        }
        match done.recv_timeout(Duration::from_millis(5)) {
            Ok(result) => {
                in_flight -= 1;
                match result {
                    Ok((peer, channel, stream)) => {
                        // A dialer retries only after giving up on its side: the newest wins.
                        got.retain(|(r, c, _)| !(*r == peer && *c == channel));
                        got.push((peer, channel, stream));
                    }
                    Err(why) => refused.add(why),
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => {}
        }
    }
    Ok(got)
}

/// Why connections were refused, kept short: the first few reasons and a count of the rest.
#[derive(Default)]
struct Refusals {
    first: Vec<String>,
    more: usize,
}

impl Refusals {
    const KEEP: usize = 5;

    fn add(&mut self, why: String) {
        if self.first.len() < Self::KEEP {
            self.first.push(why);
        } else {
            self.more += 1;
        }
    }

    fn summary(&self) -> Option<String> {
        if self.first.is_empty() {
            return None;
        }
        let mut s = self.first.join("; ");
        if self.more > 0 {
            s.push_str(&format!("; and {} more", self.more));
        }
        Some(s)
    }
}

/// The acceptor's side: answers any well-formed hello with its own hello and token proof (so that
/// a dialer from a different group or build learns why), and accepts only a higher rank of this
/// group that proves the token.
fn acceptor_handshake(
    mut stream: TcpStream,
    rank: usize,
    size: usize,
    token: &[u8],
    limit: Instant,
) -> Result<Accepted, String> {
    set_timeouts(&stream, limit).map_err(|e| e.to_string())?;
    let theirs = match Hello::read_from(&mut stream).map_err(|e| format!("no hello: {}", describe_io(&e)))? {
        Ok(h) => h,
        Err(why) => {
            // A tandem endpoint of another version learns ours from our hello; strangers get
            // nothing they can use.
            if why.contains("version") {
                let _ =
                    mine_for(0, rank, size).and_then(|h| h.write_to(&mut stream).map_err(|e| e.to_string()));
            }
            return Err(why);
        }
    };
    let mine = mine_for(theirs.channel, rank, size)?;
    mine.write_to(&mut stream).map_err(|e| e.to_string())?;
    stream.write_all(&auth::transcript_mac(token, b"accept", &theirs, &mine)).map_err(|e| e.to_string())?;
    let peer = theirs.rank as usize;
    let mut mac = [0u8; MAC_LEN];
    stream.read_exact(&mut mac).map_err(|e| {
        format!(
            "the dialer claiming rank {peer} hung up instead of proving the token ({}): it holds a different \
             job token or belongs to another group",
            describe_io(&e)
        )
    })?;
    if !auth::macs_equal(&mac, &auth::transcript_mac(token, b"connect", &theirs, &mine)) {
        return Err(format!("the dialer claiming rank {peer}: its job token does not match"));
    }
    if theirs.size as usize != size {
        return Err(format!(
            "rank {peer} believes the group has {} ranks, this rank has {size}",
            theirs.size
        ));
    }
    if peer <= rank || peer >= size || theirs.channel > CONTROL {
        return Err(format!(
            "it claims rank {} channel {}, which may not dial rank {rank}",
            theirs.rank, theirs.channel
        ));
    }
    stream.write_all(&[ACCEPTED]).map_err(|e| e.to_string())?;
    Ok((peer, theirs.channel, stream))
}

fn mine_for(channel: u8, rank: usize, size: usize) -> Result<Hello, String> {
    let nonce = auth::nonce().map_err(|e| format!("no randomness: {e}"))?;
    Ok(Hello { channel, rank: rank as u32, size: size as u32, nonce })
}

impl Mesh {
    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.names.len()
    }

    fn data_stream(&mut self, peer: usize) -> Result<&mut TcpStream, CommError> {
        let deadline = self.deadline;
        let name = self.names.get(peer).cloned();
        let stream = self.data.get_mut(peer).and_then(Option::as_mut).ok_or_else(|| {
            CommError::Invalid(format!(
                "no data connection to {}",
                name.map_or("?".to_owned(), |p| p.to_string())
            ))
        })?;
        let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_secs(1));
        stream.set_read_timeout(Some(left)).and_then(|_| stream.set_write_timeout(Some(left))).map_err(
            |e| CommError::Rendezvous(format!("cannot configure the connection to rank {peer}: {e}")),
        )?;
        Ok(stream)
    }

    /// Sends one setup frame (at most 64 KiB) to `peer`.
    pub fn send_frame(&mut self, peer: usize, bytes: &[u8]) -> Result<(), CommError> {
        if bytes.len() > MAX_FRAME {
            return Err(CommError::Invalid(format!(
                "a setup frame of {} bytes exceeds {MAX_FRAME}",
                bytes.len()
            )));
        }
        let name = self.names[peer].clone();
        let stream = self.data_stream(peer)?;
        stream.write_all(&(bytes.len() as u32).to_le_bytes()).and_then(|_| stream.write_all(bytes)).map_err(
            |e| CommError::PeerFailed { peer: name, reason: format!("setup after the rendezvous: {e}") },
        )
    }

    /// Receives one setup frame from `peer`.
    pub fn recv_frame(&mut self, peer: usize) -> Result<Vec<u8>, CommError> {
        let name = self.names[peer].clone();
        let failed = |e: io::Error| CommError::PeerFailed {
            peer: name.clone(),
            reason: format!("setup after the rendezvous: {}", describe_io(&e)),
        };
        let stream = self.data_stream(peer)?;
        let mut len = [0u8; 4];
        stream.read_exact(&mut len).map_err(failed)?;
        let len = u32::from_le_bytes(len) as usize;
        if len > MAX_FRAME {
            return Err(CommError::PeerFailed {
                peer: name.clone(),
                reason: format!("sent a setup frame of {len} bytes, more than {MAX_FRAME}"),
            });
        }
        let mut bytes = vec![0u8; len];
        stream.read_exact(&mut bytes).map_err(failed)?;
        Ok(bytes)
    }

    /// Sends `mine` to every other rank and returns what each sent (this rank's own at its index).
    /// Every rank must call it at the same point.
    pub fn all_to_all(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>, CommError> {
        let (size, rank) = (self.size(), self.rank);
        // Frames are small, so every write fits the socket buffers: write all, then read all.
        for peer in (0..size).filter(|&p| p != rank) {
            self.send_frame(peer, mine)?;
        }
        (0..size)
            .map(|peer| if peer == self.rank { Ok(mine.to_vec()) } else { self.recv_frame(peer) })
            .collect()
    }

    /// The transport over these connections, switched to non-blocking mode.
    pub fn into_transport(self, config: &TcpConfig) -> Result<TcpTransport, CommError> {
        let Mesh { rank, names, data, control, .. } = self;
        let mut links = Vec::with_capacity(names.len());
        for (peer, (d, c)) in data.into_iter().zip(control).enumerate() {
            links.push(match (d, c) {
                (Some(d), Some(c)) => {
                    for s in [&d, &c] {
                        configure(s, config.socket_buffer_bytes).map_err(|e| {
                            CommError::Rendezvous(format!(
                                "cannot configure the connection to {}: {e}",
                                names[peer]
                            ))
                        })?;
                    }
                    Some(Link::new(d, c))
                }
                _ if peer == rank => None,
                _ => return Err(CommError::Rendezvous(format!("{} is not connected", names[peer]))),
            });
        }
        Ok(TcpTransport::new(rank, names, links, config))
    }
}

/// No Nagle delay, non-blocking, and the socket buffers (0 keeps the kernel's autotuning).
fn configure(s: &TcpStream, buffer_bytes: usize) -> io::Result<()> {
    s.set_nodelay(true)?;
    s.set_nonblocking(true)?;
    s.set_read_timeout(None)?;
    s.set_write_timeout(None)?;
    if buffer_bytes > 0 {
        use std::os::fd::AsRawFd;
        let size = libc::c_int::try_from(buffer_bytes).unwrap_or(libc::c_int::MAX);
        for opt in [libc::SO_SNDBUF, libc::SO_RCVBUF] {
            // SAFETY: a valid socket and a pointer to a c_int that lives for the call.
            let rc = unsafe {
                libc::setsockopt(
                    s.as_raw_fd(),
                    libc::SOL_SOCKET,
                    opt,
                    (&size as *const libc::c_int).cast(),
                    size_of::<libc::c_int>() as libc::socklen_t,
                )
            };
            if rc != 0 {
                return Err(io::Error::last_os_error());
            }
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A mesh of rank 0 whose data connection to rank 1 is `ours`, with the other end returned.
    fn mesh_with_peer() -> (Mesh, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let ours = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (theirs, _) = listener.accept().unwrap();
        let names = vec![
            Peer { rank: 0, addr: "127.0.0.1:1".to_owned() },
            Peer { rank: 1, addr: "127.0.0.1:2".to_owned() },
        ];
        let mesh = Mesh {
            rank: 0,
            names,
            data: vec![None, Some(ours)],
            control: vec![None, None],
            deadline: Instant::now() + Duration::from_secs(5),
        };
        (mesh, theirs)
    }

    #[test]
    fn an_oversized_setup_frame_is_refused_before_anything_is_allocated() {
        let (mut mesh, mut peer) = mesh_with_peer();
        peer.write_all(&u32::MAX.to_le_bytes()).unwrap();
        let err = mesh.recv_frame(1).unwrap_err().to_string();
        assert!(err.contains("rank 1") && err.contains("4294967295 bytes, more than 65536"), "{err}");
    }

    #[test]
    fn a_setup_frame_cut_short_names_the_peer() {
        let (mut mesh, mut peer) = mesh_with_peer();
        peer.write_all(&100u32.to_le_bytes()).unwrap();
        peer.write_all(b"short").unwrap();
        drop(peer);
        let err = mesh.recv_frame(1).unwrap_err();
        assert!(matches!(err, CommError::PeerFailed { ref peer, .. } if peer.rank == 1), "{err}");
    }

    #[test]
    fn a_group_of_one_listens_on_nothing_so_a_taken_port_does_not_stop_it() {
        // Another program holds the port the job config gives the only rank (the local runner's
        // ports were free a moment before); the rank still forms its group.
        let taken = TcpListener::bind("127.0.0.1:0").unwrap();
        let peers = [Endpoint::new("127.0.0.1", taken.local_addr().unwrap().port())];
        let mesh = form_mesh(0, &peers, "127.0.0.1", b"token", &TcpConfig::default()).unwrap();
        assert_eq!((mesh.rank, mesh.data.len(), mesh.control.len()), (0, 1, 1));
        // With a second rank the port is needed, and its being taken is named.
        let two = [peers[0].clone(), Endpoint::new("127.0.0.1", 1)];
        let Err(err) = form_mesh(0, &two, "127.0.0.1", b"token", &TcpConfig::default()) else {
            panic!("a group of two formed on a taken port")
        };
        let err = err.to_string();
        assert!(
            err.contains("cannot listen on 127.0.0.1:") && err.contains("check that the port is free"),
            "{err}"
        );
    }

    #[test]
    fn setup_frames_round_trip() {
        let (mut mesh, peer) = mesh_with_peer();
        let mut other = Mesh {
            rank: 1,
            names: mesh.names.clone(),
            data: vec![Some(peer), None],
            control: vec![None, None],
            deadline: Instant::now() + Duration::from_secs(5),
        };
        mesh.send_frame(1, b"hello").unwrap();
        assert_eq!(other.recv_frame(0).unwrap(), b"hello");
        assert!(matches!(mesh.send_frame(1, &vec![0; MAX_FRAME + 1]), Err(CommError::Invalid(_))));
    }
}
