//! Every layer against its naive form: forward values, parameter gradients and input gradients,
//! on odd shapes, with stride and padding, at 1 and 2 threads. Batch norm, layer norm, attention
//! and the loss are also checked by finite differences (they are smooth).

use crate::common::{Rand, assert_close};
use tandem_kernels::layers::{
    AvgPool2d, BatchNorm, CausalSelfAttention, ChainBuilder, Conv2d, ConvSpec, Ctx, Dense, Embedding,
    Flatten, Gelu, GlobalAvgPool, Init, Layer, LayerNorm, Layout, Linear, LogitsOrder, MaxPool2d, PoolSpec,
    PositionEmbedding, Relu, Residual, SoftmaxCrossEntropy, State,
};
use tandem_kernels::pool::Pool;

/// Forward and backward of one layer: (y, dx, grads).
struct Run {
    y: Vec<f32>,
    dx: Vec<f32>,
    grads: Vec<f32>,
}

fn run(
    layer: &mut dyn Layer,
    threads: usize,
    batch: usize,
    params: &[f32],
    state: &mut [f32],
    x: &[f32],
    dy: &[f32],
) -> Run {
    run_tokens(layer, threads, batch, params, state, x, &[], dy)
}

#[allow(clippy::too_many_arguments)]
fn run_tokens(
    layer: &mut dyn Layer,
    threads: usize,
    batch: usize,
    params: &[f32],
    state: &mut [f32],
    x: &[f32],
    tokens: &[u32],
    dy: &[f32],
) -> Run {
    let pool = Pool::new(threads);
    let cx = Ctx { pool: &pool, batch, tokens };
    layer.reserve(batch, threads);
    let mut y = vec![f32::NAN; batch * layer.output().features()];
    layer.forward(&cx, params, State::Train(state), x, &mut y);
    let mut dx = vec![f32::NAN; batch * layer.input().features()];
    let mut grads = vec![f32::NAN; params.len()];
    let mut dyc = dy.to_vec();
    layer.backward(&cx, params, x, &y, &mut dyc, Some(&mut dx), &mut grads);
    Run { y, dx, grads }
}

fn param_len(layer: &dyn Layer) -> usize {
    layer.params().iter().map(|p| p.len()).sum()
}

#[test]
fn dense_matches_naive() {
    let mut rng = Rand::new(10);
    for &(i, o, n, relu) in
        &[(1, 1, 1, false), (7, 5, 3, true), (33, 17, 20, true), (64, 10, 65, false), (100, 130, 7, true)]
    {
        let mut layer = Dense::new(i, o, relu);
        let params = rng.vec(param_len(&layer));
        let (w, b) = params.split_at(o * i);
        let x = rng.vec(i * n); // feature-major [i × n]
        let dy = rng.vec(o * n);
        // Naive.
        let mut y = vec![0.0; o * n];
        for oo in 0..o {
            for s in 0..n {
                let mut v = b[oo];
                for ii in 0..i {
                    v += w[oo * i + ii] * x[ii * n + s];
                }
                y[oo * n + s] = if relu { v.max(0.0) } else { v };
            }
        }
        let dz: Vec<f32> = dy.iter().zip(&y).map(|(&g, &v)| if relu && v <= 0.0 { 0.0 } else { g }).collect();
        let mut gw = vec![0.0; o * i];
        let mut gb = vec![0.0; o];
        let mut dx = vec![0.0; i * n];
        for oo in 0..o {
            for s in 0..n {
                gb[oo] += dz[oo * n + s];
                for ii in 0..i {
                    gw[oo * i + ii] += dz[oo * n + s] * x[ii * n + s];
                    dx[ii * n + s] += dz[oo * n + s] * w[oo * i + ii];
                }
            }
        }
        let want_g: Vec<f32> = gw.into_iter().chain(gb).collect();
        for threads in [1, 2] {
            let r = run(&mut layer, threads, n, &params, &mut [], &x, &dy);
            let what = format!("dense {i}→{o} batch {n} relu {relu} threads {threads}");
            assert_close(&r.y, &y, 1e-5, &format!("{what}: forward"));
            assert_close(&r.grads, &want_g, 1e-5, &format!("{what}: parameter gradient"));
            assert_close(&r.dx, &dx, 1e-5, &format!("{what}: input gradient"));
        }
    }
}

