//! Faults against real `tandem ps` processes: hostile bytes and wrong tokens while a group
//! trains, and a PS replica killed and restarted from its checkpoint shard.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use crate::ps_common::{Job, TOKEN, addrs, eventually, worker_config};
use tandem_input::DataCursor;
use tandem_ps::client::{ClientError, PsClient};
use tandem_ps::wire::{self, ErrorCode, Frame, PROTOCOL_VERSION, Peer};

/// A raw connection, past the server's challenge, with the challenge's nonce.
pub fn raw_challenged(addr: &str) -> (TcpStream, [u8; wire::NONCE_LEN]) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let Frame::Challenge { nonce } = reply(&mut s) else { panic!("the server opens with a challenge") };
    (s, nonce)
}

fn raw(addr: &str) -> TcpStream {
    raw_challenged(addr).0
}

pub fn hello(
    token: &str,
    challenge: &[u8; wire::NONCE_LEN],
    peer: Peer,
    total_len: u64,
    total_steps: u64,
) -> Frame {
    let nonce = [0x5c; wire::NONCE_LEN];
    let proof = wire::hello_proof(token.as_bytes(), challenge, &nonce, peer, total_len, total_steps);
    Frame::Hello { proof, nonce, peer, total_len, total_steps }
}

pub fn send(s: &mut TcpStream, frame: &Frame) {
    wire::write_frame(s, frame).unwrap();
}

pub fn reply(s: &mut TcpStream) -> Frame {
    wire::read_frame(s, wire::DEFAULT_MAX_FRAME).unwrap()
}

pub fn refused_with(frame: Frame, want: ErrorCode) -> bool {
    matches!(frame, Frame::Error { code, .. } if code == want)
}

/// After a refusal that ends the session, the server closes: the next read sees end of stream
/// (or a reset, when the server closed with our unread bytes still queued).
pub fn closed(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 1];
    match s.read(&mut b) {
        Ok(0) => true,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
        Ok(_) => false,
    }
}

#[test]
fn hostile_bytes_and_wrong_tokens_are_refused_while_training_goes_on() {
    let job = Job::new("ps-sync", 0, 1, 0);
    let ps = job.spawn_ps(0, 0);
    let servers = vec![ps.addr.clone()];
    let n = 8usize;
    let steps = 40u64;
    let mut trainer = job.worker(&servers, 0, 0, n as u64);
    trainer.init(0, &vec![0.0; n]).unwrap();
    trainer.join().unwrap();
    let training = std::thread::spawn(move || {
        let mut w = vec![0.0; n];
        for _ in 0..steps {
            trainer.push(0, 0, &vec![1.0; n]).unwrap();
            trainer.pull(0, &mut w).unwrap();
        }
        w
    });

    // An HTTP request is not a frame: refused, and the connection closed (the stream is lost).
    let mut s = raw(&ps.addr);
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    assert!(refused_with(reply(&mut s), ErrorCode::Malformed));
    assert!(closed(&mut s));

    // A frame before hello.
    let mut s = raw(&ps.addr);
    send(&mut s, &Frame::Pull { offset: 0, len: 8 });
    assert!(refused_with(reply(&mut s), ErrorCode::Unauthenticated));
    assert!(closed(&mut s));

    // A wrong token, on a worker hello and an observer hello; and a right proof replayed on
    // another connection (it covers the first connection's challenge only).
    for peer in [Peer::Worker { group: 0, rank: 0, attempt: 0 }, Peer::Observer] {
        let (mut s, nonce) = raw_challenged(&ps.addr);
        send(&mut s, &hello("not-the-token", &nonce, peer, 8, 1000));
        assert!(refused_with(reply(&mut s), ErrorCode::Unauthenticated));
        assert!(closed(&mut s));
    }
    let (_first, nonce) = raw_challenged(&ps.addr);
    let mut s = raw(&ps.addr);
    send(&mut s, &hello(TOKEN, &nonce, Peer::Observer, 0, 0));
    assert!(refused_with(reply(&mut s), ErrorCode::Unauthenticated), "a replayed proof is refused");
    assert!(closed(&mut s));

    // A header announcing a 1 GiB body is refused before anything is read.
    let mut s = raw(&ps.addr);
    let mut header = (1u32 << 30).to_be_bytes().to_vec();
    header.extend_from_slice(&[b'T', b'P', PROTOCOL_VERSION, 0x05]);
    s.write_all(&header).unwrap();
    assert!(refused_with(reply(&mut s), ErrorCode::TooLarge));
    assert!(closed(&mut s));

    // After a proper hello: an unknown kind and a truncated body are answered, and the session goes on.
    let (mut s, nonce) = raw_challenged(&ps.addr);
    send(&mut s, &hello(TOKEN, &nonce, Peer::Observer, 0, 0));
    assert!(matches!(reply(&mut s), Frame::Welcome { shard: 0, .. }));
    s.write_all(&[0, 0, 0, 2, b'T', b'P', PROTOCOL_VERSION, 0x42, 1, 2]).unwrap();
    assert!(refused_with(reply(&mut s), ErrorCode::UnknownFrame));
    s.write_all(&[0, 0, 0, 3, b'T', b'P', PROTOCOL_VERSION, 0x06, 1, 2, 3]).unwrap();
    assert!(refused_with(reply(&mut s), ErrorCode::Malformed));
    send(&mut s, &Frame::Push { offset: 0, step: 0, values: vec![9.0; 8] });
    assert!(refused_with(reply(&mut s), ErrorCode::Protocol), "observers cannot push");
    send(&mut s, &Frame::StatusRequest);
    let Frame::Status(json) = reply(&mut s) else { panic!("status expected") };
    let status: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert!(status["refused"].as_u64().unwrap() >= 8, "{status}");

    // A connection that sends half a header and stalls does not hold anyone up.
    let mut stalled = raw(&ps.addr);
    stalled.write_all(&[0, 0]).unwrap();

    let w = training.join().unwrap();
    assert_eq!(
        w,
        vec![-(steps as f32); n],
        "every step of the real client was applied, none of the hostile ones"
    );
    let log = ps.log_text();
    assert!(log.contains("frame refused") && log.contains("wrong job token"), "refusals are logged:\n{log}");
    let _ = stalled;
}

