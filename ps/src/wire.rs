//! The parameter-server wire protocol: explicit, versioned, length-prefixed binary frames.
//!
//! Layout of every frame (all integers little-endian except where noted):
//!
//! ```text
//! u32 body length (big-endian, bytes after this 8-byte header) | b"TP" | u8 version | u8 kind | body
//! ```
//!
//! Strings are `u32 length + UTF-8`; float vectors are `u64 count + count × f32`, group-count
//! vectors `u64 count + count × u32`. Requests have kinds `0x01..=0x0B`, replies `0x80..=0x88`
//! (`0x80`, the challenge, opens every connection), errors `0xEE`.
//!
//! Authentication, as the collectives' handshake (`tandem_comm::auth`): the server opens every
//! connection with a [`Frame::Challenge`] (a fresh nonce); the client's [`Frame::Hello`] carries its
//! own nonce and [`hello_proof`], an HMAC of the job token over both nonces and the hello's fields;
//! the server's [`Frame::Welcome`] carries [`welcome_proof`], an HMAC under a distinct label over
//! both nonces and the layout it announces, which the client checks. So the token never crosses
//! the wire, neither proof can be replayed on another connection, and a client never trains
//! against a server that does not hold the job's token. Before the hello a server reads at most
//! [`MAX_HELLO_FRAME`] bytes of one frame and answers anything but a valid hello with one error and
//! a close.
//!
//! Guarantees: [`decode_body`] never panics and never allocates more than the body it is given;
//! a header announcing more than the receiver's maximum frame size is refused before any body is
//! read ([`WireError::TooLarge`]). A peer of another protocol version is refused with
//! [`WireError::Version`], which names both versions. Errors say whether the byte stream can still be followed
//! ([`WireError::is_fatal`]): after a bad magic, version or size the receiver cannot find the next
//! frame and must close; after an unknown kind or a malformed body it has consumed exactly one
//! frame and may answer and go on.

use std::io::{self, Read, Write};

use serde::Serialize;

use tandem_api::PsMode;

use tandem_api::DataCursor;

/// First two bytes after the length: "TP", Tandem parameter server.
pub const MAGIC: [u8; 2] = *b"TP";
/// Protocol version this build speaks. Version 2: the hello carries the run's step count, pushes
/// carry no kind (the mode both sides agreed on at hello decides), and the elastic mode its α and
/// τ. Version 3: the server opens with a challenge and the hello proves the job token with an
/// HMAC of it instead of carrying the token. Version 4: mutual proof (the hello carries the
/// client's nonce, the welcome the server's proof), one frame of at most [`MAX_HELLO_FRAME`]
/// bytes before the hello, and the [`ErrorCode::Busy`] refusal. Version 5: a report carries the
/// group's share of time waiting on data and its skipped samples. Version 6: and its ranks' data
/// cursors. Version 7: the welcome carries the run's step count. Version 8: a push carries the step
/// it belongs to. Version 9: shard 0 holds the job's epoch plan (`get-epochs`, `epochs`). Version
/// 10: the error codes [`ErrorCode::OutOfBounds`] and [`ErrorCode::NonFinite`], with which a server
/// refuses (and closes) an authenticated peer's frame whose field lies outside what the job allows,
/// or whose values are not all finite.
pub const PROTOCOL_VERSION: u8 = 10;

/// Most epochs an epoch plan may hold ([`Frame::GetEpochs`]): a request beyond it is refused,
/// not allocated.
pub const MAX_EPOCHS: u64 = 1 << 20;

/// Largest frame body a server reads before the hello has proven the token (a hello is 77 bytes).
pub const MAX_HELLO_FRAME: usize = 128;
/// The kind byte of [`Frame::Hello`].
pub const HELLO_KIND: u8 = 0x01;

/// Length of the server's challenge nonce.
pub const NONCE_LEN: usize = 16;
/// Length of a hello's proof (HMAC-SHA256).
pub const PROOF_LEN: usize = tandem_util::token::MAC_LEN;

/// The proof a hello carries: `HMAC(token, "tandem-ps-v4/hello" ‖ challenge ‖ client nonce ‖ peer
/// ‖ total_len ‖ total_steps)`, binding the hello's fields to this connection's challenge, so the
/// token never crosses the wire and a proof cannot be replayed on another connection or with
/// other fields.
pub fn hello_proof(
    token: &[u8],
    challenge: &[u8; NONCE_LEN],
    client_nonce: &[u8; NONCE_LEN],
    peer: Peer,
    total_len: u64,
    total_steps: u64,
) -> [u8; PROOF_LEN] {
    let peer_bytes: Vec<u8> = match peer {
        Peer::Worker { group, rank, attempt } => {
            [&[0u8][..], &group.to_le_bytes(), &rank.to_le_bytes(), &attempt.to_le_bytes()].concat()
        }
        Peer::Observer => vec![1],
    };
    tandem_util::token::hmac(
        token,
        &[
            b"tandem-ps-v4/hello",
            challenge,
            client_nonce,
            &peer_bytes,
            &total_len.to_le_bytes(),
            &total_steps.to_le_bytes(),
        ],
    )
}