/// Naive NHWC convolution: (y, grads [w then b], dx).
fn conv_naive(
    s: ConvSpec,
    h: usize,
    w: usize,
    n: usize,
    params: &[f32],
    x: &[f32],
    dy: &[f32],
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let ConvSpec { cin, cout, kh, kw, stride, pad, bias, relu } = s;
    let ho = (h + 2 * pad - kh) / stride + 1;
    let wo = (w + 2 * pad - kw) / stride + 1;
    let wi = |co: usize, ci: usize, ky: usize, kx: usize| ((co * cin + ci) * kh + ky) * kw + kx;
    let xi = |b: usize, y: usize, xx: usize, c: usize| ((b * h + y) * w + xx) * cin + c;
    let yi = |b: usize, y: usize, xx: usize, c: usize| ((b * ho + y) * wo + xx) * cout + c;
    let nw = cout * cin * kh * kw;
    let mut y = vec![0.0; n * ho * wo * cout];
    let taps = |oy: usize, ox: usize| {
        let mut v = Vec::new();
        for ky in 0..kh {
            for kx in 0..kw {
                let (iy, ix) =
                    ((oy * stride + ky) as isize - pad as isize, (ox * stride + kx) as isize - pad as isize);
                if iy >= 0 && ix >= 0 && (iy as usize) < h && (ix as usize) < w {
                    v.push((ky, kx, iy as usize, ix as usize));
                }
            }
        }
        v
    };
    for b in 0..n {
        for oy in 0..ho {
            for ox in 0..wo {
                for co in 0..cout {
                    let mut v = if bias { params[nw + co] } else { 0.0 };
                    for &(ky, kx, iy, ix) in &taps(oy, ox) {
                        for ci in 0..cin {
                            v += params[wi(co, ci, ky, kx)] * x[xi(b, iy, ix, ci)];
                        }
                    }
                    y[yi(b, oy, ox, co)] = if relu { v.max(0.0) } else { v };
                }
            }
        }
    }
    let mut g = vec![0.0; nw + if bias { cout } else { 0 }];
    let mut dx = vec![0.0; n * h * w * cin];
    for b in 0..n {
        for oy in 0..ho {
            for ox in 0..wo {
                for co in 0..cout {
                    let at = yi(b, oy, ox, co);
                    let dz = if relu && y[at] <= 0.0 { 0.0 } else { dy[at] };
                    if bias {
                        g[nw + co] += dz;
                    }
                    for &(ky, kx, iy, ix) in &taps(oy, ox) {
                        for ci in 0..cin {
                            g[wi(co, ci, ky, kx)] += dz * x[xi(b, iy, ix, ci)];
                            dx[xi(b, iy, ix, ci)] += dz * params[wi(co, ci, ky, kx)];
                        }
                    }
                }
            }
        }
    }
    (y, g, dx)
}

#[test]
fn conv_matches_naive_with_stride_padding_and_odd_shapes() {
    let mut rng = Rand::new(11);
    // (cin, cout, h, w, kh, kw, stride, pad, bias, relu, batch)
    let cases = [
        (1, 16, 12, 12, 5, 5, 1, 2, true, true, 3),
        (3, 5, 7, 6, 3, 3, 1, 1, true, false, 2),
        (2, 4, 9, 9, 3, 3, 2, 1, true, true, 3),
        (4, 6, 8, 8, 1, 1, 2, 0, false, false, 2),
        (16, 32, 6, 6, 5, 5, 1, 2, true, true, 5),
        (3, 2, 5, 7, 2, 3, 3, 0, true, false, 1),
        (5, 3, 4, 4, 3, 3, 1, 0, false, true, 4),
        // more output channels than one block of the weight re-layouts, and a partial block
        (3, 21, 5, 6, 3, 3, 1, 1, true, false, 2),
        // stride 1, a non-square kernel: the direct input gradient pads dy by 0 rows and 1 column
        (3, 4, 6, 7, 2, 3, 1, 1, false, true, 3),
        // stride 1 with padding as large as the kernel: the input gradient by scattered columns
        (2, 3, 4, 5, 1, 1, 1, 1, true, false, 2),
        // more weights than activations: the weight gradient's taps split over the threads (in
        // whole micro-tiles of 6 and a partial one); the cases above with fewer weights than
        // activations split the batch and add the threads' partial sums
        (7, 70, 3, 3, 3, 3, 1, 1, true, true, 2),
    ];
    for &(cin, cout, h, w, kh, kw, stride, pad, bias, relu, n) in &cases {
        let spec = ConvSpec { cin, cout, kh, kw, stride, pad, bias, relu };
        let mut layer = Conv2d::new(spec, h, w).unwrap();
        let params = rng.vec(param_len(&layer));
        let x = rng.vec(n * h * w * cin);
        let dy = rng.vec(n * layer.output().features());
        let (y, g, dx) = conv_naive(spec, h, w, n, &params, &x, &dy);
        for threads in [1, 2] {
            let r = run(&mut layer, threads, n, &params, &mut [], &x, &dy);
            let what = format!("conv {spec:?} on {h}×{w} batch {n} threads {threads}");
            assert_close(&r.y, &y, 1e-5, &format!("{what}: forward"));
            assert_close(&r.grads, &g, 1e-5, &format!("{what}: parameter gradient"));
            assert_close(&r.dx, &dx, 1e-5, &format!("{what}: input gradient"));
        }
    }
}

#[test]
fn conv_rejects_a_kernel_that_does_not_fit() {
    let spec = ConvSpec { cin: 1, cout: 1, kh: 5, kw: 5, stride: 1, pad: 0, bias: true, relu: false };
    let err = Conv2d::new(spec, 3, 3).unwrap_err();
    assert!(err.contains("does not fit"), "{err}");
}

fn pool_taps(
    k: usize,
    stride: usize,
    pad: usize,
    h: usize,
    w: usize,
    oy: usize,
    ox: usize,
) -> Vec<(usize, usize)> {
    let mut v = Vec::new();
    for ky in 0..k {
        for kx in 0..k {
            let (iy, ix) =
                ((oy * stride + ky) as isize - pad as isize, (ox * stride + kx) as isize - pad as isize);
            if iy >= 0 && ix >= 0 && (iy as usize) < h && (ix as usize) < w {
                v.push((iy as usize, ix as usize));
            }
        }
    }
    v
}

