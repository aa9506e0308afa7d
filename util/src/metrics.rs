//! Prometheus metrics of a tandem process (`tandem ps`, `tandem worker`, the `tandem progress`
//! sidecar): what a stock Prometheus scrapes from `GET /metrics` on the launch contract's
//! metrics port ([`tandem_api::contract::METRICS_PORT`]) without the job token. They are numbers
//! about the run — never weights, data, the job config or the token, which the status endpoint
//! keeps behind the token's proof.
//!
//! Families (prefix `tandem_`), each this process's own:
//! - `step_seconds` (histogram): wall time of one training step, compute and exchange;
//! - `samples_total`: samples this rank trained; `step`: the last step it finished;
//! - `data_wait_seconds_total`: time its steps waited on input (an input-bound rank's rate
//!   nears 1);
//! - `collective_seconds_total{op}`, `collective_bytes_total{op}`: time in the group's
//!   collectives and the bytes of the buffers passed to them (`op`: `allreduce`,
//!   `reduce_scatter`, `allgather`, `broadcast`, `barrier`);
//! - `ps_exchange_seconds_total{op}`, `ps_exchange_bytes_total{op}`: a worker's pushes and pulls
//!   to the parameter servers (`op`: `push`, `pull`);
//! - `restarts`: restarts of this process's group or PS so far (the contract's attempt).
//!
//! A worker's page holds them all ([`Metrics::encode`] with `worker`); a PS's page holds
//! `restarts` and its shard's `tandem_ps_*` families
//! (`StatusDocument::metrics` in the trainer's `ps::server::http`); a progress sidecar's its group's
//! `tandem_group_*` families.
//!
//! Recording is a few atomic operations, always on; serving starts only where the contract asks
//! for it ([`start`], [`serve`]). Guarantees of the endpoint: only `GET /metrics` answers 200
//! (another path 404, another method 405); at most [`MAX_CONNECTIONS`] connections are served at
//! once, a request's head must arrive within [`HEADER_TIMEOUT`] and a connection lives at most
//! [`CONNECTION_LIFETIME`], so a slow or flooding client costs only its own connection and never
//! a training step.

use std::convert::Infallible;
use std::future::Future;

use std::pin::Pin;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// Connections served at once; the next waits in the kernel's accept queue.
pub const MAX_CONNECTIONS: usize = 16;
/// Time a request's head may take to arrive.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest a connection is kept, whatever it does.
pub const CONNECTION_LIFETIME: Duration = Duration::from_secs(30);
/// Content type of the page: Prometheus's text format, which the PS's shard families use too.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Label of the per-operation families.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabel {
    op: &'static str,
}

type Seconds = Counter<f64, AtomicU64>;

/// Seconds and bytes of one operation.
#[derive(Clone, Debug, Default)]
pub struct Op {
    seconds: Seconds,
    bytes: Counter,
}

impl Op {
    /// Records one call that took `took` and moved `bytes`.
    pub fn record(&self, took: Duration, bytes: usize) {
        self.seconds.inc_by(took.as_secs_f64());
        self.bytes.inc_by(bytes as u64);
    }
}

/// The process's instruments; [`metrics`] returns the one set.
pub struct Metrics {
    /// Wall time of each training step.
    pub step_seconds: Histogram,
    /// Samples this rank trained.
    pub samples: Counter,
    /// The last step this rank finished.
    pub step: Gauge,
    /// Time the steps waited on input.
    pub data_wait_seconds: Seconds,
    /// The group's collectives.
    pub allreduce: Op,
    /// See [`Metrics::allreduce`].
    pub reduce_scatter: Op,
    /// See [`Metrics::allreduce`].
    pub allgather: Op,
    /// See [`Metrics::allreduce`].
    pub broadcast: Op,
    /// See [`Metrics::allreduce`].
    pub barrier: Op,
    /// Pushes to the parameter servers.
    pub push: Op,
    /// Pulls from the parameter servers.
    pub pull: Op,
    /// Restarts of this process's group or PS so far.
    pub restarts: Gauge,
    /// What a worker records.
    worker: Registry,
    /// What every process has.
    process: Registry,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

/// The process's metrics.
pub fn metrics() -> &'static Metrics {
    static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);
    &METRICS
}

