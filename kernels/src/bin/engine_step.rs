//! `engine-step [--models m1,m2,…] [--threads N] [--seconds S] [--no-peak] [--profile]`: the
//! engine's training step (forward, backward, SGD with momentum 0.9 as PyTorch's `torch.optim.SGD`)
//! on synthetic data, one model at a time, as `bench/train_torch.py` runs the same models in
//! PyTorch. Models (default all):
//! - `mlp`: 784 → 256 → 128 → 10, batch 64 (MNIST-shaped);
//! - `cnn`: the trainer's LeNet (5×5 convolutions with 16 and 32 channels, dense 128), batch 64;
//! - `resnet20`: CIFAR-style ResNet-20 on Fashion-MNIST's 1×28×28, 10 classes, batch 128;
//! - `resnet18`, `vgga`: ImageNet-shaped 3×224×224, 1,000 classes, batch 8;
//! - `gpt`: 4 layers, 4 heads, width 128, context 128, character vocabulary (65), batch 16.
//!
//! Each model runs for about S seconds (default 10) after a warm-up; one JSON line per model with
//! samples/s (and tokens/s for the GPT), the step's breakdown (forward, loss, backward,
//! optimizer), the process's CPU time per step, the GEMM work's GFLOP/s and its fraction of this
//! machine's GEMM peak at the model's shapes (the best of them, measured here with the same GEMM
//! and threads). `--profile` adds the
//! time per kind of layer. `bench/train.sh` runs it beside PyTorch.

use std::collections::BTreeMap;
use std::time::Instant;

use tandem_kernels::models::{self, GptConfig, ResNetConfig, VggConfig, VggVariant};
use tandem_kernels::net::{Batch, NetError, Network};
use tandem_kernels::peak::{self, PeakOptions, Shape};

/// One benchmarked model: how to build it, its batch and the GEMM shapes its step is made of.
struct Bench {
    name: &'static str,
    batch: usize,
    build: fn(usize) -> Result<Network, NetError>,
    shapes: fn() -> Vec<Shape>,
}

fn s(name: &'static str, m: usize, n: usize, k: usize) -> Shape {
    Shape { name, m, n, k }
}

const BENCHES: &[Bench] = &[
    Bench {
        name: "mlp",
        batch: 64,
        build: |t| models::mlp(784, &[256, 128], 10, t),
        shapes: || vec![s("fc1 forward", 256, 64, 784), s("fc1 weight-grad", 256, 784, 64)],
    },
    Bench {
        name: "cnn",
        batch: 64,
        build: |t| models::lenet((1, 28, 28), [16, 32], &[128], 10, t),
        shapes: || vec![s("conv2 forward", 64 * 196, 32, 400), s("conv2 weight-grad", 400, 32, 64 * 196)],
    },
    Bench {
        name: "resnet20",
        batch: 128,
        build: |t| models::resnet(ResNetConfig::standard(20)?, (1, 28, 28), 10, t),
        shapes: || {
            vec![
                s("stage1 3×3 forward", 128 * 784, 16, 144),
                s("stage2 3×3 forward", 128 * 196, 32, 288),
                s("stage3 3×3 forward", 128 * 49, 64, 576),
            ]
        },
    },
    Bench {
        name: "resnet18",
        batch: 8,
        build: |t| models::resnet(ResNetConfig::standard(18)?, (3, 224, 224), 1000, t),
        shapes: || {
            vec![
                s("layer1 3×3 forward", 8 * 3136, 64, 576),
                s("layer3 3×3 forward", 8 * 196, 256, 2304),
                s("layer4 3×3 forward", 8 * 49, 512, 4608),
            ]
        },
    },
    Bench {
        name: "vgga",
        batch: 8,
        build: |t| models::vgg(VggConfig::standard(VggVariant::A), (3, 224, 224), 1000, t),
        shapes: || {
            vec![
                s("conv 128→256 at 56 forward", 8 * 3136, 256, 1152),
                s("conv 512→512 at 14 forward", 8 * 196, 512, 4608),
            ]
        },
    },
    Bench {
        name: "gpt",
        batch: 16,
        build: |t| models::gpt(gpt_config(), t),
        shapes: || vec![s("c_fc forward", 16 * 128, 512, 128), s("c_proj forward", 16 * 128, 128, 512)],
    },
];

fn gpt_config() -> GptConfig {
    GptConfig { vocab: 65, context: 128, layers: 4, heads: 4, width: 128 }
}