#[test]
fn pooling_matches_naive() {
    let mut rng = Rand::new(12);
    for &(c, h, w, k, stride, pad, n) in
        &[(3, 7, 6, 2, 2, 0, 2), (2, 9, 9, 3, 2, 1, 3), (16, 28, 28, 2, 2, 0, 2), (5, 5, 5, 3, 1, 1, 1)]
    {
        let spec = PoolSpec { k, stride, pad };
        let ho = (h + 2 * pad - k) / stride + 1;
        let wo = (w + 2 * pad - k) / stride + 1;
        let x = rng.vec(n * h * w * c);
        let dy = rng.vec(n * ho * wo * c);
        let xi = |b: usize, y: usize, xx: usize, ch: usize| ((b * h + y) * w + xx) * c + ch;
        let yi = |b: usize, y: usize, xx: usize, ch: usize| ((b * ho + y) * wo + xx) * c + ch;
        let (mut ymax, mut dmax) = (vec![0.0; dy.len()], vec![0.0; x.len()]);
        let (mut yavg, mut davg) = (vec![0.0; dy.len()], vec![0.0; x.len()]);
        for b in 0..n {
            for oy in 0..ho {
                for ox in 0..wo {
                    for ch in 0..c {
                        let taps = pool_taps(k, stride, pad, h, w, oy, ox);
                        let best = taps
                            .iter()
                            .copied()
                            .max_by(|a, bb| x[xi(b, a.0, a.1, ch)].total_cmp(&x[xi(b, bb.0, bb.1, ch)]))
                            .unwrap();
                        let o = yi(b, oy, ox, ch);
                        ymax[o] = x[xi(b, best.0, best.1, ch)];
                        dmax[xi(b, best.0, best.1, ch)] += dy[o];
                        let s: f32 = taps.iter().map(|t| x[xi(b, t.0, t.1, ch)]).sum();
                        yavg[o] = s / (k * k) as f32;
                        for t in &taps {
                            davg[xi(b, t.0, t.1, ch)] += dy[o] / (k * k) as f32;
                        }
                    }
                }
            }
        }
        for threads in [1, 2] {
            let what = format!("{c}×{h}×{w} window {k} stride {stride} pad {pad} threads {threads}");
            let mut mp = MaxPool2d::new(spec, c, h, w).unwrap();
            let r = run(&mut mp, threads, n, &[], &mut [], &x, &dy);
            assert_close(&r.y, &ymax, 0.0, &format!("max pool {what}: forward"));
            assert_close(&r.dx, &dmax, 1e-6, &format!("max pool {what}: input gradient"));
            let mut ap = AvgPool2d::new(spec, c, h, w).unwrap();
            let r = run(&mut ap, threads, n, &[], &mut [], &x, &dy);
            assert_close(&r.y, &yavg, 1e-6, &format!("avg pool {what}: forward"));
            assert_close(&r.dx, &davg, 1e-6, &format!("avg pool {what}: input gradient"));
        }
    }
}

#[test]
fn global_avg_pool_flatten_and_relu_match_naive() {
    let mut rng = Rand::new(13);
    let (c, h, w, n) = (5, 3, 4, 3);
    let x = rng.vec(n * h * w * c);
    let xi = |b: usize, y: usize, xx: usize, ch: usize| ((b * h + y) * w + xx) * c + ch;
    // Global average pooling: NHWC → feature-major [c × n].
    let dy = rng.vec(c * n);
    let mut y = vec![0.0; c * n];
    let mut dx = vec![0.0; x.len()];
    for b in 0..n {
        for ch in 0..c {
            for yy in 0..h {
                for xx in 0..w {
                    y[ch * n + b] += x[xi(b, yy, xx, ch)] / (h * w) as f32;
                    dx[xi(b, yy, xx, ch)] = dy[ch * n + b] / (h * w) as f32;
                }
            }
        }
    }
    let r = run(&mut GlobalAvgPool::new(c, h, w), 1, n, &[], &mut [], &x, &dy);
    assert_close(&r.y, &y, 1e-6, "global avg pool forward");
    assert_close(&r.dx, &dx, 1e-6, "global avg pool input gradient");
    // Flatten: NHWC → feature-major in PyTorch's (c, h, w) order, and back.
    let dy = rng.vec(c * h * w * n);
    let r = run(&mut Flatten::new(c, h, w), 1, n, &[], &mut [], &x, &dy);
    for b in 0..n {
        for ch in 0..c {
            for yy in 0..h {
                for xx in 0..w {
                    let f = (ch * h + yy) * w + xx;
                    assert_eq!(r.y[f * n + b], x[xi(b, yy, xx, ch)]);
                    assert_eq!(r.dx[xi(b, yy, xx, ch)], dy[f * n + b]);
                }
            }
        }
    }
    // ReLU.
    let layout = Layout::Image { c, h, w };
    let r = run(&mut Relu::new(layout), 2, n, &[], &mut [], &x, &dy);
    for i in 0..x.len() {
        assert_eq!(r.y[i], x[i].max(0.0));
        assert_eq!(r.dx[i], if x[i] > 0.0 { dy[i] } else { 0.0 });
    }
}

/// Σ r·BN(x) as a function of (params, x), for finite differences.
fn bn_objective(layout: Layout, n: usize, params: &[f32], x: &[f32], r: &[f32]) -> f64 {
    let mut bn = BatchNorm::new(layout);
    let pool = Pool::single();
    bn.reserve(n, 1);
    let mut state = vec![0.0; 2 * params.len() / 2];
    let mut y = vec![0.0; x.len()];
    bn.forward(&Ctx { pool: &pool, batch: n, tokens: &[] }, params, State::Train(&mut state), x, &mut y);
    y.iter().zip(r).map(|(&a, &b)| a as f64 * b as f64).sum()
}

