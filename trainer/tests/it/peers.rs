//! The "peers reachable" gate with real processes: a `tcp` group whose peer never comes up, or
//! whose peer's name does not resolve, and a `tandem launcher` whose hostfile names a worker that
//! does not exist, fail within `TANDEM_PEER_TIMEOUT` with the retryable
//! [`contract::EXIT_PEER_LOST`] and an error — also written as the termination message — naming
//! the unreachable peer; mpirun never starts.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::ps_common::Job;
use tandem_api::contract::{self, Endpoint, Role};

/// A deadline far below the 120-s default, and how long a test waits before calling it a hang.
const PEER_TIMEOUT: &str = "3";
const HANG: Duration = Duration::from_secs(90);

fn free_port() -> u16 {
    tandem_util::proc::free_ports(1).unwrap()[0]
}

fn tcp_job(peers: Vec<Endpoint>) -> Job {
    let size = peers.len();
    let job = Job::with_spec(serde_json::json!({
        "model": {"kind": "mlp", "hidden": [8]},
        "data": {"source": "synthetic", "batchSize": 8, "syntheticSamples": 256},
        "training": {"algorithm": "allreduce", "steps": 10, "optimizer": {"kind": "sgd", "learningRate": 0.05}},
        "parameterServers": {"replicas": 0},
        "workers": {"groups": 1, "groupSize": size, "minGroups": 1, "maxGroups": 1, "backend": "tcp"}
    }));
    job.write_topology(&[], &[peers]);
    job
}

/// Runs rank `rank` of `job`'s group to its exit, failing the test if it outlives [`HANG`].
fn run_rank(job: &Job, rank: u32) -> (Output, String) {
    let env = job.launch(Role::Worker { group: 0, rank }, 0);
    let termination = job.dir.path().join(format!("termination-{rank}"));
    let child = Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args(["worker", "--device", "cpu"])
        .envs(env.to_vars())
        .env(contract::env::PEER_TIMEOUT, PEER_TIMEOUT)
        .env(contract::env::TERMINATION_LOG, &termination)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let output = wait_output(child);
    (output, std::fs::read_to_string(&termination).unwrap_or_default())
}

fn wait_output(mut child: std::process::Child) -> Output {
    let deadline = Instant::now() + HANG;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("still waiting for its peers after {HANG:?}, far past the {PEER_TIMEOUT}-s deadline");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn a_tcp_group_whose_peer_never_comes_up_fails_within_the_deadline_naming_it() {
    let peers = crate::ps_common::loopback_endpoints(3);
    let missing = peers[2].port;
    let job = tcp_job(peers);
    // Ranks 0 and 1 start; rank 2 never does.
    let ranks: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..2)
            .map(|r| {
                s.spawn({
                    let job = &job;
                    move || run_rank(job, r)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (rank, (output, termination)) in ranks.iter().enumerate() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(contract::EXIT_PEER_LOST), "rank {rank}:\n{stderr}");
        let named = format!("rank 2 (127.0.0.1:{missing})");
        assert!(stderr.contains(&named), "rank {rank} names the missing peer {named}:\n{stderr}");
        assert!(termination.contains(&named), "rank {rank}'s termination message: {termination:?}");
    }
}

#[test]
fn a_tcp_group_whose_peer_name_does_not_resolve_fails_naming_it_and_the_dns_error() {
    let ports = tandem_util::proc::free_ports(2).unwrap();
    let peers = vec![Endpoint::new("missing-peer.invalid", ports[0]), Endpoint::new("127.0.0.1", ports[1])];
    let job = tcp_job(peers);
    let (output, termination) = run_rank(&job, 1);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(contract::EXIT_PEER_LOST), "{stderr}");
    assert!(stderr.contains("rank 0 (missing-peer.invalid:"), "{stderr}");
    assert!(stderr.contains("lookup"), "the cause is the name lookup:\n{stderr}");
    assert!(termination.contains("missing-peer.invalid"), "{termination:?}");
}

/// `tandem launcher` of a 2-rank mpi group with `hosts` as its hostfile and sshd on `port`; an
/// mpirun that does not exist, so that getting past the gate shows as its "not found" error.
fn launch(dir: &Path, hosts: &[&str], port: u16) -> (Output, String) {
    let job = Job::with_spec(serde_json::json!({
        "model": {"kind": "mlp", "hidden": [8]},
        "data": {"source": "synthetic", "batchSize": 8, "syntheticSamples": 256},
        "training": {"algorithm": "allreduce", "steps": 10, "optimizer": {"kind": "sgd", "learningRate": 0.05}},
        "parameterServers": {"replicas": 0},
        "workers": {"groups": 1, "groupSize": hosts.len(), "minGroups": 1, "maxGroups": 1, "backend": "mpi"}
    }));
    let hostfile = dir.join("hostfile");
    let lines: String = hosts.iter().map(|h| format!("{h} slots=1\n")).collect();
    std::fs::write(&hostfile, format!("# the group's workers\n{lines}")).unwrap();
    let env = job.launch(Role::Launcher { group: 0 }, 0);
    let termination = dir.join("termination");
    let child = Command::new(env!("CARGO_BIN_EXE_tandem"))
        .arg("launcher")
        .envs(env.to_vars())
        .env("TANDEM_MPIRUN", dir.join("no-such-mpirun"))
        .env("OMPI_MCA_orte_default_hostfile", &hostfile)
        .env("OMPI_MCA_prte_default_hostfile", &hostfile)
        .env("OMPI_MCA_plm_rsh_args", format!("-p {port} -o ConnectionAttempts=10"))
        .env(contract::env::PEER_TIMEOUT, PEER_TIMEOUT)
        .env(contract::env::TERMINATION_LOG, &termination)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let output = wait_output(child);
    (output, std::fs::read_to_string(&termination).unwrap_or_default())
}

#[test]
fn the_launcher_starts_mpirun_only_once_every_workers_sshd_is_reachable() {
    let tmp = tempfile::tempdir().unwrap();
    // A stand-in for a worker's sshd port: the gate only connects, it speaks no protocol.
    let sshd = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = sshd.local_addr().unwrap().port();

    let (output, termination) = launch(tmp.path(), &["127.0.0.1", "missing-worker.invalid"], port);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(contract::EXIT_PEER_LOST), "{stderr}");
    assert!(
        stderr.contains("1 of 2 peers not reachable within 3 s")
            && stderr.contains(&format!("worker 0/1 at missing-worker.invalid:{port} (DNS:")),
        "{stderr}"
    );
    assert!(!stderr.contains("no-such-mpirun"), "mpirun was not started:\n{stderr}");
    assert!(termination.contains("worker 0/1 at missing-worker.invalid"), "{termination:?}");

    // A worker whose sshd does not listen is named with the TCP error.
    let closed = free_port();
    let (output, _) = launch(tmp.path(), &["127.0.0.1"], closed);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains(&format!("worker 0/0 at 127.0.0.1:{closed} (TCP:")), "{stderr}");

    // Every worker reachable: the gate opens, and the launcher goes on to start mpirun.
    let (output, _) = launch(tmp.path(), &["127.0.0.1", "localhost"], port);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("no-such-mpirun` was not found"), "{stderr}");
}
