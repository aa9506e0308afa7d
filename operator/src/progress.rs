//! Progress from the trainer: reads a running job's PS replica 0 over its HTTP status endpoint
//! (`GET http://<pod IP>:7072/status`, answered by `tandem ps`) for `status.progress`, proving the
//! job token with an HMAC over the request ([`tandem_api::contract::status_auth`]) instead of
//! sending it. A job without parameter servers, or whose workers run the user's own command,
//! reports through its first group's rank 0 instead, where `tandem progress` serves the same
//! document beside the training process; a group that ended between two polls left its last
//! progress in that sidecar's termination message ([`last_reported`]).
//!
//! Expected flow: for a Running job, the controller picks the pod ([`status_address`]), gets the
//! job token ([`Tokens::get`], cached per job UID), and [`fetch`]es the status with a timeout.
//! Any failure is the caller's to log at debug: the last progress stays in place.
//!
//! Guarantees: one connection per fetch, bounded in time ([`FETCH_TIMEOUT`]) and in the body
//! read ([`MAX_BODY`]); nothing but the PS pod's IP from the API server is dialled.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::Duration;

use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::Api;
use kube::{Client, ResourceExt};
use tandem_api::contract::{self, PsStatus, status_auth};
use tandem_api::{Progress, Role};

use crate::plan::PodPhase;
use crate::validate::ValidatedJob;
use tandem_api::names;

/// Default of how often the progress of a Running job is read (at most;
/// the resync may be shorter); `--progress-every` of the operator.
pub const POLL_EVERY: Duration = Duration::from_secs(10);
/// Time one fetch may take, connection included.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(3);
/// Largest status body read.
pub const MAX_BODY: usize = 1 << 20;

/// Why the status of a PS could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// No connection or no HTTP answer.
    #[error("cannot reach the status endpoint {addr}: {message}")]
    Unreachable {
        /// Address dialled.
        addr: SocketAddr,
        /// Cause.
        message: String,
    },
    /// The endpoint answered with an error code.
    #[error("the status endpoint {addr} answered {code}{hint}")]
    Refused {
        /// Address dialled.
        addr: SocketAddr,
        /// HTTP status code.
        code: u16,
        /// What it means.
        hint: &'static str,
    },
    /// The body is not a status document.
    #[error("the status endpoint {addr} sent a body that is not a status document: {message}")]
    Body {
        /// Address dialled.
        addr: SocketAddr,
        /// Cause.
        message: String,
    },
    /// The endpoint did not answer in time.
    #[error("the status endpoint {addr} did not answer within {FETCH_TIMEOUT:?}")]
    TimedOut {
        /// Address dialled.
        addr: SocketAddr,
    },
}

impl FetchError {
    /// Whether the endpoint refused the token (the cached token may be stale).
    pub fn is_unauthorized(&self) -> bool {
        matches!(self, FetchError::Refused { code: 401, .. })
    }
}

/// `GET /status` from `addr` with the job token, within [`FETCH_TIMEOUT`].
pub async fn fetch(addr: SocketAddr, token: &str) -> Result<PsStatus, FetchError> {
    let body = tokio::time::timeout(FETCH_TIMEOUT, exchange(addr, token, "GET", contract::STATUS_PATH))
        .await
        .unwrap_or(Err(FetchError::TimedOut { addr }))?;
    serde_json::from_slice::<PsStatus>(&body).map_err(|e| FetchError::Body { addr, message: e.to_string() })
}

/// `POST /groups?count=<groups>` to PS replica 0 at `addr` with the job token, within
/// [`FETCH_TIMEOUT`]: the job's group count, which shard 0 plans the next epochs with
/// ([`contract::GROUPS_PATH`]).
pub async fn post_groups(addr: SocketAddr, token: &str, groups: u32) -> Result<(), FetchError> {
    let target = contract::groups_target(groups);
    tokio::time::timeout(FETCH_TIMEOUT, exchange(addr, token, "POST", &target))
        .await
        .unwrap_or(Err(FetchError::TimedOut { addr }))
        .map(drop)
}

