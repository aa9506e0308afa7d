//! What a worker rank (or an observer) uses to talk to every parameter-server shard.
//!
//! Expected flow: [`PsClient::connect`] (retries until the servers are up, says hello to each
//! shard and checks that they agree on the layout), [`PsClient::init`] with the rank's initial
//! weights, [`PsClient::join`], then per step [`PsClient::push`] and [`PsClient::pull`] of the
//! rank's range. After an error from a shard that restarted, [`PsClient::reconnect`] and pull
//! again: the shard resumes from its checkpoint.
//!
//! Guarantees: requests for a range are split along [`super::shard::ranges`] and into frames no
//! larger than the frame limit, sent to every shard involved before any reply is awaited (so the
//! shards work in parallel), and answered in order; every error names the shard index and
//! address and the operation; every wait is bounded by the configured timeouts.
//!
//! Caveats: the client is blocking (one rank, one thread); a pull can legitimately wait for other
//! groups (sync and bounded-staleness modes), so the request timeout must exceed a slow step.

use std::io::{BufReader, BufWriter, Write};
use std::net::TcpStream;
use std::ops::Range;
use std::time::{Duration, Instant};

use super::shard;
use super::wire::{self, ErrorCode, Frame, Peer, Progress, ReadError};
use tandem_api::{ExitClass, PsMode};

/// How to reach the parameter servers.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// `host:port` of each shard, by index.
    pub servers: Vec<String>,
    /// The job token.
    pub token: String,
    /// Who this client is.
    pub peer: Peer,
    /// Length of the flat parameter vector (0 for an observer that does not know it).
    pub total_len: u64,
    /// Steps of the run, over which the servers' schedule runs (a worker's
    /// [`tandem_api::JobPlan::total_steps`]; 0 for an observer).
    pub total_steps: u64,
    /// The mode the servers must run (the worker's [`tandem_api::PsMode::of`] its job); `None`
    /// accepts any (an observer).
    pub mode: Option<PsMode>,
    /// How long to keep retrying to reach a server that is not up yet.
    pub connect_timeout: Duration,
    /// How long to wait for any one reply.
    pub request_timeout: Duration,
    /// Largest frame body to send or accept.
    pub max_frame: usize,
}

impl ClientConfig {
    /// A worker rank's config with default limits (60 s to connect, 300 s per reply); give it its
    /// run with [`ClientConfig::run`] (the servers refuse a worker that does not say).
    pub fn worker(
        servers: Vec<String>,
        token: impl Into<String>,
        group: u32,
        rank: u32,
        attempt: u32,
        total_len: u64,
    ) -> Self {
        Self {
            servers,
            token: token.into(),
            peer: Peer::Worker { group, rank, attempt },
            total_len,
            total_steps: 0,
            mode: None,
            connect_timeout: Duration::from_secs(60),
            request_timeout: Duration::from_secs(300),
            max_frame: wire::DEFAULT_MAX_FRAME,
        }
    }

    /// An observer's config: reads status and weights only.
    pub fn observer(servers: Vec<String>, token: impl Into<String>) -> Self {
        Self { peer: Peer::Observer, ..Self::worker(servers, token, 0, 0, 0, 0) }
    }

    /// The run this worker trains: `total_steps` steps against servers that must run `mode`.
    pub fn run(mut self, total_steps: u64, mode: PsMode) -> Self {
        self.total_steps = total_steps;
        self.mode = Some(mode);
        self
    }
}

