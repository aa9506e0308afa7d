//! The parameter server's HTTP status endpoint: what the operator reads into a TrainingJob's
//! `status.progress`, and what a person or Prometheus reads while a job runs.
//!
//! Expected flow: `tandem ps` binds a [`StatusListener`] next to its shard
//! ([`tandem_api::contract::STATUS_PORT`]) and hands it to [`super::Server::run`], which
//! serves it beside the training protocol and answers each request from the shard's state.
//!
//! Routes (HTTP/1.1, one request per connection, `Connection: close`):
//! - `GET /status` with `Authorization: Bearer <job token>`: 200 and a
//!   [`tandem_api::contract::PsStatus`] as JSON, plus the shard's `mode`, `ready`, `groups`,
//!   `refused` and `waitingPulls`;
//! - `GET /metrics` with the same token: the same numbers in Prometheus text format;
//! - `GET /healthz`: 200 `ok`, without a token (a probe that learns nothing);
//! - a missing or wrong token: 401; another path: 404; another method: 405; a request that is
//!   not HTTP: 400; a head larger than [`MAX_HEAD`]: 431.
//!
//! Guarantees: the endpoint shares nothing with the training connections but a bounded query
//! queue to the shard's owner, so a malformed, slow or flooding client costs only its own
//! connection: at most [`MAX_CONNECTIONS`] are served at once, each must send its head within
//! [`READ_TIMEOUT`] and is closed after one answer. Tokens are compared in constant time.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc, oneshot};

use super::state::{GroupStatus, ShardStatus};
use crate::util::token::same_bytes;
use tandem_api::PsMode;
use tandem_api::contract::{PsStatus, STATUS_PATH};

/// Largest request head (request line and headers) read, in bytes.
pub const MAX_HEAD: usize = 8 * 1024;
/// Time a client has to send its whole request head.
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Requests served at once; more wait in the accept queue.
pub const MAX_CONNECTIONS: usize = 32;
/// Time the shard has to answer a status query before the request gets 503.
const QUERY_TIMEOUT: Duration = Duration::from_secs(10);

/// A bound status endpoint, not yet serving.
pub struct StatusListener {
    listener: TcpListener,
}

impl StatusListener {
    /// Binds `addr` (`host:port`; port 0 picks a free one).
    pub async fn bind(addr: &str) -> std::io::Result<Self> {
        Ok(Self { listener: TcpListener::bind(addr).await? })
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }
}

/// The status document: the contract's [`PsStatus`] and the shard's details.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusDocument {
    /// What the operator reads.
    #[serde(flatten)]
    pub summary: PsStatus,
    /// Consistency mode.
    pub mode: PsMode,
    /// Whether the shard holds its initial weights.
    pub ready: bool,
    /// Groups seen, by index.
    pub groups: Vec<GroupStatus>,
    /// Frames refused since start.
    pub refused: u64,
    /// Pulls waiting for their mode's condition.
    pub waiting_pulls: usize,
}

impl StatusDocument {
    /// The document for `status`, with the job's throughput over all groups (samples per second).
    pub fn new(status: ShardStatus, samples_per_second: Option<f64>) -> Self {
        let progress = status.progress.map(|p| tandem_api::job::Progress {
            step: p.step,
            epoch: p.epoch,
            loss: p.loss.map(f64::from),
            accuracy: p.accuracy.map(f64::from),
            samples_per_second,
        });
        let summary = PsStatus {
            shard: status.shard,
            replicas: status.replicas,
            version: status.version,
            member_groups: status.groups.iter().filter(|g| g.member).count() as u32,
            progress,
        };
        Self {
            summary,
            mode: status.mode,
            ready: status.ready,
            groups: status.groups,
            refused: status.refused,
            waiting_pulls: status.waiting_pulls,
        }
    }

