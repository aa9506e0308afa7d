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
/// The launch contract's exit code for a lost peer (retryable).
const PEER_LOST: i32 = 200;

struct Rank {
    child: Child,
    stdout: Receiver<String>,
    stderr: JoinHandle<String>,
}

struct Finished {
    success: bool,
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

fn free_ports(n: usize) -> Vec<u16> {
    tandem_util::proc::free_ports(n).unwrap()
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
    start_each(ports, ranks, token, |_| extra.iter().map(|s| s.to_string()).collect())
}

/// Starts `ranks` with `token(rank)` and each rank's own extra arguments.
fn start_each(
    ports: &[u16],
    ranks: &[usize],
    token: impl Fn(usize) -> PathBuf,
    extra: impl Fn(usize) -> Vec<String>,
) -> Vec<Rank> {
    let peers = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect::<Vec<_>>().join(",");
    ranks
        .iter()
        .map(|&rank| {
            let mut child = Command::new(TANDEM)
                .args(["comm-rank", "--backend", "tcp", "--rank", &rank.to_string(), "--peers", &peers])
                .arg("--token-file")
                .arg(token(rank))
                .args(extra(rank))
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
            let status = r.child.wait().unwrap();
            let (success, code) = (status.success(), status.code());
            // The reader thread may still be forwarding lines: read until it closes the channel
            // at the end of the child's stdout, not just what already arrived.
            let stdout: Vec<String> = r.stdout.iter().collect();
            Finished { success, code, stdout: stdout.join("\n"), stderr: r.stderr.join().unwrap() }
        })
        .collect()
}

fn same_token(_: usize) -> PathBuf {
    token_file("s3cret-job-token")
}

#[test]
fn every_collective_matches_the_serial_reference_on_1_to_6_ranks() {
    // Over TCP between every rank, and through shared memory (all ranks share this machine).
    for shm in ["off", "on"] {
        for n in 1..=6 {
            let ports = free_ports(n);
            let all: Vec<usize> = (0..n).collect();
            let done = finish(
                start(&ports, &all, same_token, &["--shm", shm, "--timeout-s", "60", "selftest"]),
                Duration::from_secs(600),
            );
            for (rank, f) in done.iter().enumerate() {
                assert!(f.success, "{n} ranks, shm {shm}: rank {rank} failed:\n{}{}", f.stdout, f.stderr);
                assert!(f.stdout.contains("selftest passed"), "{n} ranks, rank {rank}: {}", f.stdout);
            }
            if n > 1 {
                let path =
                    if shm == "on" { "shared memory between all ranks" } else { "TCP between every rank" };
                assert!(done[0].stderr.contains(path), "{n} ranks, shm {shm}: {}", done[0].stderr);
            }
        }
    }
}

#[test]
fn uneven_chunking_and_the_ring_for_every_size_still_match() {
    // Every allreduce algorithm forced for every size, over TCP only, with tiny chunks: every
    // message is pipelined in many pieces, and the self-test's lengths are not divisible by the
    // rank count.
    for n in 2..=4 {
        let all: Vec<usize> = (0..n).collect();
        for algo in ["ring", "rabenseifner", "rd"] {
            let ports = free_ports(n);
            let args =
                ["--shm", "off", "--algo", algo, "--chunk-bytes", "100", "--timeout-s", "60", "selftest"];
            for (rank, f) in
                finish(start(&ports, &all, same_token, &args), Duration::from_secs(600)).iter().enumerate()
            {
                assert!(f.success, "{n} ranks, {algo}, rank {rank}: {}{}", f.stdout, f.stderr);
                assert!(f.stdout.contains("selftest passed"), "{n} ranks, {algo}, rank {rank}: {}", f.stdout);
            }
        }
    }
}

#[test]
fn a_rank_with_the_wrong_token_is_refused() {
    let ports = free_ports(2);
    let token = |rank: usize| token_file(if rank == 0 { "right-token" } else { "wrong-token" });
    let args = ["--connect-timeout-s", "20", "selftest"];
    let done = finish(start(&ports, &[0, 1], token, &args), Duration::from_secs(120));
    assert!(!done[0].success && !done[1].success);
    assert!(done[1].stderr.contains("does not hold this job's token"), "rank 1: {}", done[1].stderr);
    // A wrong token is the job's configuration, not a lost peer: no point in restarting.
    assert_eq!(done[1].code, Some(1), "rank 1: {}", done[1].stderr);
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
        assert_eq!(f.code, Some(PEER_LOST), "a missing peer is retryable: {}", f.stderr);
    }
}

/// Starts a 4-rank soak of 16 MiB allreduces and waits until they are running.
fn soak(timeout_s: &str) -> (Vec<u16>, Vec<Rank>) {
    soak_on(timeout_s, |_| Vec::new())
}