/// A failed exchange with a parameter server.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server could not be reached within the connect timeout.
    #[error(
        "cannot reach PS {index} at {addr} within {waited:?}: {source}; is the parameter server running?"
    )]
    Connect {
        /// Shard index.
        index: usize,
        /// Address.
        addr: String,
        /// Time spent retrying.
        waited: Duration,
        /// Last cause.
        source: std::io::Error,
    },
    /// The server did not answer in time.
    #[error("PS {index} at {addr} did not answer {op} within {after:?}")]
    Timeout {
        /// Shard index.
        index: usize,
        /// Address.
        addr: String,
        /// Operation.
        op: &'static str,
        /// Timeout.
        after: Duration,
    },
    /// The connection broke or was closed.
    #[error(
        "connection to PS {index} at {addr} lost during {op}: {detail}; reconnect once the server is back"
    )]
    Lost {
        /// Shard index.
        index: usize,
        /// Address.
        addr: String,
        /// Operation.
        op: &'static str,
        /// Cause.
        detail: String,
    },
    /// The server refused the request.
    #[error("PS {index} at {addr} refused {op} ({code:?}): {message}")]
    Refused {
        /// Shard index.
        index: usize,
        /// Address.
        addr: String,
        /// Operation.
        op: &'static str,
        /// Category.
        code: ErrorCode,
        /// The server's explanation.
        message: String,
    },
    /// The server answered something this client did not ask for.
    #[error("PS {index} at {addr} answered {op} with an unexpected {got} frame")]
    Unexpected {
        /// Shard index.
        index: usize,
        /// Address.
        addr: String,
        /// Operation.
        op: &'static str,
        /// Frame received.
        got: &'static str,
    },
    /// The servers' layout does not match this client's.
    #[error("PS {index} at {addr}: {detail}")]
    Layout {
        /// Shard index.
        index: usize,
        /// Address.
        addr: String,
        /// What disagrees.
        detail: String,
    },
    /// A range outside the vector.
    #[error("range {offset}..{end} is outside the {total}-value parameter vector")]
    Range {
        /// Start.
        offset: u64,
        /// End.
        end: u64,
        /// Vector length.
        total: u64,
    },
    /// The server's welcome does not prove the job token: it is not this job's parameter server.
    #[error(
        "PS {index} at {addr} did not prove the job token in its welcome; it is not this job's parameter \
         server (check the job config's parameterServers list and the token file)"
    )]
    Unproven {
        /// Shard index.
        index: usize,
        /// Address.
        addr: String,
    },
    /// The client was built without servers.
    #[error("no parameter servers configured: the job's parameterServers.replicas is 0")]
    NoServers,
}

impl ClientError {
    /// Whether a parameter server was lost (unreachable, silent, or its connection broke), rather
    /// than refused this worker: restarting the worker once the server is back can cure it.
    pub fn is_peer_lost(&self) -> bool {
        matches!(self, ClientError::Connect { .. } | ClientError::Timeout { .. } | ClientError::Lost { .. })
    }

    /// How a process that this error ends exits: [`ExitClass::PeerLost`] for a lost server,
    /// [`ExitClass::Permanent`] for a refusal (a wrong token, a job it does not serve).
    pub fn exit_class(&self) -> ExitClass {
        if self.is_peer_lost() { ExitClass::PeerLost } else { ExitClass::Permanent }
    }
}

struct Conn {
    reader: BufReader<TcpStream>,
    writer: BufWriter<TcpStream>,
}

/// A connection to every shard. See the module documentation.
pub struct PsClient {
    config: ClientConfig,
    conns: Vec<Option<Conn>>,
    ranges: Vec<Range<u64>>,
    mode: PsMode,
    joined: bool,
    /// Steps of the run, from shard 0's welcome (0 while unknown).
    run_steps: u64,
}

/// A group's furthest reported progress as the servers keep it ([`PsClient::reported`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reported {
    /// The step.
    pub step: u64,
    /// Each rank's data cursor after it, in rank order (empty when the group sent none).
    pub cursors: Vec<tandem_api::DataCursor>,
}

/// What the servers keep of a group's progress ([`PsClient::kept`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Kept {
    /// The furthest step the group reported to any shard, with its ranks' data cursors after it
    /// (kept across the group's restarts while the shard runs, and in the shard's checkpoints;
    /// `None` when it reported nothing) — the furthest not beyond [`Kept::contributed`] when one
    /// is, so that a group that continues there can read its streams' way to it.
    pub reported: Option<Reported>,
    /// The group's steps whose contributions reached every shard whole (each shard's record of
    /// the group's last whole step + 1, the least over the shards), kept across the group's
    /// restarts and in the shards' checkpoints; `None` when a shard that holds part of the vector
    /// has no record (nothing pushed yet, or it restarted from a checkpoint written before the
    /// record was kept).
    pub contributed: Option<u64>,
}