struct Options {
    models: Vec<String>,
    threads: usize,
    seconds: f64,
    peak: bool,
    profile: bool,
}

fn main() {
    let opts = parse_args();
    for b in BENCHES {
        if !opts.models.iter().any(|m| m == b.name) {
            continue;
        }
        let mut net = match (b.build)(opts.threads) {
            Ok(n) => n,
            Err(e) => fail(&format!("building {}: {e}", b.name)),
        };
        let record = bench(&mut net, b, &opts);
        println!("{record}");
    }
}

/// Deterministic data: `batches` batches of inputs in [0, 1) (token ids for a language model)
/// and targets.
struct Data {
    values: Vec<f32>,
    tokens: Vec<u32>,
    targets: Vec<u32>,
}

fn data(net: &Network, batch: usize, batches: usize) -> Data {
    let mut seed = 0x1234_5678_9abc_def0u64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 40) as f32 / (1u64 << 24) as f32
    };
    let n = batch * batches;
    let classes = net.classes();
    let (values, tokens) = match net.input() {
        tandem_kernels::layers::Layout::Tokens { vocab, .. } => (
            Vec::new(),
            (0..n * net.input_len()).map(|_| (next() * vocab as f32) as u32 % vocab as u32).collect(),
        ),
        _ => ((0..n * net.input_len()).map(|_| next()).collect(), Vec::new()),
    };
    let targets = (0..n * net.targets_per_sample())
        .map(|_| (next() * classes as f32) as u32 % classes as u32)
        .collect();
    Data { values, tokens, targets }
}

fn bench(net: &mut Network, b: &Bench, opts: &Options) -> serde_json::Value {
    let batch = b.batch;
    let n = net.num_params();
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
        fail(&format!("initialising {}: {e}", b.name));
    }
    let batches = 4;
    let d = data(net, batch, batches);
    let (per_in, per_out) = (net.input_len(), net.targets_per_sample());
    let (lr, mu) = (0.01f32, 0.9f32);
    let mut step = |i: usize, net: &mut Network| -> (f64, f64, f32) {
        let j = i % batches;
        let x = if d.tokens.is_empty() {
            Batch::Values(&d.values[j * batch * per_in..(j + 1) * batch * per_in])
        } else {
            Batch::Tokens(&d.tokens[j * batch * per_in..(j + 1) * batch * per_in])
        };
        let y = &d.targets[j * batch * per_out..(j + 1) * batch * per_out];
        let t0 = Instant::now();
        let loss = match net.forward_backward(&params, &mut state, &mut grads, x, y) {
            Ok(s) => s.loss,
            Err(e) => fail(&format!("{} step: {e}", b.name)),
        };
        let t1 = Instant::now();
        net.pool().for_parts(&mut params, &grads, &mut velocity, |p, g, v| sgd(p, g, v, lr, mu));
        let t2 = Instant::now();
        ((t1 - t0).as_secs_f64(), (t2 - t1).as_secs_f64(), loss)
    };
    // Warm-up: buffers, page faults, the pool's threads.
    let warm = Instant::now();
    let mut i = 0;
    while i < 2 || (warm.elapsed().as_secs_f64() < 0.5 && i < 20) {
        step(i, net);
        i += 1;
    }
    let (mut t_compute, mut t_opt, mut total) = (0.0f64, 0.0f64, 0.0f64);
    let (mut t_fwd, mut t_loss, mut t_bwd) = (0.0f64, 0.0f64, 0.0f64);
    let mut steps = 0;
    let mut last_loss = 0.0;
    let (start, cpu_start) = (Instant::now(), cpu_ms());
    while steps < 3 || start.elapsed().as_secs_f64() < opts.seconds {
        let (c, o, loss) = step(i + steps, net);
        let st = net.last_step();
        t_fwd += st.forward;
        t_loss += st.loss;
        t_bwd += st.backward;
        t_compute += c;
        t_opt += o;
        total += c + o;
        last_loss = loss;
        steps += 1;
    }
    let cpu_per_step = (cpu_ms() - cpu_start) / steps as f64;
    // The profile: one more step, outside the timed ones, with every layer timed (slower by the
    // clock reads only, a few hundred per step).
    let mut kinds: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    if opts.profile {
        net.set_profiling(true);
        step(i + steps, net);
        for t in net.layer_times().iter().filter(|t| t.leaf) {
            let kind = t.kind.split_whitespace().next().unwrap_or("?").to_owned();
            let e = kinds.entry(kind).or_default();
            e.0 += t.forward * 1e3;
            e.1 += t.backward * 1e3;
        }
        net.set_profiling(false);
    }
    let per = |v: f64| v / steps as f64 * 1e3;
    let flops = net.step_flops(batch);
    let step_s = total / steps as f64;
    let gflops = flops / step_s / 1e9;
    let threads = net.threads();
    let shapes = if opts.peak { (b.shapes)() } else { Vec::new() };
    let peak_opts = PeakOptions { threads: vec![threads], seconds: 0.3, shapes, references: false };
    let gemm_peak = if peak_opts.shapes.is_empty() {
        0.0
    } else {
        peak::measure(&peak_opts).iter().map(|r| r.gflops).fold(0.0, f64::max)
    };
    let samples_per_second = (steps * batch) as f64 / total;
    let mut record = serde_json::json!({
        "impl": "tandem-engine",
        "model": b.name,
        "batch": batch,
        "steps": steps,
        "threads": threads,
        "parameters": n,
        "samples_per_second": samples_per_second,
        "ms_per_step": per(total),
        "cpu_ms_per_step": cpu_per_step,
        "breakdown_ms": {
            "forward": per(t_fwd),
            "loss": per(t_loss),
            "backward": per(t_bwd),
            "optimizer": per(t_opt),
            "other": per(t_compute) - per(t_fwd + t_loss + t_bwd),
        },
        "gflop_per_step": flops / 1e9,
        "gflops": gflops,
        "gemm_peak_gflops": gemm_peak,
        "fraction_of_peak": if gemm_peak > 0.0 { gflops / gemm_peak } else { 0.0 },
        "final_loss": last_loss,
    });
    if per_out > 1 {
        record["tokens_per_second"] = serde_json::json!(samples_per_second * per_out as f64);
    }
    if opts.profile {
        record["profile_ms"] = serde_json::json!(
            kinds
                .iter()
                .map(|(k, (f, bw))| (k.clone(), serde_json::json!({"forward": f, "backward": bw})))
                .collect::<serde_json::Map<_, _>>()
        );
    }
    record
}

