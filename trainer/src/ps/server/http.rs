//! The parameter server's HTTP status endpoint: what the operator reads into a TrainingJob's
//! `status.progress`, and what a person or Prometheus reads while a job runs.
//!
//! Expected flow: `tandem ps` binds a [`StatusListener`] next to its shard
//! ([`tandem_api::contract::STATUS_PORT`]) and hands it to [`super::Server::run`], which
//! serves it beside the training protocol and answers each request from the shard's state.
//!
//! Routes (HTTP/1.1 on hyper, one request per connection, `Connection: close`):
//! - `GET /status` with an `Authorization: Tandem-HMAC …` header that proves the job token without
//!   sending it ([`tandem_api::contract::status_auth`]): 200 and a
//!   [`tandem_api::contract::PsStatus`] as JSON, plus the shard's `mode`, `ready`, `groups`,
//!   `refused` and `waitingPulls`;
//! - `GET /metrics` with the same proof: the same numbers in Prometheus text format;
//! - `POST /groups?count=<n>` with the same proof (over method `POST` and the target with its
//!   query), on shard 0 only: the job's group count, which the next epoch plan splits the data
//!   among ([`tandem_api::contract::GROUPS_PATH`]); 204 once the shard took it, 400 for a count
//!   that is not a whole number from 1 to [`MAX_GROUPS`], 404 from a server without an epoch
//!   plan;
//! - `GET /healthz`: 200 `ok`, without a token (a probe that learns nothing), or 503 with the
//!   reason once the shard task has failed;
//! - a missing, wrong, stale or replayed proof (or a bearer token, which this endpoint no longer
//!   takes): 401; another path: 404; another method: 405; a request that is not HTTP: 400; a head
//!   larger than [`MAX_HEAD`]: 431; a head not sent within [`READ_TIMEOUT`]: the connection is
//!   closed.
//!
//! Guarantees: the endpoint shares nothing with the training connections but a bounded query
//! queue to the shard's owner, so a malformed, slow or flooding client costs only its own
//! connection. Accepting never waits: connections still sending their head are bounded per
//! source and in all ([`super::gate`], [`MAX_CONNECTIONS`]; the oldest of the busiest source
//! makes room) until hyper has parsed their head, each must send its head within
//! [`READ_TIMEOUT`] and is closed after one answer,
//! so a probe of `/healthz` — one short head — is answered at once however many slow peers
//! hold connections. MACs are compared in constant time.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http_body_util::Full;
use hyper::StatusCode;
use hyper::body::{Bytes, Incoming};
use hyper::header::{self, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use serde::Serialize;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};

use super::gate::{Admission, Bounds};
use super::state::{GroupStatus, ShardStatus};
use tandem_api::PsMode;
use tandem_api::contract::{GROUPS_PATH, PsStatus, STATUS_PATH, status_auth};
use tandem_ps::wire::Progress;
use tandem_util::token::{hex, hmac, same_bytes};

/// Largest request head (request line and headers, with the blank line that ends them) taken, in
/// bytes: one byte more is answered 431. (Also hyper's smallest read buffer.)
pub const MAX_HEAD: usize = 8 * 1024;
/// Time a client has to send its whole request head (below the operator's 3 s fetch timeout).
pub const READ_TIMEOUT: Duration = Duration::from_secs(2);
/// Connections still sending their head, at most, in all.
pub const MAX_CONNECTIONS: usize = 64;
/// Connections still sending their head, at most, from one source address.
pub const MAX_CONNECTIONS_PER_SOURCE: usize = 32;
/// Time one connection may take in all, head, shard query and answer.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(15);
/// Nonces remembered against replays (each for [`status_auth::MAX_SKEW_SECONDS`] twice over).
const MAX_NONCES: usize = 4096;
/// Time the shard has to answer a status query before the request gets 503.
const QUERY_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether the server is healthy, as `/healthz` reports it. Cheap to clone (shared).
#[derive(Clone, Debug, Default)]
pub struct Health(Arc<Mutex<Option<String>>>);

impl Health {
    /// Marks the server failed for `why`; `/healthz` answers 503 with it from now on.
    pub fn fail(&self, why: String) {
        if let Ok(mut failure) = self.0.lock() {
            failure.get_or_insert(why);
        }
    }

