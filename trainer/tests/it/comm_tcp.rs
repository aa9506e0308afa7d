//! The `tcp` collective backend with real processes on loopback: every op against the serial
//! reference on 1–6 ranks, fused against per-tensor allreduce, authentication, and failures (a killed,
//! a hung and a missing rank) that every other rank must report in time, naming the culprit.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, channel};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

const TANDEM: &str = env!("CARGO_BIN_EXE_tandem");

struct Rank {
    child: Child,
    stdout: Receiver<String>,
    stderr: JoinHandle<String>,
}

struct Finished {
    success: bool,
    stdout: String,
    stderr: String,
}

fn free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<TcpListener> = (0..n).map(|_| TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    listeners.iter().map(|l| l.local_addr().unwrap().port()).collect()
}

/// A token file holding `content`: one file per token (not per call), so runs leave no pile of
/// files behind; written under a temporary name and renamed, so a rank never reads half a token.
fn token_file(content: &str) -> PathBuf {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir();
    let path = dir.join(format!("tandem-comm-test-{content}.token"));
    if std::fs::read_to_string(&path).ok().as_deref() != Some(content) {
        let tmp = dir.join(format!(
            "tandem-comm-test-{}-{}.tmp",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::write(&tmp, content).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
    }
    path
}

/// Starts `ranks` (a subset of `0..ports.len()`) with `token(rank)` and the extra arguments.
fn start(ports: &[u16], ranks: &[usize], token: impl Fn(usize) -> PathBuf, extra: &[&str]) -> Vec<Rank> {
    let peers = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect::<Vec<_>>().join(",");
    ranks
        .iter()
        .map(|&rank| {
            let mut child = Command::new(TANDEM)
                .args(["comm-rank", "--backend", "tcp", "--rank", &rank.to_string(), "--peers", &peers])
                .arg("--token-file")
                .arg(token(rank))
                .args(extra)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            let (tx, stdout) = channel();
            let out = child.stdout.take().unwrap();
            thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    let _ = tx.send(line);
                }
            });
            let mut err = child.stderr.take().unwrap();
            let stderr = thread::spawn(move || {
                let mut s = String::new();
                let _ = err.read_to_string(&mut s);
                s
            });
            Rank { child, stdout, stderr }
        })
        .collect()
}

/// Waits for every rank to exit; kills all and panics past `limit`.
fn finish(ranks: Vec<Rank>, limit: Duration) -> Vec<Finished> {
    let deadline = Instant::now() + limit;
    let mut ranks = ranks;
    loop {
        if ranks.iter_mut().all(|r| r.child.try_wait().unwrap().is_some()) {
            break;
        }
        if Instant::now() > deadline {
            for r in &mut ranks {
                let _ = r.child.kill();
            }
            panic!("ranks still running after {limit:?}: a collective hung");
        }
        thread::sleep(Duration::from_millis(50));
    }
    ranks
        .into_iter()
        .map(|mut r| {
            let success = r.child.wait().unwrap().success();
            // The reader thread may still be forwarding lines: read until it closes the channel
            // at the end of the child's stdout, not just what already arrived.
            let stdout: Vec<String> = r.stdout.iter().collect();
            Finished { success, stdout: stdout.join("\n"), stderr: r.stderr.join().unwrap() }
        })
        .collect()
}

fn same_token(_: usize) -> PathBuf {
    token_file("s3cret-job-token")
}

#[test]
fn every_collective_matches_the_serial_reference_on_1_to_6_ranks() {
    for n in 1..=6 {
        let ports = free_ports(n);
        let all: Vec<usize> = (0..n).collect();
        let done = finish(
            start(&ports, &all, same_token, &["--timeout-s", "60", "selftest"]),
            Duration::from_secs(600),
        );
        for (rank, f) in done.iter().enumerate() {
            assert!(f.success, "{n} ranks: rank {rank} failed:\n{}{}", f.stdout, f.stderr);
            assert!(f.stdout.contains("selftest passed"), "{n} ranks, rank {rank}: {}", f.stdout);
        }
    }
}

#[test]
fn uneven_chunking_and_the_ring_for_every_size_still_match() {
    // Tiny chunks and no recursive doubling: every message is pipelined in many pieces.
    let ports = free_ports(3);
    let args = ["--small-bytes", "0", "--chunk-bytes", "100", "--timeout-s", "60", "selftest"];
    for f in finish(start(&ports, &[0, 1, 2], same_token, &args), Duration::from_secs(600)) {
        assert!(f.success, "{}{}", f.stdout, f.stderr);
    }
}

