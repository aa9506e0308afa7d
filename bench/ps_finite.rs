//! What the parameter server's finite check costs a push: the shard's own work on a push's floats
//! (decode the frame's bytes into floats, copy them into the group's gradient, and the SGD update
//! of the shard's weights, as `ps::server::state` does in async mode) before the check (a plain
//! copy) and after (`ps::server::finite::copy_finite`, which checks as it copies), with the
//! separate pass `first_non_finite` (elastic pushes, inits) alone beside them; the check as it
//! ships (this file includes its source), alternating in one run. Prints a table and one JSON
//! record per push size: the fastest of the rounds, which on a shared machine is the least
//! disturbed.
//!
//! Not a cargo target, so it builds in seconds without the trainer:
//!   rustc -C opt-level=3 --edition 2024 bench/ps_finite.rs -o target/ps_finite && target/ps_finite
//! (`make bench-ps-finite` does both.) Figures only count on a quiet machine:
//! `/work/shared/tools/quiet-run -- make bench-ps-finite`.

#![allow(dead_code)]

#[path = "../trainer/src/ps/server/finite.rs"]
mod finite;

use std::hint::black_box;
use std::time::Instant;

/// The wire's float decode (`ps::wire`, `Reader::floats`).
fn decode(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// The shard's work on a push without the check: decode, copy into the gradient, SGD update.
fn push_before(bytes: &[u8], grad: &mut [f32], weights: &mut [f32]) {
    let values = decode(bytes);
    grad.copy_from_slice(&values);
    for (w, g) in weights.iter_mut().zip(grad.iter()) {
        *w -= 1e-3 * *g;
    }
}

/// The same with the finite check, as the copy into the gradient.
fn push_after(bytes: &[u8], grad: &mut [f32], weights: &mut [f32]) -> bool {
    let values = decode(bytes);
    if !finite::copy_finite(grad, &values) {
        return false;
    }
    for (w, g) in weights.iter_mut().zip(grad.iter()) {
        *w -= 1e-3 * *g;
    }
    true
}

fn fastest(v: Vec<f64>) -> f64 {
    v.into_iter().fold(f64::MAX, f64::min)
}

fn main() {
    let rounds: usize = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(7);
    // A small push, an MLP's whole gradient, and the largest one frame carries (16 MiB).
    println!("{:>10} {:>12} {:>12} {:>12} {:>9}", "floats", "before µs", "after µs", "pass µs", "overhead");
    for n in [16_384usize, 235_146, (16 << 20) / 4 - 16] {
        let bytes: Vec<u8> = (0..n).flat_map(|i| ((i % 97) as f32 * 1e-3 - 0.05).to_le_bytes()).collect();
        let values = decode(&bytes);
        let (mut grad, mut weights) = (vec![0.0f32; n], vec![0.5f32; n]);
        let reps = (64 << 20) / (n * 4) + 1;
        let (mut before, mut after, mut check) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..rounds {
            let t = Instant::now();
            for _ in 0..reps {
                push_before(black_box(&bytes), &mut grad, &mut weights);
            }
            before.push(t.elapsed().as_secs_f64() / reps as f64);
            let t = Instant::now();
            for _ in 0..reps {
                assert!(push_after(black_box(&bytes), &mut grad, &mut weights));
            }
            after.push(t.elapsed().as_secs_f64() / reps as f64);
            let t = Instant::now();
            for _ in 0..reps {
                assert!(finite::first_non_finite(black_box(&values)).is_none());
            }
            check.push(t.elapsed().as_secs_f64() / reps as f64);
        }
        // What the change replaced, alone: the plain copy into the gradient, and the checked one.
        let (mut copy, mut checked) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            let t = Instant::now();
            for _ in 0..reps {
                grad.copy_from_slice(black_box(&values));
                black_box(&mut grad);
            }
            copy.push(t.elapsed().as_secs_f64() / reps as f64);
            let t = Instant::now();
            for _ in 0..reps {
                assert!(finite::copy_finite(&mut grad, black_box(&values)));
                black_box(&mut grad);
            }
            checked.push(t.elapsed().as_secs_f64() / reps as f64);
        }
        let (copy, checked) = (fastest(copy) * 1e6, fastest(checked) * 1e6);
        println!("{:>10} copy alone {copy:.2} µs, checked copy alone {checked:.2} µs", "");
        println!(
            "{{\"bench\":\"ps-finite-copy\",\"floats\":{n},\"copy_us\":{copy:.2},\"checked_copy_us\":{checked:.2}}}"
        );
        black_box(&weights);
        let (b, a, c) = (fastest(before) * 1e6, fastest(after) * 1e6, fastest(check) * 1e6);
        let overhead = (a / b - 1.0) * 100.0;
        println!("{n:>10} {b:>12.1} {a:>12.1} {c:>12.1} {overhead:>8.1}%");
        println!(
            "{{\"bench\":\"ps-finite\",\"floats\":{n},\"before_us\":{b:.2},\"after_us\":{a:.2},\"separate_pass_us\":{c:.2},\"separate_pass_gb_s\":{:.2},\"overhead_pct\":{overhead:.2}}}",
            (n * 4) as f64 / (c * 1e-6) / 1e9
        );
    }
}
