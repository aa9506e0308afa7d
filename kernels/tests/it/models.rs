//! Whole networks: the gradient of the mean loss by central finite differences on a small input
//! for every model (MLP, LeNet, ResNet of both families and both block kinds, VGG-A and VGG-16, the
//! GPT) at tiny widths, every parameter tensor reached by a non-zero gradient, parameter counts of
//! the full-size models against torchvision's and GPT-2's published figures, batch-norm state
//! updated in training and read in evaluation, the GPT's causality, 1 and 2 threads agreeing, and
//! bad input rejected with a clear error.

use crate::common::Rand;
use tandem_kernels::layers::{
    BatchNorm, Conv2d, ConvSpec, Dense, GlobalAvgPool, LayerTime, Layout, MaxPool2d, PoolSpec, Relu,
};
use tandem_kernels::models::{self, GptConfig, ResNetConfig, ResNetFamily, VggConfig, VggVariant};
use tandem_kernels::net::{Batch, NetError, Network, NetworkBuilder};

fn setup(net: &Network, seed: u64, scale: f32) -> (Vec<f32>, Vec<f32>) {
    setup_bn(net, seed, scale, 1.0)
}

/// Initial parameters scaled by `scale` (batch-norm weights by `bn_scale`), plus small non-zero
/// offsets so that bias paths matter.
fn setup_bn(net: &Network, seed: u64, scale: f32, bn_scale: f32) -> (Vec<f32>, Vec<f32>) {
    let mut rng = Rand::new(seed);
    let mut params = vec![0.0; net.num_params()];
    let mut state = vec![0.0; net.num_state()];
    net.init(&mut params, &mut state, &mut |lo, hi| lo + (hi - lo) * (rng.sym() * 0.5 + 0.5)).unwrap();
    for (i, p) in params.iter_mut().enumerate() {
        *p = *p * scale + 0.05 * ((i % 5) as f32 - 2.0);
    }
    for e in net.params() {
        let is_bn = e.name.contains(".bn") || e.name.starts_with("bn") || e.name.contains("downsample.1");
        if is_bn && e.name.ends_with(".weight") {
            params[e.range()].iter_mut().for_each(|p| *p *= bn_scale);
        }
    }
    (params, state)
}

/// How a finite-difference check runs.
#[derive(Clone, Copy)]
struct Fd {
    /// Scale of the initial weights.
    scale: f32,
    /// Extra scale of batch-norm weights.
    bn_scale: f32,
    /// Step.
    h: f32,
    /// No ReLU or max pooling: no point is skipped as a kink.
    smooth: bool,
    /// At most one in this many points may be skipped as kinks.
    kink_share: usize,
}

/// A network with ReLU and max pooling at its initial scale.
const KINKED: Fd = Fd { scale: 1.0, bn_scale: 1.0, h: 1e-3, smooth: false, kink_share: 5 };

/// A random input batch and its targets.
enum Input {
    Values(Vec<f32>),
    Tokens(Vec<u32>),
}

impl Input {
    fn batch(&self) -> Batch<'_> {
        match self {
            Input::Values(v) => Batch::Values(v),
            Input::Tokens(t) => Batch::Tokens(t),
        }
    }
}

fn random_batch(net: &Network, batch: usize, rng: &mut Rand) -> (Input, Vec<u32>) {
    let x = match net.input() {
        Layout::Tokens { vocab, .. } => {
            Input::Tokens((0..batch * net.input_len()).map(|_| rng.below(vocab) as u32).collect())
        }
        _ => Input::Values(rng.vec(batch * net.input_len())),
    };
    let y = (0..batch * net.targets_per_sample()).map(|_| rng.below(net.classes()) as u32).collect();
    (x, y)
}

