//! Peers that hold the job token but send what the job does not allow, against real `tandem ps`
//! processes on loopback: each bad field is refused with a message naming it, its value and the
//! bound, and the connection closed; the shard's version and the other groups' training go on,
//! a restart resumes from the newest checkpoint, and a NaN never reaches the weights.

use std::net::TcpStream;

use crate::ps_common::{Job, TOKEN, worker_config};
use crate::ps_faults::{closed, hello, raw_challenged, reply, send};
use tandem_api::contract::JobConfig;
use tandem_input::DataCursor;
use tandem_ps::client::{ClientError, PsClient};
use tandem_ps::wire::{ErrorCode, Frame, Peer, Progress};

const N: usize = 8;

/// A session past its hello as `peer` (the welcome read).
fn authed(addr: &str, peer: Peer) -> TcpStream {
    let (mut s, nonce) = raw_challenged(addr);
    send(&mut s, &hello(TOKEN, &nonce, peer, N as u64, 1000));
    let welcome = reply(&mut s);
    assert!(matches!(welcome, Frame::Welcome { .. }), "{peer:?}: {welcome:?}");
    s
}

/// Reads a refusal of `code` whose message says each of `says`, then the close.
fn refused(s: &mut TcpStream, code: ErrorCode, says: &[&str]) {
    let Frame::Error { code: got, message } = reply(s) else { panic!("a refusal expected") };
    assert_eq!(got, code, "{message}");
    for part in says {
        assert!(message.contains(part), "{message:?} should say {part:?}");
    }
    assert!(closed(s), "the connection is closed after: {message}");
}

/// A hello as `peer` on a new connection, refused with `says`.
fn hello_refused(addr: &str, peer: Peer, says: &[&str]) {
    let (mut s, nonce) = raw_challenged(addr);
    send(&mut s, &hello(TOKEN, &nonce, peer, N as u64, 1000));
    refused(&mut s, ErrorCode::OutOfBounds, says);
}

fn worker(group: u32, rank: u32) -> Peer {
    Peer::Worker { group, rank, attempt: 0 }
}

/// One step of both groups: each pushes 1 everywhere and pulls the weights back.
fn step_both(groups: &mut [PsClient; 2], step: u64) -> Vec<f32> {
    let mut w = vec![0.0; N];
    for g in groups.iter_mut() {
        g.push(step, 0, &[1.0; N]).unwrap();
        g.pull(0, &mut w).unwrap();
    }
    w
}