#[test]
fn batch_norm_train_eval_running_stats_and_gradients() {
    let mut rng = Rand::new(14);
    for (layout, n) in [(Layout::Image { c: 3, h: 4, w: 5 }, 3), (Layout::Features(6), 7)] {
        let mut bn = BatchNorm::new(layout);
        let c = match layout {
            Layout::Image { c, .. } => c,
            Layout::Features(f) => f,
            _ => unreachable!(),
        };
        let mut params = rng.vec(2 * c);
        for g in &mut params[..c] {
            *g += 1.5;
        }
        let x: Vec<f32> = rng.vec(n * layout.features()).iter().map(|v| 3.0 * v + 0.7).collect();
        let dy = rng.vec(x.len());
        let lane = |ch: usize| -> Vec<usize> {
            match layout {
                Layout::Features(_) => (0..n).map(|b| ch * n + b).collect(),
                Layout::Image { c, h, w } => (0..n * h * w).map(|j| j * c + ch).collect(),
                _ => unreachable!(),
            }
        };
        let mut state = vec![0.0; 2 * c];
        state[c..].fill(1.0);
        let r = run(&mut bn, 1, n, &params, &mut state, &x, &dy);
        // Forward and running statistics, naive in f64.
        let mut want = vec![0.0; x.len()];
        for ch in 0..c {
            let idx = lane(ch);
            let m: f64 = idx.iter().map(|&i| x[i] as f64).sum::<f64>() / idx.len() as f64;
            let v: f64 = idx.iter().map(|&i| (x[i] as f64 - m).powi(2)).sum::<f64>() / idx.len() as f64;
            for &i in &idx {
                want[i] = ((x[i] as f64 - m) / (v + 1e-5).sqrt() * params[ch] as f64 + params[c + ch] as f64)
                    as f32;
            }
            let unbiased = v * idx.len() as f64 / (idx.len() - 1) as f64;
            assert!((state[ch] as f64 - 0.1 * m).abs() < 1e-5, "running mean of channel {ch}");
            assert!(
                (state[c + ch] as f64 - (0.9 + 0.1 * unbiased)).abs() < 1e-4,
                "running var of channel {ch}"
            );
        }
        assert_close(&r.y, &want, 1e-5, &format!("batch norm {layout:?}: training forward"));
        // Evaluation uses the running statistics.
        let pool = Pool::single();
        let mut y = vec![0.0; x.len()];
        bn.forward(&Ctx { pool: &pool, batch: n, tokens: &[] }, &params, State::Eval(&state), &x, &mut y);
        for ch in 0..c {
            for &i in &lane(ch) {
                let e = (x[i] - state[ch]) / (state[c + ch] + 1e-5).sqrt() * params[ch] + params[c + ch];
                assert!((y[i] - e).abs() < 1e-4, "eval forward of channel {ch}: {} vs {e}", y[i]);
            }
        }
        // Gradients by central differences of Σ dy·y.
        let h = 1e-2f32;
        for (which, len) in [("param", params.len()), ("input", x.len())] {
            for i in 0..len {
                let (mut p, mut xx) = (params.clone(), x.clone());
                let slot = if which == "param" { &mut p[i] } else { &mut xx[i] };
                let orig = *slot;
                *slot = orig + h;
                let up = bn_objective(layout, n, &p, &xx, &dy);
                let (mut p2, mut xx2) = (params.clone(), x.clone());
                if which == "param" {
                    p2[i] = orig - h
                } else {
                    xx2[i] = orig - h
                }
                let down = bn_objective(layout, n, &p2, &xx2, &dy);
                let fd = ((up - down) / (2.0 * h as f64)) as f32;
                let an = if which == "param" { r.grads[i] } else { r.dx[i] };
                assert!(
                    (fd - an).abs() < 2e-2 * fd.abs().max(1.0),
                    "batch norm {layout:?} {which} {i}: analytic {an}, finite difference {fd}"
                );
            }
        }
    }
}

#[test]
fn softmax_cross_entropy_matches_naive_and_finite_differences() {
    let mut rng = Rand::new(15);
    let (c, n) = (7, 5);
    let logits: Vec<f32> = rng.vec(c * n).iter().map(|v| 4.0 * v).collect();
    let labels: Vec<u32> = (0..n).map(|_| rng.below(c) as u32).collect();
    let loss = SoftmaxCrossEntropy::new(c);
    let mut grad = vec![0.0; c * n];
    let (sum, correct) = loss.run(&logits, &labels, Some(&mut grad));
    let mut want = 0.0f64;
    let mut want_correct = 0;
    for b in 0..n {
        let z: Vec<f64> = (0..c).map(|k| logits[k * n + b] as f64).collect();
        let lse = z.iter().map(|v| v.exp()).sum::<f64>().ln();
        want += lse - z[labels[b] as usize];
        let arg = (0..c).max_by(|&i, &j| z[i].total_cmp(&z[j])).unwrap();
        want_correct += usize::from(arg == labels[b] as usize);
    }
    assert!((sum - want).abs() < 1e-4, "loss {sum} vs {want}");
    assert_eq!(correct, want_correct);
    let h = 1e-2;
    for i in 0..c * n {
        let mut up = logits.clone();
        up[i] += h;
        let mut down = logits.clone();
        down[i] -= h;
        let fd =
            (loss.run(&up, &labels, None).0 - loss.run(&down, &labels, None).0) / n as f64 / (2.0 * h as f64);
        assert!(
            (fd as f32 - grad[i]).abs() < 1e-3,
            "logit {i}: analytic {}, finite difference {fd}",
            grad[i]
        );
    }
}

