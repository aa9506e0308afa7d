//! The real architectures through the trainer's `Model` trait: every parameter of every kind
//! (ResNet of both families, VGG-A and VGG-16, the GPT) receives a non-zero gradient; the candle
//! backend refuses them by name; batch-norm state survives a checkpoint and a resume bit for bit;
//! a GPT learns from the windows of a text.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use crate::trainer_support;

use tandem_api::{ModelKind, ModelSpec, TrainingJobSpec, VggVariant};
use tandem_compute::device::Device;
use tandem_compute::model::{self, Batch, Model, Net};
use tandem_compute::optim::Optimizer;
use tandem_compute::params::ParamStore;
use tandem_compute::train::{LocalStep, Trainer};
use tandem_input::{self as data, InputShape, Splits, text};
use tandem_util::rng::Rng;

fn resnet(depth: u32, width: u32) -> ModelSpec {
    ModelSpec { kind: ModelKind::Resnet, depth: Some(depth), width: Some(width), ..ModelSpec::default() }
}

fn vgg(variant: VggVariant) -> ModelSpec {
    ModelSpec {
        kind: ModelKind::Vgg,
        variant: Some(variant),
        width: Some(2),
        classifier_width: Some(8),
        ..ModelSpec::default()
    }
}

fn gpt(layers: u32, heads: u32, dim: u32, context: u32) -> ModelSpec {
    ModelSpec {
        kind: ModelKind::Gpt,
        layers: Some(layers),
        heads: Some(heads),
        dim: Some(dim),
        context: Some(context),
        ..ModelSpec::default()
    }
}

/// One training step of `model` on a random batch of `n` samples; returns the store.
fn one_step(model: &mut dyn Model, input: InputShape, classes: usize, n: usize, tokens: bool) -> ParamStore {
    let mut store = ParamStore::new(model.layout().clone(), model.state_layout().clone());
    let parts = store.parts();
    model.init(parts.params, parts.state).unwrap();
    let mut rng = Rng::new(7);
    let d = input.features();
    let (x, y): (Vec<f32>, Vec<u32>) = if tokens {
        let ids: Vec<u32> = (0..n * d + 1).map(|_| rng.below(classes as u64) as u32).collect();
        let w = text::windows(&ids, d, classes, "random".into());
        (w.features[..n * d].to_vec(), w.labels[..n * d].to_vec())
    } else {
        let x = (0..n * d).map(|_| rng.next_f32()).collect();
        (x, (0..n).map(|i| (i % classes) as u32).collect())
    };
    let parts = store.parts();
    let stats =
        model.forward_backward(parts.params, parts.state, parts.grads, Batch { features: &x, labels: &y });
    let stats = stats.unwrap();
    assert!(stats.loss.is_finite() && stats.loss > 0.0, "{stats:?}");
    assert_eq!(stats.samples, y.len(), "one target per label");
    store
}

fn assert_every_gradient_nonzero(name: &str, store: &ParamStore) {
    let layout = store.layout();
    let zero: Vec<&str> = (layout.entries().iter().enumerate())
        .filter(|&(i, _)| layout.slice(store.grads(), i).iter().all(|&g| g == 0.0))
        .map(|(_, e)| e.name.as_str())
        .collect();
    assert!(zero.is_empty(), "{name}: tensors without gradient: {zero:?}");
    assert!(store.grads().iter().all(|g| g.is_finite()), "{name}: non-finite gradient");
}

#[test]
fn every_parameter_of_every_kind_gets_a_gradient() {
    let small = InputShape { channels: 1, height: 12, width: 12 };
    let rgb = InputShape { channels: 3, height: 32, width: 32 };
    let cases: Vec<(&str, ModelSpec, InputShape, usize)> = vec![
        ("resnet-8 (CIFAR-style) on 1×12×12", resnet(8, 4), small, 10),
        ("resnet-20 on 1×28×28", resnet(20, 2), InputShape { channels: 1, height: 28, width: 28 }, 10),
        ("resnet-18 (ImageNet-style) on 3×32×32", resnet(18, 2), rgb, 5),
        ("resnet-50 (bottlenecks) on 3×32×32", resnet(50, 2), rgb, 5),
        ("vgg-a on 3×32×32", vgg(VggVariant::A), rgb, 5),
        ("vgg-16 on 3×32×32", vgg(VggVariant::D), rgb, 5),
    ];
    for (name, spec, input, classes) in cases {
        let mut m = model::build(&spec, input, classes, 3, &Device::Cpu).unwrap();
        let store = one_step(m.as_mut(), input, classes, 4, false);
        assert_every_gradient_nonzero(name, &store);
        if spec.kind == ModelKind::Resnet {
            assert!(!store.state_layout().is_empty(), "{name}: batch norm keeps running statistics");
            assert!(store.state_layout().entries().iter().any(|e| e.name.ends_with("running_var")), "{name}");
        }
    }
    let context = InputShape { channels: 1, height: 1, width: 6 };
    let mut m = model::build(&gpt(2, 2, 8, 6), context, 11, 3, &Device::Cpu).unwrap();
    let store = one_step(m.as_mut(), context, 11, 3, true);
    assert_every_gradient_nonzero("gpt", &store);
    assert!(store.layout().entries().iter().all(|e| e.name != "lm_head.weight"), "lm_head is tied to wte");
}

