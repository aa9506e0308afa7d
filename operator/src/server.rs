//! The operator's HTTP endpoint: `/metrics` (Prometheus text), `/healthz` (the process serves)
//! and `/readyz` (the replica knows its role: it leads with a synced cache, or stands by).
//!
//! Guarantees: the server stops accepting when the shutdown signal fires and never blocks the
//! controller; unknown paths get 404.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

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

/// Binds `addr`; the returned listener is served by [`serve`].
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// Serves until `shutdown` completes.
pub async fn serve(
    listener: TcpListener,
    metrics: Metrics,
    health: Health,
    refresh: Refresh,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            () = &mut shutdown => return,
            accepted = listener.accept() => accepted,
        };
        let Ok((stream, _)) = accepted else { continue };
        let (metrics, health, refresh) = (metrics.clone(), health.clone(), refresh.clone());
        tokio::spawn(async move {
            let service = service_fn(move |req: Request<Incoming>| {
                let response = route(req.uri().path(), &metrics, &health, &refresh);
                async move { Ok::<_, Infallible>(response) }
            });
            if let Err(e) = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await {
                tracing::debug!(error = %e, "metrics connection ended with an error");
            }
        });
    }
}
