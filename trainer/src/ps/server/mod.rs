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
//! and pulls never deadlocks against the server.
//!
//! Before a connection has proven the job token it never reaches the shard task and costs a
//! bounded amount: the connection's own task sends the challenge, reads one frame of at most
//! [`wire::MAX_HELLO_FRAME`] bytes, and closes unless it is a hello with a valid proof, all within
//! one hard deadline (`hello_timeout`) from the accept. Anything else — bytes that are not a
//! frame, an unknown or other kind, a larger frame, a wrong proof, silence — gets at most one
//! error frame and the close. Unauthenticated connections are bounded per source address and in
//! all ([`gate`]: the oldest of the busiest source makes room, so a real client is served while a
//! hostile one floods), the log lines they cause are rate-limited, and their count shows in the
//! status document's `refused`. At most `max_connections` authenticated connections are served;
//! a hello beyond that is refused ([`wire::ErrorCode::Busy`]).
//!
//! If the shard task fails (a panic), the server stops serving, marks the status endpoint's
//! `/healthz` failed and [`Server::run`] returns [`ServerError::ShardFailed`], so `tandem ps`
//! exits non-zero and is restarted from its newest checkpoint; no final checkpoint is written
//! from a state that a panic may have left half-updated. With [`Server::with_status`] it also
//! serves the HTTP status endpoint ([`http`]), whose queries the same task answers between
//! frames; the training service never waits for it.

pub mod checkpoint;
mod finite;
pub mod gate;
pub mod http;
pub mod optim;
pub mod state;

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tandem_api::contract::JobConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, Semaphore, mpsc, oneshot};

use checkpoint::CheckpointError;
use gate::{Admission, Bounds, Ticket};
use http::{Health, StatusDocument, StatusListener};
use state::{Output, RestoreError, SessionId, ShardConfig, ShardState};
use tandem_ps::wire::{self, ErrorCode, Frame, HEADER_LEN, NONCE_LEN, Peer, WireError};
use tandem_util::token;

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
    /// Most authenticated connections served at once.
    pub max_connections: usize,
    /// Hard deadline, from the accept, for a new connection to prove the token in its hello.
    pub hello_timeout: Duration,
    /// Bounds on connections that have not proven the token yet ([`gate`]).
    pub unauthenticated: Bounds,
    /// The job config file, read again for its group count whenever a group asks for the epoch
    /// plan (scaling rewrites it: the operator's ConfigMap, the local runner's `job.json`);
    /// `None` keeps the count the shard started with.
    pub job_config: Option<PathBuf>,
}

impl ServerConfig {
    /// Defaults for everything but the shard.
    pub fn new(shard: ShardConfig) -> Self {
        Self {
            shard,
            checkpoints: None,
            max_frame: wire::DEFAULT_MAX_FRAME,
            max_connections: 1024,
            hello_timeout: Duration::from_secs(10),
            unauthenticated: Bounds { per_source: 64, total: 256 },
            job_config: None,
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
    /// The task that owns the shard failed; the shard's state since its newest checkpoint is lost.
    #[error(
        "the shard task failed: {0}; the parameter server stops so that it is restarted from its newest checkpoint"
    )]
    ShardFailed(String),
}

/// A bound parameter server, ready to run.
pub struct Server {
    listener: TcpListener,
    state: ShardState,
    config: ServerConfig,
    status: Option<StatusListener>,
    metrics: Option<std::net::TcpListener>,
}