#[test]
fn batch_norm_fused_relu_and_threads_match_naive() {
    let mut rng = Rand::new(16);
    for (layout, n) in [(Layout::Image { c: 19, h: 5, w: 7 }, 5), (Layout::Sequence { t: 9, d: 33 }, 3)] {
        let c = match layout {
            Layout::Image { c, .. } => c,
            Layout::Sequence { d, .. } => d,
            _ => unreachable!(),
        };
        let params: Vec<f32> =
            rng.vec(2 * c).iter().enumerate().map(|(i, v)| if i < c { 1.0 + v } else { *v }).collect();
        let x: Vec<f32> = rng.vec(n * layout.features()).iter().map(|v| 2.0 * v + 0.3).collect();
        let dy = rng.vec(x.len());
        let rows = x.len() / c;
        // Naive in f64: y = relu(bn(x)), then the gradients through the ReLU mask.
        let (mut y, mut dx, mut g) = (vec![0.0; x.len()], vec![0.0; x.len()], vec![0.0; 2 * c]);
        for ch in 0..c {
            let xs: Vec<f64> = (0..rows).map(|r| x[r * c + ch] as f64).collect();
            let m = xs.iter().sum::<f64>() / rows as f64;
            let v = xs.iter().map(|a| (a - m).powi(2)).sum::<f64>() / rows as f64;
            let inv = 1.0 / (v + 1e-5).sqrt();
            let (gm, bt) = (params[ch] as f64, params[c + ch] as f64);
            let mut dz = vec![0.0; rows];
            for r in 0..rows {
                let z = (xs[r] - m) * inv * gm + bt;
                y[r * c + ch] = z.max(0.0) as f32;
                dz[r] = if z > 0.0 { dy[r * c + ch] as f64 } else { 0.0 };
            }
            let sd: f64 = dz.iter().sum();
            let sdx: f64 = (0..rows).map(|r| dz[r] * (xs[r] - m) * inv).sum();
            g[ch] = sdx as f32;
            g[c + ch] = sd as f32;
            for r in 0..rows {
                let xhat = (xs[r] - m) * inv;
                dx[r * c + ch] = (gm * inv / rows as f64 * (rows as f64 * dz[r] - sd - xhat * sdx)) as f32;
            }
        }
        for threads in [1, 2] {
            let mut state = vec![0.0; 2 * c];
            let mut bn = BatchNorm::new(layout).with_relu();
            let r = run(&mut bn, threads, n, &params, &mut state, &x, &dy);
            let what = format!("batch norm + relu {layout:?} threads {threads}");
            assert_close(&r.y, &y, 1e-5, &format!("{what}: forward"));
            assert_close(&r.grads, &g, 1e-4, &format!("{what}: parameter gradient"));
            assert_close(&r.dx, &dx, 1e-4, &format!("{what}: input gradient"));
        }
    }
}

#[test]
fn linear_matches_naive() {
    let mut rng = Rand::new(17);
    // (tokens per sample, in, out, bias, batch)
    for &(t, i, o, bias, n) in
        &[(1, 1, 1, true, 1), (5, 7, 3, true, 2), (9, 33, 70, false, 3), (4, 64, 17, true, 5)]
    {
        let mut layer = Linear::new(t, i, o, bias, Init::Zeros);
        let params = rng.vec(param_len(&layer));
        let w = &params[..o * i];
        let rows = n * t;
        let x = rng.vec(rows * i);
        let dy = rng.vec(rows * o);
        let (mut y, mut g, mut dx) = (vec![0.0; rows * o], vec![0.0; params.len()], vec![0.0; rows * i]);
        for r in 0..rows {
            for oo in 0..o {
                let mut v = if bias { params[o * i + oo] } else { 0.0 };
                for ii in 0..i {
                    v += x[r * i + ii] * w[oo * i + ii];
                    g[oo * i + ii] += dy[r * o + oo] * x[r * i + ii];
                    dx[r * i + ii] += dy[r * o + oo] * w[oo * i + ii];
                }
                y[r * o + oo] = v;
                if bias {
                    g[o * i + oo] += dy[r * o + oo];
                }
            }
        }
        for threads in [1, 2] {
            let r = run(&mut layer, threads, n, &params, &mut [], &x, &dy);
            let what = format!("linear {i}→{o} on {n}×{t} tokens bias {bias} threads {threads}");
            assert_close(&r.y, &y, 1e-5, &format!("{what}: forward"));
            assert_close(&r.grads, &g, 1e-5, &format!("{what}: parameter gradient"));
            assert_close(&r.dx, &dx, 1e-5, &format!("{what}: input gradient"));
        }
    }
}