#[test]
fn a_rank_with_the_wrong_token_is_refused() {
    let ports = free_ports(2);
    let token = |rank: usize| token_file(if rank == 0 { "right-token" } else { "wrong-token" });
    let args = ["--connect-timeout-s", "8", "selftest"];
    let done = finish(start(&ports, &[0, 1], token, &args), Duration::from_secs(120));
    assert!(!done[0].success && !done[1].success);
    assert!(done[1].stderr.contains("does not hold this job's token"), "rank 1: {}", done[1].stderr);
    // Whichever side checks first hangs up; the other reports the token either way.
    assert!(
        done[0].stderr.contains("rank 1") && done[0].stderr.contains("job token"),
        "rank 0: {}",
        done[0].stderr
    );
}

#[test]
fn a_missing_rank_fails_the_rendezvous_on_every_rank_naming_it() {
    let ports = free_ports(4);
    let args = ["--connect-timeout-s", "5", "selftest"];
    let done = finish(start(&ports, &[0, 1, 3], same_token, &args), Duration::from_secs(120));
    let named = format!("rank 2 (127.0.0.1:{})", ports[2]);
    for f in &done {
        assert!(!f.success);
        assert!(f.stderr.contains(&named), "expected {named:?} in: {}", f.stderr);
    }
}

/// Starts a 4-rank soak of 16 MiB allreduces and waits until they are running.
fn soak(timeout_s: &str) -> (Vec<u16>, Vec<Rank>) {
    let ports = free_ports(4);
    let args = ["--timeout-s", timeout_s, "soak", "--len", "4194304", "--iterations", "100000"];
    let ranks = start(&ports, &[0, 1, 2, 3], same_token, &args);
    let first = ranks[0].stdout.recv_timeout(Duration::from_secs(120)).expect("the soak never started");
    assert!(first.starts_with("iteration"), "{first}");
    (ports, ranks)
}

#[test]
fn a_killed_rank_makes_every_other_rank_fail_naming_it() {
    let (ports, mut ranks) = soak("60");
    let mut victim = ranks.remove(2);
    victim.child.kill().unwrap();
    victim.child.wait().unwrap();
    // Well below the 60 s collective timeout: a death is seen at once, not by timing out.
    let done = finish(ranks, Duration::from_secs(45));
    let named = format!("rank 2 (127.0.0.1:{})", ports[2]);
    for f in &done {
        assert!(!f.success, "a rank finished although its peer died");
        assert!(f.stderr.contains(&named), "expected {named:?} in: {}", f.stderr);
    }
}

#[test]
fn a_hung_rank_is_named_by_every_other_rank_after_the_timeout() {
    let (ports, mut ranks) = soak("3");
    let victim = ranks.remove(2);
    let pid = victim.child.id() as libc::pid_t;
    // SAFETY: signalling a child process this test started and still owns.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let done = finish(ranks, Duration::from_secs(90));
    // SAFETY: as above; the stopped child must not outlive the test.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let mut victim = victim;
    let _ = victim.child.wait();
    let named = format!("rank 2 (127.0.0.1:{})", ports[2]);
    for f in &done {
        assert!(!f.success, "a rank finished although its peer hung");
        assert!(f.stderr.contains(&named), "expected {named:?} in: {}", f.stderr);
    }
}

#[test]
fn bench_allreduce_prints_one_json_record_per_size() {
    let out = Command::new(TANDEM)
        .args([
            "bench",
            "allreduce",
            "--backend",
            "tcp",
            "--ranks",
            "3",
            "--bytes",
            "4K,1M",
            "--output",
            "json",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<serde_json::Value> =
        String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 2);
    for (line, bytes) in lines.iter().zip([4096, 1 << 20]) {
        assert_eq!(line["backend"], "tcp");
        assert_eq!(line["ranks"], 3);
        assert_eq!(line["bytes"], bytes);
        let (alg, bus, lat) = (
            line["algbw_gbps"].as_f64().unwrap(),
            line["busbw_gbps"].as_f64().unwrap(),
            line["latency_us"].as_f64().unwrap(),
        );
        assert!(alg > 0.0 && lat > 0.0);
        assert!((bus - alg * 2.0 * 2.0 / 3.0).abs() < 1e-9 * bus.max(1.0), "busbw {bus} vs algbw {alg}");
        assert!((alg - bytes as f64 / lat / 1e3).abs() < 1e-6 * alg, "algbw {alg} vs {bytes} B in {lat} us");
    }
}
