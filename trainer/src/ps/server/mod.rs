//! The parameter-server process: binds, accepts bounded connections, feeds the shard state
//! machine ([`state`]) and carries out what it asks (send, close, checkpoint); the update rule a
//! shard runs ([`optim`]), its checkpoints ([`checkpoint`]) and its HTTP status endpoint
//! ([`http`]) are its internals, which only `tandem ps` uses.
//!
//! Expected flow: [`Server::bind`] restores the newest intact checkpoint of its shard (if any),
//! then [`Server::run`] serves until the `shutdown` future completes, then writes a last
//! checkpoint so a graceful stop loses nothing.
//!
//! Guarantees: one task owns the [`ShardState`], so frames are applied one at a time in arrival
//! order; each connection has a reader and a writer task, so a client that pipelines big pushes
//! and pulls never deadlocks against the server; bytes that are not frames, frames before hello,
//! and wrong tokens are refused, logged and (where the stream is lost) the connection closed,
//! while every other connection is served as before. A connection that says nothing within the
//! hello timeout is closed. At most `max_connections` are open; more wait in the accept queue.
//! With [`Server::with_status`] it also serves the HTTP status endpoint ([`http`]), whose
//! queries the same task answers between frames; the training service never waits for it.

pub mod checkpoint;
pub mod http;
pub mod optim;
pub mod state;

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, Semaphore, mpsc, oneshot};

use crate::ps::wire::{self, Frame, HEADER_LEN, Peer, WireError};
use crate::util::token;
use checkpoint::CheckpointError;
use http::{StatusDocument, StatusListener};
use state::{Output, RestoreError, SessionId, ShardConfig, ShardState};

/// How a server runs.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// The shard it holds.
    pub shard: ShardConfig,
    /// Where its checkpoints live, stamped with the job they belong to; `None` keeps nothing on
    /// disk.
    pub checkpoints: Option<checkpoint::Store>,
    /// Largest frame body accepted, in bytes.
    pub max_frame: usize,
    /// Most connections served at once.
    pub max_connections: usize,
    /// How long a new connection may take to send its first frame.
    pub hello_timeout: Duration,
}

impl ServerConfig {
    /// Defaults for everything but the shard.
    pub fn new(shard: ShardConfig) -> Self {
        Self {
            shard,
            checkpoints: None,
            max_frame: wire::DEFAULT_MAX_FRAME,
            max_connections: 1024,
            hello_timeout: Duration::from_secs(30),
        }
    }
}

/// A server that could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The address cannot be bound.
    #[error("cannot bind the parameter server to {addr}: {source}")]
    Bind {
        /// Address asked for.
        addr: String,
        /// Cause.
        source: std::io::Error,
    },
    /// Accepting connections failed.
    #[error("accepting connections failed: {0}")]
    Accept(std::io::Error),
    /// The checkpoint folder cannot be read or holds no intact file.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// The newest checkpoint does not fit this shard.
    #[error("cannot resume from {path}: {source}")]
    Restore {
        /// Checkpoint folder.
        path: PathBuf,
        /// Cause.
        source: RestoreError,
    },
}

/// A bound parameter server, ready to run.
pub struct Server {
    listener: TcpListener,
    state: ShardState,
    config: ServerConfig,
    status: Option<StatusListener>,
}

enum Event {
    Connected(SessionId, mpsc::UnboundedSender<Outbound>),
    Frame(SessionId, Frame),
    Wire(SessionId, WireError),
    Disconnected(SessionId),
    Status(oneshot::Sender<StatusDocument>),
    Shutdown,
}

enum Outbound {
    Frame(Frame),
    Close,
}