#[test]
fn layer_norm_matches_naive() {
    let mut rng = Rand::new(18);
    for &(t, d, n) in &[(1, 1, 1), (5, 7, 2), (3, 33, 3), (2, 128, 2)] {
        let mut layer = LayerNorm::new(t, d);
        let params: Vec<f32> =
            rng.vec(2 * d).iter().enumerate().map(|(i, v)| if i < d { 1.0 + v } else { *v }).collect();
        let x: Vec<f32> = rng.vec(n * t * d).iter().map(|v| 3.0 * v - 0.5).collect();
        let dy = rng.vec(x.len());
        let (mut y, mut dx, mut g) = (vec![0.0; x.len()], vec![0.0; x.len()], vec![0.0f64; 2 * d]);
        for r in 0..n * t {
            let xs: Vec<f64> = x[r * d..(r + 1) * d].iter().map(|&v| v as f64).collect();
            let m = xs.iter().sum::<f64>() / d as f64;
            let var = xs.iter().map(|v| (v - m).powi(2)).sum::<f64>() / d as f64;
            let rstd = 1.0 / (var + 1e-5).sqrt();
            let xhat: Vec<f64> = xs.iter().map(|v| (v - m) * rstd).collect();
            let gh: Vec<f64> = (0..d).map(|j| dy[r * d + j] as f64 * params[j] as f64).collect();
            let m1 = gh.iter().sum::<f64>() / d as f64;
            let m2 = (0..d).map(|j| gh[j] * xhat[j]).sum::<f64>() / d as f64;
            for j in 0..d {
                y[r * d + j] = (xhat[j] * params[j] as f64 + params[d + j] as f64) as f32;
                dx[r * d + j] = (rstd * (gh[j] - m1 - xhat[j] * m2)) as f32;
                g[j] += dy[r * d + j] as f64 * xhat[j];
                g[d + j] += dy[r * d + j] as f64;
            }
        }
        let g: Vec<f32> = g.iter().map(|&v| v as f32).collect();
        for threads in [1, 2] {
            let r = run(&mut layer, threads, n, &params, &mut [], &x, &dy);
            let what = format!("layer norm {d} on {n}×{t} tokens threads {threads}");
            assert_close(&r.y, &y, 1e-5, &format!("{what}: forward"));
            assert_close(&r.grads, &g, 1e-4, &format!("{what}: parameter gradient"));
            assert_close(&r.dx, &dx, 1e-4, &format!("{what}: input gradient"));
        }
    }
}

#[test]
fn gelu_matches_its_formula() {
    let mut rng = Rand::new(19);
    let layout = Layout::Sequence { t: 3, d: 1000 };
    let x: Vec<f32> = rng.vec(layout.features() * 2).iter().map(|v| 6.0 * v).collect();
    let dy = rng.vec(x.len());
    let f = |v: f64| 0.5 * v * (1.0 + (0.797_884_560_802_865_4 * (v + 0.044715 * v.powi(3))).tanh());
    for threads in [1, 2] {
        let r = run(&mut Gelu::new(layout), threads, 2, &[], &mut [], &x, &dy);
        for i in 0..x.len() {
            let v = x[i] as f64;
            assert!((r.y[i] as f64 - f(v)).abs() < 2e-6 * f(v).abs().max(1.0), "gelu({v}) = {}", r.y[i]);
            let fd = (f(v + 1e-4) - f(v - 1e-4)) / 2e-4;
            let want = dy[i] as f64 * fd;
            assert!((r.dx[i] as f64 - want).abs() < 1e-5, "gelu'({v}): {} vs {want}", r.dx[i]);
        }
    }
}

#[test]
fn embeddings_match_naive_and_do_not_depend_on_threads() {
    let mut rng = Rand::new(20);
    let (t, vocab, d, n) = (6, 5, 19, 4);
    let mut emb = Embedding::new(t, vocab, d, Init::Zeros);
    let params = rng.vec(vocab * d);
    // Repeated ids, and id 4 never used.
    let tokens: Vec<u32> = (0..n * t).map(|i| [0, 1, 2, 3, 1, 1][i % 6]).collect();
    let dy = rng.vec(n * t * d);
    let mut want_g = vec![0.0f32; vocab * d];
    for (r, &tok) in tokens.iter().enumerate() {
        for j in 0..d {
            want_g[tok as usize * d + j] += dy[r * d + j];
        }
    }
    let mut first: Option<Vec<f32>> = None;
    for threads in [1, 2, 3] {
        let r = run_tokens(&mut emb, threads, n, &params, &mut [], &[], &tokens, &dy);
        for (row, &tok) in tokens.iter().enumerate() {
            assert_eq!(&r.y[row * d..(row + 1) * d], &params[tok as usize * d..(tok as usize + 1) * d]);
        }
        assert_close(&r.grads, &want_g, 1e-6, &format!("embedding gradient, threads {threads}"));
        assert!(r.grads[4 * d..].iter().all(|&v| v == 0.0), "an unused id gets no gradient");
        match &first {
            None => first = Some(r.grads),
            Some(f) => assert_eq!(f, &r.grads, "the table's gradient must not depend on the thread count"),
        }
    }
    let mut pos = PositionEmbedding::new(t, d, Init::Zeros);
    let params = rng.vec(t * d);
    let x = rng.vec(n * t * d);
    let r = run(&mut pos, 2, n, &params, &mut [], &x, &dy);
    let mut want_g = vec![0.0f32; t * d];
    for b in 0..n {
        for i in 0..t {
            for j in 0..d {
                let at = (b * t + i) * d + j;
                assert_eq!(r.y[at], x[at] + params[i * d + j]);
                want_g[i * d + j] += dy[at];
            }
        }
    }
    assert_close(&r.grads, &want_g, 1e-6, "position embedding gradient");
    assert_eq!(r.dx, dy, "position embedding input gradient");
}