#[test]
fn every_bad_field_of_a_token_holder_is_refused_while_the_other_groups_train_and_resume() {
    // Bounded async (s = 2), plain SGD at rate 1, 1000 steps, at most 4 groups of 1 rank, a
    // checkpoint every 5 updates.
    let job = Job::with_spec(serde_json::json!({
        "training": {
            "algorithm": "ps-async",
            "steps": 1000,
            "staleness": 2,
            "optimizer": {"kind": "sgd", "learningRate": 1.0},
            "checkpoint": {"everySteps": 5}
        },
        "workers": {"groups": 2, "minGroups": 1, "maxGroups": 4, "groupSize": 1},
        "parameterServers": {"replicas": 1}
    }));
    let mut ps = job.spawn_ps(0, 0);
    let addr = ps.addr.clone();
    let servers = vec![addr.clone()];
    let mut groups = [job.worker(&servers, 0, 0, N as u64), job.worker(&servers, 1, 0, N as u64)];
    groups[0].init(0, &[0.0; N]).unwrap();
    for g in &mut groups {
        g.join().unwrap();
    }
    for t in 0..3 {
        step_both(&mut groups, t);
    }

    // Group and rank indices beyond the plan.
    hello_refused(&addr, worker(4, 0), &["group 4", "workers.maxGroups is 4"]);
    hello_refused(&addr, worker(u32::MAX, 0), &["group 4294967295", "workers.maxGroups is 4"]);
    hello_refused(&addr, worker(1_000_000, 0), &["group 1000000"]);
    hello_refused(&addr, worker(2, 1), &["rank 1 of group 2", "workers.groupSize is 1"]);

    // Steps beyond the run, and beyond the staleness window ahead of the group's last whole step.
    let push = |step: u64, offset: u64, len: usize| Frame::Push { offset, step, values: vec![1.0; len] };
    let mut s = authed(&addr, worker(2, 0));
    send(&mut s, &push(u64::MAX, 0, N));
    refused(&mut s, ErrorCode::OutOfBounds, &["group 2", "step 18446744073709551615", "below 1000"]);
    let mut s = authed(&addr, worker(2, 0));
    send(&mut s, &push(1000, 0, N));
    refused(&mut s, ErrorCode::OutOfBounds, &["group 2", "step 1000", "below 1000"]);
    let mut s = authed(&addr, worker(2, 0));
    send(&mut s, &Frame::Join);
    assert!(matches!(reply(&mut s), Frame::Joined { .. }));
    send(&mut s, &Frame::Push { offset: 0, step: 0, values: vec![0.0; N] });
    assert!(matches!(reply(&mut s), Frame::Ack { .. }), "a real step of group 2 (a zero gradient)");
    send(&mut s, &push(9, 0, N));
    refused(
        &mut s,
        ErrorCode::OutOfBounds,
        &["group 2", "step 9", "at most 2 steps ahead", "at most step 3"],
    );

    // Offsets and lengths beyond the layout.
    let mut s = authed(&addr, worker(2, 0));
    send(&mut s, &push(1, 6, 4));
    refused(&mut s, ErrorCode::BadRange, &["range 6..10", "0..8"]);
    let mut s = authed(&addr, worker(2, 0));
    send(&mut s, &Frame::Pull { offset: 0, len: 9 });
    refused(&mut s, ErrorCode::BadRange, &["range 0..9", "0..8"]);

    // Reports beyond the run or the group.
    for (progress, says) in [
        (
            Progress { step: u64::MAX, ..Progress::default() },
            &["report of group 2", "step 18446744073709551615"][..],
        ),
        (
            Progress { step: 1, samples: u64::MAX, ..Progress::default() },
            &["samples 18446744073709551615"][..],
        ),
        (
            Progress { step: 1, cursors: vec![DataCursor::at(0, 1); 2], ..Progress::default() },
            &["2 data cursors", "1 ranks"][..],
        ),
    ] {
        let mut s = authed(&addr, worker(2, 0));
        send(&mut s, &Frame::Report(progress));
        refused(&mut s, ErrorCode::OutOfBounds, says);
    }

    // A worker whose model diverged: its push of an infinity is refused, saying so.
    let mut diverged = job.worker(&servers, 3, 0, N as u64);
    diverged.join().unwrap();
    let mut grad = [1.0f32; N];
    grad[5] = f32::INFINITY;
    let err = diverged.push(0, 0, &grad).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, ClientError::Refused { code: ErrorCode::NonFinite, .. }), "{text}");
    assert!(text.contains("group 3 for step 0 holds inf at offset 5"), "{text}");
    drop(diverged);

    // The shard took none of it: the two groups train on, every step of theirs applied once.
    for t in 3..6 {
        step_both(&mut groups, t);
    }
    let mut w = vec![0.0; N];
    let version = groups[0].pull(0, &mut w).unwrap();
    assert_eq!(w, vec![-12.0; N], "6 steps of 2 groups; nothing of the refused frames");
    assert_eq!(version, 13, "12 steps of groups 0 and 1 and group 2's one zero step");
    let mut observer = job.observer(&servers);
    let status = observer.status(0).unwrap();
    let kept: Vec<(u64, Option<u64>)> = status["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| (g["group"].as_u64().unwrap(), g["contributed"].as_u64()))
        .collect();
    assert_eq!(kept, vec![(0, Some(6)), (1, Some(6)), (2, Some(1)), (3, None)], "{status}");

    // Raising maxGroups on the running job lets group 4 in: the server reads the bounds again.
    let path = job.dir.path().join("job.json");
    let mut config = JobConfig::from_json(&std::fs::read_to_string(&path).unwrap()).unwrap();
    config.spec.workers.max_groups = 5;
    std::fs::write(&path, config.to_json()).unwrap();
    drop(authed(&addr, worker(4, 0)));

    // A restart (SIGTERM writes a last checkpoint) resumes from the newest checkpoint, version 13.
    drop(groups);
    drop(observer);
    let port = ps.port();
    ps.terminate();
    let mut files: Vec<String> = std::fs::read_dir(job.output().join("ps-0"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(files, ["shard-0-v000000000010.ckpt", "shard-0-v000000000013.ckpt"]);
    let ps = job.spawn_ps(0, port);
    let log = ps.log_text();
    assert!(log.contains("resumed from checkpoint") && log.contains("version=13"), "{log}");
    let mut observer = job.observer(&servers);
    assert_eq!(observer.status(0).unwrap()["version"], 13);
    // Group 0's next attempt continues at its next step.
    let mut g0 = PsClient::connect(worker_config(&servers, 0, 0, 1, N as u64)).unwrap();
    g0.join().unwrap();
    assert_eq!(g0.kept(0).unwrap().contributed, Some(6));
    g0.push(6, 0, &[1.0; N]).unwrap();
    let version = g0.pull(0, &mut w).unwrap();
    assert_eq!((version, w), (14, vec![-13.0; N]));
}

#[test]
fn a_nan_push_is_refused_and_the_weights_stay_finite() {
    let job = Job::new("ps-sync", 0, 1, 0);
    let ps = job.spawn_ps(0, 0);
    let servers = vec![ps.addr.clone()];
    let mut healthy = job.worker(&servers, 0, 0, N as u64);
    let mut sick = job.worker(&servers, 1, 0, N as u64);
    healthy.init(0, &[0.0; N]).unwrap();
    healthy.join().unwrap();
    sick.join().unwrap();
    let mut w = vec![0.0; N];
    // Step 0: both groups, the mean of 1 and 3.
    healthy.push(0, 0, &[1.0; N]).unwrap();
    sick.push(0, 0, &[3.0; N]).unwrap();
    healthy.pull(0, &mut w).unwrap();
    assert_eq!(w, vec![-2.0; N]);
    // Step 1: group 1's gradient holds a NaN. Refused, naming the group, the step and where;
    // its connection closes, so the synchronous step completes with group 0 alone.
    healthy.push(1, 0, &[1.0; N]).unwrap();
    let mut grad = [3.0f32; N];
    grad[3] = f32::NAN;
    let err = sick.push(1, 0, &grad).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, ClientError::Refused { code: ErrorCode::NonFinite, .. }), "{text}");
    assert!(
        text.contains("push of group 1 for step 1 holds NaN at offset 3")
            && text.contains("weights stay finite")
            && text.contains("learningRate"),
        "{text}"
    );
    let version = healthy.pull(0, &mut w).unwrap();
    assert_eq!((version, &w), (2, &vec![-3.0; N]), "group 0's step alone; nothing of the NaN");
    let mut observer = job.observer(&servers);
    observer.pull(0, &mut w).unwrap();
    assert!(w.iter().all(|x| x.is_finite()), "{w:?}");
    let status = observer.status(0).unwrap();
    let members: Vec<u64> = status["groups"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|g| g["member"] == true)
        .map(|g| g["group"].as_u64().unwrap())
        .collect();
    assert_eq!(members, vec![0], "the refused group left: {status}");
}