    /// The document in Prometheus text format.
    pub fn metrics(&self) -> String {
        use std::fmt::Write;
        let s = &self.summary;
        let mut out = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, value: Option<f64>| {
            let _ = writeln!(out, "# HELP tandem_ps_{name} {help}\n# TYPE tandem_ps_{name} {kind}");
            if let Some(v) = value {
                let _ = writeln!(out, "tandem_ps_{name}{{shard=\"{}\"}} {v}", s.shard);
            }
        };
        let progress = s.progress.as_ref();
        metric("version", "counter", "Updates the shard has applied.", Some(s.version as f64));
        metric(
            "member_groups",
            "gauge",
            "Worker groups currently members.",
            Some(f64::from(s.member_groups)),
        );
        metric(
            "ready",
            "gauge",
            "1 once the shard holds its initial weights.",
            Some(f64::from(u8::from(self.ready))),
        );
        metric("refused_frames_total", "counter", "Frames refused since start.", Some(self.refused as f64));
        metric(
            "waiting_pulls",
            "gauge",
            "Pulls waiting for their mode's condition.",
            Some(self.waiting_pulls as f64),
        );
        metric("step", "gauge", "Most advanced step a group reported.", progress.map(|p| p.step as f64));
        metric("loss", "gauge", "Training loss of that report.", progress.and_then(|p| p.loss));
        metric("accuracy", "gauge", "Test accuracy of that report.", progress.and_then(|p| p.accuracy));
        metric(
            "samples_per_second",
            "gauge",
            "Training throughput over all member groups.",
            progress.and_then(|p| p.samples_per_second),
        );
        out
    }
}

/// How the endpoint asks the shard's owner for a document.
pub type Query = mpsc::Sender<oneshot::Sender<StatusDocument>>;

/// Serves `listener` until the task is dropped or aborted.
pub async fn serve(listener: StatusListener, token: Arc<str>, query: Query) {
    let limit = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(permit) = limit.clone().acquire_owned().await else { return };
        let stream = match listener.listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                tracing::debug!(error = %e, "status endpoint: accept failed; retrying");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let (token, query) = (token.clone(), query.clone());
        tokio::spawn(async move {
            if let Err(e) = answer(stream, &token, &query).await {
                tracing::debug!(error = %e, "status endpoint: connection failed");
            }
            drop(permit);
        });
    }
}

/// A parsed request head: what routing needs.
#[derive(Debug, PartialEq, Eq)]
struct Request {
    method: String,
    path: String,
    authorization: Option<String>,
}

enum HeadError {
    TooLarge,
    Malformed,
    Closed,
}