impl Kept {
    /// What the shards keep together, from each shard's latest report and each record of the
    /// shards that hold part of the vector (`None`: that shard has none).
    fn of_shards(reports: Vec<Reported>, contributed: &[Option<u64>]) -> Self {
        let contributed =
            contributed.iter().copied().collect::<Option<Vec<u64>>>().and_then(|v| v.into_iter().min());
        // A shard restarted from its checkpoint holds an older report than the others, and the
        // group continues at that checkpoint's steps: its report is the one to continue from.
        let furthest = |within: Option<u64>| {
            reports.iter().filter(|r| within.is_none_or(|c| r.step <= c)).max_by_key(|r| r.step).cloned()
        };
        let reported = furthest(contributed).or_else(|| furthest(None));
        Self { reported, contributed }
    }
}

impl PsClient {
    /// Connects to every shard (retrying until the connect timeout) and says hello.
    pub fn connect(config: ClientConfig) -> Result<Self, ClientError> {
        if config.servers.is_empty() {
            return Err(ClientError::NoServers);
        }
        let replicas = config.servers.len() as u32;
        let mut client = Self {
            ranges: shard::ranges(config.total_len, replicas),
            conns: (0..config.servers.len()).map(|_| None).collect(),
            config,
            mode: PsMode::Sync,
            joined: false,
            run_steps: 0,
        };
        for index in 0..client.conns.len() {
            client.open(index)?;
        }
        Ok(client)
    }

    /// Reconnects every shard whose connection broke, says hello again and rejoins if joined.
    pub fn reconnect(&mut self) -> Result<(), ClientError> {
        for index in 0..self.conns.len() {
            if self.conns[index].is_none() {
                self.open(index)?;
                if self.joined {
                    self.call_one(index, "join", Frame::Join)?;
                }
            }
        }
        Ok(())
    }

    /// Whether every shard connection is up.
    pub fn is_connected(&self) -> bool {
        self.conns.iter().all(Option::is_some)
    }

    /// Who this client is (its group, rank and attempt for a worker).
    pub fn peer(&self) -> Peer {
        self.config.peer
    }

    /// What the servers keep of `group`'s progress, from one status request to each shard.
    pub fn kept(&mut self, group: u32) -> Result<Kept, ClientError> {
        // Every shard's latest report, and the records of the shards that hold part of the vector.
        let mut reports = Vec::new();
        let mut contributed = Vec::new();
        for index in 0..self.conns.len() {
            let status = self.status(index)?;
            let entry = status["groups"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|g| g["group"].as_u64() == Some(u64::from(group)));
            let progress = entry.map(|g| &g["progress"]);
            if let Some(step) = progress.and_then(|p| p["step"].as_u64()) {
                let cursors = progress.and_then(|p| serde_json::from_value(p["cursors"].clone()).ok());
                reports.push(Reported { step, cursors: cursors.unwrap_or_default() });
            }
            if !self.ranges[index].is_empty() {
                contributed.push(entry.and_then(|g| g["contributed"].as_u64()));
            }
        }
        Ok(Kept::of_shards(reports, &contributed))
    }

    /// The furthest step `group` reported to any shard, with its ranks' data cursors after that
    /// step (see [`Kept::reported`]).
    pub fn reported(&mut self, group: u32) -> Result<Option<Reported>, ClientError> {
        Ok(self.kept(group)?.reported)
    }

    /// The servers' consistency mode.
    pub fn mode(&self) -> PsMode {
        self.mode
    }

    /// Steps of the run the servers' learning-rate schedule spans (0 while unknown): the job's
    /// length, set by its first worker, which a worker runs even where its own plan counts
    /// another (a group added by scaling an `epochs` job splits each epoch over more ranks).
    pub fn run_steps(&self) -> u64 {
        self.run_steps
    }

    /// Each shard's range of the vector.
    pub fn ranges(&self) -> &[Range<u64>] {
        &self.ranges
    }