/// Checks the analytic gradient against central differences (step `h`) of the mean loss at about
/// 60 parameters spread over the flat vector and the first values of about 60 tensors spread over
/// the list (all of them in a small network), and that every tensor gets a non-zero gradient.
/// Networks with ReLU or max pooling (`smooth` false) skip points where a kink lies within ±h (the
/// one-sided slopes disagree), at most one in `kink_share`.
fn check_gradient(mut net: Network, batch: usize, seed: u64, fd: Fd) {
    let Fd { scale, bn_scale, h, smooth, kink_share } = fd;
    let mut rng = Rand::new(seed);
    let (params, state) = setup_bn(&net, seed, scale, bn_scale);
    let (x, y) = random_batch(&net, batch, &mut rng);
    let mut grads = vec![0.0; params.len()];
    let mut s = state.clone();
    net.forward_backward(&params, &mut s, &mut grads, x.batch(), &y).unwrap();
    for e in net.params() {
        let g = &grads[e.range()];
        assert!(g.iter().any(|&v| v != 0.0), "{} received no gradient", e.name);
        assert!(g.iter().all(|v| v.is_finite()), "{} has a non-finite gradient", e.name);
    }
    let entries = net.params().to_vec();
    let mut loss_at = |p: &[f32]| {
        let mut s = state.clone();
        let mut g = vec![0.0; p.len()];
        net.forward_backward(p, &mut s, &mut g, x.batch(), &y).unwrap().loss as f64
    };
    // Points spread over the vector, and the first value of every tensor.
    let mut points: Vec<usize> = (0..params.len()).step_by((params.len() / 60).max(1)).collect();
    points.extend(entries.iter().step_by(entries.len().div_ceil(60)).map(|e| e.offset));
    points.sort_unstable();
    points.dedup();
    let base = loss_at(&params);
    let (mut checked, mut kinks) = (0, 0);
    for &i in &points {
        let mut up = params.clone();
        up[i] += h;
        let mut down = params.clone();
        down[i] -= h;
        let (lu, ld) = (loss_at(&up), loss_at(&down));
        let (right, left) = ((lu - base) / h as f64, (base - ld) / h as f64);
        // A ReLU or max-pool kink inside ±h makes the one-sided slopes disagree: skip that point.
        if !smooth && (right - left).abs() > 1e-3 + 0.01 * right.abs().max(left.abs()) {
            kinks += 1;
            continue;
        }
        let fd = ((lu - ld) / (2.0 * h as f64)) as f32;
        let an = grads[i];
        let name = &entries.iter().find(|e| e.range().contains(&i)).unwrap().name;
        assert!(
            (fd - an).abs() <= 2e-3 + 3e-2 * an.abs().max(fd.abs()),
            "{name} (flat {i}): analytic {an}, finite difference {fd}"
        );
        checked += 1;
    }
    assert!(kinks * kink_share <= checked + kinks, "{kinks} of {} points sat on a kink", checked + kinks);
    assert!(checked >= 40, "checked only {checked} parameters");
}

#[test]
fn mlp_gradient_by_finite_differences() {
    check_gradient(models::mlp(12, &[9, 7], 4, 1).unwrap(), 5, 1, KINKED);
}

#[test]
fn lenet_gradient_by_finite_differences() {
    check_gradient(models::lenet((1, 8, 8), [3, 4], &[6], 3, 1).unwrap(), 3, 2, KINKED);
    check_gradient(models::lenet((2, 9, 7), [2, 3], &[5], 3, 2).unwrap(), 2, 3, KINKED);
}