impl Server {
    /// Binds `addr` and restores the shard from its newest intact checkpoint of this job, if any.
    pub async fn bind(addr: &str, config: ServerConfig) -> Result<Self, ServerError> {
        let state = match &config.checkpoints {
            Some(store) => match store.latest()? {
                Some(snapshot) => {
                    let (version, dir) = (snapshot.version, store.dir());
                    let state = ShardState::restore(config.shard.clone(), snapshot)
                        .map_err(|source| ServerError::Restore { path: dir.to_owned(), source })?;
                    tracing::info!(shard = config.shard.index, version, dir = %dir.display(), "resumed from checkpoint");
                    state
                }
                None => ShardState::new(config.shard.clone()),
            },
            None => ShardState::new(config.shard.clone()),
        };
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| ServerError::Bind { addr: addr.to_owned(), source })?;
        Ok(Self { listener, state, config, status: None })
    }

    /// Also serves the HTTP status endpoint on `listener` while running (see [`http`]).
    pub fn with_status(mut self, listener: StatusListener) -> Self {
        self.status = Some(listener);
        self
    }

    /// The address actually bound (useful with port 0).
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Updates the shard holds now (the checkpoint's version after a restart).
    pub fn version(&self) -> u64 {
        self.state.version()
    }

    /// Serves until `shutdown` completes, then writes a final checkpoint.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<(), ServerError> {
        let Server { listener, state, config, status } = self;
        let (events_tx, events_rx) = mpsc::channel::<Event>(1024);
        let actor = tokio::spawn(actor(state, events_rx, config.checkpoints.clone()));
        let status = status.map(|listener| {
            let (query_tx, mut query_rx) = mpsc::channel::<oneshot::Sender<StatusDocument>>(16);
            let events = events_tx.clone();
            let forward = tokio::spawn(async move {
                while let Some(reply) = query_rx.recv().await {
                    if events.send(Event::Status(reply)).await.is_err() {
                        break;
                    }
                }
            });
            let token: Arc<str> = config.shard.token.as_str().into();
            (tokio::spawn(http::serve(listener, token, query_tx)), forward)
        });
        let limit = Arc::new(Semaphore::new(config.max_connections.max(1)));
        let mut next: SessionId = 0;
        tokio::pin!(shutdown);
        let result = loop {
            let permit = tokio::select! {
                _ = &mut shutdown => break Ok(()),
                p = limit.clone().acquire_owned() => match p {
                    Ok(p) => p,
                    Err(_) => break Ok(()),
                },
            };
            let (stream, peer) = tokio::select! {
                _ = &mut shutdown => break Ok(()),
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) if is_transient(&e) => {
                        tracing::warn!(error = %e, "accept failed; retrying");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                    Err(e) => break Err(ServerError::Accept(e)),
                },
            };
            next += 1;
            let session = next;
            tracing::debug!(session, %peer, "connection accepted");
            let events = events_tx.clone();
            let (max_frame, hello_timeout) = (config.max_frame, config.hello_timeout);
            tokio::spawn(async move {
                connection(stream, session, events, max_frame, hello_timeout).await;
                drop(permit);
            });
        };
        drop(listener);
        if let Some((serve, forward)) = status {
            serve.abort();
            forward.abort();
        }
        // Connections may stay open for ever, so the actor is told to stop rather than left to
        // notice that every sender is gone; it writes a last checkpoint first.
        let _ = events_tx.send(Event::Shutdown).await;
        let _ = actor.await;
        result
    }
}

fn is_transient(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(e.kind(), ConnectionAborted | ConnectionReset | Interrupted | WouldBlock)
        || e.raw_os_error().is_some_and(|c| c == 24 || c == 23) // EMFILE, ENFILE: wait for a close
}

/// Owns the shard: applies events in order and routes outputs.
async fn actor(mut state: ShardState, mut events: mpsc::Receiver<Event>, store: Option<checkpoint::Store>) {
    let mut writers: HashMap<SessionId, mpsc::UnboundedSender<Outbound>> = HashMap::new();
    let mut meter = Throughput::default();
    while let Some(event) = events.recv().await {
        let outputs = match event {
            Event::Frame(s, Frame::Report(p)) => {
                if let Some(Peer::Worker { group, attempt, .. }) = state.peer(s) {
                    meter.record(group, attempt, p.samples, Instant::now());
                }
                state.handle(s, Frame::Report(p))
            }
            Event::Connected(s, tx) => {
                writers.insert(s, tx);
                match token::random_bytes() {
                    Ok(nonce) => state.connect(s, nonce),
                    Err(e) => {
                        tracing::warn!(session = s, error = %e, "no random challenge for a new connection; closing it");
                        vec![Output::Close(s)]
                    }
                }
            }
            Event::Frame(s, frame) => state.handle(s, frame),
            Event::Wire(s, error) => state.refuse_wire(s, &error),
            Event::Disconnected(s) => {
                writers.remove(&s);
                state.disconnect(s)
            }
            Event::Status(reply) => {
                let status = state.status();
                let members = status.groups.iter().filter(|g| g.member).map(|g| g.group);
                let rate = meter.rate(members);
                let _ = reply.send(StatusDocument::new(status, rate));
                Vec::new()
            }
            Event::Shutdown => break,
        };
        for output in outputs {
            match output {
                Output::Send(s, frame) => {
                    if let Some(tx) = writers.get(&s) {
                        let _ = tx.send(Outbound::Frame(frame));
                    }
                }
                Output::Close(s) => {
                    if let Some(tx) = writers.get(&s) {
                        let _ = tx.send(Outbound::Close);
                    }
                }
                Output::Checkpoint => write_checkpoint(&state, store.as_ref()).await,
            }
        }
    }
    write_checkpoint(&state, store.as_ref()).await;
}

/// Each group's throughput, from the samples count of its last two progress reports.
#[derive(Default)]
struct Throughput {
    groups: HashMap<u32, GroupRate>,
}

struct GroupRate {
    attempt: u32,
    at: Instant,
    samples: u64,
    per_second: Option<f64>,
}

impl Throughput {
    fn record(&mut self, group: u32, attempt: u32, samples: u64, at: Instant) {
        let rate = self.groups.entry(group).or_insert(GroupRate { attempt, at, samples, per_second: None });
        if rate.attempt != attempt || samples < rate.samples {
            // A relaunched group counts from zero again.
            *rate = GroupRate { attempt, at, samples, per_second: None };
            return;
        }
        let seconds = at.duration_since(rate.at).as_secs_f64();
        if samples > rate.samples && seconds > 0.0 {
            rate.per_second = Some((samples - rate.samples) as f64 / seconds);
            rate.at = at;
            rate.samples = samples;
        }
    }

