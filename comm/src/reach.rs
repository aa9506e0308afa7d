//! The "peers reachable" gate: before a unit starts its collectives (a launcher before `mpirun`),
//! every peer must resolve (DNS) and accept a TCP connection within a deadline, or the unit fails
//! at once with an error that names each unreachable peer and why — instead of `mpirun` or the
//! user's own wait loop hanging on a dead or never-scheduled worker.
//!
//! Guarantees: every peer is tried concurrently and again every [`RETRY`] until the deadline (a
//! DNS record or a listener may appear late); the error lists the peers still unreachable at the
//! deadline with the last failure of each, DNS and TCP told apart. Nothing is sent on a probe
//! connection: it is closed as soon as it is made.

use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// Pause between two attempts at one peer.
pub const RETRY: Duration = Duration::from_millis(200);

/// One peer to reach: its name in errors (a pod, a rank) and its address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// What the error calls it, e.g. `worker 0/2 (job-g0-2.job.ns.svc)`.
    pub name: String,
    /// Host name or address.
    pub host: String,
    /// TCP port.
    pub port: u16,
}

/// The peers that were not reachable by the deadline.
#[derive(Debug, thiserror::Error)]
#[error(
    "{} of {total} peers not reachable within {} s: {}; check that those pods are running and that \
     their names resolve (a headless Service publishing not-ready addresses), or raise {}",
    .missing.len(),
    .timeout.as_secs(),
    .missing.iter().map(|(t, why)| format!("{} at {}:{} ({why})", t.name, t.host, t.port)).collect::<Vec<_>>().join("; "),
    tandem_api::contract::env::PEER_TIMEOUT
)]
pub struct Unreachable {
    /// The deadline it waited.
    pub timeout: Duration,
    /// Peers it tried.
    pub total: usize,
    /// Each unreachable peer with its last failure.
    pub missing: Vec<(Target, String)>,
}

/// Waits until every target resolves and accepts a TCP connection, for at most `timeout`.
pub fn await_reachable(targets: &[Target], timeout: Duration) -> Result<(), Unreachable> {
    let deadline = Instant::now() + timeout;
    let missing: Vec<(Target, String)> = std::thread::scope(|scope| {
        let probes: Vec<_> = targets.iter().map(|t| (t, scope.spawn(move || reach(t, deadline)))).collect();
        probes
            .into_iter()
            .filter_map(|(t, probe)| {
                let outcome = probe.join().unwrap_or_else(|_| Err("the probe thread panicked".to_owned()));
                outcome.err().map(|why| (t.clone(), why))
            })
            .collect()
    });
    if missing.is_empty() { Ok(()) } else { Err(Unreachable { timeout, total: targets.len(), missing }) }
}

/// Tries `target` until `deadline`: `Err` with the last failure.
fn reach(target: &Target, deadline: Instant) -> Result<(), String> {
    loop {
        let why = match resolve(target) {
            Err(e) => format!("DNS: cannot resolve {}: {e}", target.host),
            Ok(addrs) => match connect_any(&addrs, deadline) {
                Ok(()) => return Ok(()),
                Err(e) => format!("TCP: {e}"),
            },
        };
        let now = Instant::now();
        if now + RETRY >= deadline {
            return Err(why);
        }
        std::thread::sleep(RETRY);
    }
}

fn resolve(target: &Target) -> std::io::Result<Vec<SocketAddr>> {
    let addrs: Vec<SocketAddr> = (target.host.as_str(), target.port).to_socket_addrs()?.collect();
    if addrs.is_empty() {
        return Err(std::io::Error::other("the name has no address"));
    }
    Ok(addrs)
}

fn connect_any(addrs: &[SocketAddr], deadline: Instant) -> Result<(), String> {
    let mut last = String::new();
    for addr in addrs {
        let left = deadline
            .saturating_duration_since(Instant::now())
            .clamp(Duration::from_millis(10), Duration::from_secs(2));
        match TcpStream::connect_timeout(addr, left) {
            Ok(_) => return Ok(()),
            Err(e) => last = format!("cannot connect to {addr}: {e}"),
        }
    }
    Err(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listening_peer_passes_and_a_missing_one_is_named_with_its_cause() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let up = Target { name: "rank 0".into(), host: "127.0.0.1".into(), port };
        assert!(await_reachable(std::slice::from_ref(&up), Duration::from_secs(5)).is_ok());
        let down = Target { name: "rank 1".into(), host: "127.0.0.1".into(), port: closed };
        let started = Instant::now();
        let err = await_reachable(&[up, down], Duration::from_millis(600)).unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
        assert_eq!(err.missing.len(), 1);
        let text = err.to_string();
        assert!(
            text.contains("1 of 2 peers") && text.contains(&format!("rank 1 at 127.0.0.1:{closed} (TCP:")),
            "{text}"
        );
    }
}