impl Metrics {
    fn new() -> Self {
        let mut registry = Registry::with_prefix("tandem");
        let mut process = Registry::with_prefix("tandem");
        let step_seconds = Histogram::new(exponential_buckets(0.001, 2.0, 16));
        registry.register_with_unit(
            "step",
            "Wall time of one training step of this rank, compute and exchange",
            Unit::Seconds,
            step_seconds.clone(),
        );
        let samples = Counter::default();
        registry.register("samples", "Samples this rank trained", samples.clone());
        let step = Gauge::default();
        registry.register("step", "The last step this rank finished", step.clone());
        let data_wait_seconds = Seconds::default();
        registry.register_with_unit(
            "data_wait",
            "Time this rank's steps waited on input",
            Unit::Seconds,
            data_wait_seconds.clone(),
        );
        let collective_seconds = Family::<OpLabel, Seconds>::default();
        registry.register_with_unit(
            "collective",
            "Time in the group's collectives, by operation",
            Unit::Seconds,
            collective_seconds.clone(),
        );
        let collective_bytes = Family::<OpLabel, Counter>::default();
        registry.register_with_unit(
            "collective",
            "Bytes of the buffers passed to the group's collectives, by operation",
            Unit::Bytes,
            collective_bytes.clone(),
        );
        let exchange_seconds = Family::<OpLabel, Seconds>::default();
        registry.register_with_unit(
            "ps_exchange",
            "Time in pushes to and pulls from the parameter servers",
            Unit::Seconds,
            exchange_seconds.clone(),
        );
        let exchange_bytes = Family::<OpLabel, Counter>::default();
        registry.register_with_unit(
            "ps_exchange",
            "Bytes of the values pushed to and pulled from the parameter servers",
            Unit::Bytes,
            exchange_bytes.clone(),
        );
        let restarts = Gauge::default();
        process.register("restarts", "Restarts of this process's group or PS so far", restarts.clone());
        let of = |seconds: &Family<OpLabel, Seconds>, bytes: &Family<OpLabel, Counter>, op| Op {
            seconds: seconds.get_or_create(&OpLabel { op }).clone(),
            bytes: bytes.get_or_create(&OpLabel { op }).clone(),
        };
        let collective = |op| of(&collective_seconds, &collective_bytes, op);
        let exchange = |op| of(&exchange_seconds, &exchange_bytes, op);
        Self {
            step_seconds,
            samples,
            step,
            data_wait_seconds,
            allreduce: collective("allreduce"),
            reduce_scatter: collective("reduce_scatter"),
            allgather: collective("allgather"),
            broadcast: collective("broadcast"),
            barrier: collective("barrier"),
            push: exchange("push"),
            pull: exchange("pull"),
            restarts,
            worker: registry,
            process,
        }
    }

    /// Records one training step of `samples` that took `took`, ending at `step`.
    pub fn record_step(&self, step: u64, took: Duration, samples: u64) {
        self.step_seconds.observe(took.as_secs_f64());
        self.samples.inc_by(samples);
        self.step.set(i64::try_from(step).unwrap_or(i64::MAX));
    }

    /// The process's families in Prometheus's text format, a worker's among them with `worker`.
    pub fn encode(&self, worker: bool) -> String {
        let mut out = String::new();
        for registry in [Some(&self.process), worker.then_some(&self.worker)].into_iter().flatten() {
            let mut part = String::new();
            if prometheus_client::encoding::text::encode(&mut part, registry).is_err() {
                continue;
            }
            // The OpenMetrics end marker: more families follow on the page.
            out.push_str(part.strip_suffix("# EOF\n").unwrap_or(&part));
        }
        out
    }
}

/// What `/metrics` answers, produced at each scrape.
pub type Page = Arc<dyn Fn() -> Pin<Box<dyn Future<Output = String> + Send>> + Send + Sync>;

/// A worker's page: every family of [`Metrics`].
pub fn worker_page() -> Page {
    Arc::new(|| Box::pin(async { metrics().encode(true) }))
}

fn respond(status: StatusCode, content_type: &str, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    if let Ok(value) = content_type.parse() {
        response.headers_mut().insert(hyper::header::CONTENT_TYPE, value);
    }
    response
}

async fn route(method: &Method, path: &str, page: &Page) -> Response<Full<Bytes>> {
    if path != "/metrics" {
        return respond(StatusCode::NOT_FOUND, "text/plain", "not found: try GET /metrics\n".to_owned());
    }
    if method != Method::GET && method != Method::HEAD {
        let mut response = respond(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "only GET is served on /metrics\n".to_owned(),
        );
        response
            .headers_mut()
            .insert(hyper::header::ALLOW, hyper::header::HeaderValue::from_static("GET, HEAD"));
        return response;
    }
    respond(StatusCode::OK, CONTENT_TYPE, page().await)
}