    /// Why the server failed, if it did.
    pub fn failure(&self) -> Option<String> {
        self.0.lock().ok().and_then(|f| f.clone())
    }
}

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
    /// The job's epoch plan (shard 0): groups that split each epoch's data, epoch 0 first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub epochs: Vec<u32>,
}

/// What the endpoint serves: a JSON document for `/status` that is also readable as Prometheus
/// text for `/metrics`. The PS serves its [`StatusDocument`]; `tandem progress` a user group's.
pub trait Document: Serialize + Send + 'static {
    /// The document in Prometheus text format.
    fn metrics(&self) -> String;
}

impl Document for StatusDocument {
    fn metrics(&self) -> String {
        StatusDocument::metrics(self)
    }
}

impl StatusDocument {
    /// The document for `status`, with the job's throughput over all groups (samples per second).
    pub fn new(status: ShardStatus, samples_per_second: Option<f64>) -> Self {
        let progress = status.progress.map(|p| tandem_api::job::Progress {
            step: p.step,
            epoch: p.epoch,
            loss: p.loss.map(tandem_api::job::Progress::measured),
            accuracy: p.accuracy.map(tandem_api::job::Progress::measured),
            samples_per_second,
        });
        let summary = PsStatus {
            shard: status.shard,
            replicas: status.replicas,
            version: status.version,
            member_groups: status.groups.iter().filter(|g| g.member).count() as u32,
            progress,
            planned_groups: status.planned_groups,
        };
        Self {
            summary,
            mode: status.mode,
            ready: status.ready,
            groups: status.groups,
            refused: status.refused,
            waiting_pulls: status.waiting_pulls,
            epochs: status.epochs,
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
        // Per group: an input-bound group shows as a data-wait share near 1.
        let reports: Vec<(u32, &Progress)> =
            self.groups.iter().filter_map(|g| Some((g.group, g.progress.as_ref()?))).collect();
        let mut per_group = |name: &str, kind: &str, help: &str, value: &dyn Fn(&Progress) -> f64| {
            let _ = writeln!(out, "# HELP tandem_ps_{name} {help}\n# TYPE tandem_ps_{name} {kind}");
            for (group, p) in &reports {
                let _ =
                    writeln!(out, "tandem_ps_{name}{{shard=\"{}\",group=\"{group}\"}} {}", s.shard, value(p));
            }
        };
        per_group(
            "data_wait_ratio",
            "gauge",
            "Share of a group's time between its last two reports that its steps waited on data.",
            &|p| f64::from(p.data_wait),
        );
        per_group(
            "samples_skipped_total",
            "counter",
            "Samples a group's ranks skipped as unreadable since they started.",
            &|p| p.skipped as f64,
        );
        out
    }
}

/// How the endpoint asks the document's owner (the shard) for a document.
pub type Query<D = StatusDocument> = mpsc::Sender<oneshot::Sender<D>>;
/// How the endpoint hands a posted group count to shard 0, which answers once it took it.
pub type Orders = mpsc::Sender<(u32, oneshot::Sender<()>)>;
/// Largest group count `POST /groups` takes (the CRD's bound on the worker pods).
pub const MAX_GROUPS: u32 = 4096;

/// Serves `listener` until the task is dropped or aborted; `/healthz` reports `health`; a posted
/// group count goes to `orders` (`None`: `/groups` is not served).
pub async fn serve<D: Document>(
    listener: StatusListener,
    token: Arc<str>,
    query: Query<D>,
    orders: Option<Orders>,
    health: Health,
) {
    let admission = Admission::new(Bounds { per_source: MAX_CONNECTIONS_PER_SOURCE, total: MAX_CONNECTIONS });
    let cx = Arc::new(Endpoint { token, query, orders, health, seen: Mutex::new(Nonces::default()) });
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(READ_TIMEOUT)
        .max_header_size(MAX_HEAD)
        // One byte past the limit is read, so that a head just over it is read whole and its 431
        // is not cut by a reset.
        .max_buf_size(MAX_HEAD + 1)
        .keep_alive(false);
    loop {
        let (stream, peer) = match listener.listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::debug!(error = %e, "status endpoint: accept failed; retrying");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let ticket = admission.admit(peer.ip());
        let (cx, http) = (cx.clone(), http.clone());
        tokio::spawn(async move {
            // The ticket is held until hyper has parsed the head (the service is called then):
            // only connections still sending theirs count against the bounds.
            let evicted = ticket.eviction();
            let ticket = Mutex::new(Some(ticket));
            let service = service_fn(move |request: hyper::Request<Incoming>| {
                if let Ok(mut held) = ticket.lock() {
                    held.take();
                }
                let cx = cx.clone();
                async move { Ok::<_, Infallible>(answer(&request, &cx).await) }
            });
            let connection = http.serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                () = evicted => tracing::debug!(%peer, "status endpoint: a connection still sending its head made room"),
                served = tokio::time::timeout(CONNECTION_TIMEOUT, connection) => match served {
                    Ok(Err(e)) => tracing::debug!(error = %e, "status endpoint: connection failed"),
                    Err(_) => tracing::debug!("status endpoint: answer not taken in time"),
                    Ok(Ok(())) => {}
                },
            }
        });
    }
}

