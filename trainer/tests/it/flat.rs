//! The flat view: set(get()) is the identity and the flat gradient is the per-tensor gradients.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use candle_core::Tensor;
use tandem_api::{ModelKind, ModelSpec};
use tandem_compute::device::Device;
use tandem_compute::model::{Model, Net};
use tandem_input::InputShape;
use tandem_input::synthetic;

fn models() -> Vec<Net> {
    let shape = InputShape { channels: 1, height: 8, width: 8 };
    let mlp = ModelSpec {
        kind: ModelKind::Mlp,
        hidden: vec![16, 12],
        channels: vec![4, 6],
        ..ModelSpec::default()
    };
    let cnn =
        ModelSpec { kind: ModelKind::Cnn, hidden: vec![10], channels: vec![3, 5], ..ModelSpec::default() };
    vec![
        Net::new(&mlp, shape, 10, 1, &Device::Cpu).unwrap(),
        Net::new(&cnn, shape, 10, 1, &Device::Cpu).unwrap(),
    ]
}

#[test]
fn layout_is_forward_order_weight_before_bias() {
    let [mlp, cnn] = <[Net; 2]>::try_from(models()).unwrap();
    let names: Vec<&str> = mlp.layout().entries().iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "fc3.weight", "fc3.bias"]);
    assert_eq!(mlp.num_params(), 64 * 16 + 16 + 16 * 12 + 12 + 12 * 10 + 10);
    let names: Vec<&str> = cnn.layout().entries().iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names[..4], ["conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias"]);
    // Offsets are contiguous.
    let mut next = 0;
    for e in cnn.layout().entries() {
        assert_eq!(e.offset, next);
        next += e.len;
    }
    assert_eq!(next, cnn.num_params());
}

#[test]
fn set_of_get_is_identity_and_set_changes_the_model() {
    for m in models() {
        let mut p = vec![0.0; m.num_params()];
        m.read_params(&mut p).unwrap();
        m.write_params(&p).unwrap();
        let mut q = vec![1.0; m.num_params()];
        m.read_params(&mut q).unwrap();
        assert_eq!(
            p.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            q.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
        // Writing new values is visible per tensor, at the layout's offsets.
        let new: Vec<f32> = (0..p.len()).map(|i| i as f32 * 1e-3).collect();
        m.write_params(&new).unwrap();
        for (e, var) in m.layout().entries().iter().zip(m.vars()) {
            let v = var.as_tensor().flatten_all().unwrap().to_vec1::<f32>().unwrap();
            assert_eq!(v, new[e.offset..e.offset + e.len], "{}", e.name);
        }
        assert!(m.write_params(&new[1..]).is_err(), "a short buffer must be refused");
    }
}

#[test]
fn flat_gradient_equals_per_tensor_gradients() {
    let data = synthetic(32, InputShape { channels: 1, height: 8, width: 8 }, 10, 5);
    for m in models() {
        let mut flat = vec![f32::NAN; m.num_params()];
        m.loss_and_grad(&data.features, &data.labels, &mut flat).unwrap();
        // The same loss through candle directly.
        let x = Tensor::from_slice(&data.features, (32, 64), &candle_core::Device::Cpu).unwrap();
        let y = Tensor::from_slice(&data.labels, 32, &candle_core::Device::Cpu).unwrap();
        let loss = candle_nn::loss::cross_entropy(&m.forward(&x).unwrap(), &y).unwrap();
        let grads = loss.backward().unwrap();
        for (e, var) in m.layout().entries().iter().zip(m.vars()) {
            let g = grads.get(var.as_tensor()).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
            assert_eq!(g, flat[e.offset..e.offset + e.len], "{}", e.name);
            assert!(g.iter().any(|&v| v != 0.0), "{} has an all-zero gradient", e.name);
        }
    }
}

#[test]
fn same_seed_same_weights_other_seed_other_weights() {
    let spec = ModelSpec::default();
    let shape = InputShape { channels: 1, height: 28, width: 28 };
    let read = |seed| {
        let m = Net::new(&spec, shape, 10, seed, &Device::Cpu).unwrap();
        let mut p = vec![0.0; m.num_params()];
        m.read_params(&mut p).unwrap();
        p
    };
    assert_eq!(read(3), read(3));
    assert_ne!(read(3), read(4));
}

#[test]
fn impossible_models_are_refused_with_a_reason() {
    let tiny = InputShape { channels: 1, height: 3, width: 3 };
    let cnn = ModelSpec { kind: ModelKind::Cnn, ..ModelSpec::default() };
    let err = Net::new(&cnn, tiny, 10, 0, &Device::Cpu).unwrap_err().to_string();
    assert!(err.contains("4×4"), "{err}");
    let zero = ModelSpec { hidden: vec![0], ..ModelSpec::default() };
    let err = Net::new(&zero, tiny, 10, 0, &Device::Cpu).unwrap_err().to_string();
    assert!(err.contains("hidden"), "{err}");
}