enum Event {
    /// An authenticated connection: the challenge it answered and where its replies go.
    Connected(SessionId, [u8; NONCE_LEN], mpsc::UnboundedSender<Outbound>),
    Frame(SessionId, Frame),
    Wire(SessionId, WireError),
    Disconnected(SessionId),
    Status(oneshot::Sender<StatusDocument>),
    /// The job's group count, posted to shard 0's status endpoint (by the operator).
    PlanGroups(u32, oneshot::Sender<()>),
    Shutdown,
    /// Makes the shard task panic (tests of its supervision).
    #[cfg(test)]
    Panic,
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
        Ok(Self { listener, state, config, status: None, metrics: None })
    }

    /// Also serves the HTTP status endpoint on `listener` while running (see [`http`]).
    pub fn with_status(mut self, listener: StatusListener) -> Self {
        self.status = Some(listener);
        self
    }

    /// Also serves Prometheus metrics on `listener` while running, without the token
    /// ([`tandem_util::metrics`]; the shard's families of [`StatusDocument::metrics`] and
    /// `tandem_ps_event_queue_depth`, the requests waiting for the shard task).
    pub fn with_metrics(mut self, listener: std::net::TcpListener) -> Self {
        self.metrics = Some(listener);
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

    /// Serves until `shutdown` completes, then writes a final checkpoint. Returns
    /// [`ServerError::ShardFailed`] at once if the shard task fails.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<(), ServerError> {
        self.run_inner(shutdown, |_, _| {}).await
    }

    async fn run_inner(
        self,
        shutdown: impl Future<Output = ()>,
        started: impl FnOnce(&mpsc::Sender<Event>, &Health),
    ) -> Result<(), ServerError> {
        let Server { listener, state, config, status, metrics } = self;
        let admission = Admission::new(config.unauthenticated);
        let health = Health::default();
        let (events_tx, events_rx) = mpsc::channel::<Event>(1024);
        let mut actor = tokio::spawn(actor(
            state,
            events_rx,
            config.checkpoints.clone(),
            admission.clone(),
            config.job_config.clone(),
        ));
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
            // Shard 0 holds the epoch plan, and takes the job's group count on `/groups`.
            let orders = (config.shard.index == 0).then(|| {
                let (orders_tx, mut orders_rx) = mpsc::channel::<(u32, oneshot::Sender<()>)>(4);
                let events = events_tx.clone();
                tokio::spawn(async move {
                    while let Some((count, reply)) = orders_rx.recv().await {
                        if events.send(Event::PlanGroups(count, reply)).await.is_err() {
                            break;
                        }
                    }
                });
                orders_tx
            });
            let token: Arc<str> = config.shard.token.as_str().into();
            (tokio::spawn(http::serve(listener, token, query_tx, orders, health.clone())), forward)
        });
        let metrics = match metrics.map(TcpListener::from_std).transpose() {
            Ok(listener) => {
                listener.map(|l| tokio::spawn(tandem_util::metrics::serve(l, metrics_page(&events_tx))))
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot serve metrics; training goes on without them");
                None
            }
        };
        started(&events_tx, &health);
        let context = Arc::new(Context {
            events: events_tx.clone(),
            token: config.shard.token.as_str().into(),
            max_frame: config.max_frame,
            hello_timeout: config.hello_timeout,
            limit: Arc::new(Semaphore::new(config.max_connections.max(1))),
            admission,
        });
        let mut next: SessionId = 0;
        let mut actor_done = false;
        tokio::pin!(shutdown);
        let result = loop {
            let (stream, peer) = tokio::select! {
                _ = &mut shutdown => break Ok(()),
                ended = &mut actor => {
                    actor_done = true;
                    let why = match ended {
                        Ok(()) => "it stopped unexpectedly".to_owned(),
                        Err(e) => panic_message(e),
                    };
                    tracing::error!(error = %why, "the shard task failed; stopping");
                    health.fail(format!("the shard task failed: {why}"));
                    break Err(ServerError::ShardFailed(why));
                }
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
            let ticket = context.admission.admit(peer.ip());
            tokio::spawn(connection(stream, session, ticket, context.clone()));
        };
        drop(listener);
        if let Some((serve, forward)) = status {
            serve.abort();
            forward.abort();
        }
        if let Some(serve) = metrics {
            serve.abort();
        }
        if !actor_done {
            // Connections may stay open for ever, so the actor is told to stop rather than left
            // to notice that every sender is gone; it writes a last checkpoint first.
            let _ = events_tx.send(Event::Shutdown).await;
            let _ = actor.await;
        }
        result
    }
}