async fn answer(mut stream: TcpStream, token: &str, query: &Query) -> std::io::Result<()> {
    let head = match tokio::time::timeout(READ_TIMEOUT, read_head(&mut stream)).await {
        Ok(Ok(head)) => head,
        Ok(Err(HeadError::TooLarge)) => {
            return respond(&mut stream, 431, "text/plain", "request head too large\n").await;
        }
        Ok(Err(HeadError::Malformed)) => {
            return respond(&mut stream, 400, "text/plain", "not an HTTP/1.x request\n").await;
        }
        Ok(Err(HeadError::Closed)) => return Ok(()),
        Err(_) => {
            return respond(&mut stream, 408, "text/plain", "request head not sent in time\n").await;
        }
    };
    let Some(request) = parse_head(&head) else {
        return respond(&mut stream, 400, "text/plain", "not an HTTP/1.x request\n").await;
    };
    let path = request.path.split('?').next().unwrap_or_default();
    let route = match path {
        "/healthz" => Route::Health,
        STATUS_PATH => Route::Status,
        "/metrics" => Route::Metrics,
        _ => return respond(&mut stream, 404, "text/plain", "not found: try GET /status\n").await,
    };
    if request.method != "GET" {
        return respond(&mut stream, 405, "text/plain", "only GET is served\n").await;
    }
    if route == Route::Health {
        return respond(&mut stream, 200, "text/plain", "ok\n").await;
    }
    let authorised = request
        .authorization
        .as_deref()
        .and_then(|a| a.strip_prefix("Bearer ").or_else(|| a.strip_prefix("bearer ")))
        .is_some_and(|t| same_bytes(t.trim().as_bytes(), token.as_bytes()));
    if !authorised {
        return respond(
            &mut stream,
            401,
            "text/plain",
            "send the job token as `Authorization: Bearer <token>`\n",
        )
        .await;
    }
    let (tx, rx) = oneshot::channel();
    let document = match query.try_send(tx) {
        Ok(()) => tokio::time::timeout(QUERY_TIMEOUT, rx).await.ok().and_then(Result::ok),
        Err(_) => None,
    };
    let Some(document) = document else {
        return respond(&mut stream, 503, "text/plain", "the shard is busy or stopping; retry\n").await;
    };
    match route {
        Route::Metrics => {
            respond(&mut stream, 200, "text/plain; version=0.0.4; charset=utf-8", &document.metrics()).await
        }
        _ => {
            let body = serde_json::to_string(&document).unwrap_or_else(|_| "{}".to_owned());
            respond(&mut stream, 200, "application/json", &body).await
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Route {
    Health,
    Status,
    Metrics,
}

/// Reads up to the blank line that ends the head; refuses heads over [`MAX_HEAD`].
async fn read_head(stream: &mut TcpStream) -> Result<Vec<u8>, HeadError> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        let n = stream.read(&mut chunk).await.map_err(|_| HeadError::Closed)?;
        if n == 0 {
            return if buf.is_empty() { Err(HeadError::Closed) } else { Err(HeadError::Malformed) };
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = find_end(&buf) {
            buf.truncate(end);
            return Ok(buf);
        }
        if buf.len() > MAX_HEAD {
            return Err(HeadError::TooLarge);
        }
        // Fail fast on bytes that cannot start an HTTP request line.
        if !buf.iter().take(16).all(|b| b.is_ascii_graphic() || *b == b' ' || *b == b'\r' || *b == b'\n') {
            return Err(HeadError::Malformed);
        }
    }
}

fn find_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").or_else(|| buf.windows(2).position(|w| w == b"\n\n"))
}

/// Parses the request line and the `Authorization` header; `None` if it is not HTTP/1.x.
fn parse_head(head: &[u8]) -> Option<Request> {
    let text = std::str::from_utf8(head).ok()?;
    let mut lines = text.split('\n').map(|l| l.strip_suffix('\r').unwrap_or(l));
    let mut parts = lines.next()?.split(' ');
    let (method, path, version) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some()
        || !version.starts_with("HTTP/1.")
        || method.is_empty()
        || !method.bytes().all(|b| b.is_ascii_uppercase())
        || !path.starts_with('/')
    {
        return None;
    }
    let mut authorization = None;
    for line in lines.filter(|l| !l.is_empty()) {
        let (name, value) = line.split_once(':')?;
        if name.eq_ignore_ascii_case("authorization") {
            authorization = Some(value.trim().to_owned());
        }
    }
    Some(Request { method: method.to_owned(), path: path.to_owned(), authorization })
}

async fn respond(stream: &mut TcpStream, code: u16, content_type: &str, body: &str) -> std::io::Result<()> {
    let reason = match code {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        431 => "Request Header Fields Too Large",
        _ => "Service Unavailable",
    };
    let mut extra = String::new();
    if code == 401 {
        extra.push_str("WWW-Authenticate: Bearer\r\n");
    }
    if code == 405 {
        extra.push_str("Allow: GET\r\n");
    }
    let head = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nCache-Control: no-store\r\nConnection: close\r\n{extra}\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_requests_and_refuses_what_is_not_http() {
        let r = parse_head(b"GET /status?x=1 HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer t0k\r\n").unwrap();
        assert_eq!(r.method, "GET");
        assert_eq!(r.path, "/status?x=1");
        assert_eq!(r.authorization.as_deref(), Some("Bearer t0k"));
        assert_eq!(parse_head(b"GET /status HTTP/1.0").unwrap().authorization, None);
        for bad in [
            &b"\x00\x01garbage"[..],
            b"GET status HTTP/1.1",
            b"GET / SPDY/3",
            b"get / HTTP/1.1",
            b"GET / HTTP/1.1 x",
        ] {
            assert_eq!(parse_head(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
        assert_eq!(parse_head(b"GET / HTTP/1.1\r\nno colon here"), None);
    }

    #[test]
    fn finds_the_end_of_the_head() {
        assert_eq!(find_end(b"GET / HTTP/1.1\r\n\r\nbody"), Some(14));
        assert_eq!(find_end(b"GET / HTTP/1.1\n\n"), Some(14));
        assert_eq!(find_end(b"GET / HTTP/1.1\r\n"), None);
    }
}