/// [`soak`] with each rank's own extra arguments first (a simulated host).
fn soak_on(timeout_s: &str, extra: impl Fn(usize) -> Vec<String>) -> (Vec<u16>, Vec<Rank>) {
    let ports = free_ports(4);
    let args = ["--timeout-s", timeout_s, "soak", "--len", "4194304", "--iterations", "100000"];
    let ranks = start_each(&ports, &[0, 1, 2, 3], same_token, |rank| {
        let mut a = extra(rank);
        a.extend(args.iter().map(|s| s.to_string()));
        a
    });
    let first = ranks[0].stdout.recv_timeout(Duration::from_secs(120)).expect("the soak never started");
    assert!(first.starts_with("iteration"), "{first}");
    (ports, ranks)
}

/// Kills `victim` of a running 4-rank soak (each rank with its `extra` arguments) and checks
/// that every other rank fails within 45 s, well below the 60 s collective timeout (a death is
/// seen at once, not by timing out), naming it and exiting with the retryable code.
fn assert_a_killed_rank_is_named(victim: usize, extra: impl Fn(usize) -> Vec<String>) {
    let (ports, mut ranks) = soak_on("60", extra);
    let mut dead = ranks.remove(victim);
    dead.child.kill().unwrap();
    dead.child.wait().unwrap();
    let done = finish(ranks, Duration::from_secs(45));
    let named = format!("rank {victim} (127.0.0.1:{})", ports[victim]);
    for f in &done {
        assert!(!f.success, "a rank finished although its peer died");
        assert!(f.stderr.contains(&named), "expected {named:?} in: {}", f.stderr);
        assert_eq!(f.code, Some(PEER_LOST), "{}", f.stderr);
    }
}

#[test]
fn a_killed_rank_makes_every_other_rank_fail_naming_it() {
    // All four ranks on this machine: the shared-memory path.
    assert_a_killed_rank_is_named(2, |_| Vec::new());
}

#[test]
fn a_killed_rank_of_a_tcp_only_group_is_named_by_every_other_rank() {
    // Shared memory turned off: detection by the data and control connections alone.
    assert_a_killed_rank_is_named(2, |_| vec!["--shm".to_owned(), "off".to_owned()]);
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
    // Co-located ranks take shared memory unless it is turned off; the record names the path.
    for (shm, backend) in [("off", "tcp"), ("on", "shm")] {
        let out = Command::new(TANDEM)
            .args(["bench", "allreduce", "--backend", "tcp", "--shm", shm, "--ranks", "3"])
            .args(["--bytes", "4K,1M", "--output", "json"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let lines: Vec<serde_json::Value> =
            String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines.len(), 2);
        for (line, bytes) in lines.iter().zip([4096, 1 << 20]) {
            assert_eq!(line["backend"], backend);
            assert_eq!(line["ranks"], 3);
            assert_eq!(line["bytes"], bytes);
            let (alg, bus, lat, memcpy) = (
                line["algbw_gbps"].as_f64().unwrap(),
                line["busbw_gbps"].as_f64().unwrap(),
                line["latency_us"].as_f64().unwrap(),
                line["memcpy_gbps"].as_f64().unwrap(),
            );
            assert!(alg > 0.0 && lat > 0.0 && memcpy > 0.0);
            assert!((bus - alg * 2.0 * 2.0 / 3.0).abs() < 1e-9 * bus.max(1.0), "busbw {bus} vs algbw {alg}");
            assert!(
                (alg - bytes as f64 / lat / 1e3).abs() < 1e-6 * alg,
                "algbw {alg} vs {bytes} B in {lat} us"
            );
        }
    }
}

/// `--host-id` arguments that put rank `r` on simulated host `hosts[r]`.
fn on_hosts(hosts: &[usize]) -> impl Fn(usize) -> Vec<String> + '_ {
    move |rank| vec!["--host-id".to_owned(), format!("host{}", hosts[rank])]
}

#[test]
fn every_rank_layout_matches_the_serial_reference_on_every_rank() {
    // Simulated hosts (`--host-id`): ranks given the same id map one shared-memory segment, the
    // others talk TCP. Network namespaces would only change the network identity, while the ranks
    // would still share /dev/shm; the host id is what decides the path, so the test sets it.
    let layouts: [(&[usize], &str); 8] = [
        (&[0, 0, 1, 1], "hierarchical"),
        (&[0, 1, 0, 1], "hierarchical"),
        (&[0, 0, 0, 1], "hierarchical"),
        (&[0, 1, 1, 1], "hierarchical"),
        (&[0, 0, 0, 0], "shared memory between all ranks"),
        (&[0, 1, 2, 3], "TCP between every rank"),
        (&[0, 1, 1, 2, 2, 2], "hierarchical"),
        (&[0, 0, 1, 1, 1], "hierarchical"),
    ];
    for (hosts, path) in layouts {
        let ports = free_ports(hosts.len());
        let all: Vec<usize> = (0..hosts.len()).collect();
        let ranks = start_each(&ports, &all, same_token, |rank| {
            let mut a = on_hosts(hosts)(rank);
            a.extend(["--timeout-s", "60", "selftest"].map(str::to_owned));
            a
        });
        let done = finish(ranks, Duration::from_secs(600));
        for (rank, f) in done.iter().enumerate() {
            assert!(f.success, "hosts {hosts:?}: rank {rank} failed:\n{}{}", f.stdout, f.stderr);
            assert!(f.stdout.contains("selftest passed"), "hosts {hosts:?}, rank {rank}: {}", f.stdout);
        }
        assert!(done[0].stderr.contains(path), "hosts {hosts:?}: expected {path:?} in {}", done[0].stderr);
    }
}

