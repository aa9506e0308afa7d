//! Whole networks: the gradient of the mean loss by central finite differences on a small input
//! (MLP, LeNet CNN, and a conv–batch-norm–pool stack like a ResNet stem), every parameter reached
//! by a non-zero gradient, 1 and 2 threads agreeing, and bad input rejected with a clear error.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

mod common;

use common::Rand;
use tandem_kernels::layers::{
    BatchNorm, Conv2d, ConvSpec, Dense, GlobalAvgPool, Layout, MaxPool2d, PoolSpec, Relu,
};
use tandem_kernels::models;
use tandem_kernels::net::{NetError, Network, NetworkBuilder};

fn setup(net: &Network, seed: u64) -> (Vec<f32>, Vec<f32>) {
    let mut rng = Rand::new(seed);
    let mut params = vec![0.0; net.num_params()];
    let mut state = vec![0.0; net.num_state()];
    net.init(&mut params, &mut state, &mut |lo, hi| lo + (hi - lo) * (rng.sym() * 0.5 + 0.5)).unwrap();
    // Non-zero biases, so their paths matter.
    for (i, p) in params.iter_mut().enumerate() {
        *p += 0.05 * ((i % 5) as f32 - 2.0);
    }
    (params, state)
}

/// Checks the analytic gradient against central differences of the mean loss at `samples`
/// parameters spread over the flat vector, and that every tensor gets a non-zero gradient.
fn check_gradient(mut net: Network, batch: usize, seed: u64) {
    let mut rng = Rand::new(seed);
    let (params, state) = setup(&net, seed);
    let x = rng.vec(batch * net.input_features());
    let y: Vec<u32> = (0..batch).map(|_| rng.below(net.classes()) as u32).collect();
    let mut grads = vec![0.0; params.len()];
    let mut s = state.clone();
    net.forward_backward(&params, &mut s, &mut grads, &x, &y).unwrap();
    for e in net.params() {
        let g = &grads[e.offset..e.offset + e.len];
        assert!(g.iter().any(|&v| v != 0.0), "{} received no gradient", e.name);
        assert!(g.iter().all(|v| v.is_finite()), "{} has a non-finite gradient", e.name);
    }
    let entries = net.params().to_vec();
    let mut loss_at = |p: &[f32]| {
        let mut s = state.clone();
        let mut g = vec![0.0; p.len()];
        net.forward_backward(p, &mut s, &mut g, &x, &y).unwrap().loss as f64
    };
    let h = 1e-3f32;
    let step = (params.len() / 60).max(1);
    let base = loss_at(&params);
    let (mut checked, mut kinks) = (0, 0);
    for i in (0..params.len()).step_by(step) {
        let mut up = params.clone();
        up[i] += h;
        let mut down = params.clone();
        down[i] -= h;
        let (lu, ld) = (loss_at(&up), loss_at(&down));
        let (right, left) = ((lu - base) / h as f64, (base - ld) / h as f64);
        // A ReLU or max-pool kink inside ±h makes the one-sided slopes disagree: skip that point.
        if (right - left).abs() > 2e-3 + 0.05 * right.abs().max(left.abs()) {
            kinks += 1;
            continue;
        }
        let fd = ((lu - ld) / (2.0 * h as f64)) as f32;
        let an = grads[i];
        let name = &entries.iter().find(|e| (e.offset..e.offset + e.len).contains(&i)).unwrap().name;
        assert!(
            (fd - an).abs() <= 2e-3 + 3e-2 * an.abs().max(fd.abs()),
            "{name} (flat {i}): analytic {an}, finite difference {fd}"
        );
        checked += 1;
    }
    assert!(kinks * 10 <= checked, "{kinks} of {} points sat on a kink", checked + kinks);
    assert!(checked >= 45, "checked only {checked} parameters");
}

#[test]
fn mlp_gradient_by_finite_differences() {
    check_gradient(models::mlp(12, &[9, 7], 4, 1).unwrap(), 5, 1);
}