/// The server's proof in its welcome: `HMAC(token, "tandem-ps-v7/welcome" ‖ challenge ‖ client
/// nonce ‖ shard ‖ replicas ‖ start ‖ end ‖ total_len ‖ total_steps)`. Its label differs from the hello's, so a
/// server cannot be made to answer a client's proof for it.
pub fn welcome_proof(
    token: &[u8],
    challenge: &[u8; NONCE_LEN],
    client_nonce: &[u8; NONCE_LEN],
    layout: [u64; 6],
) -> [u8; PROOF_LEN] {
    let [shard, replicas, start, end, total_len, total_steps] = layout.map(u64::to_le_bytes);
    tandem_util::token::hmac(
        token,
        &[
            b"tandem-ps-v7/welcome",
            challenge,
            client_nonce,
            &shard,
            &replicas,
            &start,
            &end,
            &total_len,
            &total_steps,
        ],
    )
}
/// Bytes of the fixed header.
pub const HEADER_LEN: usize = 8;
/// Default largest body accepted: 16 MiB. Clients split larger pushes and pulls into pieces.
pub const DEFAULT_MAX_FRAME: usize = 16 << 20;
/// Body bytes of a push, init or weights frame besides the floats (kind, offset, step, count), with margin.
const VALUES_OVERHEAD: usize = 64;

/// The most floats one push, init or weights frame may carry under a body limit of `max_frame`.
pub fn max_values_per_frame(max_frame: usize) -> usize {
    (max_frame.saturating_sub(VALUES_OVERHEAD) / 4).max(1)
}

/// Who is on the other end of a connection, as declared in [`Frame::Hello`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Peer {
    /// Rank `rank` of worker group `group`, in the group's launch `attempt`.
    Worker {
        /// Group index.
        group: u32,
        /// Rank inside the group.
        rank: u32,
        /// Restart count of the group; a higher attempt replaces the group's earlier one.
        attempt: u32,
    },
    /// A reader of status and weights (the operator, a test, a person): never a group member.
    Observer,
}

/// Training progress a worker group reports; shown by the status frame.
#[derive(Clone, Debug, PartialEq, Serialize, Default)]
pub struct Progress {
    /// Steps the group has completed.
    pub step: u64,
    /// Latest training loss, if measured.
    pub loss: Option<f32>,
    /// Latest test accuracy, if measured.
    pub accuracy: Option<f32>,
    /// Samples the group has processed.
    pub samples: u64,
    /// Passes over the training set the group has completed.
    pub epoch: u32,
    /// Share of the time since the group's previous report that its steps waited on data (0–1):
    /// near 1 the job is input-bound.
    pub data_wait: f32,
    /// Samples the group's ranks skipped since they started (unreadable images, damaged shard
    /// members).
    pub skipped: u64,
    /// Each rank's data cursor after `step`, in rank order (where its stream continues: a rank
    /// that skipped unreadable samples is past `step × batch`), so that a restarted group goes on
    /// with the next unseen sample; empty when the group sent none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub cursors: Vec<DataCursor>,
}

/// Why the server refused a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ErrorCode {
    /// No hello yet, or a wrong job token.
    Unauthenticated,
    /// The bytes are not a frame of this protocol.
    Malformed,
    /// A frame kind this server does not know, or one only servers send.
    UnknownFrame,
    /// A valid frame at the wrong moment (push before join, a second push of the same range…).
    Protocol,
    /// A range outside this shard or the vector.
    BadRange,
    /// The client's model or mode does not match the server's.
    Mismatch,
    /// A frame larger than the server accepts.
    TooLarge,
    /// The server serves as many connections as it may; retry later.
    Busy,
    /// A field of the frame (a step, a group or rank index, a count) lies outside what the job
    /// allows; the message names the field, its value and the bound. The server closes the
    /// connection after it.
    OutOfBounds,
    /// The frame's values are not all finite (a NaN or an infinity, as from a diverged model);
    /// the message names the group, the step and the first such value. The server applied
    /// nothing of it and closes the connection after it.
    NonFinite,
}

impl ErrorCode {
    fn to_wire(self) -> u16 {
        match self {
            ErrorCode::Unauthenticated => 1,
            ErrorCode::Malformed => 2,
            ErrorCode::UnknownFrame => 3,
            ErrorCode::Protocol => 4,
            ErrorCode::BadRange => 5,
            ErrorCode::Mismatch => 6,
            ErrorCode::TooLarge => 7,
            ErrorCode::Busy => 8,
            ErrorCode::OutOfBounds => 9,
            ErrorCode::NonFinite => 10,
        }
    }

