//! `conv-step [--models m1,m2,…] [--threads N] [--reps R]`: every distinct convolution of the
//! benchmarked CNNs (`resnet20`, `resnet18`, `vgga`, at `engine-step`'s batches), timed alone:
//! forward, and backward with the weight and input gradients (the weight gradient only for a
//! network's first layer, as the network runs it). Each is run R times (default 5) after one
//! warm-up; one JSON line per layer with the minimum and median milliseconds of wall time and of
//! the process's CPU time (the steadier figure on a machine shared with other work: at one thread
//! it leaves out the time the thread waited for a core), and one line per model with the totals
//! weighted by how often the shape occurs in the model. For A/B comparisons of the
//! convolution's code paths, next to `engine-step`'s whole steps.

use std::time::Instant;

use tandem_kernels::layers::{Conv2d, ConvSpec, Ctx, Layer, State};
use tandem_kernels::pool::Pool;

/// One convolution of a model: its spec, input size, whether the input gradient is taken, and
/// how many times the model has it.
struct Shape {
    spec: ConvSpec,
    hw: usize,
    dx: bool,
    count: usize,
}

fn c(cin: usize, cout: usize, k: usize, stride: usize, hw: usize, count: usize) -> Shape {
    let spec = ConvSpec { cin, cout, kh: k, kw: k, stride, pad: k / 2, bias: false, relu: false };
    Shape { spec, hw, dx: true, count }
}

/// The first layer: no input gradient.
fn first(mut s: Shape) -> Shape {
    s.dx = false;
    s
}

/// VGG's convolutions have bias and fused ReLU.
fn vgg(cin: usize, cout: usize, hw: usize, count: usize) -> Shape {
    let mut s = c(cin, cout, 3, 1, hw, count);
    s.spec.bias = true;
    s.spec.relu = true;
    s
}

/// (model, batch, convolutions).
fn models() -> Vec<(&'static str, usize, Vec<Shape>)> {
    vec![
        (
            "resnet20",
            128,
            vec![
                first(c(1, 16, 3, 1, 28, 1)),
                c(16, 16, 3, 1, 28, 6),
                c(16, 32, 3, 2, 28, 1),
                c(16, 32, 1, 2, 28, 1),
                c(32, 32, 3, 1, 14, 5),
                c(32, 64, 3, 2, 14, 1),
                c(32, 64, 1, 2, 14, 1),
                c(64, 64, 3, 1, 7, 5),
            ],
        ),
        (
            "resnet18",
            8,
            vec![
                first(c(3, 64, 7, 2, 224, 1)),
                c(64, 64, 3, 1, 56, 4),
                c(64, 128, 3, 2, 56, 1),
                c(64, 128, 1, 2, 56, 1),
                c(128, 128, 3, 1, 28, 3),
                c(128, 256, 3, 2, 28, 1),
                c(128, 256, 1, 2, 28, 1),
                c(256, 256, 3, 1, 14, 3),
                c(256, 512, 3, 2, 14, 1),
                c(256, 512, 1, 2, 14, 1),
                c(512, 512, 3, 1, 7, 3),
            ],
        ),
        (
            "vgga",
            8,
            vec![
                first(vgg(3, 64, 224, 1)),
                vgg(64, 128, 112, 1),
                vgg(128, 256, 56, 1),
                vgg(256, 256, 56, 1),
                vgg(256, 512, 28, 1),
                vgg(512, 512, 28, 1),
                vgg(512, 512, 14, 2),
            ],
        ),
    ]
}