#[test]
fn lenet_gradient_by_finite_differences() {
    check_gradient(models::lenet((1, 8, 8), [3, 4], &[6], 3, 1).unwrap(), 3, 2);
    check_gradient(models::lenet((2, 9, 7), [2, 3], &[5], 3, 2).unwrap(), 2, 3);
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
    check_gradient(stem(1), 4, 4);
    check_gradient(stem(2), 4, 5);
}

#[test]
fn batch_norm_state_is_updated_in_training_and_read_in_evaluation() {
    let mut net = stem(1);
    assert_eq!(net.num_state(), 2 * (4 + 5));
    let names: Vec<&str> = net.state().iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["bn1.running_mean", "bn1.running_var", "bn2.running_mean", "bn2.running_var"]);
    let (params, state0) = setup(&net, 6);
    assert_eq!(&state0[4..8], &[1.0; 4], "running variances start at 1");
    let mut rng = Rand::new(7);
    let x = rng.vec(4 * net.input_features());
    let y = [0u32, 1, 2, 0];
    let before = net.evaluate(&params, &state0, &x, &y).unwrap();
    let mut state = state0.clone();
    let mut grads = vec![0.0; params.len()];
    net.forward_backward(&params, &mut state, &mut grads, &x, &y).unwrap();
    assert_ne!(state, state0, "a training step must update the running statistics");
    let after = net.evaluate(&params, &state, &x, &y).unwrap();
    assert_ne!(before.loss, after.loss, "evaluation must use the running statistics");
}

#[test]
fn two_threads_match_one() {
    for (a, b) in [
        (
            models::lenet((1, 28, 28), [16, 32], &[128], 10, 1).unwrap(),
            models::lenet((1, 28, 28), [16, 32], &[128], 10, 2).unwrap(),
        ),
        (models::mlp(784, &[256, 128], 10, 1).unwrap(), models::mlp(784, &[256, 128], 10, 2).unwrap()),
    ] {
        let (mut a, mut b) = (a, b);
        let (params, mut state) = setup(&a, 8);
        let mut rng = Rand::new(9);
        let x = rng.vec(17 * a.input_features());
        let y: Vec<u32> = (0..17).map(|_| rng.below(10) as u32).collect();
        let (mut ga, mut gb) = (vec![0.0; params.len()], vec![0.0; params.len()]);
        let sa = a.forward_backward(&params, &mut state, &mut ga, &x, &y).unwrap();
        let sb = b.forward_backward(&params, &mut state, &mut gb, &x, &y).unwrap();
        assert!((sa.loss - sb.loss).abs() < 1e-5);
        common::assert_close(&gb, &ga, 1e-5, "gradient at 2 threads vs 1");
    }
}

#[test]
fn bad_input_is_a_clear_error() {
    let mut net = models::mlp(4, &[3], 2, 1).unwrap();
    let (params, mut state) = setup(&net, 10);
    let mut grads = vec![0.0; params.len()];
    let err = net.forward_backward(&params, &mut state, &mut grads, &[0.0; 7], &[0, 1]).unwrap_err();
    assert_eq!(err, NetError::Length { what: "the input batch", expected: 8, got: 7 });
    let err = net.forward_backward(&params, &mut state, &mut grads, &[0.0; 8], &[0, 2]).unwrap_err();
    assert!(err.to_string().contains("label 2 of sample 1"), "{err}");
    let err = net.forward_backward(&params[1..], &mut state, &mut grads, &[0.0; 8], &[0, 1]).unwrap_err();
    assert!(err.to_string().contains("params has"), "{err}");
    let err =
        NetworkBuilder::new(Layout::Features(4)).push("fc1", Dense::new(5, 2, false)).build(1).unwrap_err();
    assert!(err.to_string().contains("takes Features(5)"), "{err}");
    let err = models::lenet((1, 3, 3), [2, 2], &[4], 2, 1).unwrap_err();
    assert!(err.to_string().contains("at least 4×4"), "{err}");
}