    fn from_wire(code: u16) -> Option<Self> {
        Some(match code {
            1 => ErrorCode::Unauthenticated,
            2 => ErrorCode::Malformed,
            3 => ErrorCode::UnknownFrame,
            4 => ErrorCode::Protocol,
            5 => ErrorCode::BadRange,
            6 => ErrorCode::Mismatch,
            7 => ErrorCode::TooLarge,
            8 => ErrorCode::Busy,
            9 => ErrorCode::OutOfBounds,
            10 => ErrorCode::NonFinite,
            _ => return None,
        })
    }
}

/// One message of the protocol, in either direction.
#[derive(Clone, Debug, PartialEq)]
pub enum Frame {
    /// First frame of every connection: the job token, who is calling, the length of the
    /// flat parameter vector the caller trains (0 for an observer that does not know it) and the
    /// run's step count, over which the servers' learning-rate schedule runs (0 for an observer).
    Hello {
        /// [`hello_proof`] of the job token over this connection's challenge and these fields.
        proof: [u8; PROOF_LEN],
        /// The client's fresh nonce, which the welcome's proof covers.
        nonce: [u8; NONCE_LEN],
        /// The caller.
        peer: Peer,
        /// Length of the whole flat parameter vector.
        total_len: u64,
        /// Steps of the whole run ([`tandem_api::JobPlan::total_steps`]).
        total_steps: u64,
    },
    /// Initial weights for `offset..offset+len` (global offsets); ignored once the shard holds weights.
    Init {
        /// Global offset of the first value.
        offset: u64,
        /// The weights.
        values: Vec<f32>,
    },
    /// The caller's group becomes a member: it is waited for (sync) and counted (staleness).
    Join,
    /// The caller's group stops being a member; its unfinished contribution is dropped.
    Leave,
    /// A contribution for `offset..offset+len` (global offsets): a gradient (sync and async modes)
    /// or an elastic difference (elastic mode).
    Push {
        /// Global offset of the first value.
        offset: u64,
        /// The group's step (from 0) the contribution belongs to: the shard keeps the group's last
        /// step whose contribution reached it whole, where a restarted group continues in the
        /// asynchronous modes.
        step: u64,
        /// The values.
        values: Vec<f32>,
    },
    /// Asks for the weights of `offset..offset+len`; answered when the mode allows the caller to read.
    Pull {
        /// Global offset.
        offset: u64,
        /// Number of values.
        len: u64,
    },
    /// Progress of the caller's group.
    Report(Progress),
    /// Asks for the shard's status.
    StatusRequest,
    /// The caller group's non-trainable model state (e.g. batch-norm running statistics), from
    /// its rank 0 after every step; shard 0 holds the mean over the groups (see
    /// `ps::server::state`).
    PutState {
        /// The whole state vector.
        values: Vec<f32>,
    },
    /// Asks shard 0 for the job's epoch plan through epoch `epoch`: how many groups split each
    /// epoch's data (fixed for an epoch when a group first asks for it; see `ps::server::state`).
    GetEpochs {
        /// The last epoch wanted.
        epoch: u64,
    },
    /// Asks shard 0 for the model state it holds.
    GetState,
    /// The server's first frame on every connection: the nonce the hello's proof covers.
    Challenge {
        /// Fresh random bytes, one per connection.
        nonce: [u8; NONCE_LEN],
    },
    /// Answer to hello: the shard's place and mode.
    Welcome {
        /// Shard index.
        shard: u32,
        /// Number of shards.
        replicas: u32,
        /// First global offset held.
        start: u64,
        /// One past the last global offset held.
        end: u64,
        /// Length of the whole vector (0 while unknown).
        total_len: u64,
        /// Steps of the run the shard's learning-rate schedule spans (0 while unknown): the first
        /// worker's, which every later worker runs (a group added by scaling an `epochs` job
        /// counts fewer steps in its own plan).
        total_steps: u64,
        /// Consistency mode.
        mode: PsMode,
        /// Updates applied so far.
        version: u64,
        /// [`welcome_proof`]: the server holds the job token too.
        proof: [u8; PROOF_LEN],
    },
    /// Answer to join.
    Joined {
        /// The group's clock on this shard (completed contributions, counted for staleness).
        clock: u64,
        /// Updates applied so far.
        version: u64,
    },
    /// Answer to leave.
    Left,
    /// Answer to init, push and report.
    Ack {
        /// Updates applied so far.
        version: u64,
        /// The caller group's clock (0 for observers).
        clock: u64,
    },
    /// Answer to pull.
    Weights {
        /// Updates applied to these weights.
        version: u64,
        /// Global offset of the first value.
        offset: u64,
        /// The weights.
        values: Vec<f32>,
    },
    /// Answer to get-state: the mean of the groups' latest model states (empty while none).
    ModelState {
        /// The whole state vector.
        values: Vec<f32>,
    },
    /// Answer to get-epochs: the groups that split each epoch's data, epoch 0 first, through
    /// the epoch asked for.
    Epochs {
        /// Group count per epoch.
        groups: Vec<u32>,
    },
    /// Answer to a status request: a JSON object (see `ps::server::state::ShardStatus`).
    Status(String),
    /// A refusal.
    Error {
        /// Category.
        code: ErrorCode,
        /// What was wrong and what to do.
        message: String,
    },
}