/// conv 3×3 s2 p1 → batch norm → ReLU → max pool 3×3 s2 p1 → conv 1×1 → batch norm → global average
/// pooling → dense: the layers a ResNet is made of, chained.
fn stem(threads: usize) -> Network {
    let conv = |cin, cout, k, stride, pad| ConvSpec {
        cin,
        cout,
        kh: k,
        kw: k,
        stride,
        pad,
        bias: false,
        relu: false,
    };
    NetworkBuilder::new(Layout::Image { c: 3, h: 9, w: 9 })
        .try_push("conv1", Conv2d::new(conv(3, 4, 3, 2, 1), 9, 9))
        .push("bn1", BatchNorm::new(Layout::Image { c: 4, h: 5, w: 5 }))
        .push("relu1", Relu::new(Layout::Image { c: 4, h: 5, w: 5 }))
        .try_push("pool1", MaxPool2d::new(PoolSpec { k: 3, stride: 2, pad: 1 }, 4, 5, 5))
        .try_push("conv2", Conv2d::new(conv(4, 5, 1, 1, 0), 3, 3))
        .push("bn2", BatchNorm::new(Layout::Image { c: 5, h: 3, w: 3 }))
        .push("gap", GlobalAvgPool::new(5, 3, 3))
        .push("fc", Dense::new(5, 3, false))
        .build(threads)
        .unwrap()
}

#[test]
fn conv_batchnorm_pool_stack_gradient_by_finite_differences() {
    check_gradient(stem(1), 4, 4, KINKED);
    check_gradient(stem(2), 4, 5, KINKED);
}

fn tiny_resnet(
    depth: usize,
    family: ResNetFamily,
    width: usize,
    input: (usize, usize, usize),
    threads: usize,
) -> Network {
    models::resnet(ResNetConfig { depth, family, width }, input, 3, threads).unwrap()
}

#[test]
fn resnet_cifar_gradient_by_finite_differences() {
    // ResNet-8: one basic block per stage, projections into stages 2 and 3.
    check_gradient(tiny_resnet(8, ResNetFamily::Cifar, 2, (1, 8, 8), 1), 3, 6, KINKED);
    check_gradient(tiny_resnet(14, ResNetFamily::Cifar, 2, (2, 7, 9), 2), 2, 7, KINKED);
}

#[test]
fn resnet_imagenet_basic_and_bottleneck_gradient_by_finite_differences() {
    // Small images: every unit a perturbation moves is a ReLU or max-pool kink it may cross, and
    // the last stages run on 1×1 maps, so batch norm needs a few samples.
    check_gradient(
        tiny_resnet(18, ResNetFamily::ImageNet, 2, (3, 16, 16), 2),
        4,
        8,
        Fd { h: 3e-4, ..KINKED },
    );
    // Sixteen bottlenecks at He initialisation grow the residual stream until the loss saturates
    // and curves sharply; smaller batch-norm scales keep it tame (as zero-initialised last batch
    // norms would, without zeroing the blocks' gradients). Batch norm of a narrow channel over few
    // values has large gains, so many points sit near a kink: up to half may be skipped (and at
    // least 40 must agree).
    let net = tiny_resnet(50, ResNetFamily::ImageNet, 2, (3, 64, 48), 1);
    check_gradient(net, 4, 9, Fd { h: 3e-4, bn_scale: 0.3, kink_share: 2, ..KINKED });
}

#[test]
fn vgg_gradient_by_finite_differences() {
    let a = VggConfig { variant: VggVariant::A, width: 2, hidden: 6 };
    // 16×16: the fifth pooling would leave less than a pixel and is left out.
    check_gradient(models::vgg(a, (3, 16, 16), 3, 2).unwrap(), 2, 10, Fd { h: 3e-4, ..KINKED });
    let d = VggConfig { variant: VggVariant::Vgg16, width: 1, hidden: 5 };
    check_gradient(models::vgg(d, (1, 12, 10), 3, 1).unwrap(), 2, 11, Fd { h: 3e-4, ..KINKED });
}

fn tiny_gpt(threads: usize) -> Network {
    models::gpt(GptConfig { vocab: 11, context: 7, layers: 2, heads: 2, width: 8 }, threads).unwrap()
}