#[test]
fn a_killed_ps_replica_resumes_from_its_checkpoint_shard() {
    let every = 5u64;
    let job = Job::new("ps-sync", 0, 2, every);
    let mut ps = vec![job.spawn_ps(0, 0), job.spawn_ps(1, 0)];
    let servers = addrs(&ps);
    let n = 9usize;
    let mut client = PsClient::connect(worker_config(&servers, 0, 0, 0, n as u64)).unwrap();
    let init: Vec<f32> = (0..n).map(|i| i as f32).collect();
    client.init(0, &init).unwrap();
    client.join().unwrap();
    // Distinct gradients per step, so weights at every version are distinguishable.
    let grad = |t: u64| -> Vec<f32> { (0..n).map(|i| 0.01 * (t + 1) as f32 * (i + 1) as f32).collect() };
    let mut history = vec![init.clone()];
    let mut w = init.clone();
    for t in 0..12 {
        client.push(t, 0, &grad(t)).unwrap();
        client.pull(0, &mut w).unwrap();
        history.push(w.clone());
    }
    let shard1 = client.ranges()[1].clone();
    let (a, b) = (shard1.start as usize, shard1.end as usize);

    ps[1].kill();
    let err = client.push(12, 0, &grad(12)).err().or_else(|| {
        let mut w = vec![0.0; n];
        client.pull(0, &mut w).err()
    });
    let msg = err.map(|e| e.to_string()).unwrap_or_default();
    assert!(msg.contains(&format!("PS 1 at {}", servers[1])), "errors name the shard and address: {msg}");

    // Restarted on the same port, it resumes from version 10: the newest multiple of 5, at most 5 lost.
    ps[1] = job.spawn_ps(1, ps[1].port());
    client.reconnect().unwrap();
    let mut observer = job.observer(&servers);
    let status = observer.status(1).unwrap();
    assert_eq!(status["version"], 10, "{status}");
    assert!(ps[1].log_text().contains("resumed from checkpoint"));
    let mut now = vec![0.0; n];
    client.pull(0, &mut now).unwrap();
    assert_eq!(&now[a..b], &history[10][a..b], "shard 1 holds exactly its weights of step 10");
    // Shard 0 kept its own progress; it took the step-12 push if that push reached it first.
    assert!(
        now[..a] == history[12][..a]
            || now[..a]
                == history[12][..a].iter().zip(&grad(12)[..a]).map(|(w, g)| w - g).collect::<Vec<_>>()
    );

    // Training goes on against the restarted replica.
    for t in 13..20 {
        client.push(t, 0, &grad(t)).unwrap();
        client.pull(0, &mut now).unwrap();
    }
    assert_eq!(observer.status(1).unwrap()["version"], 17);
}