/// The PS's metrics page: the process's families, then the shard's, asked of the shard task as a
/// status query is (without them when it does not answer within [`METRICS_QUERY_TIMEOUT`]).
fn metrics_page(events: &mpsc::Sender<Event>) -> tandem_util::metrics::Page {
    let events = events.clone();
    Arc::new(move || {
        let events = events.clone();
        Box::pin(async move {
            use std::fmt::Write;
            let mut page = tandem_util::metrics::metrics().encode(false);
            let depth = events.max_capacity() - events.capacity();
            let _ = writeln!(
                page,
                "# HELP tandem_ps_event_queue_depth Requests waiting for the shard task.\n\
                 # TYPE tandem_ps_event_queue_depth gauge\ntandem_ps_event_queue_depth {depth}"
            );
            let (tx, rx) = oneshot::channel();
            if events.try_send(Event::Status(tx)).is_ok()
                && let Ok(Ok(document)) = tokio::time::timeout(METRICS_QUERY_TIMEOUT, rx).await
            {
                page.push_str(&document.metrics());
            }
            page
        })
    })
}

/// Time the shard task has to answer a scrape's query.
const METRICS_QUERY_TIMEOUT: Duration = Duration::from_secs(5);

/// What a panicked (or cancelled) task said.
fn panic_message(e: tokio::task::JoinError) -> String {
    match e.try_into_panic() {
        Ok(payload) => payload
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .map_or_else(|| "it panicked".to_owned(), |m| format!("it panicked: {m}")),
        Err(e) => e.to_string(),
    }
}

/// What every connection task shares.
struct Context {
    events: mpsc::Sender<Event>,
    token: Arc<str>,
    max_frame: usize,
    hello_timeout: Duration,
    /// Places for authenticated connections.
    limit: Arc<Semaphore>,
    admission: Admission,
}

fn is_transient(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(e.kind(), ConnectionAborted | ConnectionReset | Interrupted | WouldBlock)
        || e.raw_os_error().is_some_and(|c| c == 24 || c == 23) // EMFILE, ENFILE: wait for a close
}

/// The job config at `path` now; `None` (logged, saying what keeps its last value: `keeps`) when
/// it cannot be read, as while a ConfigMap update swaps the file.
fn read_job(path: &Path, keeps: &str) -> Option<JobConfig> {
    let read = std::fs::read_to_string(path).map_err(|e| e.to_string());
    match read.and_then(|text| JobConfig::from_json(&text).map_err(|e| e.to_string())) {
        Ok(job) => Some(job),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot read the job config; {keeps}");
            None
        }
    }
}

/// The group count of the job config at `path` now.
fn planned_groups(path: &Path) -> Option<u32> {
    read_job(path, "the epoch plan keeps the last group count read").map(|job| job.spec.workers.groups)
}

/// The bounds on group and rank indices of the job config at `path` now: `workers.maxGroups`
/// (at least `workers.groups`) and `workers.groupSize`.
fn group_bounds(path: &Path) -> Option<(u32, u32)> {
    let job = read_job(path, "workers' group and rank indices keep the last bounds read")?;
    let workers = &job.spec.workers;
    Some((workers.max_groups.max(workers.groups), workers.group_size))
}

