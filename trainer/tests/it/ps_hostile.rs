//! Hostile peers against a real `tandem ps` on loopback, before they prove the job token: each
//! gets one answer at most and a close, floods cost the server bounded memory and log, many of
//! them do not keep a real client from its hello, and an absurd hello size is refused without
//! harming the shard. Bounds are asserted on memory and counts, never on speed.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use crate::ps_common::{Job, TOKEN, eventually, worker_config};
use crate::ps_faults::{closed, hello, raw_challenged, refused_with, reply, send};
use tandem_ps::client::{ClientConfig, PsClient};
use tandem_ps::wire::{self, ErrorCode, Frame, PROTOCOL_VERSION, Peer};

const MIB: u64 = 1 << 20;

/// A connection to `addr` from the loopback address `source` (127.0.0.0/8 is all loopback).
fn connect_from(rt: &tokio::runtime::Runtime, source: Ipv4Addr, addr: &str) -> std::io::Result<TcpStream> {
    let addr: SocketAddr = addr.parse().unwrap();
    rt.block_on(async {
        let socket = tokio::net::TcpSocket::new_v4()?;
        socket.bind(SocketAddr::from((source, 0)))?;
        let stream = socket.connect(addr).await?.into_std()?;
        stream.set_nonblocking(false)?;
        Ok(stream)
    })
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

/// A header of `kind` announcing `len` body bytes, in protocol `version`.
fn header(len: u32, version: u8, kind: u8) -> Vec<u8> {
    let mut h = len.to_be_bytes().to_vec();
    h.extend_from_slice(&[b'T', b'P', version, kind]);
    h
}

#[test]
fn before_its_hello_a_connection_gets_one_answer_and_then_the_close() {
    let job = Job::new("ps-sync", 0, 1, 0);
    let ps = job.spawn_ps(0, 0);

    // An unknown kind, then a known non-hello kind: one refusal each, then the close (the server
    // once answered and kept reading, without a deadline, for ever).
    for kind in [0x42u8, 0x03] {
        let (mut s, _) = raw_challenged(&ps.addr);
        s.write_all(&header(0, PROTOCOL_VERSION, kind)).unwrap();
        // More frames behind it are not answered.
        for _ in 0..100 {
            s.write_all(&header(0, PROTOCOL_VERSION, kind)).unwrap();
        }
        let answer = reply(&mut s);
        assert!(refused_with(answer.clone(), ErrorCode::Unauthenticated), "kind 0x{kind:02x}: {answer:?}");
        assert!(closed(&mut s), "kind 0x{kind:02x}: closed after one answer");
    }

    // A hello whose body is cut short is malformed: refused and closed.
    let (mut s, _) = raw_challenged(&ps.addr);
    s.write_all(&header(10, PROTOCOL_VERSION, wire::HELLO_KIND)).unwrap();
    s.write_all(&[0; 10]).unwrap();
    assert!(refused_with(reply(&mut s), ErrorCode::Malformed));
    assert!(closed(&mut s));

    // A hello larger than a hello can be is refused from its header, before its body is read.
    let (mut s, _) = raw_challenged(&ps.addr);
    s.write_all(&header(16 << 20, PROTOCOL_VERSION, wire::HELLO_KIND)).unwrap();
    let Frame::Error { code: ErrorCode::TooLarge, message } = reply(&mut s) else {
        panic!("too large expected")
    };
    assert!(message.contains(&format!("limit of {} bytes", wire::MAX_HELLO_FRAME)), "{message}");
    assert!(closed(&mut s));

    // A peer of the previous protocol version is told so, with both versions.
    let (mut s, nonce) = raw_challenged(&ps.addr);
    let mut old = Vec::new();
    wire::encode(&hello(TOKEN, &nonce, Peer::Observer, 0, 0), &mut old);
    old[6] = PROTOCOL_VERSION - 1;
    s.write_all(&old).unwrap();
    let Frame::Error { message, .. } = reply(&mut s) else { panic!("a refusal expected") };
    assert!(
        message.contains(&format!("protocol version {} is not supported", PROTOCOL_VERSION - 1))
            && message.contains(&format!("speaks {PROTOCOL_VERSION}"))
            && message.contains("same tandem image"),
        "{message}"
    );
    assert!(closed(&mut s));

    // A peer that trickles a byte now and then is closed at the hello deadline (5 s here), with
    // one refusal that says why.
    let (mut s, nonce) = raw_challenged(&ps.addr);
    let mut trickle = Vec::new();
    wire::encode(&hello(TOKEN, &nonce, Peer::Observer, 0, 0), &mut trickle);
    let mut trickle = trickle.into_iter();
    let started = Instant::now();
    let mut answer = Vec::new();
    s.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
    loop {
        assert!(started.elapsed() < Duration::from_secs(60), "the trickling peer was never closed");
        // 85 bytes at one per 300 ms: the whole hello would take 25 s.
        if let Some(b) = trickle.next()
            && s.write_all(&[b]).is_err()
        {
            break;
        }
        let mut b = [0u8; 256];
        match s.read(&mut b) {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&b[..n]),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
    }
    let text = String::from_utf8_lossy(&answer);
    assert!(text.contains("no hello proving the job token within 5s"), "{text:?}");

    // A real client is served as ever.
    PsClient::connect(worker_config(std::slice::from_ref(&ps.addr), 0, 0, 0, 8)).unwrap();
}

#[test]
fn many_hostile_connections_do_not_keep_a_real_client_from_its_hello() {
    let job = Job::new("ps-sync", 0, 1, 0);
    let ps = job.spawn_ps(0, 0);
    let rt = runtime();
    // Silent connections: 400 from one address (past its bound of 64), 40 from each of ten more
    // (past the bound of 256 in all).
    let mut silent = Vec::new();
    for i in 0..400 {
        silent.push(
            connect_from(&rt, Ipv4Addr::new(127, 0, 0, 2), &ps.addr).unwrap_or_else(|e| panic!("{i}: {e}")),
        );
    }
    for host in 10..20 {
        for _ in 0..40 {
            silent.push(connect_from(&rt, Ipv4Addr::new(127, 0, 0, host), &ps.addr).unwrap());
        }
    }
    // And 1,000 connections that each send one frame and then keep the connection open.
    let addr = ps.addr.clone();
    let one_frame = std::thread::spawn(move || {
        let rt = runtime();
        let mut held = Vec::new();
        for i in 0..1000u32 {
            let Ok(mut s) = connect_from(&rt, Ipv4Addr::new(127, 0, 1, (i % 200) as u8 + 1), &addr) else {
                continue;
            };
            let _ = s.write_all(&header(0, PROTOCOL_VERSION, 0x42 + (i % 3) as u8));
            held.push(s);
        }
        held
    });

    // A real worker, from 127.0.0.1, says hello to the shard while all that goes on; its
    // timeouts are short, so a server that lets the hostile connections starve it fails this.
    let mut config = worker_config(std::slice::from_ref(&ps.addr), 0, 0, 0, 8);
    config.connect_timeout = Duration::from_secs(10);
    config.request_timeout = Duration::from_secs(10);
    let started = Instant::now();
    let mut client = PsClient::connect(config).expect("the real client is served");
    let hello_took = started.elapsed();
    client.init(0, &[0.0; 8]).unwrap();
    client.join().unwrap();
    let held = one_frame.join().unwrap();
    // Served again after the flood of one-frame connections, and an observer too.
    let mut observer = PsClient::connect(ClientConfig {
        request_timeout: Duration::from_secs(10),
        ..ClientConfig::observer(vec![ps.addr.clone()], TOKEN)
    })
    .unwrap();
    let status = observer.status(0).unwrap();
    let refused = status["refused"].as_u64().unwrap();
    println!(
        "real client's hello under {} silent and 1000 one-frame hostile connections: {hello_took:?}; refused so far {refused}",
        silent.len()
    );
    assert!(refused >= 400, "evictions and refusals are counted: {status}");
    let log = ps.log_text();
    let lines = log.lines().filter(|l| l.contains("unauthenticated peer refused")).count();
    println!("log lines about refused peers: {lines} for {refused} refusals");
    assert!(lines <= 60, "refusals are logged at a bounded rate, got {lines} lines for {refused}");
    drop((silent, held));
}

#[test]
fn a_flood_from_unauthenticated_peers_does_not_grow_the_server() {
    let job = Job::new("ps-sync", 0, 1, 0);
    let ps = job.spawn_ps(0, 0);
    // Let the process settle before the baseline.
    PsClient::connect(ClientConfig::observer(vec![ps.addr.clone()], TOKEN)).unwrap();
    let before = ps.rss();

    // 1.8 M frames of 8 bytes (14 MB) of an unknown kind, written without reading a reply; each
    // connection the server closes is replaced by a new one until all are sent.
    let frame = header(0, PROTOCOL_VERSION, 0x42);
    let chunk: Vec<u8> = frame.iter().copied().cycle().take(8 * 8192).collect();
    let total = 1_800_000u64 * 8;
    let (mut sent, mut connections) = (0u64, 0u32);
    while sent < total {
        let (mut s, _) = raw_challenged(&ps.addr);
        connections += 1;
        s.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
        while sent < total {
            match s.write(&chunk) {
                Ok(n) => sent += n as u64,
                Err(_) => break,
            }
        }
        assert!(connections < 100_000, "the server never closed a flooding connection");
    }
    let after_small = ps.rss();

    // 20 connections that each announce a 16 MiB hello and send it.
    let big: Vec<u8> = {
        let mut b = header(16 << 20, PROTOCOL_VERSION, wire::HELLO_KIND);
        b.resize(8 + (16 << 20), 0);
        b
    };
    let big = std::sync::Arc::new(big);
    let senders: Vec<_> = (0..20)
        .map(|_| {
            let (addr, big) = (ps.addr.clone(), big.clone());
            std::thread::spawn(move || {
                let (mut s, _) = raw_challenged(&addr);
                s.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
                let _ = s.write_all(&big);
                s
            })
        })
        .collect();
    let held: Vec<TcpStream> = senders.into_iter().map(|t| t.join().unwrap()).collect();
    let after_big = ps.rss();
    println!(
        "PS RSS: {:.1} MiB before, {:.1} MiB after 14 MB of 8-byte frames over {connections} connection(s), \
         {:.1} MiB with 20 connections that sent a 16 MiB hello",
        before as f64 / MIB as f64,
        after_small as f64 / MIB as f64,
        after_big as f64 / MIB as f64
    );
    assert!(
        after_small < before + 32 * MIB,
        "the small-frame flood grew the server: {before} → {after_small}"
    );
    assert!(after_big < before + 32 * MIB, "20 × 16 MiB hellos grew the server: {before} → {after_big}");
    let log = std::fs::metadata(&ps.log).unwrap().len();
    println!("PS log: {log} bytes");
    assert!(log < MIB, "refusals are logged at a bounded rate: the log has {log} bytes");
    drop(held);
    // And it serves a real client.
    PsClient::connect(worker_config(std::slice::from_ref(&ps.addr), 0, 0, 0, 8)).unwrap();
}

#[test]
fn an_absurd_hello_size_is_refused_on_the_wire_and_the_shard_lives_on() {
    // The default model (an MLP [256, 128] on 28×28 images) has 235,146 parameters.
    let job = Job::new("ps-sync", 0, 1, 0);
    let mut ps = job.spawn_ps(0, 0);
    let worker = Peer::Worker { group: 0, rank: 0, attempt: 0 };
    for absurd in [1u64 << 62, 1 << 34, 235_147] {
        let (mut s, nonce) = raw_challenged(&ps.addr);
        send(&mut s, &hello(TOKEN, &nonce, worker, absurd, 1000));
        let Frame::Error { code: ErrorCode::Mismatch, message } = reply(&mut s) else {
            panic!("{absurd}: a refusal expected")
        };
        assert!(
            message.contains(&format!("{absurd}-value")) && message.contains("at most 235146"),
            "{message}"
        );
        assert!(closed(&mut s));
    }
    // The shard was not sized by any of them and serves the plan's length.
    let servers = vec![ps.addr.clone()];
    let mut client = PsClient::connect(worker_config(&servers, 0, 0, 0, 235_146)).unwrap();
    client.init(0, &vec![0.5; 235_146]).unwrap();
    client.join().unwrap();
    let mut w = vec![0.0; 235_146];
    client.pull(0, &mut w).unwrap();
    assert!(w.iter().all(|&x| x == 0.5));
    drop(client);
    let status = ps.terminate();
    assert_eq!(
        status.code(),
        Some(tandem_api::contract::EXIT_PREEMPTED),
        "a healthy shard stops on SIGTERM with the retryable code: {status:?}"
    );
    eventually("the final checkpoint", || {
        job.output().join("ps-0").read_dir().is_ok_and(|mut d| d.next().is_some())
    });
}