/// One signed request, `method target`, to `addr`; the body of a 2xx answer.
async fn exchange(addr: SocketAddr, token: &str, method: &str, target: &str) -> Result<Bytes, FetchError> {
    let unreachable = |message: String| FetchError::Unreachable { addr, message };
    let stream = tokio::net::TcpStream::connect(addr).await.map_err(|e| unreachable(e.to_string()))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| unreachable(e.to_string()))?;
    // The connection task ends with the connection (the server closes after one answer).
    let driver = tokio::spawn(connection);
    let request = hyper::Request::builder()
        .method(method)
        .uri(target)
        .header(hyper::header::HOST, addr.to_string())
        .header(hyper::header::AUTHORIZATION, authorization(token, method, target).map_err(unreachable)?)
        .body(Empty::<Bytes>::new())
        .map_err(|e| unreachable(e.to_string()))?;
    let result = async {
        let response = sender.send_request(request).await.map_err(|e| unreachable(e.to_string()))?;
        let code = response.status().as_u16();
        if !(200..300).contains(&code) {
            let hint = match code {
                401 => ": the job token was refused (the token Secret and the PS disagree)",
                404 => ": this PS does not serve this path (an older trainer image, or not replica 0?)",
                405 => ": this PS does not take this method (an older trainer image?)",
                _ => "",
            };
            return Err(FetchError::Refused { addr, code, hint });
        }
        Limited::new(response.into_body(), MAX_BODY)
            .collect()
            .await
            .map_err(|e| FetchError::Body { addr, message: e.to_string() })
            .map(|body| body.to_bytes())
    }
    .await;
    driver.abort();
    result
}

/// The `Authorization` value of `method target` now: a [`status_auth`] proof of `token`.
fn authorization(token: &str, method: &str, target: &str) -> Result<String, String> {
    use ring::rand::SecureRandom;
    let unix = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let mut nonce = [0u8; status_auth::NONCE_HEX_LEN / 2];
    ring::rand::SystemRandom::new()
        .fill(&mut nonce)
        .map_err(|_| "no random nonce from the system to sign the request".to_owned())?;
    Ok(signed(token, method, target, unix, &hex(&nonce)))
}