/// Naive causal attention in f64 on `[n·t × 3d]` rows: (output, input gradient).
fn attention_naive(
    t: usize,
    d: usize,
    heads: usize,
    n: usize,
    x: &[f32],
    dy: &[f32],
) -> (Vec<f32>, Vec<f32>) {
    let hd = d / heads;
    let scale = 1.0 / (hd as f64).sqrt();
    let mut y = vec![0.0f32; n * t * d];
    let mut dx = vec![0.0f32; n * t * 3 * d];
    let at =
        |b: usize, i: usize, part: usize, h: usize, j: usize| (b * t + i) * 3 * d + part * d + h * hd + j;
    for b in 0..n {
        for h in 0..heads {
            let q = |i: usize, j: usize| x[at(b, i, 0, h, j)] as f64;
            let k = |i: usize, j: usize| x[at(b, i, 1, h, j)] as f64;
            let v = |i: usize, j: usize| x[at(b, i, 2, h, j)] as f64;
            let mut p = vec![vec![0.0f64; t]; t];
            for i in 0..t {
                let s: Vec<f64> =
                    (0..=i).map(|s| (0..hd).map(|j| q(i, j) * k(s, j)).sum::<f64>() * scale).collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = s.iter().map(|v| (v - m).exp()).sum();
                for (s_, &sv) in s.iter().enumerate() {
                    p[i][s_] = (sv - m).exp() / z;
                }
                for j in 0..hd {
                    y[(b * t + i) * d + h * hd + j] = (0..=i).map(|s| p[i][s] * v(s, j)).sum::<f64>() as f32;
                }
            }
            let dout = |i: usize, j: usize| dy[(b * t + i) * d + h * hd + j] as f64;
            let mut ds = vec![vec![0.0f64; t]; t];
            for i in 0..t {
                let dp: Vec<f64> = (0..=i).map(|s| (0..hd).map(|j| dout(i, j) * v(s, j)).sum()).collect();
                let dot: f64 = (0..=i).map(|s| p[i][s] * dp[s]).sum();
                for s in 0..=i {
                    ds[i][s] = p[i][s] * (dp[s] - dot) * scale;
                }
            }
            for i in 0..t {
                for j in 0..hd {
                    dx[at(b, i, 0, h, j)] = (0..=i).map(|s| ds[i][s] * k(s, j)).sum::<f64>() as f32;
                    dx[at(b, i, 1, h, j)] = (i..t).map(|r| ds[r][i] * q(r, j)).sum::<f64>() as f32;
                    dx[at(b, i, 2, h, j)] = (i..t).map(|r| p[r][i] * dout(r, j)).sum::<f64>() as f32;
                }
            }
        }
    }
    (y, dx)
}

#[test]
fn causal_attention_matches_naive_and_finite_differences() {
    let mut rng = Rand::new(21);
    // (t, d, heads, batch): one token, odd widths, several query blocks (t > 24).
    for &(t, d, heads, n) in &[(1, 4, 2, 2), (5, 6, 3, 2), (30, 12, 2, 3), (53, 8, 1, 1)] {
        let mut layer = CausalSelfAttention::new(t, d, heads).unwrap();
        let x: Vec<f32> = rng.vec(n * t * 3 * d).iter().map(|v| 2.0 * v).collect();
        let dy = rng.vec(n * t * d);
        let (y, dx) = attention_naive(t, d, heads, n, &x, &dy);
        for threads in [1, 2] {
            let r = run(&mut layer, threads, n, &[], &mut [], &x, &dy);
            let what = format!("attention t {t} d {d} heads {heads} batch {n} threads {threads}");
            assert_close(&r.y, &y, 1e-5, &format!("{what}: forward"));
            assert_close(&r.dx, &dx, 1e-4, &format!("{what}: input gradient"));
        }
    }
    // The naive backward itself against central differences of Σ dy·y.
    let (t, d, heads, n) = (4, 4, 2, 1);
    let x = rng.vec(n * t * 3 * d);
    let dy = rng.vec(n * t * d);
    let (_, dx) = attention_naive(t, d, heads, n, &x, &dy);
    for i in 0..x.len() {
        let h = 1e-3;
        let (mut up, mut down) = (x.clone(), x.clone());
        up[i] += h;
        down[i] -= h;
        let f = |xx: &[f32]| -> f64 {
            let (y, _) = attention_naive(t, d, heads, n, xx, &dy);
            y.iter().zip(&dy).map(|(&a, &b)| a as f64 * b as f64).sum()
        };
        let fd = (f(&up) - f(&down)) / (2.0 * h as f64);
        assert!(
            (fd - dx[i] as f64).abs() < 1e-2,
            "attention input {i}: naive gradient {}, finite difference {fd}",
            dx[i]
        );
    }
}

#[test]
fn attention_rejects_heads_that_do_not_divide_the_width() {
    let err = CausalSelfAttention::new(8, 10, 3).unwrap_err();
    assert!(err.contains("divisible"), "{err}");
}

fn conv(cin: usize, cout: usize, k: usize, stride: usize, pad: usize) -> ConvSpec {
    ConvSpec { cin, cout, kh: k, kw: k, stride, pad, bias: false, relu: false }
}