    fn addr(&self, index: usize) -> String {
        self.config.servers.get(index).cloned().unwrap_or_default()
    }

    fn open(&mut self, index: usize) -> Result<(), ClientError> {
        let addr = self.addr(index);
        let started = Instant::now();
        let stream = loop {
            match TcpStream::connect(&addr) {
                Ok(s) => break s,
                Err(source) if started.elapsed() >= self.config.connect_timeout => {
                    return Err(ClientError::Connect { index, addr, waited: started.elapsed(), source });
                }
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        };
        let lost = |e: std::io::Error| ClientError::Lost {
            index,
            addr: addr.clone(),
            op: "hello",
            detail: e.to_string(),
        };
        stream.set_nodelay(true).map_err(lost)?;
        stream.set_read_timeout(Some(self.config.request_timeout)).map_err(lost)?;
        stream.set_write_timeout(Some(self.config.request_timeout)).map_err(lost)?;
        let writer = BufWriter::with_capacity(1 << 16, stream.try_clone().map_err(lost)?);
        self.conns[index] = Some(Conn { reader: BufReader::with_capacity(1 << 16, stream), writer });
        // The server opens with a challenge; the hello proves the token over it and our own
        // nonce, and the welcome proves it back (the token itself never crosses the wire).
        let challenge = match self.read_reply(index, "hello")? {
            Frame::Challenge { nonce } => nonce,
            other => return Err(ClientError::Unexpected { index, addr, op: "hello", got: other.name() }),
        };
        let nonce: [u8; wire::NONCE_LEN] = tandem_util::token::random_bytes().map_err(lost)?;
        let (peer, total_len, total_steps) =
            (self.config.peer, self.config.total_len, self.config.total_steps);
        let token = self.config.token.as_bytes();
        let proof = wire::hello_proof(token, &challenge, &nonce, peer, total_len, total_steps);
        let hello = Frame::Hello { proof, nonce, peer, total_len, total_steps };
        let reply = self.call_one(index, "hello", hello)?;
        let Frame::Welcome { shard, replicas, start, end, total_len, total_steps, mode, proof, .. } = reply
        else {
            return Err(ClientError::Unexpected { index, addr, op: "hello", got: reply.name() });
        };
        let token = self.config.token.as_bytes();
        let layout = [u64::from(shard), u64::from(replicas), start, end, total_len, total_steps];
        let want = wire::welcome_proof(token, &challenge, &nonce, layout);
        if !tandem_util::token::same_bytes(&proof, &want) {
            self.conns[index] = None;
            return Err(ClientError::Unproven { index, addr });
        }
        let layout = |detail: String| ClientError::Layout { index, addr: addr.clone(), detail };
        if shard as usize != index || replicas as usize != self.config.servers.len() {
            return Err(layout(format!(
                "it is shard {shard} of {replicas}, but this client lists it as shard {index} of {}; \
                 the job config's parameterServers list is out of date",
                self.config.servers.len()
            )));
        }
        if self.config.total_len == 0 && total_len > 0 {
            self.config.total_len = total_len;
            self.ranges = shard::ranges(total_len, replicas);
        }
        if total_len > 0 && self.ranges.get(index) != Some(&(start..end)) {
            return Err(layout(format!("it holds {start}..{end}, expected {:?}", self.ranges.get(index))));
        }
        if let Some(expected) = self.config.mode.filter(|&m| m != mode) {
            return Err(layout(format!(
                "it runs {mode} but this worker's algorithm needs {expected}; workers and servers must read \
                 the same job config"
            )));
        }
        self.mode = mode;
        if index == 0 {
            self.run_steps = total_steps;
        }
        Ok(())
    }

    /// Sends `frames` (shard, frame) pipelined, then reads one reply per frame, in order.
    fn exchange(
        &mut self,
        op: &'static str,
        frames: Vec<(usize, Frame)>,
    ) -> Result<Vec<(usize, Frame)>, ClientError> {
        let mut buf = Vec::new();
        for (index, frame) in &frames {
            buf.clear();
            wire::encode(frame, &mut buf);
            let addr = self.addr(*index);
            let Some(conn) = self.conns.get_mut(*index).and_then(Option::as_mut) else {
                return Err(ClientError::Lost { index: *index, addr, op, detail: "not connected".into() });
            };
            if let Err(e) = conn.writer.write_all(&buf) {
                self.conns[*index] = None;
                return Err(self.io_error(*index, op, e));
            }
        }
        let mut touched: Vec<usize> = frames.iter().map(|(i, _)| *i).collect();
        touched.dedup();
        for &index in &touched {
            if let Some(conn) = self.conns[index].as_mut()
                && let Err(e) = conn.writer.flush()
            {
                self.conns[index] = None;
                return Err(self.io_error(index, op, e));
            }
        }
        let mut replies = Vec::with_capacity(frames.len());
        for (index, _) in &frames {
            replies.push((*index, self.read_reply(*index, op)?));
        }
        Ok(replies)
    }

    /// Reads the next frame from server `index`; an error frame becomes [`ClientError::Refused`].
    fn read_reply(&mut self, index: usize, op: &'static str) -> Result<Frame, ClientError> {
        let max = self.config.max_frame;
        let addr = self.addr(index);
        let Some(conn) = self.conns.get_mut(index).and_then(Option::as_mut) else {
            return Err(ClientError::Lost { index, addr, op, detail: "not connected".into() });
        };
        match wire::read_frame(&mut conn.reader, max) {
            Ok(Frame::Error { code, message }) => {
                Err(ClientError::Refused { index, addr, op, code, message })
            }
            Ok(frame) => Ok(frame),
            Err(ReadError::Io(e)) => {
                self.conns[index] = None;
                Err(self.io_error(index, op, e))
            }
            Err(ReadError::Closed) => {
                self.conns[index] = None;
                let detail = "the server closed the connection".into();
                Err(ClientError::Lost { index, addr, op, detail })
            }
            Err(ReadError::Wire(e)) => {
                self.conns[index] = None;
                Err(ClientError::Lost { index, addr, op, detail: e.to_string() })
            }
        }
    }

    fn io_error(&self, index: usize, op: &'static str, e: std::io::Error) -> ClientError {
        let addr = self.addr(index);
        match e.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
                ClientError::Timeout { index, addr, op, after: self.config.request_timeout }
            }
            _ => ClientError::Lost { index, addr, op, detail: e.to_string() },
        }
    }

    fn call_one(&mut self, index: usize, op: &'static str, frame: Frame) -> Result<Frame, ClientError> {
        let mut replies = self.exchange(op, vec![(index, frame)])?;
        replies.pop().map(|(_, f)| f).ok_or_else(|| ClientError::Unexpected {
            index,
            addr: self.addr(index),
            op,
            got: "nothing",
        })
    }

    fn call_all(&mut self, op: &'static str, frame: Frame) -> Result<Vec<(usize, Frame)>, ClientError> {
        let frames = (0..self.conns.len()).map(|i| (i, frame.clone())).collect();
        self.exchange(op, frames)
    }

    /// Splits `offset..offset+len` into (shard, offset, len) pieces of at most one frame each.
    fn pieces(&self, offset: u64, len: u64) -> Result<Vec<(usize, u64, u64)>, ClientError> {
        let end = offset.saturating_add(len);
        let total = self.config.total_len;
        if end > total {
            return Err(ClientError::Range { offset, end, total });
        }
        let step = wire::max_values_per_frame(self.config.max_frame) as u64;
        let mut out = Vec::new();
        for (index, range) in self.ranges.iter().enumerate() {
            let part = shard::intersect(&(offset..end), range);
            let mut at = part.start;
            while at < part.end {
                let n = step.min(part.end - at);
                out.push((index, at, n));
                at += n;
            }
        }
        Ok(out)
    }

    fn expect_acks(
        op: &'static str,
        replies: Vec<(usize, Frame)>,
        addr: impl Fn(usize) -> String,
    ) -> Result<(), ClientError> {
        for (index, reply) in replies {
            if !matches!(reply, Frame::Ack { .. }) {
                return Err(ClientError::Unexpected { index, addr: addr(index), op, got: reply.name() });
            }
        }
        Ok(())
    }

    /// Offers initial weights for `offset..`; shards that already hold weights ignore them.
    pub fn init(&mut self, offset: u64, values: &[f32]) -> Result<(), ClientError> {
        let frames = self
            .pieces(offset, values.len() as u64)?
            .into_iter()
            .map(|(i, at, n)| {
                let a = (at - offset) as usize;
                (i, Frame::Init { offset: at, values: values[a..a + n as usize].to_vec() })
            })
            .collect();
        let replies = self.exchange("init", frames)?;
        let servers = self.config.servers.clone();
        Self::expect_acks("init", replies, |i| servers.get(i).cloned().unwrap_or_default())
    }

    /// Makes this client's group a member of every shard; returns each shard's clock for it.
    pub fn join(&mut self) -> Result<Vec<u64>, ClientError> {
        let replies = self.call_all("join", Frame::Join)?;
        self.joined = true;
        replies
            .into_iter()
            .map(|(index, f)| match f {
                Frame::Joined { clock, .. } => Ok(clock),
                other => Err(ClientError::Unexpected {
                    index,
                    addr: self.addr(index),
                    op: "join",
                    got: other.name(),
                }),
            })
            .collect()
    }

    /// Takes this client's group out of every shard's membership.
    pub fn leave(&mut self) -> Result<(), ClientError> {
        self.call_all("leave", Frame::Leave)?;
        self.joined = false;
        Ok(())
    }

    /// Pushes `values` for `offset..` (a gradient, or an elastic difference in EASGD mode), the
    /// contribution of the group's step `step` (from 0).
    pub fn push(&mut self, step: u64, offset: u64, values: &[f32]) -> Result<(), ClientError> {
        let started = std::time::Instant::now();
        let result = self.push_unmetered(step, offset, values);
        tandem_util::metrics::metrics().push.record(started.elapsed(), std::mem::size_of_val(values));
        result
    }

    fn push_unmetered(&mut self, step: u64, offset: u64, values: &[f32]) -> Result<(), ClientError> {
        let frames = self
            .pieces(offset, values.len() as u64)?
            .into_iter()
            .map(|(i, at, n)| {
                let a = (at - offset) as usize;
                (i, Frame::Push { offset: at, step, values: values[a..a + n as usize].to_vec() })
            })
            .collect();
        let replies = self.exchange("push", frames)?;
        let servers = self.config.servers.clone();
        Self::expect_acks("push", replies, |i| servers.get(i).cloned().unwrap_or_default())
    }

    /// Pulls the weights of `offset..offset+out.len()` into `out`; returns the lowest version
    /// among the shards read. Waits as long as the mode says the group must.
    pub fn pull(&mut self, offset: u64, out: &mut [f32]) -> Result<u64, ClientError> {
        let started = std::time::Instant::now();
        let result = self.pull_unmetered(offset, out);
        tandem_util::metrics::metrics().pull.record(started.elapsed(), std::mem::size_of_val(out));
        result
    }

    fn pull_unmetered(&mut self, offset: u64, out: &mut [f32]) -> Result<u64, ClientError> {
        let pieces = self.pieces(offset, out.len() as u64)?;
        let frames = pieces.iter().map(|&(i, at, n)| (i, Frame::Pull { offset: at, len: n })).collect();
        let replies = self.exchange("pull", frames)?;
        let mut min_version = u64::MAX;
        for ((index, reply), (_, at, n)) in replies.into_iter().zip(pieces) {
            match reply {
                Frame::Weights { version, offset: got, values } if got == at && values.len() as u64 == n => {
                    let a = (at - offset) as usize;
                    out[a..a + values.len()].copy_from_slice(&values);
                    min_version = min_version.min(version);
                }
                other => {
                    return Err(ClientError::Unexpected {
                        index,
                        addr: self.addr(index),
                        op: "pull",
                        got: other.name(),
                    });
                }
            }
        }
        Ok(if min_version == u64::MAX { 0 } else { min_version })
    }

    /// Reports the group's progress to every shard (read back by status).
    pub fn report(&mut self, progress: Progress) -> Result<(), ClientError> {
        let replies = self.call_all("report", Frame::Report(progress))?;
        let servers = self.config.servers.clone();
        Self::expect_acks("report", replies, |i| servers.get(i).cloned().unwrap_or_default())
    }

    /// Puts this group's non-trainable model state (rank 0, after a step) on shard 0, which
    /// holds the mean over the groups.
    pub fn put_state(&mut self, values: &[f32]) -> Result<(), ClientError> {
        let reply = self.call_one(0, "put-state", Frame::PutState { values: values.to_vec() })?;
        let servers = self.config.servers.clone();
        Self::expect_acks("put-state", vec![(0, reply)], |i| servers.get(i).cloned().unwrap_or_default())
    }

    /// The model state shard 0 holds: the groups' mean, or empty while no group has put one.
    pub fn get_state(&mut self) -> Result<Vec<f32>, ClientError> {
        match self.call_one(0, "get-state", Frame::GetState)? {
            Frame::ModelState { values } => Ok(values),
            other => Err(ClientError::Unexpected {
                index: 0,
                addr: self.addr(0),
                op: "get-state",
                got: other.name(),
            }),
        }
    }

    /// The job's epoch plan through `epoch` from shard 0: the groups that split each epoch's
    /// data, epoch 0 first (fixing the epochs no group asked for yet).
    pub fn epochs(&mut self, epoch: u64) -> Result<Vec<u32>, ClientError> {
        match self.call_one(0, "get-epochs", Frame::GetEpochs { epoch })? {
            Frame::Epochs { groups } if groups.len() as u64 == epoch.saturating_add(1) => Ok(groups),
            Frame::Epochs { groups } => Err(ClientError::Layout {
                index: 0,
                addr: self.addr(0),
                detail: format!("asked for the plan through epoch {epoch}, got {} epochs", groups.len()),
            }),
            other => Err(ClientError::Unexpected {
                index: 0,
                addr: self.addr(0),
                op: "get-epochs",
                got: other.name(),
            }),
        }
    }

    /// Shard `index`'s status as JSON (see `ps::server::state::ShardStatus`).
    pub fn status(&mut self, index: usize) -> Result<serde_json::Value, ClientError> {
        match self.call_one(index, "status", Frame::StatusRequest)? {
            Frame::Status(json) => serde_json::from_str(&json).map_err(|e| ClientError::Layout {
                index,
                addr: self.addr(index),
                detail: format!("status is not JSON: {e}"),
            }),
            other => Err(ClientError::Unexpected {
                index,
                addr: self.addr(index),
                op: "status",
                got: other.name(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tandem_api::DataCursor;

    fn report(step: u64) -> Reported {
        Reported { step, cursors: vec![DataCursor::at(1, step)] }
    }

    #[test]
    fn a_group_continues_from_the_report_of_the_shard_that_restarted_from_its_checkpoint() {
        // Shard 1 restarted from a checkpoint taken after step 20 was reported and step 23 was
        // applied; shard 0 ran on to report 40 and apply 47.
        let kept = Kept::of_shards(vec![report(40), report(20)], &[Some(47), Some(23)]);
        assert_eq!(kept, Kept { reported: Some(report(20)), contributed: Some(23) });
        // Without a restart, the furthest report, which every shard applied.
        let kept = Kept::of_shards(vec![report(40), report(40)], &[Some(47), Some(45)]);
        assert_eq!(kept, Kept { reported: Some(report(40)), contributed: Some(45) });
        // A shard without a record (a checkpoint from before it was kept): the furthest report.
        let kept = Kept::of_shards(vec![report(40), report(20)], &[Some(47), None]);
        assert_eq!(kept, Kept { reported: Some(report(40)), contributed: None });
        // No report at or before the applied steps: the furthest there is, not none.
        let kept = Kept::of_shards(vec![report(40)], &[Some(3)]);
        assert_eq!(kept.reported, Some(report(40)));
        assert_eq!(Kept::of_shards(Vec::new(), &[]), Kept::default());
    }
}
