//! Optimizers against hand-computed updates, and on sub-ranges (as a PS shard runs them).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use tandem_api::{OptimizerKind, OptimizerSpec, ScheduleKind, ScheduleSpec};
use tandem_compute::optim::{LrSchedule, Optimizer};

fn sgd(momentum: f64, nesterov: bool, weight_decay: f64) -> OptimizerSpec {
    OptimizerSpec { kind: OptimizerKind::Sgd, momentum, nesterov, weight_decay, ..OptimizerSpec::default() }
}

fn close(a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= 1e-6 * (1.0 + y.abs()), "element {i}: got {x}, expected {y}");
    }
}

#[test]
fn plain_sgd_subtracts_lr_times_gradient() {
    let mut o = Optimizer::new(&sgd(0.0, false, 0.0), 2);
    let mut p = [1.0, -2.0];
    o.step(&mut p, &[0.5, -1.0], 0.1).unwrap();
    close(&p, &[0.95, -1.9]);
}

#[test]
fn momentum_accumulates_velocity() {
    // v1 = g1 = 1; p = 1 - 0.1*1 = 0.9. v2 = 0.9*1 + 2 = 2.9; p = 0.9 - 0.1*2.9 = 0.61.
    let mut o = Optimizer::new(&sgd(0.9, false, 0.0), 1);
    let mut p = [1.0];
    o.step(&mut p, &[1.0], 0.1).unwrap();
    close(&p, &[0.9]);
    o.step(&mut p, &[2.0], 0.1).unwrap();
    close(&p, &[0.61]);
}

#[test]
fn nesterov_looks_ahead() {
    // v1 = 1, d = 1 + 0.9*1 = 1.9, p = 1 - 0.19 = 0.81. v2 = 0.9 + 2 = 2.9, d = 2 + 2.61 = 4.61,
    // p = 0.81 - 0.461 = 0.349.
    let mut o = Optimizer::new(&sgd(0.9, true, 0.0), 1);
    let mut p = [1.0];
    o.step(&mut p, &[1.0], 0.1).unwrap();
    close(&p, &[0.81]);
    o.step(&mut p, &[2.0], 0.1).unwrap();
    close(&p, &[0.349]);
}

#[test]
fn weight_decay_is_decoupled() {
    // p = 2 - 0.1*0.5*2 = 1.9, then - 0.1*1 = 1.8.
    let mut o = Optimizer::new(&sgd(0.0, false, 0.5), 1);
    let mut p = [2.0];
    o.step(&mut p, &[1.0], 0.1).unwrap();
    close(&p, &[1.8]);
}

#[test]
fn adamw_matches_the_formula() {
    let spec = OptimizerSpec {
        kind: OptimizerKind::Adamw,
        weight_decay: 0.01,
        beta1: 0.9,
        beta2: 0.999,
        epsilon: 1e-8,
        ..OptimizerSpec::default()
    };
    let mut o = Optimizer::new(&spec, 1);
    let mut p = [1.0f32];
    let (lr, g1, g2) = (0.01f64, 0.5f64, -0.25f64);
    o.step(&mut p, &[g1 as f32], lr).unwrap();
    // t = 1: m̂ = g, v̂ = g², so the step is lr·g/(|g|+ε) ≈ lr·sign(g); decay first.
    let mut q = 1.0f64;
    q -= lr * 0.01 * q;
    let (m1, v1) = (0.1 * g1, 0.001 * g1 * g1);
    q -= lr * (m1 / 0.1) / ((v1 / 0.001).sqrt() + 1e-8);
    close(&p, &[q as f32]);
    o.step(&mut p, &[g2 as f32], lr).unwrap();
    q -= lr * 0.01 * q;
    let (m2, v2) = (0.9 * m1 + 0.1 * g2, 0.999 * v1 + 0.001 * g2 * g2);
    let (bc1, bc2) = (1.0 - 0.9f64.powi(2), 1.0 - 0.999f64.powi(2));
    q -= lr * (m2 / bc1) / ((v2 / bc2).sqrt() + 1e-8);
    close(&p, &[q as f32]);
}

#[test]
fn a_shard_updates_exactly_like_the_whole_vector() {
    for spec in
        [sgd(0.9, true, 0.1), OptimizerSpec { kind: OptimizerKind::Adamw, ..OptimizerSpec::default() }]
    {
        let n = 10;
        let mut whole = Optimizer::new(&spec, n);
        let mut shard = Optimizer::new(&spec, 4);
        let mut p: Vec<f32> = (0..n).map(|i| i as f32 * 0.3 - 1.0).collect();
        let mut ps = p[3..7].to_vec();
        for k in 0..5 {
            let g: Vec<f32> = (0..n).map(|i| ((i * 7 + k * 3) % 5) as f32 - 2.0).collect();
            whole.step(&mut p, &g, 0.05).unwrap();
            shard.step(&mut ps, &g[3..7], 0.05).unwrap();
        }
        assert_eq!(&p[3..7], ps.as_slice(), "{spec:?}");
    }
}

#[test]
fn state_round_trips_and_wrong_lengths_are_refused() {
    let spec = sgd(0.9, false, 0.0);
    let mut a = Optimizer::new(&spec, 3);
    let mut p = [1.0, 2.0, 3.0];
    a.step(&mut p, &[0.1, 0.2, 0.3], 0.1).unwrap();
    let mut b = Optimizer::new(&spec, 3);
    b.restore(&a.state()).unwrap();
    let mut q = p;
    a.step(&mut p, &[0.3, 0.2, 0.1], 0.1).unwrap();
    b.step(&mut q, &[0.3, 0.2, 0.1], 0.1).unwrap();
    assert_eq!(p, q);
    assert!(a.step(&mut [0.0; 2], &[0.0; 2], 0.1).is_err());
    let adam = Optimizer::new(&OptimizerSpec { kind: OptimizerKind::Adamw, ..OptimizerSpec::default() }, 3);
    let err = b.restore(&adam.state()).unwrap_err().to_string();
    assert!(err.contains("Adamw"), "{err}");
    assert!(Optimizer::new(&spec, 4).restore(&a.state()).is_err());
}

#[test]
fn schedules_warm_up_then_decay() {
    let warm = ScheduleSpec { kind: ScheduleKind::Constant, warmup_steps: 4, ..ScheduleSpec::default() };
    let s = LrSchedule::new(0.1, &warm, 100);
    let got: Vec<f64> = (0..6).map(|i| s.at(i)).collect();
    let want = [0.025, 0.05, 0.075, 0.1, 0.1, 0.1];
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() < 1e-12, "{got:?}");
    }
    let step = ScheduleSpec { kind: ScheduleKind::Step, warmup_steps: 0, step_size: 10, gamma: Some(0.5) };
    let s = LrSchedule::new(0.2, &step, 100);
    assert_eq!((s.at(0), s.at(9), s.at(10), s.at(25)), (0.2, 0.2, 0.1, 0.05));
    let cos = ScheduleSpec { kind: ScheduleKind::Cosine, warmup_steps: 10, ..ScheduleSpec::default() };
    let s = LrSchedule::new(1.0, &cos, 110);
    assert!((s.at(10) - 1.0).abs() < 1e-12);
    assert!((s.at(60) - 0.5).abs() < 1e-12);
    assert!(s.at(110).abs() < 1e-12);
}