#[test]
fn gpt_gradient_by_finite_differences() {
    // Weights 4× GPT-2's initial scale, so that every block's gradient is well above the
    // difference quotient's rounding noise (at 10× the loss curves so much that the quotient
    // needs steps below 1e-3 to converge).
    check_gradient(tiny_gpt(1), 3, 12, Fd { scale: 4.0, h: 1e-3, smooth: true, ..KINKED });
    check_gradient(tiny_gpt(2), 2, 13, Fd { scale: 4.0, h: 1e-3, smooth: true, ..KINKED });
}

#[test]
fn full_size_models_have_the_published_parameter_counts() {
    // torchvision's resnet18/34/50, vgg11 (VGG-A) and vgg16 with 1,000 classes; GPT-2 small.
    let imagenet = (3, 224, 224);
    for (depth, want) in [(18, 11_689_512), (34, 21_797_672), (50, 25_557_032)] {
        let net = models::resnet(ResNetConfig::standard(depth).unwrap(), imagenet, 1000, 1).unwrap();
        assert_eq!(net.num_params(), want, "ResNet-{depth}");
    }
    for (variant, want) in [(VggVariant::A, 132_863_336), (VggVariant::Vgg16, 138_357_544)] {
        let net = models::vgg(VggConfig::standard(variant), imagenet, 1000, 1).unwrap();
        assert_eq!(net.num_params(), want, "{variant:?}");
    }
    let gpt2 = GptConfig { vocab: 50257, context: 1024, layers: 12, heads: 12, width: 768 };
    assert_eq!(models::gpt(gpt2, 1).unwrap().num_params(), 124_439_808, "GPT-2 small");
    // ResNet-20 on Fashion-MNIST: 16/32/64 channels, projection shortcuts (PyTorch's count of the
    // same module in bench/train_torch.py).
    let net = models::resnet(ResNetConfig::standard(20).unwrap(), (1, 28, 28), 10, 1).unwrap();
    assert_eq!(net.num_params(), 272_186, "ResNet-20");
}

#[test]
fn resnet_names_follow_torchvision() {
    let net = models::resnet(ResNetConfig::standard(18).unwrap(), (3, 64, 64), 10, 1).unwrap();
    let names: Vec<&str> = net.params().iter().map(|e| e.name.as_str()).collect();
    for want in [
        "conv1.weight",
        "bn1.weight",
        "layer1.0.conv1.weight",
        "layer1.1.bn2.bias",
        "layer2.0.downsample.0.weight",
        "layer2.0.downsample.1.weight",
        "layer4.1.conv2.weight",
        "fc.weight",
        "fc.bias",
    ] {
        assert!(names.contains(&want), "{want} missing from {names:?}");
    }
    assert!(
        !names.iter().any(|n| n.starts_with("layer1.0.downsample")),
        "layer1.0 keeps its shape: no projection"
    );
    let state: Vec<&str> = net.state().iter().map(|e| e.name.as_str()).collect();
    assert_eq!(
        &state[..4],
        &["bn1.running_mean", "bn1.running_var", "layer1.0.bn1.running_mean", "layer1.0.bn1.running_var"]
    );
    let gpt = tiny_gpt(1);
    let names: Vec<&str> = gpt.params().iter().map(|e| e.name.as_str()).collect();
    assert_eq!(&names[..4], &["wte.weight", "wpe.weight", "h.0.ln_1.weight", "h.0.ln_1.bias"]);
    assert!(names.contains(&"h.1.attn.c_attn.weight") && names.contains(&"h.1.mlp.c_proj.bias"));
    assert_eq!(names.last(), Some(&"ln_f.bias"), "lm_head is tied to wte and has no tensor of its own");
}

