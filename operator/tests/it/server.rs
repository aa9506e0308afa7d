//! The operator's `/metrics`, `/healthz` and `/readyz` endpoint against slow and idle peers
//! (issue 15, item 9): slowloris connections are cut off by the header timeout, the number served
//! at once is bounded, and a real probe is still answered.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tandem_operator::metrics::Metrics;
use tandem_operator::server::{self, Health, Limits};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Far above anything the limits below allow, so a failure means "never", not "slow".
const NEVER: Duration = Duration::from_secs(30);

async fn start(limits: Limits) -> (std::net::SocketAddr, tokio::sync::oneshot::Sender<()>) {
    let listener = server::bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let refresh: server::Refresh = Arc::new(|| {});
    tokio::spawn(server::serve_with(
        listener,
        Metrics::default(),
        Health::default(),
        refresh,
        limits,
        async {
            let _ = stopped.await;
        },
    ));
    (addr, stop)
}

/// A connection that sends the start of a request and never finishes its headers.
async fn slow_peer(addr: std::net::SocketAddr) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: operator\r\nX-Slow: ").await.unwrap();
    stream
}

/// Reads until the server closes the connection; what it sent.
async fn until_closed(stream: &mut TcpStream) -> Vec<u8> {
    let mut seen = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return seen,
            Ok(n) => seen.extend_from_slice(&buf[..n]),
        }
    }
}

async fn healthz(addr: std::net::SocketAddr) -> String {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: operator\r\nConnection: close\r\n\r\n").await.unwrap();
    String::from_utf8_lossy(&until_closed(&mut stream).await).into_owned()
}

#[tokio::test]
async fn slow_peers_are_cut_off_and_a_probe_is_still_answered() {
    let limits = Limits {
        connections: 8,
        header_timeout: Duration::from_millis(500),
        connection_lifetime: Duration::from_secs(20),
    };
    let (addr, _stop) = start(limits).await;
    // Twice as many slowloris peers as there are slots: half are served (and held), half wait.
    let mut slow = Vec::new();
    for _ in 0..2 * limits.connections {
        slow.push(slow_peer(addr).await);
    }
    let probe = tokio::spawn(async move { tokio::time::timeout(NEVER, healthz(addr)).await });
    for (i, stream) in slow.iter_mut().enumerate() {
        let closed = tokio::time::timeout(NEVER, until_closed(stream)).await;
        assert!(closed.is_ok(), "slow peer {i} was never cut off: the header timeout does not hold");
    }
    let answer = probe.await.unwrap().expect("the probe was never answered while slow peers came and went");
    assert!(answer.starts_with("HTTP/1.1 200"), "the probe got {answer:?}");
}

#[tokio::test]
async fn an_idle_connection_does_not_hold_a_slot_forever() {
    let limits = Limits {
        connections: 1,
        header_timeout: Duration::from_millis(500),
        connection_lifetime: Duration::from_secs(2),
    };
    let (addr, _stop) = start(limits).await;
    // Connects and sends nothing at all.
    let mut idle = TcpStream::connect(addr).await.unwrap();
    let started = Instant::now();
    let answer = tokio::time::timeout(NEVER, healthz(addr))
        .await
        .expect("the probe waited forever behind an idle peer");
    assert!(answer.starts_with("HTTP/1.1 200"), "the probe got {answer:?}");
    assert!(
        tokio::time::timeout(NEVER, until_closed(&mut idle)).await.is_ok(),
        "the idle peer was never closed (after {:?})",
        started.elapsed()
    );
}
