//! The HTTP status endpoint of a real `tandem ps` process: the job token guards it, it serves the
//! progress a worker group reported, and hostile bytes on it disturb neither it nor training.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};

use crate::ps_common::{Job, TOKEN};
use tandem::ps::wire::Progress;
use tandem_api::contract::{PsStatus, env};

/// A child process killed when dropped.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A `tandem ps` for shard 0 with its status endpoint on any free port.
struct Ps {
    _child: Running,
    addr: String,
    status: String,
}

fn spawn_ps_with_status(job: &Job) -> Ps {
    let launch = job.ps_launch(0);
    let log = job.dir.path().join("ps-status.log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args(["ps", "--port", "0", "--hello-timeout", "5"])
        .envs(launch.to_vars())
        .env(env::STATUS_PORT, "0")
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    let second = lines.next().unwrap().unwrap();
    let addr = first.strip_prefix("listening on ").expect(&first).to_owned();
    let status = second.strip_prefix("status on ").expect(&second).to_owned();
    // Keep reading stdout so the PS never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    Ps { _child: Running(child), addr, status }
}

/// Sends `request` as is and returns the status code and body of the answer.
fn raw(addr: &str, request: &[u8]) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(request).unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    let code = answer.split(' ').nth(1).and_then(|c| c.parse().ok()).expect(&answer);
    let body = answer.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    (code, body)
}

fn get(addr: &str, path: &str, token: Option<&str>) -> (u16, String) {
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    raw(addr, format!("GET {path} HTTP/1.1\r\nHost: ps\r\n{auth}\r\n").as_bytes())
}

#[test]
fn the_status_endpoint_serves_reported_progress_to_the_token_only() {
    let job = Job::new("ps-async", 0, 1, 0);
    let ps = spawn_ps_with_status(&job);
    let status = ps.status.clone();

    // Before any report: a status without progress.
    let (code, body) = get(&status, "/status", Some(TOKEN));
    assert_eq!(code, 200, "{body}");
    let before: PsStatus = serde_json::from_str(&body).unwrap();
    assert_eq!((before.shard, before.replicas, before.progress), (0, 1, None));

    // A worker group joins and reports twice.
    let mut worker = job.worker(std::slice::from_ref(&ps.addr), 0, 0, 8);
    worker.init(0, &[0.5; 8]).unwrap();
    worker.join().unwrap();
    let report = |step, samples, accuracy, epoch| Progress {
        step,
        loss: Some(0.5),
        accuracy: Some(accuracy),
        samples,
        epoch,
    };
    worker.report(report(10, 320, 0.5, 0)).unwrap();
    worker.report(report(20, 640, 0.875, 1)).unwrap();

    let (code, body) = get(&status, "/status", Some(TOKEN));
    assert_eq!(code, 200, "{body}");
    let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
    let parsed: PsStatus = serde_json::from_value(doc.clone()).unwrap();
    assert_eq!(parsed.member_groups, 1, "{body}");
    let progress = parsed.progress.expect(&body);
    assert_eq!((progress.step, progress.epoch), (20, 1));
    assert_eq!(progress.accuracy, Some(0.875));
    assert_eq!(progress.loss, Some(0.5));
    assert!(progress.samples_per_second.is_some_and(|r| r > 0.0), "{body}");
    assert_eq!(doc["groups"][0]["group"], 0, "{body}");
    assert_eq!(doc["mode"]["kind"], "async", "{body}");

    // Metrics in Prometheus text format, behind the same token.
    let (code, metrics) = get(&status, "/metrics", Some(TOKEN));
    assert_eq!(code, 200, "{metrics}");
    assert!(metrics.contains("tandem_ps_step{shard=\"0\"} 20\n"), "{metrics}");
    assert!(metrics.contains("tandem_ps_accuracy{shard=\"0\"} 0.875\n"), "{metrics}");

    // The token guards status and metrics; the health probe needs none.
    assert_eq!(get(&status, "/status", None).0, 401);
    assert_eq!(get(&status, "/status", Some("wrong-token")).0, 401);
    assert_eq!(get(&status, "/metrics", Some(&format!("{TOKEN}x"))).0, 401);
    assert_eq!(
        raw(&status, format!("GET /status HTTP/1.1\r\nAuthorization: Basic {TOKEN}\r\n\r\n").as_bytes()).0,
        401
    );
    assert_eq!(get(&status, "/healthz", None), (200, "ok\n".to_owned()));
    assert_eq!(get(&status, "/other", Some(TOKEN)).0, 404);
    assert_eq!(raw(&status, b"POST /status HTTP/1.1\r\n\r\n").0, 405);

    // Hostile bytes are refused; the endpoint and training go on.
    assert_eq!(raw(&status, b"\x00\x01\x02\xffgarbage that is not http\r\n\r\n").0, 400);
    assert_eq!(raw(&status, b"GET /status\r\n\r\n").0, 400);
    let huge = format!("GET /status HTTP/1.1\r\nX-Pad: {}\r\n\r\n", "a".repeat(64 * 1024));
    assert_eq!(raw(&status, huge.as_bytes()).0, 431);
    {
        // A client that connects and says nothing, then goes away, costs only its connection.
        let _silent = TcpStream::connect(&status).unwrap();
    }
    worker.push(0, &[0.25; 8]).unwrap();
    // A light report (no evaluation) keeps the latest accuracy.
    worker.report(Progress { step: 21, loss: Some(0.25), accuracy: None, samples: 672, epoch: 1 }).unwrap();
    let (code, body) = get(&status, "/status", Some(TOKEN));
    assert_eq!(code, 200, "{body}");
    let after: PsStatus = serde_json::from_str(&body).unwrap();
    let progress = after.progress.clone().unwrap();
    assert_eq!((progress.step, progress.loss, progress.accuracy), (21, Some(0.25), Some(0.875)), "{body}");
    assert!(after.version >= 1, "the push was applied: {body}");
}

#[test]
fn status_port_off_serves_no_endpoint_and_bad_values_are_refused() {
    let job = Job::new("ps-async", 0, 1, 0);
    let run = |value: &str| {
        let launch = job.ps_launch(0);
        Command::new(env!("CARGO_BIN_EXE_tandem"))
            .args(["ps", "--port", "0"])
            .envs(launch.to_vars())
            .env(env::STATUS_PORT, value)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let out = run("not-a-port").wait_with_output().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(env::STATUS_PORT), "{stderr}");

    let mut child = Running(run("off"));
    let mut lines = BufReader::new(child.0.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    assert!(first.starts_with("listening on "), "{first}");
    assert_eq!(lines.next().unwrap().unwrap(), "status off");
}