#[test]
fn a_gracefully_stopped_ps_loses_no_update() {
    let job = Job::new("ps-async", 3, 1, 1000);
    let mut ps = job.spawn_ps(0, 0);
    let servers = vec![ps.addr.clone()];
    let mut client = PsClient::connect(worker_config(&servers, 0, 0, 0, 4)).unwrap();
    client.init(0, &[1.0; 4]).unwrap();
    client.join().unwrap();
    let mut w = [0.0f32; 4];
    for step in 0..7 {
        client.push(step, 0, &[0.25; 4]).unwrap();
        client.pull(0, &mut w).unwrap();
    }
    let status = ps.terminate();
    assert_eq!(
        status.code(),
        Some(tandem_api::contract::EXIT_PREEMPTED),
        "SIGTERM: a last checkpoint, then the retryable code, not {status:?}:\n{}",
        ps.log_text()
    );
    let ps = job.spawn_ps(0, ps.port());
    assert!(matches!(client.pull(0, &mut w), Err(ClientError::Lost { .. })));
    client.reconnect().unwrap();
    let mut again = [0.0f32; 4];
    let version = client.pull(0, &mut again).unwrap();
    assert_eq!((version, again), (7, w), "the last checkpoint written at shutdown holds every update");
    eventually("the log to mention the resume", || ps.log_text().contains("resumed from checkpoint"));
}

#[test]
fn a_restarted_ps_keeps_each_groups_reported_step_data_cursors_and_applied_steps_for_its_restarted_groups() {
    let job = Job::new("ps-async", 0, 1, 1000);
    let mut ps = job.spawn_ps(0, 0);
    let servers = vec![ps.addr.clone()];
    let mut client = PsClient::connect(worker_config(&servers, 0, 0, 0, 4)).unwrap();
    client.init(0, &[1.0; 4]).unwrap();
    client.join().unwrap();
    client.push(0, 0, &[0.25; 4]).unwrap();
    let reported = wire::Progress {
        step: 42,
        loss: Some(0.5),
        accuracy: Some(0.75),
        samples: 1344,
        epoch: 1,
        cursors: vec![DataCursor { epoch: 1, batch: 2, sample: Some(69) }],
        ..wire::Progress::default()
    };
    client.report(reported.clone()).unwrap();
    let status = ps.terminate();
    assert_eq!(
        status.code(),
        Some(tandem_api::contract::EXIT_PREEMPTED),
        "SIGTERM: a last checkpoint, then the retryable code, not {status:?}:\n{}",
        ps.log_text()
    );

    // The PS and group 0 restart together: the group's new attempt reads its step from the PS.
    let ps = job.spawn_ps(0, ps.port());
    let mut again = PsClient::connect(worker_config(&servers, 0, 0, 1, 4)).unwrap();
    // With the ranks' data cursors after that step, from the PS's checkpoint.
    let kept = again.reported(0).unwrap().unwrap_or_else(|| panic!("nothing kept:\n{}", ps.log_text()));
    assert_eq!((kept.step, kept.cursors), (42, reported.cursors), "{}", ps.log_text());
    assert_eq!(again.reported(1).unwrap(), None, "no other group reported");
    // And its last step the shard applied whole, so a step it had applied is not applied again.
    assert_eq!(again.kept(0).unwrap().contributed, Some(1), "{}", ps.log_text());
    again.join().unwrap();
    let mut w = [0.0f32; 4];
    assert_eq!(again.pull(0, &mut w).unwrap(), 1, "the restarted group trains on");
}

#[test]
fn a_worker_of_another_mode_is_refused_and_one_of_another_run_length_runs_the_jobs() {
    let job = Job::new("ps-sync", 0, 1, 0);
    let ps = job.spawn_ps(0, 0);
    let servers = vec![ps.addr.clone()];
    let elastic =
        worker_config(&servers, 0, 0, 0, 4).run(1000, tandem_api::PsMode::Elastic { alpha: 0.5, tau: 1 });
    let err = PsClient::connect(elastic).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err.contains("runs sync but this worker's algorithm needs elastic"), "{err}");
    let mut first = PsClient::connect(worker_config(&servers, 0, 0, 0, 4)).unwrap();
    first.init(0, &[0.0; 4]).unwrap();
    assert_eq!(first.run_steps(), 1000, "the first worker sets the run's length");
    // A group added by scaling an `epochs` job counts another length with its group count: the
    // servers welcome it with the job's.
    let mut shorter = worker_config(&servers, 1, 0, 0, 4);
    shorter.total_steps = 600;
    assert_eq!(PsClient::connect(shorter).unwrap().run_steps(), 1000);
}

#[test]
fn a_client_with_the_wrong_token_is_refused_with_an_error_that_says_so() {
    let job = Job::new("ps-sync", 0, 1, 0);
    let ps = job.spawn_ps(0, 0);
    let servers = vec![ps.addr.clone()];
    let mut config = worker_config(&servers, 0, 0, 0, 4);
    config.token = "not-this-jobs-token".into();
    let err = PsClient::connect(config).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err.contains("wrong job token") && err.contains("same token file"), "{err}");
    // The right token still works.
    PsClient::connect(worker_config(&servers, 0, 0, 0, 4)).unwrap();
}