/// The process's CPU time (all its threads), milliseconds: at one thread the steadier figure on a
/// machine shared with other work (it leaves out the time the thread waited for a core).
fn cpu_ms() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid timespec for the call to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 * 1e3 + ts.tv_nsec as f64 / 1e6
}

/// PyTorch's SGD with momentum (dampening 0, no weight decay): `v = μ·v + g; p −= lr·v`.
fn sgd(p: &mut [f32], g: &[f32], v: &mut [f32], lr: f32, mu: f32) {
    for ((p, &g), v) in p.iter_mut().zip(g).zip(v.iter_mut()) {
        *v = mu * *v + g;
        *p -= lr * *v;
    }
}

fn parse_args() -> Options {
    let all: Vec<String> = BENCHES.iter().map(|b| b.name.to_owned()).collect();
    let mut opts = Options { models: all.clone(), threads: 1, seconds: 10.0, peak: true, profile: false };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--models" | "--model" => {
                let v = args.next().unwrap_or_default();
                opts.models = v.split(',').map(str::to_owned).collect();
                if let Some(bad) = opts.models.iter().find(|m| !all.contains(m)) {
                    fail(&format!("unknown model {bad:?}; the models are {}", all.join(", ")));
                }
            }
            "--threads" => {
                let v = args.next().unwrap_or_default();
                opts.threads = match v.parse::<usize>() {
                    Ok(t) if t >= 1 => t,
                    _ => fail(&format!("--threads wants a whole number ≥ 1, got {v:?}")),
                };
            }
            "--seconds" => opts.seconds = number(args.next(), "--seconds"),
            "--no-peak" => opts.peak = false,
            "--profile" => opts.profile = true,
            other => fail(&format!(
                "unknown argument {other:?}; usage: engine-step [--models m1,m2] [--threads N] [--seconds S] [--no-peak] [--profile]"
            )),
        }
    }
    opts
}

fn number(arg: Option<String>, what: &str) -> f64 {
    match arg.as_deref().map(str::parse::<f64>) {
        Some(Ok(v)) if v > 0.0 && v.is_finite() => v,
        _ => fail(&format!("{what} wants a positive number, got {arg:?}")),
    }
}

fn fail(msg: &str) -> ! {
    eprintln!("engine-step: {msg}");
    std::process::exit(2);
}