impl Frame {
    /// A short name for logs.
    pub fn name(&self) -> &'static str {
        match self {
            Frame::Hello { .. } => "hello",
            Frame::Challenge { .. } => "challenge",
            Frame::Init { .. } => "init",
            Frame::Join => "join",
            Frame::Leave => "leave",
            Frame::Push { .. } => "push",
            Frame::Pull { .. } => "pull",
            Frame::Report(_) => "report",
            Frame::StatusRequest => "status-request",
            Frame::PutState { .. } => "put-state",
            Frame::GetState => "get-state",
            Frame::GetEpochs { .. } => "get-epochs",
            Frame::Epochs { .. } => "epochs",
            Frame::ModelState { .. } => "model-state",
            Frame::Welcome { .. } => "welcome",
            Frame::Joined { .. } => "joined",
            Frame::Left => "left",
            Frame::Ack { .. } => "ack",
            Frame::Weights { .. } => "weights",
            Frame::Status(_) => "status",
            Frame::Error { .. } => "error",
        }
    }

    fn kind(&self) -> u8 {
        match self {
            Frame::Hello { .. } => 0x01,
            Frame::Challenge { .. } => 0x80,
            Frame::Init { .. } => 0x02,
            Frame::Join => 0x03,
            Frame::Leave => 0x04,
            Frame::Push { .. } => 0x05,
            Frame::Pull { .. } => 0x06,
            Frame::Report(_) => 0x07,
            Frame::StatusRequest => 0x08,
            Frame::PutState { .. } => 0x09,
            Frame::GetState => 0x0A,
            Frame::GetEpochs { .. } => 0x0B,
            Frame::Epochs { .. } => 0x88,
            Frame::ModelState { .. } => 0x87,
            Frame::Welcome { .. } => 0x81,
            Frame::Joined { .. } => 0x82,
            Frame::Left => 0x83,
            Frame::Ack { .. } => 0x84,
            Frame::Weights { .. } => 0x85,
            Frame::Status(_) => 0x86,
            Frame::Error { .. } => 0xEE,
        }
    }
}

/// Bytes that are not a valid frame.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WireError {
    /// The header does not start with the protocol's magic.
    #[error(
        "not a Tandem parameter-server frame (magic {found:02x?}, expected {MAGIC:02x?}); is a different program talking to this port?"
    )]
    BadMagic {
        /// Bytes found.
        found: [u8; 2],
    },
    /// The header names a protocol version this build does not speak.
    #[error(
        "protocol version {found} is not supported (this build speaks {PROTOCOL_VERSION}); run the same tandem image on servers and workers"
    )]
    Version {
        /// Version found.
        found: u8,
    },
    /// The announced body is larger than the receiver accepts.
    #[error("frame of {len} bytes exceeds the limit of {max} bytes; send smaller pieces")]
    TooLarge {
        /// Announced body length.
        len: usize,
        /// Limit.
        max: usize,
    },
    /// A frame kind this build does not know.
    #[error("unknown frame kind 0x{0:02x}")]
    UnknownKind(u8),
    /// The body does not decode as its kind says.
    #[error("malformed {kind} frame: {detail}")]
    Malformed {
        /// Frame kind name.
        kind: &'static str,
        /// What was wrong.
        detail: String,
    },
}

impl WireError {
    /// Whether the receiver lost its place in the byte stream and must close the connection.
    pub fn is_fatal(&self) -> bool {
        matches!(self, WireError::BadMagic { .. } | WireError::Version { .. } | WireError::TooLarge { .. })
    }

    /// The error code a server answers this with.
    pub fn code(&self) -> ErrorCode {
        match self {
            WireError::TooLarge { .. } => ErrorCode::TooLarge,
            WireError::UnknownKind(_) => ErrorCode::UnknownFrame,
            _ => ErrorCode::Malformed,
        }
    }
}