    /// Samples per second summed over `groups`, or `None` if none of them has a rate yet.
    fn rate(&self, groups: impl Iterator<Item = u32>) -> Option<f64> {
        groups.filter_map(|g| self.groups.get(&g)?.per_second).reduce(|a, b| a + b)
    }
}

async fn write_checkpoint(state: &ShardState, store: Option<&checkpoint::Store>) {
    let (Some(store), Some(snapshot)) = (store.cloned(), state.snapshot()) else { return };
    let version = snapshot.version;
    match tokio::task::spawn_blocking(move || store.save(&snapshot)).await {
        Ok(Ok(path)) => tracing::info!(version, path = %path.display(), "checkpoint written"),
        Ok(Err(e)) => tracing::error!(version, error = %e, "checkpoint failed; training goes on without it"),
        Err(e) => tracing::error!(version, error = %e, "checkpoint task failed"),
    }
}

/// Reads frames from one connection; a writer task sends what the actor queues for it.
async fn connection(
    stream: TcpStream,
    session: SessionId,
    events: mpsc::Sender<Event>,
    max_frame: usize,
    hello_timeout: Duration,
) {
    let _ = stream.set_nodelay(true);
    let (rd, wr) = stream.into_split();
    let (tx, rx) = mpsc::unbounded_channel();
    if events.send(Event::Connected(session, tx)).await.is_err() {
        return;
    }
    let closed = Arc::new(Notify::new());
    tokio::spawn(writer(wr, rx, closed.clone()));
    let mut reader = FrameReader { rd, buf: Vec::with_capacity(64 * 1024), max_frame };
    let mut first = true;
    loop {
        let read = async {
            if first {
                tokio::time::timeout(hello_timeout, reader.read())
                    .await
                    .unwrap_or(Err(ReadFailure::HelloTimeout))
            } else {
                reader.read().await
            }
        };
        let event = tokio::select! {
            _ = closed.notified() => break,
            r = read => r,
        };
        first = false;
        match event {
            Ok(frame) => {
                if events.send(Event::Frame(session, frame)).await.is_err() {
                    break;
                }
            }
            Err(ReadFailure::Wire(e)) => {
                let fatal = e.is_fatal();
                if events.send(Event::Wire(session, e)).await.is_err() || fatal {
                    break;
                }
            }
            Err(ReadFailure::HelloTimeout) => {
                tracing::warn!(session, "no hello within {hello_timeout:?}; closing");
                break;
            }
            Err(ReadFailure::Eof) => break,
            Err(ReadFailure::Io(e)) => {
                tracing::debug!(session, error = %e, "connection failed");
                break;
            }
        }
    }
    let _ = events.send(Event::Disconnected(session)).await;
}

async fn writer(mut wr: OwnedWriteHalf, mut rx: mpsc::UnboundedReceiver<Outbound>, closed: Arc<Notify>) {
    let mut buf = Vec::new();
    while let Some(out) = rx.recv().await {
        match out {
            Outbound::Frame(frame) => {
                buf.clear();
                wire::encode(&frame, &mut buf);
                if wr.write_all(&buf).await.is_err() {
                    break;
                }
            }
            Outbound::Close => break,
        }
    }
    let _ = wr.shutdown().await;
    closed.notify_one();
}

enum ReadFailure {
    Eof,
    HelloTimeout,
    Io(std::io::Error),
    Wire(WireError),
}

/// Buffered frame reader; `read` is cancel-safe because bytes stay in `buf` until a frame is whole.
struct FrameReader {
    rd: OwnedReadHalf,
    buf: Vec<u8>,
    max_frame: usize,
}

impl FrameReader {
    async fn read(&mut self) -> Result<Frame, ReadFailure> {
        loop {
            if self.buf.len() >= HEADER_LEN {
                let mut header = [0u8; HEADER_LEN];
                header.copy_from_slice(&self.buf[..HEADER_LEN]);
                let (kind, len) = wire::parse_header(&header, self.max_frame).map_err(ReadFailure::Wire)?;
                if self.buf.len() >= HEADER_LEN + len {
                    let result = wire::decode_body(kind, &self.buf[HEADER_LEN..HEADER_LEN + len]);
                    self.buf.drain(..HEADER_LEN + len);
                    return result.map_err(ReadFailure::Wire);
                }
                self.buf.reserve(HEADER_LEN + len - self.buf.len());
            }
            let n = self.rd.read_buf(&mut self.buf).await.map_err(ReadFailure::Io)?;
            if n == 0 {
                return if self.buf.is_empty() {
                    Err(ReadFailure::Eof)
                } else {
                    Err(ReadFailure::Io(std::io::ErrorKind::UnexpectedEof.into()))
                };
            }
        }
    }
}
