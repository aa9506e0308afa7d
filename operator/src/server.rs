//! The operator's HTTP endpoint: `/metrics` (Prometheus text), `/healthz` (the process serves)
//! and `/readyz` (the replica knows its role: it leads with a synced cache, or stands by).
//!
//! Guarantees: the server stops accepting when the shutdown signal fires and never blocks the
//! controller; unknown paths get 404. Slow or idle peers cannot hold it: a request's headers must
//! arrive within [`Limits::header_timeout`], a connection lives at most
//! [`Limits::connection_lifetime`], and at most [`Limits::connections`] are served at once (the
//! next waits in the kernel's accept queue), so memory stays bounded and a probe that arrives
//! while slow peers hold every slot is answered once the header timeout has cut them off.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::metrics::Metrics;

/// What the endpoints report.
#[derive(Clone, Debug, Default)]
pub struct Health {
    /// Set once the replica leads with a synced cache, or knows it stands by.
    pub ready: Arc<AtomicBool>,
}

/// Something that refreshes gauges just before a scrape.
pub type Refresh = Arc<dyn Fn() + Send + Sync>;

fn respond(status: StatusCode, content_type: &str, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    if let Ok(value) = content_type.parse() {
        response.headers_mut().insert(hyper::header::CONTENT_TYPE, value);
    }
    response
}

fn route(path: &str, metrics: &Metrics, health: &Health, refresh: &Refresh) -> Response<Full<Bytes>> {
    match path {
        "/metrics" => {
            refresh();
            respond(
                StatusCode::OK,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                metrics.encode(),
            )
        }
        "/healthz" => respond(StatusCode::OK, "text/plain", "ok\n".to_owned()),
        "/readyz" if health.ready.load(Ordering::Relaxed) => {
            respond(StatusCode::OK, "text/plain", "ok\n".to_owned())
        }
        "/readyz" => respond(StatusCode::SERVICE_UNAVAILABLE, "text/plain", "not ready\n".to_owned()),
        _ => respond(
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found: try /metrics, /healthz or /readyz\n".to_owned(),
        ),
    }
}

/// How much the server gives one peer.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Connections served at once; the next waits to be accepted until one ends.
    pub connections: usize,
    /// Time a request's headers may take to arrive (also an idle keep-alive connection's wait).
    pub header_timeout: Duration,
    /// Longest a connection is kept, whatever it does.
    pub connection_lifetime: Duration,
}

impl Default for Limits {
    /// Enough for Prometheus and the kubelet's probes many times over; the kubelet's probe
    /// timeout (1 s by default) is far above a served request's time.
    fn default() -> Self {
        Self {
            connections: 256,
            header_timeout: Duration::from_secs(5),
            connection_lifetime: Duration::from_secs(60),
        }
    }
}

/// Binds `addr`; the returned listener is served by [`serve`].
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// Serves until `shutdown` completes, with the default [`Limits`].
pub async fn serve(
    listener: TcpListener,
    metrics: Metrics,
    health: Health,
    refresh: Refresh,
    shutdown: impl std::future::Future<Output = ()>,
) {
    serve_with(listener, metrics, health, refresh, Limits::default(), shutdown).await;
}

/// Serves until `shutdown` completes, giving peers no more than `limits`.
pub async fn serve_with(
    listener: TcpListener,
    metrics: Metrics,
    health: Health,
    refresh: Refresh,
    limits: Limits,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let slots = Arc::new(Semaphore::new(limits.connections.max(1)));
    loop {
        // A slot first: while every slot is held, new connections wait in the kernel's backlog
        // (no memory here) until a peer is served or cut off by the header timeout.
        let slot = tokio::select! {
            () = &mut shutdown => return,
            slot = slots.clone().acquire_owned() => slot,
        };
        let Ok(slot) = slot else { return };
        let accepted = tokio::select! {
            () = &mut shutdown => return,
            accepted = listener.accept() => accepted,
        };
        let Ok((stream, peer)) = accepted else { continue };
        let (metrics, health, refresh) = (metrics.clone(), health.clone(), refresh.clone());
        tokio::spawn(async move {
            let _slot = slot;
            let service = service_fn(move |req: Request<Incoming>| {
                let response = route(req.uri().path(), &metrics, &health, &refresh);
                async move { Ok::<_, Infallible>(response) }
            });
            let connection = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                .serve_connection(TokioIo::new(stream), service);
            match tokio::time::timeout(limits.connection_lifetime, connection).await {
                Ok(Err(e)) => tracing::debug!(error = %e, "metrics connection ended with an error"),
                Err(_) => tracing::debug!(%peer, "metrics connection closed: lifetime over"),
                Ok(Ok(())) => {}
            }
        });
    }
}