/// What every request of the endpoint shares.
struct Endpoint<D> {
    token: Arc<str>,
    query: Query<D>,
    orders: Option<Orders>,
    health: Health,
    seen: Mutex<Nonces>,
}

/// Nonces of accepted requests, with their timestamps, for [`status_auth::MAX_SKEW_SECONDS`]
/// either side of now.
#[derive(Default)]
struct Nonces {
    by_nonce: HashMap<String, u64>,
}

impl Nonces {
    /// Records `nonce` of a request at `timestamp`; `false` if it was seen (a replay) or no room
    /// is left.
    fn first_use(&mut self, nonce: &str, timestamp: u64, now: u64) -> bool {
        let window = status_auth::MAX_SKEW_SECONDS;
        if self.by_nonce.len() >= MAX_NONCES {
            self.by_nonce.retain(|_, ts| ts.abs_diff(now) <= window);
        }
        if self.by_nonce.len() >= MAX_NONCES || self.by_nonce.contains_key(nonce) {
            return false;
        }
        self.by_nonce.insert(nonce.to_owned(), timestamp);
        true
    }
}

/// Why a request's `Authorization` header does not prove the token, for the 401's body; `None`
/// when it does.
fn refuse_auth(request: &Request, token: &str, seen: &Mutex<Nonces>, now: u64) -> Option<String> {
    let Some(value) = request.authorization.as_deref() else {
        return Some(format!(
            "send `Authorization: {} ts=<unix seconds>, nonce=<32 hex digits>, mac=<hex HMAC-SHA256 of the job \
             token over \"tandem-status-v1\\n{}\\n{}\\n<ts>\\n<nonce>\">` (see tandem_api::contract::status_auth)\n",
            status_auth::SCHEME,
            request.method,
            request.path
        ));
    };
    if value.get(..7).is_some_and(|s| s.eq_ignore_ascii_case("bearer ")) {
        return Some(format!(
            "this endpoint no longer takes the job token as a bearer (it would cross the wire in clear); \
             prove it with `Authorization: {} …` (see tandem_api::contract::status_auth)\n",
            status_auth::SCHEME
        ));
    }
    let Some(c) = status_auth::parse(value) else {
        return Some(format!(
            "the Authorization header is not `{} ts=…, nonce=…, mac=…`\n",
            status_auth::SCHEME
        ));
    };
    if c.timestamp.abs_diff(now) > status_auth::MAX_SKEW_SECONDS {
        return Some(format!(
            "the request's timestamp {} is more than {} s from this server's clock ({now}); sign it now (and \
             keep the clocks in sync)\n",
            c.timestamp,
            status_auth::MAX_SKEW_SECONDS
        ));
    }
    let want = hmac(
        token.as_bytes(),
        &[&status_auth::message(&request.method, &request.path, c.timestamp, &c.nonce)],
    );
    if !same_bytes(hex(&want).as_bytes(), c.mac.as_bytes()) {
        return Some("the MAC does not match this job's token\n".to_owned());
    }
    let fresh = seen.lock().map(|mut s| s.first_use(&c.nonce, c.timestamp, now)).unwrap_or(false);
    if !fresh {
        return Some("this nonce was used already: sign every request with a fresh one\n".to_owned());
    }
    None
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// What a request's proof covers: its method, its target (path and query) and its
/// `Authorization` header.
#[derive(Debug, PartialEq, Eq)]
struct Request {
    method: String,
    path: String,
    authorization: Option<String>,
}

impl Request {
    fn of(request: &hyper::Request<Incoming>) -> Self {
        let target = request.uri().path_and_query().map_or_else(|| request.uri().path(), |p| p.as_str());
        Self {
            method: request.method().as_str().to_owned(),
            path: target.to_owned(),
            authorization: request
                .headers()
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .map(|v| v.trim().to_owned()),
        }
    }
}

type Answer = hyper::Response<Full<Bytes>>;

async fn answer<D: Document>(request: &hyper::Request<Incoming>, cx: &Endpoint<D>) -> Answer {
    let path = request.uri().path();
    let route = match path {
        "/healthz" => Route::Health,
        STATUS_PATH => Route::Status,
        "/metrics" => Route::Metrics,
        GROUPS_PATH => Route::Groups,
        _ => return respond(StatusCode::NOT_FOUND, "text/plain", "not found: try GET /status\n".to_owned()),
    };
    let method = if route == Route::Groups { "POST" } else { "GET" };
    if request.method().as_str() != method {
        let why = format!("only {method} is served on {path}\n");
        let mut answer = respond(StatusCode::METHOD_NOT_ALLOWED, "text/plain", why);
        answer.headers_mut().insert(header::ALLOW, HeaderValue::from_static(method));
        return answer;
    }
    if route == Route::Health {
        return match cx.health.failure() {
            None => respond(StatusCode::OK, "text/plain", "ok\n".to_owned()),
            Some(why) => respond(StatusCode::SERVICE_UNAVAILABLE, "text/plain", format!("{why}\n")),
        };
    }
    let request = Request::of(request);
    if let Some(why) = refuse_auth(&request, &cx.token, &cx.seen, unix_now()) {
        let mut answer = respond(StatusCode::UNAUTHORIZED, "text/plain", why);
        answer.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static(status_auth::SCHEME));
        return answer;
    }
    if route == Route::Groups {
        return post_groups(&request, cx.orders.as_ref()).await;
    }
    let (tx, rx) = oneshot::channel();
    let document = match cx.query.try_send(tx) {
        Ok(()) => tokio::time::timeout(QUERY_TIMEOUT, rx).await.ok().and_then(Result::ok),
        Err(_) => None,
    };
    let Some(document) = document else {
        return busy();
    };
    match route {
        Route::Metrics => {
            respond(StatusCode::OK, "text/plain; version=0.0.4; charset=utf-8", document.metrics())
        }
        _ => {
            let body = serde_json::to_string(&document).unwrap_or_else(|_| "{}".to_owned());
            respond(StatusCode::OK, "application/json", body)
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Route {
    Health,
    Status,
    Metrics,
    Groups,
}

/// `POST /groups?count=<n>`, its proof checked: hands the count to the shard and answers 204 once
/// it took it.
async fn post_groups(request: &Request, orders: Option<&Orders>) -> Answer {
    let Some(orders) = orders else {
        let why = "this server holds no epoch plan: post to PS replica 0\n".to_owned();
        return respond(StatusCode::NOT_FOUND, "text/plain", why);
    };
    let Some(count) = group_count(&request.path) else {
        let why = format!(
            "send the group count as {GROUPS_PATH}?count=<n>, n a whole number from 1 to {MAX_GROUPS}\n"
        );
        return respond(StatusCode::BAD_REQUEST, "text/plain", why);
    };
    let (tx, rx) = oneshot::channel();
    let taken = match orders.try_send((count, tx)) {
        Ok(()) => tokio::time::timeout(QUERY_TIMEOUT, rx).await.is_ok_and(|r| r.is_ok()),
        Err(_) => false,
    };
    if !taken {
        return busy();
    }
    respond(StatusCode::NO_CONTENT, "", String::new())
}

/// The `count` of a `/groups?count=<n>` target, if it is a whole number in `1..=MAX_GROUPS`.
fn group_count(target: &str) -> Option<u32> {
    let query = target.split_once('?')?.1;
    let value = query.split('&').find_map(|pair| pair.strip_prefix("count="))?;
    value.parse().ok().filter(|n| (1..=MAX_GROUPS).contains(n))
}

fn busy() -> Answer {
    respond(
        StatusCode::SERVICE_UNAVAILABLE,
        "text/plain",
        "the server is busy or stopping; retry\n".to_owned(),
    )
}

/// An answer that no cache keeps; a 204 has no body and says nothing of one.
fn respond(status: StatusCode, content_type: &str, body: String) -> Answer {
    let mut answer = hyper::Response::new(Full::new(Bytes::from(body)));
    *answer.status_mut() = status;
    let headers = answer.headers_mut();
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if status != StatusCode::NO_CONTENT
        && let Ok(value) = HeaderValue::from_str(content_type)
    {
        headers.insert(header::CONTENT_TYPE, value);
    }
    answer
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(path: &str, authorization: Option<String>) -> Request {
        Request { method: "GET".into(), path: path.into(), authorization }
    }

    #[test]
    fn a_proof_of_the_token_is_taken_once_and_a_bearer_never() {
        // The vector the operator's tests sign too (operator/src/progress.rs).
        let (token, nonce, ts) = ("ps-test-token-7f3a", "00112233445566778899aabbccddeeff", 1_700_000_000);
        let mac = "7d8f647cdb62af56414e7fdf6317e46ea012a04fadc39ae3481e8908af0fa1e3";
        let mac_here = hex(&hmac(token.as_bytes(), &[&status_auth::message("GET", "/status", ts, nonce)]));
        assert_eq!(mac_here, mac);
        let seen = Mutex::new(Nonces::default());
        let signed = request("/status", Some(status_auth::header(ts, nonce, mac)));
        assert_eq!(refuse_auth(&signed, token, &seen, ts + 10), None);
        let replay = refuse_auth(&signed, token, &seen, ts + 11).unwrap();
        assert!(replay.contains("used already"), "{replay}");
        let other_path =
            request("/metrics", Some(status_auth::header(ts, "ff112233445566778899aabbccddeeff", mac)));
        assert!(refuse_auth(&other_path, token, &seen, ts).unwrap().contains("does not match"));
        let stale =
            request("/status", Some(status_auth::header(ts, "aa112233445566778899aabbccddeeff", mac)));
        assert!(refuse_auth(&stale, token, &seen, ts + 301).unwrap().contains("more than 300 s"));
        let bearer = request("/status", Some(format!("Bearer {token}")));
        assert!(refuse_auth(&bearer, token, &seen, ts).unwrap().contains("no longer takes"));
        assert!(refuse_auth(&request("/status", None), token, &seen, ts).unwrap().contains("Tandem-HMAC"));
    }

    /// `status.progress` (and so `kubectl get tj`'s Accuracy column) carries the accuracy as
    /// measured, `0.944`, not the `f32`'s exact value `0.944000005722046`.
    #[test]
    fn the_status_document_carries_measured_values_as_they_print() {
        let status = ShardStatus {
            shard: 0,
            replicas: 1,
            mode: tandem_api::PsMode::Sync,
            version: 3,
            ready: true,
            total_len: 10,
            range: 0..10,
            groups: Vec::new(),
            progress: Some(Progress {
                step: 600,
                loss: Some(0.3162f32),
                accuracy: Some(0.944f32),
                ..Default::default()
            }),
            refused: 0,
            waiting_pulls: 0,
            epochs: Vec::new(),
            planned_groups: Some(1),
        };
        let json = serde_json::to_string(&StatusDocument::new(status, Some(1500.0))).unwrap();
        assert!(json.contains(r#""accuracy":0.944,"#) || json.contains(r#""accuracy":0.944}"#), "{json}");
        assert!(json.contains(r#""loss":0.3162,"#), "{json}");
        assert!(!json.contains("0.944000"), "{json}");
    }
}
