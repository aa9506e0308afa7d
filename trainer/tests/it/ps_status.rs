//! The HTTP status endpoint of a real `tandem ps` process: a proof of the job token guards it (the
//! token itself never crosses the wire), it serves the progress a worker group reported, and
//! hostile bytes or slow peers on it disturb neither it, its health probe, nor training.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::ps_common::{Job, TOKEN};
use tandem_api::contract::{PsStatus, env, status_auth};
use tandem_ps::wire::Progress;
use tandem_util::token::{hex, hmac, random_bytes};

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

/// The `Authorization` value proving `token` for `GET path` now, as the operator signs it.
fn signed(token: &str, path: &str) -> String {
    let unix = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let nonce = hex(&random_bytes::<16>().unwrap());
    let mac = hmac(token.as_bytes(), &[&status_auth::message("GET", path, unix, &nonce)]);
    status_auth::header(unix, &nonce, &hex(&mac))
}

fn get_with(addr: &str, path: &str, authorization: &str) -> (u16, String) {
    raw(addr, format!("GET {path} HTTP/1.1\r\nHost: ps\r\nAuthorization: {authorization}\r\n\r\n").as_bytes())
}

fn get(addr: &str, path: &str, token: Option<&str>) -> (u16, String) {
    match token {
        Some(t) => get_with(addr, path, &signed(t, path)),
        None => raw(addr, format!("GET {path} HTTP/1.1\r\nHost: ps\r\n\r\n").as_bytes()),
    }
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
        data_wait: 0.25,
        skipped: epoch.into(),
        cursors: vec![],
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
    // What the group waited on data, and skipped, as of its latest report.
    assert!(metrics.contains("tandem_ps_data_wait_ratio{shard=\"0\",group=\"0\"} 0.25\n"), "{metrics}");
    assert!(metrics.contains("tandem_ps_samples_skipped_total{shard=\"0\",group=\"0\"} 1\n"), "{metrics}");
    assert_eq!(
        (
            doc["groups"][0]["progress"]["data_wait"].as_f64(),
            doc["groups"][0]["progress"]["skipped"].as_u64()
        ),
        (Some(0.25), Some(1)),
        "{body}"
    );

    // The token guards status and metrics; the health probe needs none.
    assert_eq!(get(&status, "/status", None).0, 401);
    assert_eq!(get(&status, "/status", Some("wrong-token")).0, 401);
    assert_eq!(get(&status, "/metrics", Some(&format!("{TOKEN}x"))).0, 401);
    assert_eq!(
        raw(&status, format!("GET /status HTTP/1.1\r\nAuthorization: Basic {TOKEN}\r\n\r\n").as_bytes()).0,
        401
    );
    // The token in clear is no longer taken; a proof for another path, or one used already, is not
    // either.
    let (code, body) = get_with(&status, "/status", &format!("Bearer {TOKEN}"));
    assert_eq!(code, 401);
    assert!(body.contains("no longer takes the job token as a bearer"), "{body}");
    assert_eq!(get_with(&status, "/status", &signed(TOKEN, "/metrics")).0, 401);
    let once = signed(TOKEN, "/status");
    assert_eq!(get_with(&status, "/status", &once).0, 200);
    let (code, body) = get_with(&status, "/status", &once);
    assert_eq!(code, 401, "a replayed proof is refused");
    assert!(body.contains("used already"), "{body}");
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
    worker.push(0, 0, &[0.25; 8]).unwrap();
    // A light report (no evaluation) keeps the latest accuracy.
    worker
        .report(Progress {
            step: 21,
            loss: Some(0.25),
            accuracy: None,
            samples: 672,
            epoch: 1,
            ..Progress::default()
        })
        .unwrap();
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

/// Opens a connection that starts a request head and then sends one byte now and then.
fn slow_peer(addr: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(b"GET /status HTTP/1.1\r\nX-Slow: ").unwrap();
    s
}

/// `GET /healthz` with the operator's 3 s timeout (its `progress::FETCH_TIMEOUT`): the status
/// code, or `None` when no answer came in time.
fn probe(addr: &str) -> Option<u16> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(3))).ok()?;
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: ps\r\n\r\n").ok()?;
    let mut answer = String::new();
    s.read_to_string(&mut answer).ok()?;
    answer.split(' ').nth(1)?.parse().ok()
}

#[test]
fn slow_peers_on_the_status_port_do_not_delay_the_health_probe() {
    let job = Job::new("ps-async", 0, 1, 0);
    let ps = spawn_ps_with_status(&job);
    // 48 slow peers, more than the 32 the endpoint once served at once, then 200 (past its bounds).
    for slow in [48usize, 200] {
        let mut peers: Vec<TcpStream> = (0..slow).map(|_| slow_peer(&ps.status)).collect();
        let started = Instant::now();
        let mut answered = 0;
        for round in 0..12 {
            // Keep the slow peers trickling, as a slowloris does.
            for p in &mut peers {
                let _ = p.write_all(b"a");
            }
            let code = probe(&ps.status);
            assert_eq!(code, Some(200), "probe {round} under {slow} slow peers");
            answered += 1;
        }
        println!(
            "{answered} of 12 health probes answered under {slow} slow peers, in {:?}",
            started.elapsed()
        );
    }
    // The endpoint still serves status to the token holder.
    assert_eq!(get(&ps.status, "/status", Some(TOKEN)).0, 200);
}