/// Serves `GET /metrics` on `listener`, answering with `page`, until the task is dropped.
pub async fn serve(listener: TcpListener, page: Page) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        // A slot first: while every slot is held, new connections wait in the kernel's backlog.
        let Ok(slot) = slots.clone().acquire_owned().await else { return };
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::debug!(error = %e, "metrics endpoint: accept failed; retrying");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let page = page.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let service = service_fn(move |req: Request<Incoming>| {
                let page = page.clone();
                async move { Ok::<_, Infallible>(route(req.method(), req.uri().path(), &page).await) }
            });
            let connection = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service);
            match tokio::time::timeout(CONNECTION_LIFETIME, connection).await {
                Ok(Err(e)) => tracing::debug!(error = %e, "metrics connection ended with an error"),
                Err(_) => tracing::debug!(%peer, "metrics connection closed: lifetime over"),
                Ok(Ok(())) => {}
            }
        });
    }
}

/// Binds `0.0.0.0:port` (every address of the pod, so `kubectl port-forward` reaches it too;
/// `0` any free port), non-blocking, for [`serve`] or [`start`].
pub fn bind(port: u16) -> std::io::Result<std::net::TcpListener> {
    let listener = std::net::TcpListener::bind(("0.0.0.0", port))?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// Serves [`serve`] on `listener` on a thread of its own, for a process without an async
/// runtime (`tandem worker`), answering with `page`.
pub fn start(listener: std::net::TcpListener, page: Page) -> std::io::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    std::thread::Builder::new().name("metrics".to_owned()).spawn(move || {
        runtime.block_on(async move {
            match TcpListener::from_std(listener) {
                Ok(listener) => serve(listener, page).await,
                Err(e) => tracing::warn!(error = %e, "cannot serve metrics; training goes on without them"),
            }
        });
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn get(addr: SocketAddr, request: &str) -> String {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        response
    }

    #[tokio::test]
    async fn metrics_are_served_without_a_token_and_a_ps_page_adds_its_shard_to_the_process() {
        metrics().allreduce.record(Duration::from_millis(5), 4096);
        metrics().record_step(7, Duration::from_millis(20), 64);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(serve(listener, worker_page()));
        let page = get(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await;
        assert!(page.starts_with("HTTP/1.1 200"), "{page}");
        assert!(page.contains("content-type: text/plain; version=0.0.4"), "{page}");
        // The collectives' bytes only grow, whatever else this process's tests recorded.
        let bytes = page
            .lines()
            .find_map(|l| l.strip_prefix("tandem_collective_bytes_total{op=\"allreduce\"} "))
            .and_then(|v| v.parse::<u64>().ok());
        assert!(bytes.is_some_and(|b| b >= 4096), "{page}");
        assert!(page.contains("# TYPE tandem_step_seconds histogram"), "{page}");
        assert!(page.contains("tandem_samples_total "), "{page}");
        assert!(page.contains("tandem_restarts "), "{page}");
        assert!(!page.contains("# EOF"), "the OpenMetrics end marker is not in the middle: {page}");

        let other = get(addr, "GET /status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await;
        assert!(other.starts_with("HTTP/1.1 404") && other.contains("try GET /metrics"), "{other}");
        let post =
            get(addr, "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                .await;
        assert!(post.starts_with("HTTP/1.1 405") && post.contains("allow: GET, HEAD"), "{post}");
        server.abort();

        // A PS: the process's families, then the shard's; no worker family.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let ps: Page =
            Arc::new(|| Box::pin(async { metrics().encode(false) + "tandem_ps_version{shard=\"0\"} 3\n" }));
        let server = tokio::spawn(serve(listener, ps));
        let page = get(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await;
        assert!(page.contains("tandem_restarts "), "{page}");
        assert!(!page.contains("tandem_step_seconds") && !page.contains("# EOF"), "{page}");
        assert!(page.trim_end().ends_with("tandem_ps_version{shard=\"0\"} 3"), "{page}");
        server.abort();
    }

    #[test]
    fn a_worker_serves_on_a_thread_of_its_own() {
        let listener = bind(0).unwrap();
        let port = listener.local_addr().unwrap().port();
        start(listener, worker_page()).unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let local = SocketAddr::from(([127, 0, 0, 1], port));
        let page =
            runtime.block_on(get(local, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
        assert!(page.starts_with("HTTP/1.1 200") && page.contains("tandem_restarts "), "{page}");
    }
}