/// Owns the shard: applies events in order and routes outputs.
async fn actor(
    mut state: ShardState,
    mut events: mpsc::Receiver<Event>,
    store: Option<checkpoint::Store>,
    admission: Admission,
    job_config: Option<PathBuf>,
) {
    let mut writers: HashMap<SessionId, mpsc::UnboundedSender<Outbound>> = HashMap::new();
    let mut meter = Throughput::default();
    let mut counted = 0;
    while let Some(event) = events.recv().await {
        let refused = admission.refused();
        state.add_refused(refused - counted);
        counted = refused;
        let outputs = match event {
            Event::Frame(s, Frame::Report(p)) => {
                if let Some(Peer::Worker { group, attempt, .. }) = state.peer(s) {
                    meter.record(group, attempt, p.samples, Instant::now());
                }
                state.handle(s, Frame::Report(p))
            }
            Event::Connected(s, nonce, tx) => {
                writers.insert(s, tx);
                // The connection's task already sent this challenge and checked the hello's proof
                // over it; the shard records it and checks the hello again.
                let mut out = state.connect(s, nonce);
                out.retain(|o| !matches!(o, Output::Send(_, Frame::Challenge { .. })));
                out
            }
            Event::Frame(s, frame @ Frame::Hello { peer: Peer::Worker { group, rank, .. }, .. })
                if group >= state.config().bounds.max_groups || rank >= state.config().bounds.group_size =>
            {
                // The user may have raised maxGroups on the running job: read the bounds again
                // before refusing.
                if let Some((max_groups, group_size)) = job_config.as_deref().and_then(group_bounds) {
                    state.set_group_bounds(max_groups, group_size);
                }
                state.handle(s, frame)
            }
            Event::Frame(s, frame @ Frame::GetEpochs { .. }) => {
                if let Some(groups) = job_config.as_deref().and_then(planned_groups) {
                    state.set_planned_groups(groups);
                }
                state.handle(s, frame)
            }
            Event::PlanGroups(groups, reply) => {
                if state.planned_groups() != groups {
                    tracing::info!(
                        shard = state.config().index,
                        groups,
                        "group count set by the operator: epochs planned from now on split the data among these groups"
                    );
                }
                state.post_groups(groups);
                let _ = reply.send(());
                Vec::new()
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
            #[cfg(test)]
            Event::Panic => panic!("injected shard fault"),
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

/// Writes the shard's snapshot, unless its own restore would refuse it: the previous checkpoint
/// then stays the newest, and the error says why.
async fn write_checkpoint(state: &ShardState, store: Option<&checkpoint::Store>) {
    let (Some(store), Some(snapshot)) = (store.cloned(), state.snapshot()) else { return };
    let version = snapshot.version;
    if let Err(e) = state.check_restorable(&snapshot) {
        tracing::error!(version, error = %e, "checkpoint not written: its restore would refuse it; the previous one stays the newest");
        return;
    }
    match tokio::task::spawn_blocking(move || store.save(&snapshot)).await {
        Ok(Ok(path)) => tracing::info!(version, path = %path.display(), "checkpoint written"),
        Ok(Err(e)) => tracing::error!(version, error = %e, "checkpoint failed; training goes on without it"),
        Err(e) => tracing::error!(version, error = %e, "checkpoint task failed"),
    }
}

/// Serves one connection: the handshake ([`handshake`]) under the hello deadline and the
/// admission ticket, then frames to the shard task while a writer task sends what it queues.
async fn connection(stream: TcpStream, session: SessionId, ticket: Ticket, cx: Arc<Context>) {
    let _ = stream.set_nodelay(true);
    let source = ticket.source();
    let (mut rd, mut wr) = stream.into_split();
    let hello = tokio::select! {
        _ = ticket.evicted() => return,
        done = tokio::time::timeout(cx.hello_timeout, handshake(&mut rd, &mut wr, &cx.token)) => match done {
            Ok(Ok(hello)) => hello,
            Ok(Err(Refusal::Gone(why))) => {
                tracing::debug!(session, %source, "connection closed before its hello: {why}");
                return;
            }
            Ok(Err(Refusal::Answer(code, message))) => {
                cx.admission.refuse(source, &message);
                return answer_once(rd, wr, code, message).await;
            }
            Err(_) => {
                let message = format!(
                    "no hello proving the job token within {:?} of connecting; closing",
                    cx.hello_timeout
                );
                cx.admission.refuse(source, &message);
                return answer_once(rd, wr, ErrorCode::Unauthenticated, message).await;
            }
        },
    };
    drop(ticket);
    let Ok(_permit) = cx.limit.clone().try_acquire_owned() else {
        let message = "this parameter server serves as many connections as it may (max_connections); \
                       retry later or raise the limit"
            .to_owned();
        tracing::warn!(session, %source, "{message}");
        return answer_once(rd, wr, ErrorCode::Busy, message).await;
    };
    let (nonce, hello) = hello;
    let (tx, rx) = mpsc::unbounded_channel();
    if cx.events.send(Event::Connected(session, nonce, tx)).await.is_err()
        || cx.events.send(Event::Frame(session, hello)).await.is_err()
    {
        return;
    }
    let closed = Arc::new(Notify::new());
    tokio::spawn(writer(wr, rx, closed.clone()));
    let mut reader = FrameReader { rd, buf: Vec::with_capacity(64 * 1024), max_frame: cx.max_frame };
    loop {
        let event = tokio::select! {
            _ = closed.notified() => break,
            r = reader.read() => r,
        };
        match event {
            Ok(frame) => {
                if cx.events.send(Event::Frame(session, frame)).await.is_err() {
                    break;
                }
            }
            Err(ReadFailure::Wire(e)) => {
                let fatal = e.is_fatal();
                if cx.events.send(Event::Wire(session, e)).await.is_err() || fatal {
                    break;
                }
            }
            Err(ReadFailure::Eof) => break,
            Err(ReadFailure::Io(e)) => {
                tracing::debug!(session, error = %e, "connection failed");
                break;
            }
        }
    }
    let _ = cx.events.send(Event::Disconnected(session)).await;
}

/// Why a handshake ended without an authenticated hello.
enum Refusal {
    /// The peer is owed one error frame.
    Answer(ErrorCode, String),
    /// The peer left or the socket failed: nothing to answer.
    Gone(String),
}

impl From<WireError> for Refusal {
    fn from(e: WireError) -> Self {
        let code = match e {
            WireError::UnknownKind(_) => ErrorCode::Unauthenticated,
            _ => e.code(),
        };
        Refusal::Answer(code, e.to_string())
    }
}

/// Sends the challenge and reads one frame of at most [`wire::MAX_HELLO_FRAME`] bytes: a hello
/// whose proof is valid, or a refusal. Nothing here touches the shard.
async fn handshake(
    rd: &mut OwnedReadHalf,
    wr: &mut OwnedWriteHalf,
    token: &str,
) -> Result<([u8; NONCE_LEN], Frame), Refusal> {
    let gone = |e: std::io::Error| Refusal::Gone(e.to_string());
    let nonce: [u8; NONCE_LEN] = token::random_bytes().map_err(|e| {
        tracing::error!(error = %e, "no random challenge for a new connection");
        Refusal::Gone(format!("no random challenge: {e}"))
    })?;
    let mut buf = Vec::with_capacity(HEADER_LEN + NONCE_LEN);
    wire::encode(&Frame::Challenge { nonce }, &mut buf);
    wr.write_all(&buf).await.map_err(gone)?;
    let mut header = [0u8; HEADER_LEN];
    rd.read_exact(&mut header).await.map_err(gone)?;
    let (kind, len) = wire::parse_header(&header, wire::MAX_HELLO_FRAME)?;
    if kind != wire::HELLO_KIND {
        let name = wire::kind_name(kind).unwrap_or("an unknown frame kind");
        let message = format!(
            "{name} (kind 0x{kind:02x}) before hello: every connection must first answer the challenge with \
             a hello that proves the job token"
        );
        return Err(Refusal::Answer(ErrorCode::Unauthenticated, message));
    }
    let mut body = [0u8; wire::MAX_HELLO_FRAME];
    rd.read_exact(&mut body[..len]).await.map_err(gone)?;
    let hello = wire::decode_body(kind, &body[..len])?;
    let Frame::Hello { proof, nonce: client, peer, total_len, total_steps } = &hello else {
        return Err(Refusal::Answer(ErrorCode::Unauthenticated, "expected a hello".to_owned()));
    };
    let want = wire::hello_proof(token.as_bytes(), &nonce, client, *peer, *total_len, *total_steps);
    if !token::same_bytes(proof, &want) {
        return Err(Refusal::Answer(ErrorCode::Unauthenticated, state::WRONG_TOKEN.to_owned()));
    }
    Ok((nonce, hello))
}

/// Sends one error frame, ends the stream, and reads (a bounded amount of) what the peer still
/// sends for a moment, so that the close does not reset the connection before the peer has read
/// the error.
async fn answer_once(mut rd: OwnedReadHalf, mut wr: OwnedWriteHalf, code: ErrorCode, message: String) {
    const LINGER: Duration = Duration::from_millis(500);
    let mut buf = Vec::new();
    wire::encode(&Frame::Error { code, message }, &mut buf);
    let _ = tokio::time::timeout(LINGER, async {
        if wr.write_all(&buf).await.is_ok() {
            let _ = wr.shutdown().await;
        }
        let mut sink = [0u8; 4096];
        let mut drained = 0usize;
        while drained < 256 * 1024 {
            match rd.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => drained += n,
            }
        }
    })
    .await;
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

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use tandem_api::PsMode;
    use tandem_api::job::OptimizerSpec;

    fn config() -> ServerConfig {
        ServerConfig::new(ShardConfig {
            index: 0,
            replicas: 1,
            mode: PsMode::Sync,
            token: "t".into(),
            checkpoint_every: 0,
            optimizer: OptimizerSpec::default(),
            max_total_len: 16,
            groups: 1,
            bounds: state::JobBounds::loose(),
        })
    }

    async fn get(addr: SocketAddr, path: &str) -> String {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(format!("GET {path} HTTP/1.1\r\n\r\n").as_bytes()).await.unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).await.unwrap();
        answer
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_shard_task_fails_the_health_probe_and_the_run() {
        let status = StatusListener::bind("127.0.0.1:0").await.unwrap();
        let status_addr = status.local_addr().unwrap();
        let server = Server::bind("127.0.0.1:0", config()).await.unwrap().with_status(status);
        let (events_tx, events_rx) = oneshot::channel();
        let (health_tx, health_rx) = oneshot::channel();
        let run = tokio::spawn(server.run_inner(std::future::pending(), move |events, health| {
            let _ = events_tx.send(events.clone());
            let _ = health_tx.send(health.clone());
        }));
        let health = health_rx.await.unwrap();
        assert!(get(status_addr, "/healthz").await.starts_with("HTTP/1.1 200"));
        events_rx.await.unwrap().send(Event::Panic).await.unwrap();
        // The run ends on its own, with the cause, although no shutdown was asked for.
        let ended = tokio::time::timeout(Duration::from_secs(60), run).await.unwrap().unwrap();
        let Err(ServerError::ShardFailed(why)) = ended else { panic!("a shard failure expected: {ended:?}") };
        assert!(why.contains("injected shard fault"), "{why}");
        assert!(health.failure().is_some_and(|f| f.contains("injected shard fault")));
    }

    #[tokio::test]
    async fn the_health_probe_reports_a_failure() {
        let status = StatusListener::bind("127.0.0.1:0").await.unwrap();
        let addr = status.local_addr().unwrap();
        let health = Health::default();
        let (query, _queries) = mpsc::channel(1);
        let serve = tokio::spawn(http::serve::<http::StatusDocument>(
            status,
            "t".into(),
            query,
            None,
            health.clone(),
        ));
        assert!(get(addr, "/healthz").await.ends_with("\r\n\r\nok\n"));
        health.fail("the shard task failed: it panicked".into());
        let answer = get(addr, "/healthz").await;
        assert!(answer.starts_with("HTTP/1.1 503") && answer.contains("it panicked"), "{answer}");
        serve.abort();
    }
}