#[test]
fn the_models_refuse_shapes_they_cannot_take() {
    let image = InputShape { channels: 1, height: 28, width: 28 };
    let err = model::build(&gpt(2, 2, 8, 16), image, 10, 0, &Device::Cpu).unwrap_err().to_string();
    assert!(err.contains("model.context is 16 tokens") && err.contains("784"), "{err}");
    let err =
        model::build(&gpt(2, 3, 8, 6), InputShape { channels: 1, height: 1, width: 6 }, 11, 0, &Device::Cpu)
            .unwrap_err()
            .to_string();
    assert!(err.contains("model.heads (3) must divide model.dim (8)"), "{err}");
    let mut m =
        model::build(&gpt(1, 1, 4, 3), InputShape { channels: 1, height: 1, width: 3 }, 5, 0, &Device::Cpu)
            .unwrap();
    let mut store = ParamStore::new(m.layout().clone(), m.state_layout().clone());
    let parts = store.parts();
    m.init(parts.params, parts.state).unwrap();
    let parts = store.parts();
    let batch = Batch { features: &[0.0, 1.5, 2.0], labels: &[1, 2, 3] };
    let err = m.forward_backward(parts.params, parts.state, parts.grads, batch).unwrap_err().to_string();
    assert!(err.contains("value 1.5 at position 1") && err.contains("not a token id"), "{err}");
}

#[test]
fn the_candle_backend_refuses_the_engine_only_kinds_by_name() {
    let image = InputShape { channels: 1, height: 28, width: 28 };
    for (spec, name) in [(resnet(20, 16), "resnet"), (vgg(VggVariant::A), "vgg"), (gpt(1, 1, 4, 4), "gpt")] {
        let err = Net::new(&spec, image, 10, 0, &Device::Cpu).unwrap_err().to_string();
        assert!(
            err.contains(&format!("model kind {name} runs on Tandem's CPU engine only"))
                && err.contains("TANDEM_CPU_BACKEND"),
            "{err}"
        );
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn trainer(spec: &TrainingJobSpec) -> (Trainer, LocalStep) {
    let splits = data::load_job(spec, &trainer_support::data_dir()).unwrap();
    let t = trainer_support::trainer_of(spec, splits, 0, 1);
    let u = LocalStep::new(Optimizer::new(&spec.training.optimizer, t.params().len()));
    (t, u)
}

#[test]
fn batch_norm_state_survives_checkpoint_and_resume_bit_for_bit() {
    let spec = trainer_support::small_job(
        "{kind: resnet, depth: 8, width: 4}",
        "{source: synthetic, syntheticSamples: 400, syntheticShape: [1, 12, 12], batchSize: 16}",
        "{kind: sgd, learningRate: 0.05, momentum: 0.9}",
        30,
    );
    let (n, k) = (30, 23); // k inside the second epoch (320 / 16 = 20 batches)
    let (mut straight, mut su) = trainer(&spec);
    let initial = straight.state().to_vec();
    for _ in 0..n {
        straight.step(&mut su).unwrap();
    }
    assert_ne!(bits(straight.state()), bits(&initial), "training moves the running statistics");

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("k.safetensors");
    let (mut first, mut fu) = trainer(&spec);
    for _ in 0..k {
        first.step(&mut fu).unwrap();
    }
    first.save(&fu, &path).unwrap();
    let saved_state = first.state().to_vec();
    drop(first);

    let (mut resumed, mut ru) = trainer(&spec);
    resumed.resume(&mut ru, &path).unwrap();
    assert_eq!(bits(resumed.state()), bits(&saved_state), "the checkpoint restores the state");
    while resumed.step_count() < n {
        resumed.step(&mut ru).unwrap();
    }
    assert_eq!(bits(resumed.params()), bits(straight.params()));
    assert_eq!(bits(resumed.state()), bits(straight.state()));
    // Evaluation reads the running statistics: equal state, equal test results.
    assert_eq!(resumed.evaluate().unwrap(), straight.evaluate().unwrap());
}

#[test]
fn text_windows_target_the_next_token() {
    let stream: Vec<u32> = (0..25).collect();
    let w = text::windows(&stream, 4, 32, "t".into());
    assert_eq!(w.len(), 6, "24 targets fill 6 windows of 4");
    assert_eq!(w.sample(1), &[4.0, 5.0, 6.0, 7.0]);
    assert_eq!(w.targets(1), &[5, 6, 7, 8]);
    let Splits { train, test } = text::split_text(&(0..2000).collect::<Vec<u32>>(), 8, 2000, "t").unwrap();
    assert_eq!((train.len(), test.len()), (224, 24));
    assert!(test.sample(0)[0] >= 1800.0, "the held-out part is the end of the text");
    let err = text::split_text(&[1, 2, 3], 8, 4, "tiny").unwrap_err().to_string();
    assert!(err.contains("lower model.context"), "{err}");
}