#[test]
fn batch_norm_state_is_updated_in_training_and_read_in_evaluation() {
    let mut net = stem(1);
    assert_eq!(net.num_state(), 2 * (4 + 5));
    let names: Vec<&str> = net.state().iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["bn1.running_mean", "bn1.running_var", "bn2.running_mean", "bn2.running_var"]);
    let (params, state0) = setup(&net, 6, 1.0);
    assert_eq!(&state0[4..8], &[1.0; 4], "running variances start at 1");
    let mut rng = Rand::new(7);
    let x = rng.vec(4 * net.input_len());
    let y = [0u32, 1, 2, 0];
    let before = net.evaluate(&params, &state0, Batch::Values(&x), &y).unwrap();
    let mut state = state0.clone();
    let mut grads = vec![0.0; params.len()];
    net.forward_backward(&params, &mut state, &mut grads, Batch::Values(&x), &y).unwrap();
    assert_ne!(state, state0, "a training step must update the running statistics");
    let after = net.evaluate(&params, &state, Batch::Values(&x), &y).unwrap();
    assert_ne!(before.loss, after.loss, "evaluation must use the running statistics");
    // A ResNet: every running statistic moves, and evaluation with many steps' statistics of the
    // same batch gives (nearly) the training-mode loss.
    let mut net = tiny_resnet(8, ResNetFamily::Cifar, 3, (1, 8, 8), 2);
    let (params, state0) = setup(&net, 14, 1.0);
    let (x, y) = random_batch(&net, 6, &mut rng);
    let mut state = state0.clone();
    let mut train_loss = 0.0;
    for _ in 0..200 {
        train_loss =
            net.forward_backward(&params, &mut state, &mut grads_for(&net), x.batch(), &y).unwrap().loss;
    }
    for e in net.state() {
        assert!(
            state[e.range()].iter().zip(&state0[e.range()]).all(|(a, b)| a != b),
            "{} did not move",
            e.name
        );
    }
    let eval = net.evaluate(&params, &state, x.batch(), &y).unwrap();
    assert!(
        (eval.loss - train_loss).abs() < 0.1 * train_loss.abs().max(0.1),
        "eval {} vs train {train_loss}",
        eval.loss
    );
}

fn grads_for(net: &Network) -> Vec<f32> {
    vec![0.0; net.num_params()]
}

#[test]
fn gpt_is_causal() {
    let mut net = tiny_gpt(2);
    let (params, state) = setup(&net, 15, 10.0);
    let (t, vocab) = (7, 11);
    let mut rng = Rand::new(16);
    let tokens: Vec<u32> = (0..2 * t).map(|_| rng.below(vocab) as u32).collect();
    let mut base = Vec::new();
    net.logits(&params, &state, Batch::Tokens(&tokens), &mut base).unwrap();
    assert_eq!(base.len(), 2 * t * vocab);
    for j in 0..t {
        let mut changed = tokens.clone();
        changed[t + j] = (changed[t + j] + 1) % vocab as u32;
        let mut out = Vec::new();
        net.logits(&params, &state, Batch::Tokens(&changed), &mut out).unwrap();
        // Sample 0 untouched; in sample 1 positions before j identical, position j on differs.
        assert_eq!(out[..t * vocab], base[..t * vocab], "another sample's change leaked into sample 0");
        let row = |v: &[f32], i: usize| v[(t + i) * vocab..(t + i + 1) * vocab].to_vec();
        for i in 0..j {
            assert_eq!(row(&out, i), row(&base, i), "changing position {j} changed the output at {i}");
        }
        assert_ne!(row(&out, j), row(&base, j), "changing position {j} must change its own output");
    }
}

