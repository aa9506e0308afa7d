//! `engine-step [steps] [threads] [--model mlp|cnn] [--no-peak]`: the engine's training step on the trainer's MLP [256, 128] and
//! LeNet CNN (16/32 channels, dense 128), batch 64, synthetic MNIST-shaped data: forward, backward
//! and an SGD-momentum update (μ 0.9, PyTorch's rule) over the flat vectors. Prints one JSON object
//! per model with samples/s, the step breakdown, the GEMM work's GFLOP/s and its fraction of this
//! machine's GEMM peak at the model's shapes (measured here with the same GEMM and threads).
//! `bench/train.sh` runs it beside PyTorch.

use std::time::Instant;

use tandem_kernels::models;
use tandem_kernels::net::Network;
use tandem_kernels::peak::{self, PeakOptions, Shape};

fn main() {
    let all: Vec<String> = std::env::args().skip(1).collect();
    let mut only: Option<String> = None;
    let mut with_peak = true;
    let mut positional = Vec::new();
    let mut it = all.into_iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--model" => only = it.next(),
            "--no-peak" => with_peak = false,
            _ => positional.push(a),
        }
    }
    let mut args = positional.into_iter();
    let steps: usize = parse(args.next(), 200, "steps");
    let threads: usize = parse(args.next(), 1, "threads");
    let batch = 64;
    let (c, h, w, classes) = (1, 28, 28, 10);
    let samples = batch * 50;
    // Deterministic MNIST-shaped data in [0, 1) (the values do not change the cost).
    let mut seed = 0x1234_5678_9abc_def0u64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 40) as f32 / (1u64 << 24) as f32
    };
    let data: Vec<f32> = (0..samples * c * h * w).map(|_| next()).collect();
    let labels: Vec<u32> = (0..samples).map(|_| (next() * classes as f32) as u32 % classes as u32).collect();
    let nets = [
        ("mlp", models::mlp(c * h * w, &[256, 128], classes, threads), mlp_shapes()),
        ("cnn", models::lenet((c, h, w), [16, 32], &[128], classes, threads), cnn_shapes()),
    ];
    for (name, net, shapes) in nets {
        if only.as_deref().is_some_and(|m| m != name) {
            continue;
        }
        let shapes = if with_peak { shapes } else { Vec::new() };
        let mut net = match net {
            Ok(n) => n,
            Err(e) => fail(&format!("building the {name}: {e}")),
        };
        let record = bench(&mut net, name, steps, batch, &data, &labels, shapes);
        println!("{record}");
    }
}

fn mlp_shapes() -> Vec<Shape> {
    peak::step_shapes().into_iter().filter(|s| s.name.starts_with("mlp")).collect()
}

fn cnn_shapes() -> Vec<Shape> {
    peak::step_shapes().into_iter().filter(|s| s.name.starts_with("cnn")).collect()
}

#[allow(clippy::too_many_arguments)]
fn bench(
    net: &mut Network,
    name: &str,
    steps: usize,
    batch: usize,
    data: &[f32],
    labels: &[u32],
    shapes: Vec<Shape>,
) -> serde_json::Value {
    let n = net.num_params();
    let f = net.input_features();
    let mut params = vec![0.0; n];
    let mut state = vec![0.0; net.num_state()];
    let mut grads = vec![0.0; n];
    let mut velocity = vec![0.0; n];
    let mut seed = 7u64;
    let mut uniform = |lo: f32, hi: f32| {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        lo + (hi - lo) * ((seed >> 40) as f32 / (1u64 << 24) as f32)
    };
    if let Err(e) = net.init(&mut params, &mut state, &mut uniform) {
        fail(&format!("initialising the {name}: {e}"));
    }
    let batches = labels.len() / batch;
    let (lr, mu) = (0.01f32, 0.9f32);
    let warmup = steps / 10 + 5;
    let (mut t_compute, mut t_opt, mut total) = (0.0f64, 0.0f64, 0.0f64);
    let mut last_loss = 0.0;
    for i in 0..warmup + steps {
        let j = i % batches;
        let (x, y) = (&data[j * batch * f..(j + 1) * batch * f], &labels[j * batch..(j + 1) * batch]);
        let t0 = Instant::now();
        match net.forward_backward(&params, &mut state, &mut grads, x, y) {
            Ok(s) => last_loss = s.loss,
            Err(e) => fail(&format!("{name} step: {e}")),
        }
        let t1 = Instant::now();
        for ((p, &g), v) in params.iter_mut().zip(&grads).zip(velocity.iter_mut()) {
            *v = mu * *v + g;
            *p -= lr * *v;
        }
        let t2 = Instant::now();
        if i >= warmup {
            t_compute += (t1 - t0).as_secs_f64();
            t_opt += (t2 - t1).as_secs_f64();
            total += (t2 - t0).as_secs_f64();
        }
    }
    // Forward alone (evaluation mode), to split the compute phase.
    let x = &data[..batch * f];
    let y = &labels[..batch];
    let t0 = Instant::now();
    for _ in 0..steps {
        if let Err(e) = net.evaluate(&params, &state, x, y) {
            fail(&format!("{name} forward: {e}"));
        }
    }
    let forward = t0.elapsed().as_secs_f64() / steps as f64;
    let per = |v: f64| v / steps as f64 * 1e3;
    let flops = net.step_flops(batch);
    let step_s = total / steps as f64;
    let gflops = flops / step_s / 1e9;
    let threads = net.threads();
    let opts = PeakOptions { threads: vec![threads], seconds: 0.2, shapes, references: false };
    let gemm_peak = if opts.shapes.is_empty() {
        0.0
    } else {
        peak::measure(&opts).iter().map(|r| r.gflops).fold(0.0, f64::max)
    };
    serde_json::json!({
        "impl": "tandem-engine",
        "model": name,
        "batch": batch,
        "steps": steps,
        "threads": threads,
        "parameters": n,
        "samples_per_second": (steps * batch) as f64 / total,
        "ms_per_step": per(total),
        "breakdown_ms": {
            "forward": forward * 1e3,
            "backward": per(t_compute) - forward * 1e3,
            "optimizer": per(t_opt),
        },
        "gflop_per_step": flops / 1e9,
        "gflops": gflops,
        "gemm_peak_gflops": gemm_peak,
        "fraction_of_peak": if gemm_peak > 0.0 { gflops / gemm_peak } else { 0.0 },
        "final_loss": last_loss,
    })
}

fn parse(arg: Option<String>, default: usize, what: &str) -> usize {
    match arg {
        None => default,
        Some(a) => match a.parse::<usize>() {
            Ok(v) if v >= 1 => v,
            _ => fail(&format!(
                "{what} must be a whole number ≥ 1, got {a:?}; usage: engine-step [steps] [threads]"
            )),
        },
    }
}

fn fail(msg: &str) -> ! {
    eprintln!("engine-step: {msg}");
    std::process::exit(2);
}