#[test]
fn the_request_head_limit_is_exactly_as_documented() {
    let job = Job::new("ps-sync", 0, 1, 0);
    let ps = spawn_ps_with_status(&job);
    // A head of `len` bytes, its blank line included.
    let head = |len: usize| {
        let mut h = b"GET /healthz HTTP/1.1\r\nX-Pad: ".to_vec();
        h.resize(len - 4, b'a');
        h.extend_from_slice(b"\r\n\r\n");
        h
    };
    let limit = tandem::ps::server::http::MAX_HEAD;
    assert_eq!(limit, 8 * 1024, "documented as 8 KiB");
    assert_eq!(raw(&ps.status, &head(limit)), (200, "ok\n".to_owned()));
    // Heads up to about 9.2 KB once passed; the server reads all 8,193 bytes of this one, so its
    // answer is not cut by a reset.
    assert_eq!(raw(&ps.status, &head(limit + 1)).0, 431);
    let _ = &ps.addr;
}

/// The `Authorization` value proving `token` for `method target` now.
fn signed_for(token: &str, method: &str, target: &str) -> String {
    let unix = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let nonce = hex(&random_bytes::<16>().unwrap());
    let mac = hmac(token.as_bytes(), &[&status_auth::message(method, target, unix, &nonce)]);
    status_auth::header(unix, &nonce, &hex(&mac))
}

fn post(addr: &str, target: &str, authorization: Option<String>) -> (u16, String) {
    let auth = authorization.map(|a| format!("Authorization: {a}\r\n")).unwrap_or_default();
    raw(addr, format!("POST {target} HTTP/1.1\r\nHost: ps\r\n{auth}Content-Length: 0\r\n\r\n").as_bytes())
}

/// When `workers.groups` changes, the operator posts the new count to shard 0
/// (`POST /groups?count=<n>`): the next epoch is planned with it at once, and the mounted job
/// config — which a kubelet refreshes up to a minute later — no longer overrides it.
#[test]
fn a_posted_group_count_plans_the_next_epochs_before_the_mounted_config_says_it() {
    let mut spec = serde_json::json!({
        "training": {"algorithm": "ps-sync", "steps": 1000, "optimizer": {"kind": "sgd", "learningRate": 1.0}},
        "parameterServers": {"replicas": 1},
        "workers": {"groups": 3, "minGroups": 1, "maxGroups": 4}
    });
    spec["training"]["checkpoint"] = serde_json::json!({"everySteps": 0});
    let job = Job::with_spec(spec);
    let ps = spawn_ps_with_status(&job);
    let mut worker = job.worker(std::slice::from_ref(&ps.addr), 0, 0, 8);
    worker.init(0, &[0.5; 8]).unwrap();
    worker.join().unwrap();
    assert_eq!(worker.epochs(0).unwrap(), vec![3], "epoch 0 from the job config");

    let target = tandem_api::contract::groups_target(2);
    // Only a proof of the token over this method and target is taken.
    let (code, body) = post(&ps.status, &target, None);
    assert_eq!(code, 401, "{body}");
    let (code, body) = post(&ps.status, &target, Some(signed_for(TOKEN, "GET", &target)));
    assert_eq!(code, 401, "a GET's proof: {body}");
    assert!(body.contains("does not match"), "{body}");
    let (code, body) = get(&ps.status, &target, Some(TOKEN));
    assert_eq!(code, 405, "{body}");
    assert!(body.contains("only POST"), "{body}");
    for bad in ["/groups", "/groups?count=0", "/groups?count=two", "/groups?count=5000"] {
        let (code, body) = post(&ps.status, bad, Some(signed_for(TOKEN, "POST", bad)));
        assert_eq!(code, 400, "{bad}: {body}");
        assert!(body.contains("count=<n>"), "{body}");
    }
    let (code, body) = post(&ps.status, &target, Some(signed_for(TOKEN, "POST", &target)));
    assert_eq!(code, 204, "{body}");

    let (code, body) = get(&ps.status, "/status", Some(TOKEN));
    assert_eq!(code, 200, "{body}");
    let status: PsStatus = serde_json::from_str(&body).unwrap();
    assert_eq!(status.planned_groups, Some(2), "{body}");
    // The file still says 3 groups: the posted count plans the next epochs.
    assert_eq!(worker.epochs(2).unwrap(), vec![3, 2, 2]);
    let log = std::fs::read_to_string(job.dir.path().join("ps-status.log")).unwrap();
    assert!(log.contains("group count set by the operator"), "{log}");
}