#[test]
fn two_threads_match_one() {
    let nets = [
        (
            models::lenet((1, 28, 28), [16, 32], &[128], 10, 1).unwrap(),
            models::lenet((1, 28, 28), [16, 32], &[128], 10, 2).unwrap(),
        ),
        (models::mlp(784, &[256, 128], 10, 1).unwrap(), models::mlp(784, &[256, 128], 10, 2).unwrap()),
        (
            tiny_resnet(8, ResNetFamily::Cifar, 4, (1, 12, 12), 1),
            tiny_resnet(8, ResNetFamily::Cifar, 4, (1, 12, 12), 2),
        ),
        (
            models::gpt(GptConfig { vocab: 13, context: 30, layers: 2, heads: 2, width: 16 }, 1).unwrap(),
            models::gpt(GptConfig { vocab: 13, context: 30, layers: 2, heads: 2, width: 16 }, 2).unwrap(),
        ),
    ];
    for (mut a, mut b) in nets {
        let (params, state) = setup(&a, 8, 1.0);
        let mut rng = Rand::new(9);
        let (x, y) = random_batch(&a, 5, &mut rng);
        let (mut ga, mut gb) = (vec![0.0; params.len()], vec![0.0; params.len()]);
        let (mut sa, mut sb) = (state.clone(), state.clone());
        let ra = a.forward_backward(&params, &mut sa, &mut ga, x.batch(), &y).unwrap();
        let rb = b.forward_backward(&params, &mut sb, &mut gb, x.batch(), &y).unwrap();
        assert!((ra.loss - rb.loss).abs() < 1e-5);
        crate::common::assert_close(
            &gb,
            &ga,
            1e-5,
            &format!("gradient at 2 threads vs 1 ({:?})", a.describe()[0]),
        );
        crate::common::assert_close(&sb, &sa, 1e-5, "state at 2 threads vs 1");
    }
}

#[test]
fn bad_input_is_a_clear_error() {
    let mut net = models::mlp(4, &[3], 2, 1).unwrap();
    let (params, mut state) = setup(&net, 10, 1.0);
    let mut grads = vec![0.0; params.len()];
    let err =
        net.forward_backward(&params, &mut state, &mut grads, Batch::Values(&[0.0; 7]), &[0, 1]).unwrap_err();
    assert_eq!(err, NetError::Length { what: "the input batch", expected: 4, got: 7 });
    let err =
        net.forward_backward(&params, &mut state, &mut grads, Batch::Values(&[0.0; 8]), &[0, 2]).unwrap_err();
    assert!(err.to_string().contains("label 2 of target 1"), "{err}");
    let err =
        net.forward_backward(&params, &mut state, &mut grads, Batch::Values(&[0.0; 8]), &[0]).unwrap_err();
    assert!(err.to_string().contains("the targets has 1 values but the network needs 2"), "{err}");
    let err = net
        .forward_backward(&params[1..], &mut state, &mut grads, Batch::Values(&[0.0; 8]), &[0, 1])
        .unwrap_err();
    assert!(err.to_string().contains("params has"), "{err}");
    let err =
        net.forward_backward(&params, &mut state, &mut grads, Batch::Tokens(&[0; 8]), &[0, 1]).unwrap_err();
    assert!(err.to_string().contains("takes float values as input, got token ids"), "{err}");
    let err =
        NetworkBuilder::new(Layout::Features(4)).push("fc1", Dense::new(5, 2, false)).build(1).unwrap_err();
    assert!(err.to_string().contains("takes Features(5)"), "{err}");
    let err = models::lenet((1, 3, 3), [2, 2], &[4], 2, 1).unwrap_err();
    assert!(err.to_string().contains("at least 4×4"), "{err}");
    let err = models::resnet(
        ResNetConfig { depth: 21, family: ResNetFamily::Cifar, width: 16 },
        (1, 28, 28),
        10,
        1,
    )
    .unwrap_err();
    assert!(err.to_string().contains("no Cifar ResNet of depth 21"), "{err}");
    assert!(ResNetConfig::standard(19).unwrap_err().to_string().contains("neither an ImageNet depth"));
    let err = models::gpt(GptConfig { vocab: 11, context: 7, layers: 1, heads: 3, width: 8 }, 1).unwrap_err();
    assert!(err.to_string().contains("divisible by the number of heads"), "{err}");
    let mut gpt = tiny_gpt(1);
    let (params, mut state) = setup(&gpt, 11, 1.0);
    let mut grads = vec![0.0; params.len()];
    let tokens = [1u32, 2, 3, 11, 0, 0, 0];
    let err =
        gpt.forward_backward(&params, &mut state, &mut grads, Batch::Tokens(&tokens), &[0; 7]).unwrap_err();
    assert_eq!(err, NetError::Token { token: 11, position: 3, vocab: 11 });
    let err =
        gpt.forward_backward(&params, &mut state, &mut grads, Batch::Values(&[0.0; 7]), &[0; 7]).unwrap_err();
    assert!(err.to_string().contains("takes token ids as input, got float values"), "{err}");
}