#[test]
fn residual_matches_its_paths_run_separately() {
    let mut rng = Rand::new(22);
    let (c, h, w, n) = (3, 7, 5, 3);
    let input = Layout::Image { c, h, w };
    let main = || {
        ChainBuilder::new(input)
            .try_push("conv1", Conv2d::new(conv(3, 4, 3, 2, 1), h, w))
            .push("bn1", BatchNorm::new(Layout::Image { c: 4, h: 4, w: 3 }).with_relu())
            .try_push("conv2", Conv2d::new(conv(4, 4, 3, 1, 1), 4, 3))
            .push("bn2", BatchNorm::new(Layout::Image { c: 4, h: 4, w: 3 }))
            .build()
            .unwrap()
    };
    let short = || {
        ChainBuilder::new(input)
            .try_push("0", Conv2d::new(conv(3, 4, 1, 2, 0), h, w))
            .push("1", BatchNorm::new(Layout::Image { c: 4, h: 4, w: 3 }))
            .build()
            .unwrap()
    };
    let mut block = Residual::new(main(), Some(("downsample", short())), true).unwrap();
    let names: Vec<String> = block.params().iter().map(|p| p.name.clone()).collect();
    assert_eq!(
        names,
        [
            "conv1.weight",
            "bn1.weight",
            "bn1.bias",
            "conv2.weight",
            "bn2.weight",
            "bn2.bias",
            "downsample.0.weight",
            "downsample.1.weight",
            "downsample.1.bias"
        ]
    );
    let np = param_len(&block);
    let params = rng.vec(np);
    let x = rng.vec(n * input.features());
    let out = block.output().features() * n;
    let dy = rng.vec(out);
    // The paths by hand.
    let (mut m, mut s) = (main(), short());
    let pm = m.params().iter().map(|p| p.len()).sum::<usize>();
    let rm = run(&mut m, 1, n, &params[..pm], &mut [0.0; 16], &x, &vec![0.0; out]);
    let rs = run(&mut s, 1, n, &params[pm..], &mut [0.0; 8], &x, &vec![0.0; out]);
    let y: Vec<f32> = rm.y.iter().zip(&rs.y).map(|(a, b)| (a + b).max(0.0)).collect();
    let dz: Vec<f32> = dy.iter().zip(&y).map(|(&g, &v)| if v > 0.0 { g } else { 0.0 }).collect();
    let rm = run(&mut m, 1, n, &params[..pm], &mut [0.0; 16], &x, &dz);
    let rs = run(&mut s, 1, n, &params[pm..], &mut [0.0; 8], &x, &dz);
    let dx: Vec<f32> = rm.dx.iter().zip(&rs.dx).map(|(a, b)| a + b).collect();
    let g: Vec<f32> = rm.grads.iter().chain(&rs.grads).copied().collect();
    for threads in [1, 2] {
        let mut state = vec![0.0; 24];
        let r = run(&mut block, threads, n, &params, &mut state, &x, &dy);
        assert_close(&r.y, &y, 1e-5, "residual forward");
        assert_close(&r.grads, &g, 1e-4, "residual parameter gradient");
        assert_close(&r.dx, &dx, 1e-4, "residual input gradient");
    }
    // Identity shortcut, no ReLU (a pre-LN transformer's): y = x + f(x), dx = dy + f'ᵀ dy.
    let seq = Layout::Sequence { t: 3, d: 5 };
    let f = || {
        ChainBuilder::new(seq)
            .push("ln", LayerNorm::new(3, 5))
            .push("fc", Linear::new(3, 5, 5, true, Init::Zeros))
            .build()
            .unwrap()
    };
    let mut block = Residual::new(f(), None, false).unwrap();
    let params = rng.vec(param_len(&block));
    let x = rng.vec(2 * 15);
    let dy = rng.vec(2 * 15);
    let rf = run(&mut f(), 1, 2, &params, &mut [], &x, &dy);
    let r = run(&mut block, 2, 2, &params, &mut [], &x, &dy);
    let y: Vec<f32> = rf.y.iter().zip(&x).map(|(a, b)| a + b).collect();
    let dx: Vec<f32> = rf.dx.iter().zip(&dy).map(|(a, b)| a + b).collect();
    assert_close(&r.y, &y, 1e-6, "identity residual forward");
    assert_close(&r.dx, &dx, 1e-5, "identity residual input gradient");
    assert_close(&r.grads, &rf.grads, 1e-5, "identity residual parameter gradient");
    // A projection whose output does not match is refused.
    let bad = ChainBuilder::new(input).try_push("0", Conv2d::new(conv(3, 5, 1, 2, 0), h, w)).build().unwrap();
    let err = Residual::new(main(), Some(("downsample", bad)), true).unwrap_err();
    assert!(err.contains("the shortcut downsample maps"), "{err}");
    let err = Residual::new(main(), None, true).unwrap_err();
    assert!(err.contains("add a projection"), "{err}");
}

#[test]
fn softmax_cross_entropy_target_major_matches_feature_major() {
    let mut rng = Rand::new(23);
    let (c, n) = (37, 9);
    let fm: Vec<f32> = rng.vec(c * n).iter().map(|v| 5.0 * v).collect();
    let mut tm = vec![0.0; c * n];
    for k in 0..c {
        for b in 0..n {
            tm[b * c + k] = fm[k * n + b];
        }
    }
    let labels: Vec<u32> = (0..n).map(|_| rng.below(c) as u32).collect();
    let loss = SoftmaxCrossEntropy::new(c);
    let (mut gf, mut gt) = (vec![0.0; c * n], vec![0.0; c * n]);
    let (lf, cf) = loss.run_with(LogitsOrder::FeatureMajor, &fm, &labels, Some(&mut gf));
    let (lt, ct) = loss.run_with(LogitsOrder::TargetMajor, &tm, &labels, Some(&mut gt));
    assert!((lf - lt).abs() < 1e-4 * lf.abs(), "loss {lf} vs {lt}");
    assert_eq!(cf, ct);
    for k in 0..c {
        for b in 0..n {
            assert!((gf[k * n + b] - gt[b * c + k]).abs() < 1e-6, "gradient of logit {k} of target {b}");
        }
    }
    let (l_eval, _) = loss.run_with(LogitsOrder::TargetMajor, &tm, &labels, None);
    assert!((l_eval - lt).abs() < 1e-4 * lt.abs());
}