/// Appends `frame`, header included, to `out`.
pub fn encode(frame: &Frame, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&[0, 0, 0, 0]);
    out.extend_from_slice(&MAGIC);
    out.push(PROTOCOL_VERSION);
    out.push(frame.kind());
    let mut w = Writer(out);
    match frame {
        Frame::Hello { proof, nonce, peer, total_len, total_steps } => {
            w.bytes(proof);
            w.bytes(nonce);
            match peer {
                Peer::Worker { group, rank, attempt } => {
                    w.u8(0);
                    w.u32(*group);
                    w.u32(*rank);
                    w.u32(*attempt);
                }
                Peer::Observer => w.u8(1),
            }
            w.u64(*total_len);
            w.u64(*total_steps);
        }
        Frame::Init { offset, values } => {
            w.u64(*offset);
            w.floats(values);
        }
        Frame::Join | Frame::Leave | Frame::StatusRequest | Frame::Left | Frame::GetState => {}
        Frame::PutState { values } | Frame::ModelState { values } => w.floats(values),
        Frame::GetEpochs { epoch } => w.u64(*epoch),
        Frame::Epochs { groups } => {
            w.u64(groups.len() as u64);
            groups.iter().for_each(|&g| w.u32(g));
        }
        Frame::Push { offset, step, values } => {
            w.u64(*offset);
            w.u64(*step);
            w.floats(values);
        }
        Frame::Pull { offset, len } => {
            w.u64(*offset);
            w.u64(*len);
        }
        Frame::Report(p) => {
            w.u64(p.step);
            w.f32(p.loss.unwrap_or(f32::NAN));
            w.f32(p.accuracy.unwrap_or(f32::NAN));
            w.u64(p.samples);
            w.u32(p.epoch);
            w.f32(p.data_wait);
            w.u64(p.skipped);
            w.u32(u32::try_from(p.cursors.len()).unwrap_or(u32::MAX));
            for c in p.cursors.iter().take(u32::MAX as usize) {
                c.words().into_iter().for_each(|word| w.u64(word));
            }
        }
        Frame::Challenge { nonce } => w.bytes(nonce),
        Frame::Welcome { shard, replicas, start, end, total_len, total_steps, mode, version, proof } => {
            w.u32(*shard);
            w.u32(*replicas);
            w.u64(*start);
            w.u64(*end);
            w.u64(*total_len);
            w.u64(*total_steps);
            match mode {
                PsMode::Sync => w.u8(0),
                PsMode::Async { staleness } => {
                    w.u8(1);
                    w.u64(staleness.unwrap_or(u64::MAX));
                }
                PsMode::Elastic { alpha, tau } => {
                    w.u8(2);
                    w.f64(*alpha);
                    w.u64(*tau);
                }
            }
            w.u64(*version);
            w.bytes(proof);
        }
        Frame::Joined { clock, version } => {
            w.u64(*clock);
            w.u64(*version);
        }
        Frame::Ack { version, clock } => {
            w.u64(*version);
            w.u64(*clock);
        }
        Frame::Weights { version, offset, values } => {
            w.u64(*version);
            w.u64(*offset);
            w.floats(values);
        }
        Frame::Status(json) => w.string(json),
        Frame::Error { code, message } => {
            w.u16(code.to_wire());
            w.string(message);
        }
    }
    let body = (out.len() - start - HEADER_LEN) as u32;
    out[start..start + 4].copy_from_slice(&body.to_be_bytes());
}

/// Checks a header and returns the frame kind and the body length to read next.
pub fn parse_header(header: &[u8; HEADER_LEN], max_frame: usize) -> Result<(u8, usize), WireError> {
    let len = u32::from_be_bytes([header[0], header[1], header[2], header[3]]) as usize;
    let magic = [header[4], header[5]];
    if magic != MAGIC {
        return Err(WireError::BadMagic { found: magic });
    }
    if header[6] != PROTOCOL_VERSION {
        return Err(WireError::Version { found: header[6] });
    }
    if len > max_frame {
        return Err(WireError::TooLarge { len, max: max_frame });
    }
    Ok((header[7], len))
}

/// Decodes the body of a frame of kind `kind`; the whole body must be used.
pub fn decode_body(kind: u8, body: &[u8]) -> Result<Frame, WireError> {
    let name = kind_name(kind).ok_or(WireError::UnknownKind(kind))?;
    let mut r = Reader { buf: body, kind: name };
    let frame = match kind {
        0x01 => {
            let proof = r.array("proof")?;
            let nonce = r.array("nonce")?;
            let peer = match r.u8()? {
                0 => Peer::Worker { group: r.u32()?, rank: r.u32()?, attempt: r.u32()? },
                1 => Peer::Observer,
                other => return Err(r.bad(format!("unknown peer kind {other}"))),
            };
            Frame::Hello { proof, nonce, peer, total_len: r.u64()?, total_steps: r.u64()? }
        }
        0x02 => Frame::Init { offset: r.u64()?, values: r.floats()? },
        0x03 => Frame::Join,
        0x04 => Frame::Leave,
        0x05 => Frame::Push { offset: r.u64()?, step: r.u64()?, values: r.floats()? },
        0x06 => Frame::Pull { offset: r.u64()?, len: r.u64()? },
        0x07 => {
            let step = r.u64()?;
            let loss = r.f32()?;
            let accuracy = r.f32()?;
            let samples = r.u64()?;
            let epoch = r.u32()?;
            let (data_wait, skipped) = (r.f32()?, r.u64()?);
            let n = r.u32()?;
            let mut cursors = Vec::new();
            for _ in 0..n {
                cursors.push(DataCursor::of_words([r.u64()?, r.u64()?, r.u64()?]));
            }
            let some = |v: f32| if v.is_nan() { None } else { Some(v) };
            Frame::Report(Progress {
                step,
                loss: some(loss),
                accuracy: some(accuracy),
                samples,
                epoch,
                data_wait,
                skipped,
                cursors,
            })
        }
        0x08 => Frame::StatusRequest,
        0x09 => Frame::PutState { values: r.floats()? },
        0x0A => Frame::GetState,
        0x0B => Frame::GetEpochs { epoch: r.u64()? },
        0x88 => Frame::Epochs { groups: r.u32s()? },
        0x87 => Frame::ModelState { values: r.floats()? },
        0x80 => Frame::Challenge { nonce: r.array("nonce")? },
        0x81 => {
            let shard = r.u32()?;
            let replicas = r.u32()?;
            let start = r.u64()?;
            let end = r.u64()?;
            let total_len = r.u64()?;
            let total_steps = r.u64()?;
            let mode = match r.u8()? {
                0 => PsMode::Sync,
                1 => {
                    let s = r.u64()?;
                    PsMode::Async { staleness: (s != u64::MAX).then_some(s) }
                }
                2 => PsMode::Elastic { alpha: r.f64()?, tau: r.u64()? },
                other => return Err(r.bad(format!("unknown mode {other}"))),
            };
            let version = r.u64()?;
            let proof = r.array("proof")?;
            Frame::Welcome { shard, replicas, start, end, total_len, total_steps, mode, version, proof }
        }
        0x82 => Frame::Joined { clock: r.u64()?, version: r.u64()? },
        0x83 => Frame::Left,
        0x84 => Frame::Ack { version: r.u64()?, clock: r.u64()? },
        0x85 => Frame::Weights { version: r.u64()?, offset: r.u64()?, values: r.floats()? },
        0x86 => Frame::Status(r.string()?),
        0xEE => {
            let raw = r.u16()?;
            let code = ErrorCode::from_wire(raw).ok_or_else(|| r.bad(format!("unknown error code {raw}")))?;
            Frame::Error { code, message: r.string()? }
        }
        _ => return Err(WireError::UnknownKind(kind)),
    };
    if !r.buf.is_empty() {
        return Err(r.bad(format!("{} trailing bytes", r.buf.len())));
    }
    Ok(frame)
}