fn main() {
    let mut wanted: Option<Vec<String>> = None;
    let (mut threads, mut reps) = (1usize, 5usize);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let v = args.next().unwrap_or_default();
        match a.as_str() {
            "--models" | "--model" => wanted = Some(v.split(',').map(str::to_owned).collect()),
            "--threads" => threads = whole(&v, "--threads"),
            "--reps" => reps = whole(&v, "--reps"),
            other => fail(&format!(
                "unknown argument {other:?}; usage: conv-step [--models resnet20,resnet18,vgga] [--threads N] [--reps R]"
            )),
        }
    }
    let all = models();
    if let Some(w) = &wanted
        && let Some(bad) = w.iter().find(|m| !all.iter().any(|(n, ..)| n == m))
    {
        fail(&format!("unknown model {bad:?}; the models are resnet20, resnet18, vgga"));
    }
    let pool = Pool::new(threads);
    for (model, batch, shapes) in all {
        if wanted.as_ref().is_some_and(|w| !w.iter().any(|m| m == model)) {
            continue;
        }
        let mut total = [0.0f64; 4];
        for s in &shapes {
            let t = time(&pool, s, batch, reps);
            let ms = |i: usize| serde_json::json!({"min": t[i].0, "median": t[i].1});
            println!(
                "{}",
                serde_json::json!({
                    "model": model, "layer": format!("{:?}", s.spec), "hw": s.hw, "count": s.count,
                    "input_grad": s.dx, "threads": threads,
                    "forward_ms": ms(0), "backward_ms": ms(1), "forward_cpu_ms": ms(2), "backward_cpu_ms": ms(3),
                })
            );
            for (sum, (_, median)) in total.iter_mut().zip(t) {
                *sum += median * s.count as f64;
            }
        }
        println!(
            "{}",
            serde_json::json!({
                "model": model, "threads": threads, "forward_ms": total[0], "backward_ms": total[1],
                "forward_cpu_ms": total[2], "backward_cpu_ms": total[3],
            })
        );
    }
}

/// The process's CPU time (all its threads), milliseconds.
fn cpu_ms() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid timespec for the call to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 * 1e3 + ts.tv_nsec as f64 / 1e6
}

/// (min, median) milliseconds of the forward and of the backward pass, wall then CPU time.
fn time(pool: &Pool, s: &Shape, batch: usize, reps: usize) -> [(f64, f64); 4] {
    let mut layer = match Conv2d::new(s.spec, s.hw, s.hw) {
        Ok(l) => l,
        Err(e) => fail(&e),
    };
    layer.reserve(batch, pool.threads());
    let cx = Ctx { pool, batch, tokens: &[] };
    let np: usize = layer.params().iter().map(|p| p.len()).sum();
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = |n: usize| -> Vec<f32> {
        (0..n)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                (seed >> 40) as f32 / (1u64 << 23) as f32 - 1.0
            })
            .collect()
    };
    let params = next(np);
    let x = next(batch * layer.input().features());
    let dy0 = next(batch * layer.output().features());
    let mut y = vec![0.0; dy0.len()];
    let mut dy = dy0.clone();
    let mut dx = vec![0.0; x.len()];
    let mut grads = vec![0.0; np];
    let mut times: [Vec<f64>; 4] = Default::default();
    for r in 0..=reps {
        let (t0, c0) = (Instant::now(), cpu_ms());
        layer.forward(&cx, &params, State::Train(&mut []), &x, &mut y);
        let (t1, c1) = (Instant::now(), cpu_ms());
        dy.copy_from_slice(&dy0);
        let (t2, c2) = (Instant::now(), cpu_ms());
        layer.backward(&cx, &params, &x, &y, &mut dy, s.dx.then_some(&mut dx[..]), &mut grads);
        let (t3, c3) = (Instant::now(), cpu_ms());
        if r > 0 {
            let ms = |a: Instant, b: Instant| (b - a).as_secs_f64() * 1e3;
            for (v, t) in times.iter_mut().zip([ms(t0, t1), ms(t2, t3), c1 - c0, c3 - c2]) {
                v.push(t);
            }
        }
    }
    times.map(|mut v| min_median(&mut v))
}

fn min_median(v: &mut [f64]) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[0], v[v.len() / 2])
}

fn whole(v: &str, what: &str) -> usize {
    match v.parse::<usize>() {
        Ok(n) if n >= 1 => n,
        _ => fail(&format!("{what} wants a whole number ≥ 1, got {v:?}")),
    }
}

fn fail(msg: &str) -> ! {
    eprintln!("conv-step: {msg}");
    std::process::exit(2);
}