/// [`status_auth::header`] for `token`, `method target`, `unix` seconds and `nonce`.
fn signed(token: &str, method: &str, target: &str, unix: u64, nonce: &str) -> String {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, token.as_bytes());
    let mac = ring::hmac::sign(&key, &status_auth::message(method, target, unix, nonce));
    status_auth::header(unix, nonce, &hex(mac.as_ref()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The status endpoint that reports the job's progress, if its pod runs and has an IP: for a job
/// whose groups report ([`ValidatedJob::progress_from_groups`]), rank 0 of its lowest group that
/// runs (its `tandem progress` sidecar); else PS replica 0.
pub fn status_address(job: &ValidatedJob<'_>, pods: &[Pod]) -> Option<SocketAddr> {
    let running = |role: Role| {
        let name = names::pod(job.name, role);
        let pod = pods.iter().find(|p| p.name_any() == name && p.metadata.deletion_timestamp.is_none())?;
        if PodPhase::of(pod) != PodPhase::Running {
            return None;
        }
        let ip: IpAddr = pod.status.as_ref()?.pod_ip.as_deref()?.parse().ok()?;
        Some(SocketAddr::new(ip, contract::STATUS_PORT))
    };
    if job.progress_from_groups() {
        (0..job.spec.workers.groups).find_map(|group| running(Role::Worker { group, rank: 0 }))
    } else {
        running(Role::Ps { index: 0 })
    }
}

/// The furthest progress that the `tandem progress` sidecars of the job's rank-0 pods left in
/// their termination messages (JSON of [`Progress`]) when their group ended: the final step of a
/// group that finished, or stopped, since the last poll. `None` for a job that PS replica 0
/// reports.
pub fn last_reported(job: &ValidatedJob<'_>, pods: &[Pod]) -> Option<Progress> {
    if !job.progress_from_groups() {
        return None;
    }
    let ranks0: Vec<String> = (0..job.spec.workers.groups)
        .map(|group| names::pod(job.name, Role::Worker { group, rank: 0 }))
        .collect();
    pods.iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none() && ranks0.contains(&p.name_any()))
        .flat_map(|p| p.status.iter().flat_map(|s| s.init_container_statuses.iter().flatten()))
        .filter(|c| c.name == crate::builder::PROGRESS_SIDECAR)
        .filter_map(|c| c.state.as_ref()?.terminated.as_ref()?.message.as_deref())
        .filter_map(|message| serde_json::from_str::<Progress>(message).ok())
        .max_by_key(|p| p.step)
}

/// The further of two progress readings (by step; `a` when equal).
pub fn furthest(a: Option<Progress>, b: Option<Progress>) -> Option<Progress> {
    match (a, b) {
        (Some(a), Some(b)) => Some(if b.step > a.step { b } else { a }),
        (a, b) => a.or(b),
    }
}

/// Job tokens read from the jobs' `<job>-token` Secrets, by job UID (a recreated job has a new
/// UID and a new Secret).
#[derive(Debug, Default)]
pub struct Tokens {
    by_uid: Mutex<HashMap<String, String>>,
}

impl Tokens {
    /// The token of `job`: cached, or read from its Secret; `None` if the Secret or its key is
    /// missing.
    pub async fn get(&self, client: &Client, job: &ValidatedJob<'_>) -> Result<Option<String>, kube::Error> {
        if let Some(token) = self.by_uid.lock().ok().and_then(|m| m.get(job.uid).cloned()) {
            return Ok(Some(token));
        }
        let secret = Api::<Secret>::namespaced(client.clone(), job.namespace)
            .get_opt(&names::token_secret(job.name))
            .await?;
        let Some(token) = secret.as_ref().and_then(crate::secrets::token_of) else { return Ok(None) };
        self.remember(job.uid, &token);
        Ok(Some(token))
    }

    /// Remembers the token of the job with `uid` (the operator just created its Secret).
    pub fn remember(&self, uid: &str, token: &str) {
        if let Ok(mut m) = self.by_uid.lock() {
            m.insert(uid.to_owned(), token.to_owned());
        }
    }

    /// Keeps only the tokens of the jobs whose UID is in `live`.
    pub fn retain(&self, live: &std::collections::HashSet<String>) {
        if let Ok(mut m) = self.by_uid.lock() {
            m.retain(|uid, _| live.contains(uid));
        }
    }

    /// UIDs of the jobs whose token is cached.
    pub fn uids(&self) -> std::collections::HashSet<String> {
        self.by_uid.lock().map(|m| m.keys().cloned().collect()).unwrap_or_default()
    }

    /// Forgets the token of the job with `uid` (after it was refused, or when the job is gone).
    pub fn forget(&self, uid: &str) {
        if let Ok(mut m) = self.by_uid.lock() {
            m.remove(uid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_is_signed_as_tandem_ps_checks_it() {
        // The same vector the trainer's status endpoint checks (trainer/src/ps/server/http.rs).
        let header =
            signed("ps-test-token-7f3a", "GET", "/status", 1_700_000_000, "00112233445566778899aabbccddeeff");
        assert_eq!(
            header,
            "Tandem-HMAC ts=1700000000, nonce=00112233445566778899aabbccddeeff, \
             mac=7d8f647cdb62af56414e7fdf6317e46ea012a04fadc39ae3481e8908af0fa1e3"
        );
        assert!(!header.contains("ps-test-token"), "the token never crosses the wire");
    }
}