/// The name of frame kind `kind`, or `None` for a kind this build does not know.
pub fn kind_name(kind: u8) -> Option<&'static str> {
    Some(match kind {
        0x01 => "hello",
        0x02 => "init",
        0x03 => "join",
        0x04 => "leave",
        0x05 => "push",
        0x06 => "pull",
        0x07 => "report",
        0x08 => "status-request",
        0x09 => "put-state",
        0x0A => "get-state",
        0x0B => "get-epochs",
        0x88 => "epochs",
        0x80 => "challenge",
        0x81 => "welcome",
        0x82 => "joined",
        0x83 => "left",
        0x84 => "ack",
        0x85 => "weights",
        0x86 => "status",
        0x87 => "model-state",
        0xEE => "error",
        _ => return None,
    })
}

/// A frame could not be read from a blocking stream.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The peer closed the connection between frames.
    #[error("connection closed by the peer")]
    Closed,
    /// The socket failed (a read timeout shows up here as `WouldBlock` or `TimedOut`).
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The bytes are not a valid frame.
    #[error("{0}")]
    Wire(#[from] WireError),
}

/// Writes one frame to a blocking stream.
pub fn write_frame(w: &mut impl Write, frame: &Frame) -> io::Result<()> {
    let mut buf = Vec::new();
    encode(frame, &mut buf);
    w.write_all(&buf)?;
    w.flush()
}

/// Reads one frame from a blocking stream, refusing bodies over `max_frame` bytes.
pub fn read_frame(r: &mut impl Read, max_frame: usize) -> Result<Frame, ReadError> {
    let mut header = [0u8; HEADER_LEN];
    let mut got = 0;
    while got < HEADER_LEN {
        match r.read(&mut header[got..]) {
            Ok(0) if got == 0 => return Err(ReadError::Closed),
            Ok(0) => return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    let (kind, len) = parse_header(&header, max_frame)?;
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    Ok(decode_body(kind, &body)?)
}

struct Writer<'a>(&'a mut Vec<u8>);

impl Writer<'_> {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn f32(&mut self, v: f32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn bytes(&mut self, v: &[u8]) {
        self.0.extend_from_slice(v);
    }
    fn f64(&mut self, v: f64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn string(&mut self, s: &str) {
        self.u32(s.len() as u32);
        self.0.extend_from_slice(s.as_bytes());
    }
    fn floats(&mut self, values: &[f32]) {
        self.u64(values.len() as u64);
        self.0.reserve(values.len() * 4);
        for v in values {
            self.0.extend_from_slice(&v.to_le_bytes());
        }
    }
}

struct Reader<'a> {
    buf: &'a [u8],
    kind: &'static str,
}