#[test]
fn profiling_times_every_layer_and_changes_nothing() {
    let mut net = tiny_resnet(8, ResNetFamily::Cifar, 2, (1, 8, 8), 2);
    let (params, state0) = setup(&net, 17, 1.0);
    let mut rng = Rand::new(18);
    let (x, y) = random_batch(&net, 3, &mut rng);
    let (mut plain, mut profiled) = (grads_for(&net), grads_for(&net));
    let mut s = state0.clone();
    net.forward_backward(&params, &mut s, &mut plain, x.batch(), &y).unwrap();
    assert!(net.layer_times().is_empty(), "no times unless profiling");
    net.set_profiling(true);
    let mut s = state0.clone();
    net.forward_backward(&params, &mut s, &mut profiled, x.batch(), &y).unwrap();
    assert_eq!(profiled, plain, "profiling must not change the gradient");
    let times = net.layer_times();
    let names: Vec<&str> = times.iter().map(|t| t.name.as_str()).collect();
    for want in ["conv1", "bn1", "layer1.0", "layer1.0.conv1", "layer2.0.downsample.0", "fc"] {
        assert!(names.contains(&want), "{want} missing from {names:?}");
    }
    // Listed in the network's order, each composite before its own layers.
    let at = |n: &str| names.iter().position(|m| *m == n).unwrap();
    let order = ["conv1", "bn1", "layer1.0", "layer1.0.conv1", "layer2.0.downsample.0", "fc"];
    assert!(order.windows(2).all(|w| at(w[0]) < at(w[1])), "{names:?}");
    for t in &times {
        assert_eq!(t.calls, 1, "{}: one forward pass", t.name);
        assert_eq!(t.leaf, !names.iter().any(|n| n.starts_with(&format!("{}.", t.name))), "{}", t.name);
    }
    // A convolution does real work both ways: each pass was timed, not left at zero.
    for t in times.iter().filter(|t| t.leaf && t.name.ends_with("conv1")) {
        assert!(
            t.forward > 0.0 && t.backward > 0.0,
            "{}: forward {} s, backward {} s",
            t.name,
            t.forward,
            t.backward
        );
    }
    // A composite's time includes its layers', both ways.
    let of = |n: &str| times.iter().find(|t| t.name == n).unwrap();
    let block = of("layer1.0");
    let inner = |pass: fn(&LayerTime) -> f64| -> f64 {
        times.iter().filter(|t| t.leaf && t.name.starts_with("layer1.0.")).map(pass).sum()
    };
    assert!(block.forward >= inner(|t| t.forward), "layer1.0 forward {} < its layers'", block.forward);
    assert!(block.backward >= inner(|t| t.backward), "layer1.0 backward {} < its layers'", block.backward);
    // A second pass adds to every time: the profile accumulates until profiling stops.
    let mut s = state0.clone();
    net.forward_backward(&params, &mut s, &mut profiled, x.batch(), &y).unwrap();
    for (first, second) in times.iter().zip(net.layer_times()) {
        assert_eq!((second.name.as_str(), second.calls), (first.name.as_str(), 2));
        assert!(second.forward >= first.forward && second.backward >= first.backward, "{}", first.name);
    }
    net.set_profiling(false);
    assert!(net.layer_times().is_empty(), "stopping profiling clears the times");
}
