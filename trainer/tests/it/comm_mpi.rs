//! The `mpi` collective backend under a real `mpirun`: every op against the serial reference on 2–6
//! ranks, split communicators, fused against per-tensor allreduce, and the benchmark's JSON.
#![cfg(feature = "mpi")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Output};

const TANDEM: &str = env!("CARGO_BIN_EXE_tandem");

fn mpirun(ranks: usize, args: &[&str]) -> Output {
    Command::new("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "-np", &ranks.to_string(), TANDEM, "comm-rank"])
        .args(args)
        .output()
        .expect("mpirun is not installed: run `make deps`")
}

#[test]
fn every_collective_and_split_matches_the_serial_reference_on_2_to_6_ranks() {
    for n in 2..=6 {
        let out = mpirun(n, &["--backend", "mpi", "selftest", "--split"]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{n} ranks:\n{stdout}{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(stdout.matches("split group").count(), n, "every rank tests its half: {stdout}");
        assert_eq!(stdout.matches(": selftest passed").count(), n, "every rank tests the world: {stdout}");
    }
}

#[test]
fn bench_allreduce_over_mpi_prints_one_json_record_per_size() {
    let out = Command::new(TANDEM)
        .args([
            "bench",
            "allreduce",
            "--backend",
            "mpi",
            "--ranks",
            "2",
            "--bytes",
            "4K,64K",
            "--output",
            "json",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<serde_json::Value> =
        String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 2);
    for (line, bytes) in lines.iter().zip([4096, 65536]) {
        assert_eq!(line["backend"], "mpi");
        assert_eq!(line["ranks"], 2);
        assert_eq!(line["bytes"], bytes);
        // Two ranks: busbw = algbw · 2(n−1)/n = algbw.
        assert_eq!(line["busbw_gbps"], line["algbw_gbps"]);
    }
}