impl Reader<'_> {
    fn bad(&self, detail: String) -> WireError {
        WireError::Malformed { kind: self.kind, detail }
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&[u8], WireError> {
        if self.buf.len() < n {
            return Err(self.bad(format!("truncated {what}: needs {n} bytes, {} left", self.buf.len())));
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], WireError> {
        let bytes = self.take(N, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.array::<1>("u8")?[0])
    }
    fn u16(&mut self) -> Result<u16, WireError> {
        Ok(u16::from_le_bytes(self.array("u16")?))
    }
    fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(self.array("u32")?))
    }
    fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_le_bytes(self.array("u64")?))
    }
    fn f32(&mut self) -> Result<f32, WireError> {
        Ok(f32::from_le_bytes(self.array("f32")?))
    }
    fn f64(&mut self) -> Result<f64, WireError> {
        Ok(f64::from_le_bytes(self.array("f64")?))
    }
    fn string(&mut self) -> Result<String, WireError> {
        let len = self.u32()? as usize;
        let bytes = self.take(len, "string")?;
        String::from_utf8(bytes.to_vec()).map_err(|_| self.bad("string is not UTF-8".to_owned()))
    }
    fn u32s(&mut self) -> Result<Vec<u32>, WireError> {
        Ok(self.words("counts")?.map(u32::from_le_bytes).collect())
    }
    fn floats(&mut self) -> Result<Vec<f32>, WireError> {
        Ok(self.words("floats")?.map(f32::from_le_bytes).collect())
    }
    /// A `u64` count and that many 4-byte little-endian values (`what` names them in errors).
    fn words(&mut self, what: &str) -> Result<impl Iterator<Item = [u8; 4]> + '_, WireError> {
        let count = self.u64()?;
        // Checked against the bytes present before allocating, so a lying count cannot exhaust memory.
        let bytes = usize::try_from(count)
            .ok()
            .and_then(|c| c.checked_mul(4))
            .filter(|&b| b <= self.buf.len())
            .ok_or_else(|| self.bad(format!("{count} {what} announced, {} bytes left", self.buf.len())))?;
        let raw = self.take(bytes, what)?;
        Ok(raw.chunks_exact(4).map(|c| [c[0], c[1], c[2], c[3]]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_frames() -> Vec<Frame> {
        vec![
            Frame::Hello {
                proof: [7; PROOF_LEN],
                nonce: [9; NONCE_LEN],
                peer: Peer::Worker { group: 3, rank: 1, attempt: 2 },
                total_len: 1234,
                total_steps: 625,
            },
            Frame::Hello {
                proof: [0; PROOF_LEN],
                nonce: [1; NONCE_LEN],
                peer: Peer::Observer,
                total_len: 0,
                total_steps: 0,
            },
            Frame::Challenge { nonce: [0xab; NONCE_LEN] },
            Frame::Init { offset: 7, values: vec![1.0, -2.5, 3.25] },
            Frame::Join,
            Frame::Leave,
            Frame::Push { offset: 9, step: 41, values: vec![0.5; 5] },
            Frame::Push { offset: 0, step: 0, values: vec![] },
            Frame::Pull { offset: 4, len: 100 },
            Frame::PutState { values: vec![0.5, -1.25] },
            Frame::GetState,
            Frame::ModelState { values: vec![3.0] },
            Frame::GetEpochs { epoch: 7 },
            Frame::Epochs { groups: vec![2, 2, 3] },
            Frame::Epochs { groups: vec![] },
            Frame::Report(Progress {
                step: 5,
                loss: Some(0.25),
                accuracy: None,
                samples: 640,
                epoch: 2,
                data_wait: 0.5,
                skipped: 3,
                cursors: vec![],
            }),
            Frame::Report(Progress {
                step: 70,
                samples: 2240,
                cursors: vec![DataCursor::at(1, 3), DataCursor { epoch: 1, batch: 3, sample: Some(0) }],
                ..Progress::default()
            }),
            Frame::StatusRequest,
            Frame::Welcome {
                shard: 1,
                replicas: 2,
                start: 5,
                end: 10,
                total_len: 10,
                total_steps: 1000,
                mode: PsMode::Async { staleness: Some(2) },
                version: 77,
                proof: [3; PROOF_LEN],
            },
            Frame::Welcome {
                shard: 0,
                replicas: 1,
                start: 0,
                end: 1,
                total_len: 1,
                total_steps: 0,
                mode: PsMode::Async { staleness: None },
                version: 0,
                proof: [4; PROOF_LEN],
            },
            Frame::Welcome {
                shard: 2,
                replicas: 3,
                start: 8,
                end: 12,
                total_len: 12,
                total_steps: 40,
                mode: PsMode::Elastic { alpha: 0.45, tau: 4 },
                version: 9,
                proof: [5; PROOF_LEN],
            },
            Frame::Joined { clock: 3, version: 4 },
            Frame::Left,
            Frame::Ack { version: 1, clock: 2 },
            Frame::Weights { version: 8, offset: 2, values: vec![f32::MAX, f32::MIN_POSITIVE] },
            Frame::Status("{\"step\":1}".into()),
            Frame::Error { code: ErrorCode::BadRange, message: "nope".into() },
            Frame::Error { code: ErrorCode::Busy, message: "full".into() },
            Frame::Error { code: ErrorCode::OutOfBounds, message: "step".into() },
            Frame::Error { code: ErrorCode::NonFinite, message: "NaN".into() },
        ]
    }

    #[test]
    fn every_frame_round_trips() {
        for frame in all_frames() {
            let mut buf = Vec::new();
            encode(&frame, &mut buf);
            let back = read_frame(&mut buf.as_slice(), DEFAULT_MAX_FRAME);
            assert_eq!(back.ok().as_ref(), Some(&frame), "{}", frame.name());
        }
    }

    #[test]
    fn truncated_or_padded_bodies_are_malformed_not_panics() {
        for frame in all_frames() {
            let mut buf = Vec::new();
            encode(&frame, &mut buf);
            let body = &buf[HEADER_LEN..];
            let kind = buf[7];
            for cut in 0..body.len() {
                let err = decode_body(kind, &body[..cut]);
                assert!(matches!(err, Err(WireError::Malformed { .. })), "{} cut at {cut}", frame.name());
            }
            let mut padded = body.to_vec();
            padded.push(0);
            assert!(matches!(decode_body(kind, &padded), Err(WireError::Malformed { .. })));
        }
    }

    #[test]
    fn bad_headers_are_fatal_and_unknown_kinds_are_not() {
        let mut header = [0u8, 0, 0, 4, b'T', b'P', PROTOCOL_VERSION, 0x03];
        assert_eq!(parse_header(&header, 100), Ok((0x03, 4)));
        assert!(
            matches!(parse_header(&header, 3), Err(e) if e.is_fatal() && e.code() == ErrorCode::TooLarge)
        );
        header[4] = b'G';
        assert!(matches!(parse_header(&header, 100), Err(e @ WireError::BadMagic { .. }) if e.is_fatal()));
        header[4] = b'T';
        header[6] = PROTOCOL_VERSION - 1;
        assert!(
            matches!(parse_header(&header, 100), Err(e @ WireError::Version { found }) if e.is_fatal() && found == PROTOCOL_VERSION - 1)
        );
        let unknown = decode_body(0x42, &[]);
        assert!(matches!(unknown, Err(ref e @ WireError::UnknownKind(0x42)) if !e.is_fatal()));
    }

    #[test]
    fn a_lying_float_count_is_refused_without_allocating_it() {
        let mut body = Vec::new();
        body.extend_from_slice(&0u64.to_le_bytes());
        body.extend_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(decode_body(0x02, &body), Err(WireError::Malformed { kind: "init", .. })));
    }

    #[test]
    fn a_hello_proof_depends_on_the_token_both_nonces_and_every_field() {
        let peer = Peer::Worker { group: 1, rank: 2, attempt: 3 };
        let (a, c) = ([1; NONCE_LEN], [6; NONCE_LEN]);
        let base = hello_proof(b"token", &a, &c, peer, 10, 20);
        assert_eq!(base, hello_proof(b"token", &a, &c, peer, 10, 20));
        for other in [
            hello_proof(b"tokem", &a, &c, peer, 10, 20),
            hello_proof(b"token", &[2; NONCE_LEN], &c, peer, 10, 20),
            hello_proof(b"token", &a, &[7; NONCE_LEN], peer, 10, 20),
            hello_proof(b"token", &a, &c, Peer::Observer, 10, 20),
            hello_proof(b"token", &a, &c, Peer::Worker { group: 1, rank: 2, attempt: 4 }, 10, 20),
            hello_proof(b"token", &a, &c, peer, 11, 20),
            hello_proof(b"token", &a, &c, peer, 10, 21),
        ] {
            assert_ne!(other, base);
        }
        // The welcome's proof is of another label: one cannot stand in for the other.
        let welcome = welcome_proof(b"token", &a, &c, [0, 1, 0, 10, 10, 20]);
        assert_ne!(welcome, base);
        assert_ne!(welcome, welcome_proof(b"token", &a, &c, [0, 1, 0, 9, 10, 20]));
        // The run's length is proven too: a server cannot be impersonated to shorten a run.
        assert_ne!(welcome, welcome_proof(b"token", &a, &c, [0, 1, 0, 10, 10, 21]));
    }

    #[test]
    fn a_hello_fits_the_pre_authentication_limit() {
        let mut buf = Vec::new();
        let peer = Peer::Worker { group: u32::MAX, rank: u32::MAX, attempt: u32::MAX };
        let hello =
            Frame::Hello { proof: [0; PROOF_LEN], nonce: [0; NONCE_LEN], peer, total_len: 1, total_steps: 1 };
        encode(&hello, &mut buf);
        assert!(buf.len() - HEADER_LEN <= MAX_HELLO_FRAME);
        assert_eq!(buf[7], HELLO_KIND);
    }

    #[test]
    fn chunk_size_leaves_room_for_the_header_fields() {
        let n = max_values_per_frame(1024);
        let mut buf = Vec::new();
        encode(&Frame::Push { offset: u64::MAX, step: 0, values: vec![0.0; n] }, &mut buf);
        assert!(buf.len() - HEADER_LEN <= 1024);
    }
}