#[test]
fn a_killed_rank_of_a_hierarchical_group_is_named_by_every_other_rank() {
    assert_a_killed_rank_is_named(1, on_hosts(&[0, 0, 1, 1]));
}

/// Connections to `port` once it accepts: the first proves it listens and is closed at once.
fn idle_connections(port: u16, n: usize) -> Vec<std::net::TcpStream> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "rank 0 never listened on {port}");
        thread::sleep(Duration::from_millis(20));
    }
    (0..n).map(|_| std::net::TcpStream::connect(("127.0.0.1", port)).unwrap()).collect()
}

#[test]
fn idle_connections_to_rank_0_neither_delay_nor_fail_the_group() {
    // Handshakes used to run one at a time with up to 10 s each: 13 silent connections to rank 0
    // used up any connect timeout. They now run concurrently with a short deadline each.
    let ports = free_ports(3);
    let args = ["--connect-timeout-s", "20", "soak", "--len", "1000", "--iterations", "3"];
    let mut ranks = start(&ports, &[0], same_token, &args);
    let idle = idle_connections(ports[0], 13);
    ranks.extend(start(&ports, &[1, 2], same_token, &args));
    for (rank, f) in finish(ranks, Duration::from_secs(120)).iter().enumerate() {
        assert!(f.success, "rank {rank} failed beside 13 idle connections:\n{}{}", f.stdout, f.stderr);
    }
    drop(idle);
}

/// A listener on `port` that answers every connection with `reply` and keeps it open, for `life`.
fn stranger(port: u16, reply: &'static [u8], life: Duration) -> JoinHandle<()> {
    let listener = TcpListener::bind(("127.0.0.1", port)).unwrap();
    listener.set_nonblocking(true).unwrap();
    thread::spawn(move || {
        let end = Instant::now() + life;
        let mut open = Vec::new();
        while Instant::now() < end {
            match listener.accept() {
                Ok((mut s, _)) => {
                    let _ = std::io::Write::write_all(&mut s, reply);
                    open.push(s);
                }
                Err(_) => thread::sleep(Duration::from_millis(20)),
            }
        }
    })
}

#[test]
fn a_stranger_on_a_peers_port_is_named_for_what_it_is_not_blamed_on_the_token() {
    // Something else answers on rank 0's address: it speaks another protocol (permanent, exit 1)
    // or accepts and says nothing (retryable, exit 200); neither is a token problem.
    for (reply, cause, code) in [
        (
            &b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"[..],
            "not a tandem collective endpoint",
            1,
        ),
        (&b""[..], "no answer within", PEER_LOST),
    ] {
        let ports = free_ports(2);
        let listener = stranger(ports[0], reply, Duration::from_secs(30));
        let args = ["--connect-timeout-s", "7", "selftest"];
        let done = finish(start(&ports, &[1], same_token, &args), Duration::from_secs(60));
        let err = &done[0].stderr;
        assert!(!done[0].success);
        assert!(err.contains(cause) && err.contains("rank 0"), "expected {cause:?} about rank 0 in: {err}");
        assert!(!err.contains("token"), "the token is not the cause: {err}");
        assert_eq!(done[0].code, Some(code), "{err}");
        drop(listener);
    }
}

#[test]
fn a_stranger_with_another_protocol_is_refused_by_the_acceptor_and_named_at_the_deadline() {
    // Rank 1 never comes; a hostile client connects to rank 0 and sends an HTTP request (wrong
    // magic). Rank 0 refuses it without failing, and its rendezvous error names both the missing
    // rank and what was refused.
    let ports = free_ports(2);
    let ranks = start(&ports, &[0], same_token, &["--connect-timeout-s", "6", "selftest"]);
    let mut idle = idle_connections(ports[0], 1);
    std::io::Write::write_all(&mut idle[0], b"GET / HTTP/1.1\r\nHost: x\r\nUser-Agent: probe\r\n\r\n")
        .unwrap();
    let done = finish(ranks, Duration::from_secs(60));
    let err = &done[0].stderr;
    assert!(!done[0].success);
    assert!(
        err.contains(&format!("rank 1 (127.0.0.1:{})", ports[1])),
        "the missing rank is not named: {err}"
    );
    assert!(err.contains("bad magic"), "the refusal is not named: {err}");
    assert_eq!(done[0].code, Some(PEER_LOST), "{err}");
    drop(idle);
}
