//! The operator process stops promptly on SIGTERM even while its API server does not answer
//! (issue 15, item 10): a Deployment rollout or a node drain must not wait out the grace period
//! and a SIGKILL.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tokio::net::TcpListener;

/// The API server's stand-in: accepts connections and never answers (a partitioned or overloaded
/// control plane looks like this from the operator).
async fn black_hole() -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            held.push(stream);
        }
    });
    (addr, task)
}

fn kubeconfig(dir: &std::path::Path, addr: std::net::SocketAddr) -> std::path::PathBuf {
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {{server: 'https://{addr}', insecure-skip-tls-verify: true}}\n\
             users:\n- name: u\n  user: {{token: not-a-token}}\ncontexts:\n- name: x\n  context: {{cluster: c, user: u}}\ncurrent-context: x\n"
        ),
    )
    .unwrap();
    path
}

async fn stops_promptly(extra: &[&str]) {
    let (addr, hole) = black_hole().await;
    let dir = std::env::temp_dir().join(format!("tandem-op-shutdown-{}-{}", std::process::id(), extra.len()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = kubeconfig(&dir, addr);
    let mut child = Command::new(env!("CARGO_BIN_EXE_tandem-operator"))
        .args(["--metrics-addr", "127.0.0.1:0", "--log-format", "text"])
        .args(extra)
        .env("KUBECONFIG", &config)
        .env("RUST_LOG", "info")
        // The operator logs to stdout.
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Long enough to be inside its first requests to the silent API server.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(child.try_wait().unwrap().is_none(), "the operator exited before it was signalled");
    let signalled = Instant::now();
    let status = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(status.success());
    // The operator's own bound is 10 s of grace; before the fix it took about two minutes.
    let limit = Duration::from_secs(30);
    let exited = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if signalled.elapsed() > limit {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let Some(status) = exited else {
        let _ = child.kill();
        let output = child.wait_with_output().unwrap();
        panic!(
            "the operator ({extra:?}) was still running {limit:?} after SIGTERM; its log:\n{}",
            String::from_utf8_lossy(&output.stdout)
        );
    };
    let output = child.wait_with_output().unwrap();
    let log =
        format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(status.code().is_some(), "killed by a signal, not stopped: {status:?}\n{log}");
    assert!(log.contains("shutdown signal received"), "{log}");
    hole.abort();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn sigterm_stops_a_leader_candidate_whose_api_server_is_silent() {
    stops_promptly(&[]).await;
}

#[tokio::test]
async fn sigterm_stops_a_single_replica_whose_api_server_is_silent() {
    stops_promptly(&["--no-leader-election"]).await;
}
